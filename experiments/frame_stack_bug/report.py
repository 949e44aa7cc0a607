"""Markdown tables of a pre-registered frame-stack study's summary (experiments.frame_stack_bug.study):
detection steps per bug and signal with their seed-bootstrap intervals, final returns with
Student-t intervals, the learning check and every incomplete run.

    python -m experiments.frame_stack_bug.report experiments/results/frame_stack_bug/minatar_summary.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

SIGNAL_NAMES = {"saliency": "maps (`stack_age_gain`)", "return": "returns",
                "saliency_old": "old map statistic (`newest_share_gain`, descriptive)"}


def _step(x) -> str:
    return "missed" if x is None else f"{x:,}"


def _detection(r: dict) -> str:
    """'6,144 (down; 95% 4,096-8,192, never 2%)' or 'missed (last p 0.31; never 97%)'."""
    iv = r["interval"]
    never = f"never {100 * iv['never_share']:.0f}%"
    if r["detection_step"] is None:
        why = "" if r["can_reject"] else "; cannot reject with these seeds"
        return f"missed (last p {r['p_values'][-1]:.3g}{why}; {never})"
    direction = {"+": "up", "-": "down"}[r["direction"]]
    lo, hi = (_step(iv["low"]).replace("missed", "never"), _step(iv["high"]).replace("missed", "never"))
    return f"**{r['detection_step']:,}** ({direction}; 95% {lo} to {hi}, {never})"


def _prediction(r: dict) -> str:
    pred = r.get("predicted_direction")
    if pred is None:
        return "none registered"
    word = {"+": "up", "-": "down"}[pred]
    if r["detection_step"] is None:
        return f"{word}; missed"
    return f"{word}; {'matches' if r['matches_prediction'] else 'CONTRADICTS'}"


def _num(x, fmt="{:.2f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def render(summary: dict) -> str:
    """The summary's tables as markdown (no interpretation: numbers and the rule's verdicts)."""
    s = summary
    plan = s["plan"]
    lines = [f"## {s['study']} study: {plan['game']}, seeds {s['seeds'][0]}-{s['seeds'][-1]} "
             f"({len(s['seeds'])} per variant), {plan['steps']:,} env steps per run", ""]
    if s.get("report") == "incomplete":
        lines += [f"**Incomplete study, truncated** (the pre-registration's incomplete report): the rule "
                  f"on the runs that exist, at the registered checkpoints all of them reached (up to step "
                  f"{s['checkpoints'][-1]:,}); each bug against the correct runs of the same seeds. Missing "
                  f"runs: {', '.join(s['missing_runs'])}; unfinished runs: {', '.join(s['incomplete_runs']) or 'none'}.", ""]
    elif s.get("truncated"):
        lines += [f"**Interim / truncated**: analysed up to step {s['checkpoints'][-1]:,}; "
                  f"incomplete runs: {', '.join(s['incomplete_runs']) or 'none'}.", ""]
    if s.get("cannot_reject"):
        lines += ["With the seeds present the rule cannot reject (a miss below says nothing about the bug):", ""]
        lines += [f"- {x}" for x in s["cannot_reject"]] + [""]
    lines += [f"Rule: {s['rule']}. Per-bug level {s['alpha_per_bug']:.4g} (family {s['family_alpha']}); "
              f"{len(s['checkpoints'])} checkpoints, {s['checkpoints'][0]:,} to {s['checkpoints'][-1]:,}.", "",
              "| bug | " + " | ".join(SIGNAL_NAMES.values()) + " | predicted map direction |",
              "|---|" + "---|" * (len(SIGNAL_NAMES) + 1)]
    for bug, b in s["bugs"].items():
        cells = [_detection(b[k]) for k in SIGNAL_NAMES]
        lines.append(f"| {bug} | " + " | ".join(cells) + f" | {_prediction(b['saliency'])} |")
    windows = {int(k[7:]): k for b in s["bugs"].values() for k in b if k.startswith("return_") and k[7:].isdigit()}
    if windows:
        reg = next(iter(s["bugs"].values()))["return"]["statistic"]       # e.g. return_mean_100
        windows[int(reg.rsplit("_", 1)[1])] = "return"
        cols = sorted(windows)
        lines += ["", f"Return-window sensitivity: detection step under the same rule with the mean of the last W "
                  f"games (registered: W = {reg.rsplit('_', 1)[1]}; the others descriptive).", "",
                  "| bug | " + " | ".join(f"W = {w}" for w in cols) + " |", "|---|" + "---|" * len(cols)]
        for bug, b in s["bugs"].items():
            lines.append(f"| {bug} | " + " | ".join(_step(b[windows[w]]["detection_step"]) for w in cols) + " |")
    lead = s.get("lead")
    if lead:
        lines += ["", f"Lead test (registered; maps before returns, one-sided sign-flip over {len(lead['seeds'])} "
                  f"seeds): per-seed mean lead {', '.join(f'{x:,.0f}' for x in lead['per_seed_mean_lead'])} env steps; "
                  f"p = {lead['p']:.3g} (smallest attainable {lead['min_attainable_p']:.3g}, level {lead['alpha']}): "
                  f"**{'maps first' if lead['maps_first'] else 'not shown'}**."]
    lines += ["", "Detection step: the first registered checkpoint from which the test rejects at every later "
              "one (env steps). Interval: 95% seed-bootstrap stability interval of the step (1,000 "
              "resamples); never: share of resamples with no detection.", "",
              f"| variant | final return (mean) | std | 95% t-interval | per seed (step {s['checkpoints'][-1]:,}) |",
              "|---|---|---|---|---|"]
    for v, f in s["final_returns"].items():
        lo, hi = f["ci95"]
        ci = "n/a" if lo is None else f"{lo:.2f} to {hi:.2f}"
        if f["mean"] is None:
            lines.append(f"| {v} | no run | n/a | n/a | |")
            continue
        lines.append(f"| {v} | {f['mean']:.2f} | {_num(f['std'])} | {ci} | "
                     + ", ".join(f"{x:.2f}" for x in f["per_seed"]) + " |")
    lc = s["learning_check"]
    registered = ("" if lc.get("registered", s["study"] == "atari")
                  else " (registered for the Atari study only; descriptive here)")
    lines += ["", f"Learning check{registered}: the correct agent's final return {_num(lc['correct_final_return'])} against the "
              f"threshold {lc['threshold']:.2f} (2 x random play): **{'learned' if lc['learned'] else 'did not learn'}**."]
    per_update = plan["num_envs"] * plan["rollout"]
    short = {k: v for k, v in s["steps"].items() if v < plan["steps"] // per_update * per_update}
    if short:
        lines.append("Runs short of the budget: " + ", ".join(f"{k} ({v:,})" for k, v in short.items()) + ".")
    return "\n".join(lines) + "\n"


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        raise SystemExit("usage: python -m experiments.frame_stack_bug.report SUMMARY_JSON")
    path = Path(argv[0])
    if not path.exists():
        raise SystemExit(f"{path}: no such summary; run python -m experiments.frame_stack_bug.run --study ... first")
    print(render(json.loads(path.read_text())), end="")


if __name__ == "__main__":
    main()
