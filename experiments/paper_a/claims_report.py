"""Tables and a figure from `experiments.paper_a.claims`' claims.json (issue 17, item 3).

    python -m experiments.paper_a.claims_report experiments/results/paper_a_claims

Writes `tables.md` (one table per claim, every figure with its 95 % interval) and
`claims.png` (edges: trained vs random init; action vs state change per method; CAM share on
the ball and paddle rows over the training snapshots, with chance and the return's rise).
Reads only claims.json and the run's snapshot statistics already in it: no model is run.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

EDGE_LABELS = {
    "neg_gbp_vs_abs_laplacian": "max(-GBP, 0) vs abs(Laplacian)",
    "gbp_vs_laplacian": "GBP vs Laplacian (signed)",
    "abs_gbp_vs_sobel": "abs(GBP) vs Sobel magnitude",
}


def _ci(d) -> str:
    if not d or d.get("mean") is None:
        return "n/a"
    lo, hi = d["ci95"]
    return f"{d['mean']:.3f} ({lo:.3f} to {hi:.3f})"


def edges_table(res) -> list[str]:
    lines = ["| correlation (Pearson over pixels, per frame, mean over frames) | trained | random init "
             f"(mean of {res['random_inits']}) | trained - random |", "|---|---|---|---|"]
    for k, v in res["edges"].items():
        lines.append(f"| {EDGE_LABELS.get(k, k)} | {_ci(v['trained'])} | {_ci(v['random_init'])} | "
                     f"{_ci(v['trained_minus_random'])} |")
    return lines


def discrim_table(res) -> list[str]:
    lines = ["| method | action change, trained | state change, trained | ratio, trained | ratio, random init |",
             "|---|---|---|---|---|"]
    tr, rd = res["action_discriminativeness"]["trained"], res["action_discriminativeness"]["random_init"]
    for m, v in tr.items():
        r0 = rd.get(m, {}).get("ratio")
        lines.append(f"| {m} | {_ci(v['action_change'])} | {_ci(v['state_change'])} | "
                     f"{v['ratio']:.2f} | {'n/a' if r0 is None else f'{r0:.2f}'} |"
                     if v["ratio"] is not None else f"| {m} | {_ci(v['action_change'])} | "
                     f"{_ci(v['state_change'])} | n/a | n/a |")
    return lines


def cam_table(res) -> list[str]:
    lines = ["| method | network | share on ball/paddle rows | chance (row area) | object shares (RAM boxes): "
             "ball / paddle, chance |", "|---|---|---|---|---|"]
    for net in ("trained", "random_init"):
        rows, objs = res["cam_look"][net]["rows"], res["cam_look"][net]["objects"]
        for m, v in rows.items():
            o = objs.get(m, {})

            def obj(c):
                s = o.get(c)
                return "n/a" if not s else f"{s['share']:.3f} ({s['chance']:.3f})"
            lines.append(f"| {m} | {net} | {_ci(v['ball_paddle_rows']['share'])} | "
                         f"{v['ball_paddle_rows']['chance']:.3f} | ball {obj('ball')} / paddle {obj('paddle')} |")
    return lines


def _obj(row, c) -> str:
    o = (row.get("objects") or {}).get(c)
    return "" if not o else f"{o['share']:.3f} ({o['chance']:.3f})"


def snapshot_table(res) -> list[str]:
    lines = []
    for run, s in res.get("snapshots", {}).items():
        rise = s["rise_step"]
        methods = sorted({r["method"] for r in s["snapshots"]})
        has_obj = any("objects" in r for r in s["snapshots"])
        cols = [f"{m} rows share (chance)" for m in methods]
        if has_obj:
            cols += [f"{m} {c} share (chance)" for m in methods for c in ("ball", "paddle")]
        lines += [f"Run `{Path(run).name}`: the return (mean of the last 20 games) first reaches "
                  f"{s['rise_level']:.1f} at env step {rise if rise is not None else 'never'}.", "",
                  "| env step | before the rise | " + " | ".join(cols) + " |",
                  "|---|---|" + "---|" * len(cols)]
        by_step: dict = {}
        for r in s["snapshots"]:
            by_step.setdefault(r["step"], {})[r["method"]] = r
        for step in sorted(by_step):
            row = by_step[step]
            first = next(iter(row.values()))
            cells = [f"{row[m]['share']:.3f} ({row[m]['chance']:.3f})" if m in row else "" for m in methods]
            if has_obj:
                cells += [_obj(row[m], c) if m in row else "" for m in methods for c in ("ball", "paddle")]
            lines.append(f"| {step} | {'yes' if first['before_rise'] else 'no'} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def split_table(res) -> list[str]:
    sa = res.get("split_attention")
    if not sa:
        return []
    nets = [(n, sa[n]) for n in ("trained", "random_init") if n in sa] or [("", sa)]
    t = len(nets[0][1]["q"]["frame_shares"])
    lines = [f"Parameters: {sa['params']}.", "",
             "| network | stream | " + " | ".join(f"frame {k}" for k in range(t)) + " |", "|---|---|" + "---|" * t]
    for net, s in nets:
        label = net.replace("_", " ") or "-"
        for name in ("q", "value", "advantage"):
            lines.append(f"| {label} | GBP share, {name} | " + " | ".join(f"{x:.3f}" for x in s[name]["frame_shares"]) + " |")
        for name in ("value_attention", "advantage_attention"):
            lines.append(f"| {label} | {name.replace('_', ' ')} weight | " + " | ".join(f"{x:.3f}" for x in s[name]) + " |")
    return lines


def figure(res, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    runs = list(res.get("snapshots", {}).items())
    fig, axes = plt.subplots(1, 3 if runs else 2, figsize=(13 if runs else 9, 3.4))
    ax = axes[0]
    keys = list(res["edges"])
    for j, net in enumerate(("trained", "random_init")):
        m = [res["edges"][k][net]["mean"] for k in keys]
        lo = [res["edges"][k][net]["ci95"][0] for k in keys]
        hi = [res["edges"][k][net]["ci95"][1] for k in keys]
        x = np.arange(len(keys)) + (j - 0.5) * 0.35
        ax.bar(x, m, 0.35, yerr=[np.subtract(m, lo), np.subtract(hi, m)], capsize=3,
               label=net.replace("_", " "))
    ax.axhline(0, color="k", lw=0.6)
    ax.set_xticks(range(len(keys)), [EDGE_LABELS[k].replace(" vs ", "\nvs ") for k in keys], fontsize=7)
    ax.set_ylabel("Pearson r (95% CI)")
    ax.set_title("1. Guided Backprop vs edge maps", fontsize=9)
    ax.legend(fontsize=7)
    ax = axes[1]
    tr = res["action_discriminativeness"]["trained"]
    rd = res["action_discriminativeness"]["random_init"]
    ms = list(tr)
    ax.bar(np.arange(len(ms)) - 0.175, [tr[m]["ratio"] or 0 for m in ms], 0.35, label="trained")
    ax.bar(np.arange(len(ms)) + 0.175, [rd[m]["ratio"] or 0 for m in ms], 0.35, label="random init")
    ax.axhline(1, color="k", lw=0.6, ls="--")
    ax.set_xticks(range(len(ms)), ms, rotation=30, fontsize=7)
    ax.set_ylabel("action change / state change")
    ax.set_title("2. action-discriminativeness", fontsize=9)
    ax.legend(fontsize=7)
    if runs:
        ax = axes[2]
        run, s = runs[0]
        ball = all("ball" in (r.get("objects") or {}) for r in s["snapshots"])

        def val(r):   # the ball's object share (RAM boxes) where known, else the rows share
            return (r["objects"]["ball"]["share"], r["objects"]["ball"]["chance"]) if ball \
                else (r["share"], r["chance"])
        for m in sorted({r["method"] for r in s["snapshots"]}):
            rows = sorted((r["step"],) + val(r) for r in s["snapshots"] if r["method"] == m)
            ax.plot([r[0] for r in rows], [r[1] for r in rows], marker=".", label=m)
        rows = sorted((r["step"], val(r)[1]) for r in s["snapshots"])
        ax.plot([r[0] for r in rows], [r[1] for r in rows], color="gray", ls=":", label="chance")
        if s["rise_step"] is not None:
            ax.axvline(s["rise_step"], color="k", lw=0.8, ls="--", label="return rises")
        ax.set_xlabel("env steps")
        ax.set_ylabel("share of |map| on the ball" if ball else "share of |map| on ball/paddle rows")
        ax.set_title(f"3. where CAMs look during training ({Path(run).name})", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def report(out_dir) -> Path:
    out = Path(out_dir)
    res = json.loads((out / "claims.json").read_text())
    lines = [f"# Paper A's claims about the methods, measured on `{res['agent']}` "
             f"({res['probes']} probe states)", "",
             "Generated by `python -m experiments.paper_a.claims_report` from `claims.json`; definitions in "
             "`experiments/paper_a/claims.py`. Intervals: 95 % bootstrap over the probe states as if they were "
             "independent; they are runs of consecutive states, so these intervals are too narrow. Claims 1 and "
             "2 rest on the block-bootstrap re-analyses (`claim1_reanalysis.md`, `claim2_reanalysis.md`); "
             "section 3 describes these probe states of one agent only.", "",
             "## 1. Guided Backprop and edges", "", *edges_table(res), "",
             "## 2. Action-discriminativeness (1 - Spearman between maps)", "", *discrim_table(res), "",
             "## 3. Where the CAMs look", "", *cam_table(res), "", *snapshot_table(res)]
    if res.get("split_attention"):
        lines += ["## 4. Split-attention agent: Guided Backprop per stream and frame", "", *split_table(res), ""]
    (out / "tables.md").write_text("\n".join(lines) + "\n")
    figure(res, out / "claims.png")
    return out / "tables.md"


if __name__ == "__main__":
    print(report(sys.argv[1] if len(sys.argv) > 1 else "experiments/results/paper_a_claims"))
