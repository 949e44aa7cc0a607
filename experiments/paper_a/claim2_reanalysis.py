"""Re-analysis of the intervals of Paper A's claim 2 (action-discriminativeness; issue 42's rule).

    python -m experiments.paper_a.claim2_reanalysis --out experiments/results/paper_a_claims

Claim 2 ("no method is action-discriminative") was written up from claims.json's ratios of mean
action change to mean state change, which carry no interval, and from i.i.d. bootstrap intervals of
the two means over the 64 probe states. Those states are about 8 consecutive steps of one
environment after another (8 environments of one random policy), so neighbours are not
independent. This script, pre-declared and committed before it first ran:

- recomputes the per-state action changes (mean 1 - Spearman over the action pairs) and state
  changes (1 - Spearman of consecutive probes' greedy maps) with experiments.paper_a.claims' own
  functions, agent, probes and random init (seed 1, as claims.json), and stops unless every mean
  equals the committed one (|difference| <= TOLERANCE);
- gives each method's ratio R = mean(action change) / mean(state change), for the trained agent,
  the random init and their difference, a stationary-bootstrap interval in probe order: one set
  of resampled probe indices feeds numerator and denominator (and both networks), so the ratio and
  the difference are resampled as pairs; the state change of probe i is its pair (i, i + 1), absent
  for the last probe. Mean block length (primary, "auto"): the largest of the automatic lengths
  (Politis-White, jaxsal.metrics.statistics) of the four series involved; beside it fixed mean
  blocks of 8 and 16 (one and two environments' runs). 10,000 resamples, seed 0, 95 % percentile.

Pre-declared reading (primary variant), per method:
- "much less than to the state" holds if the trained ratio's interval lies below 1;
- "training makes the maps less action-specific, relative to the state" holds if the interval of
  the trained minus random-init ratio lies below 0;
- otherwise the page says which part does not hold for which method. The least-discriminative
  ordering (G1Grad-CAM, Guided Backprop) is reported with the intervals, not tested.
Written to claim2_reanalysis.json, claim2_reanalysis.md and claim2_per_state.csv.
"""
from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import numpy as np

import jaxsal
from experiments.common.machine import provenance
from experiments.common.paths import RESULTS
from experiments.paper_a import claims as pac
from jaxsal.metrics.statistics import optimal_block_length, stationary_blocks

VARIANTS = ("auto", 8, 16)
N_RESAMPLES, SEED, LEVEL, TOLERANCE = 10_000, 0, 0.95, 1e-4
NETS = ("trained", "random_init")


def per_state(apply_fn, params, obs, num_actions: int, methods=pac.DISCRIM_METHODS) -> dict:
    """{method: {"action": (n,), "state": (n,) with NaN last}}, as pac.action_discriminativeness computes them."""
    n = len(obs)
    by_action = [jaxsal.explain(apply_fn, params, obs, method=list(methods), target="q_action",
                                actions=np.full(n, a, np.int32)) for a in range(num_actions)]
    chosen = jaxsal.explain(apply_fn, params, obs, method=list(methods))
    out = {}
    for m in methods:
        a = np.stack([np.asarray(b[m]) for b in by_action])
        pairs = [(i, j) for i in range(num_actions) for j in range(i + 1, num_actions)]
        act = np.nanmean(np.stack([1 - pac.spearman_maps(a[i], a[j]) for i, j in pairs]), 0)
        c = np.asarray(chosen[m])
        state = np.append(1 - pac.spearman_maps(c[:-1], c[1:]), np.nan)
        out[m] = {"action": act, "state": state}
    return out


def _resampled_means(x, starts, lengths) -> np.ndarray:
    """Means of the finite values of x over stationary-bootstrap resamples (starts, lengths): prefix
    sums of the values and of their count, so a NaN probe (no state pair) drops out of each resample."""
    x = np.asarray(x, np.float64)
    n, ok = len(x), np.isfinite(x)
    def sums(v):
        prefix = np.concatenate([[0.0], np.cumsum(np.concatenate([v, v]))])
        full, rem = np.divmod(lengths, n)
        return (full * prefix[n] + prefix[starts + rem] - prefix[starts]).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return sums(np.where(ok, x, 0.0)) / sums(ok.astype(np.float64))


def block_length(series) -> float:
    """The primary mean block length: the largest automatic length of the series (finite values, in order)."""
    return max(optimal_block_length(np.asarray(s, float)[np.isfinite(s)]) for s in series)


def ratio_intervals(values: dict, block: float, n_resamples: int = N_RESAMPLES, seed: int = SEED) -> dict:
    """{"trained", "random_init", "trained_minus_random"}: {"mean", "low", "high"} of the ratio, resampled
    jointly (one set of probe indices for both networks, numerator and denominator)."""
    n = len(values["trained"]["action"])
    starts, lengths = stationary_blocks(n, block, n_resamples, np.random.default_rng(seed))
    point, boot = {}, {}
    for net in NETS:
        v = values[net]
        point[net] = float(np.nanmean(v["action"]) / np.nanmean(v["state"]))
        boot[net] = _resampled_means(v["action"], starts, lengths) / _resampled_means(v["state"], starts, lengths)
    point["trained_minus_random"] = point["trained"] - point["random_init"]
    boot["trained_minus_random"] = boot["trained"] - boot["random_init"]
    a = (1 - LEVEL) / 2
    out = {}
    for k, b in boot.items():
        lo, hi = np.nanquantile(b, [a, 1 - a])
        out[k] = {"mean": point[k], "low": float(lo), "high": float(hi)}
    return out


def analyse(values: dict, committed: dict) -> dict:
    """values: {net: {method: {"action", "state"}}}; committed: claims.json's action_discriminativeness."""
    res = {}
    for m in values["trained"]:
        for net in NETS:
            for part, key in (("action", "action_change"), ("state", "state_change")):
                got, want = float(np.nanmean(values[net][m][part])), committed[net][m][key]["mean"]
                if abs(got - want) > TOLERANCE:
                    raise SystemExit(f"{net}/{m}/{key}: recomputed mean {got:.6f} differs from the committed {want:.6f}")
        series = [values[net][m][part] for net in NETS for part in ("action", "state")]
        auto = block_length(series)
        iv = {v: ratio_intervals({net: values[net][m] for net in NETS}, auto if v == "auto" else float(v))
              for v in VARIANTS}
        p = iv["auto"]
        res[m] = {"block_len": auto, "intervals": iv,
                  "less_than_state": bool(p["trained"]["high"] < 1),
                  "training_lowers_it": bool(p["trained_minus_random"]["high"] < 0)}
    return res


def markdown(res: dict, meta: dict) -> str:
    def ci(r):
        return f"{r['mean']:.2f} [{r['low']:.2f}, {r['high']:.2f}]"
    lines = ["# Paper A claim 2: the action / state change ratio under autocorrelation (re-analysis)", "",
             f"**Re-analysis**, pre-declared in `experiments/paper_a/claim2_reanalysis.py` before it ran: per-state "
             f"values recomputed with the committed code, agent and random init (means checked against claims.json), "
             f"ratios resampled in probe order with a stationary bootstrap ({N_RESAMPLES} resamples). N: 1 agent, "
             f"{meta['probes']} probe states (8 environments of one random policy, runs of consecutive steps), 1 random "
             f"init. Primary: the largest automatic block length of the method's four series; blocks 8 and 16 beside it.",
             "", "| method | block | trained | random init | trained - random | block 8: trained / difference | "
             "block 16: trained / difference | ratio < 1 | training lowers it |", "|---|---|---|---|---|---|---|---|---|"]
    for m, r in res.items():
        iv = r["intervals"]
        lines.append(f"| {m} | {r['block_len']:.1f} | {ci(iv['auto']['trained'])} | {ci(iv['auto']['random_init'])} | "
                     f"{ci(iv['auto']['trained_minus_random'])} | "
                     + " | ".join(f"{ci(iv[b]['trained'])} / {ci(iv[b]['trained_minus_random'])}" for b in (8, 16))
                     + f" | {'yes' if r['less_than_state'] else 'no'} | {'yes' if r['training_lowers_it'] else 'no'} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--agent", default="breakout-dddqn")
    p.add_argument("--out", default=str(RESULTS / "paper_a_claims"))
    a = p.parse_args(argv)
    prov = provenance()
    out = Path(a.out)
    committed = json.loads((out / "claims.json").read_text())
    agent, obs, rand = pac.committed_setup(a.agent, committed)
    values = {net: per_state(agent.model.apply, params, obs, agent.card["num_actions"])
              for net, params in (("trained", agent.params), ("random_init", rand[0]))}
    res = analyse(values, committed["action_discriminativeness"])
    with open(out / "claim2_per_state.csv", "w", newline="") as f:
        w = csv.writer(f)
        cols = [(net, m, part) for net in NETS for m in values[net] for part in ("action", "state")]
        w.writerow(["state"] + [f"{net}/{m}/{part}" for net, m, part in cols])
        for i in range(len(obs)):
            w.writerow([i] + [f"{values[net][m][part][i]:.6f}" for net, m, part in cols])
    meta = {"probes": int(len(obs)), "agent": a.agent, "provenance": prov}
    (out / "claim2_reanalysis.json").write_text(json.dumps({"meta": meta, "methods": res}, indent=1, default=float))
    (out / "claim2_reanalysis.md").write_text(markdown(res, meta))
    print(markdown(res, meta))


if __name__ == "__main__":
    main()
