"""What is the agent looking at, in objects? Object shares of saliency maps with ground truth.

    python -m experiments.objects.run --states 500            # every game with a shipped agent and a table
    python -m experiments.objects.run --game pong --states 64 --early-params runs/pong/early.msgpack

For each game with an object table (jaxsal.game_objects) and a shipped agent: play the agent on
ale-py with EnvPool's preprocessing (jaxsal_agents.ale.collect_objects, epsilon 0.05 so that play
does not loop), explain every state with each method and measure
  - each method's mean share of positive attribution per object class (over the states that
    show the class) with a 95% stationary-bootstrap interval at the automatic block length, against
    the class's area share (chance) and against the share of a uniform random map on the same states;
  - the object pointing game: how often the map's maximum is on an object, and on which class;
  - how the shares change from a random-init agent (same network) to an early snapshot
    (`--early-params`, optional) to the trained agent;
  - agreement with occlusion (score "drop", the causal reference): per state, does the method's
    top class (highest share minus chance) equal occlusion's, and the Spearman correlation of
    the mean per-class shares.
Writes experiments/results/objects/<game>/summary.json (keys agent, states, methods, ...), the
per-state shares behind every interval (shares_per_state.csv.gz), a figure per game (shares.png)
and experiments/results/objects/README.md.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import time
from pathlib import Path

import numpy as np
from experiments.common.machine import provenance
from experiments.common.paths import RESULTS

OUT = RESULTS / "objects"
METHODS = {"gradient": {}, "grad_x_input": {}, "integrated_gradients": {}, "guided_backprop": {},
           "gradcam": {"layer": "conv3"}, "occlusion": {"score": "drop"}}
REFERENCE = "occlusion"


RESAMPLES = 10_000
INTERVAL = ("95% percentile stationary bootstrap of the mean over states in play order, at each series' automatic "
            f"mean block length (Politis & White 2004, as the Paper B re-analysis), {RESAMPLES} resamples")


def bootstrap_interval(values, n_boot: int = RESAMPLES, seed: int = 0) -> dict:
    """{"ci": [low, high], "block_len"}: the 95% stationary-bootstrap interval of the mean over states in
    play order (NaNs dropped) at the series' automatic block length; NaNs when empty.

    Consecutive states are near copies of each other, so fixed short blocks give intervals far too narrow;
    the automatic length follows the series' own autocorrelation (jaxsal.metrics.statistics)."""
    from jaxsal.metrics.statistics import stationary_bootstrap_ci
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"ci": [float("nan"), float("nan")], "block_len": float("nan")}
    r = stationary_bootstrap_ci(v, None, n_boot, seed=seed)
    return {"ci": [r["low"], r["high"]], "block_len": r["block_len"]}


def bootstrap_ci(values, n_boot: int = RESAMPLES, seed: int = 0):
    """[low, high] of `bootstrap_interval`."""
    return bootstrap_interval(values, n_boot, seed)["ci"]


def explain_all(agent, obs, methods, params=None):
    """{method: (N, 84, 84) maps} for `agent` (or the same network with `params`)."""
    import jaxsal
    params = agent.params if params is None else params
    return {m: np.asarray(jaxsal.explain(agent.apply_fn, params, obs, method=m, **opts), np.float32)
            for m, opts in methods.items()}


def class_table(shares, boxes, random_shares):
    """{class: {share, ci, chance, random_map_share, states}} from ObjectShares (positive mass)."""
    present = np.asarray(shares.present)
    pos, chance, rnd = (np.asarray(x, np.float64) for x in (shares.positive, shares.chance, random_shares.positive))
    out = {}
    for i, c in enumerate(shares.classes):
        here = present[:, i]
        out[c] = {"share": float(np.nanmean(pos[here, i])) if here.any() else float("nan"),
                  **bootstrap_interval(pos[here, i]),
                  "chance": float(chance[here, i].mean()) if here.any() else float("nan"),
                  "random_map_share": float(np.nanmean(rnd[here, i])) if here.any() else float("nan"),
                  "states": int(here.sum())}
    return out


def top_class(shares):
    """Per state: the class with the largest share above chance (-1 if the map has no mass)."""
    lift = np.asarray(shares.positive, np.float64) - np.asarray(shares.chance, np.float64)
    lift = np.where(np.asarray(shares.present), lift, -np.inf)
    top = np.argmax(np.nan_to_num(lift, nan=-np.inf), 1)
    return np.where(np.isfinite(lift).any(1) & ~np.isnan(np.asarray(shares.positive)).all(1), top, -1)


def spearman(a, b):
    from scipy.stats import spearmanr
    ok = np.isfinite(a) & np.isfinite(b)
    if ok.sum() < 3:
        return float("nan")
    return float(spearmanr(a[ok], b[ok]).statistic)


def play_states(agent, n_states, seed=0, num_envs=4):
    """(obs, boxes, steps): the study's states of `agent`, greedy with epsilon 0.05 on ale-py, subsampled
    evenly (also what experiments.objects.sweep.record writes for a sweep)."""
    from jaxsal_agents.ale import collect_objects

    steps = max(3 * -(-n_states // num_envs), 300)    # play long enough to pass the game's start, then subsample
    batch, boxes = collect_objects(agent, steps, num_envs=num_envs, epsilon=0.05, seed=seed)
    idx = np.linspace(0, len(batch) - 1, n_states).round().astype(int)
    return batch.obs[idx], boxes[idx], steps


def study_game(game, agent_name, n_states, methods, seed=0, early_params=None, num_envs=4):
    import jax
    import jax.numpy as jnp

    import jaxsal_agents
    from jaxsal.metrics import object_attribution, object_pointing

    t0 = time.time()
    agent = jaxsal_agents.load(agent_name)
    obs, boxes, steps = play_states(agent, n_states, seed, num_envs)
    maps = explain_all(agent, obs, methods)
    rand = np.asarray(jax.random.uniform(jax.random.PRNGKey(seed), (len(obs), 84, 84)))
    rnd_shares = object_attribution(rand, boxes)
    shares = {m: object_attribution(v, boxes) for m, v in maps.items()}
    summary = {"game": game, "agent": agent_name, "agent_return": agent.card.get("eval", {}).get("mean_return"),
               "states": int(len(obs)), "policy": f"greedy, epsilon 0.05, ale-py with EnvPool preprocessing, {num_envs} envs x {steps} steps "
                         f"subsampled evenly",
               "classes": list(boxes.classes),
               "interval": INTERVAL, "methods": {m: class_table(s, boxes, rnd_shares) for m, s in shares.items()}}
    # pointing game
    point = {}
    union_area = np.asarray(boxes.masks("union").any(1).mean((-2, -1)))
    for m, v in maps.items():
        hits, classes = object_pointing(v, boxes)
        hits = np.asarray(hits)
        point[m] = {"on_any_object": float(hits.any(1).mean()), "chance": float(union_area.mean()),
                    "by_class": {c: float(hits[:, i].mean()) for i, c in enumerate(classes)}}
    hits, _ = object_pointing(rand, boxes)
    point["random_map"] = {"on_any_object": float(np.asarray(hits).any(1).mean()), "chance": float(union_area.mean())}
    summary["pointing"] = point
    # agreement with occlusion
    if REFERENCE in shares:
        ref_top = top_class(shares[REFERENCE])
        ref_mean = np.array([summary["methods"][REFERENCE][c]["share"] for c in boxes.classes])
        agree = {}
        for m, s in shares.items():
            if m == REFERENCE:
                continue
            top = top_class(s)
            ok = (top >= 0) & (ref_top >= 0)
            mean = np.array([summary["methods"][m][c]["share"] for c in boxes.classes])
            agree[m] = {"top_class_agreement": float((top[ok] == ref_top[ok]).mean()) if ok.any() else float("nan"),
                        "spearman_mean_shares": spearman(mean, ref_mean)}
        summary["agreement_with_occlusion"] = agree
    # random init -> (early) -> trained
    init_params = agent.model.init(jax.random.PRNGKey(seed + 1), jnp.zeros((1, 84, 84, 4), jnp.uint8))
    stages = {"random_init": init_params}
    if early_params:
        stages["early"] = jaxsal_agents.load(agent_name, params_path=early_params).params
    stages["trained"] = agent.params
    grad_methods = {m: o for m, o in methods.items() if m != REFERENCE}   # occlusion is the slow one
    over = {}
    for stage, params in stages.items():
        mp = maps if stage == "trained" else explain_all(agent, obs, grad_methods, params)
        over[stage] = {m: {c: v["share"] for c, v in class_table(object_attribution(mp[m], boxes), boxes, rnd_shares).items()}
                       for m in grad_methods}
    summary["training_stages"] = over
    summary["seconds"] = round(time.time() - t0, 1)
    summary["provenance"] = provenance()   # host, CPU, versions, load and the commit of the code that ran
    return summary, obs, maps, boxes, shares


def write_per_state(shares, path):
    """path (.csv.gz): method, class, state, share (positive share; empty where the class is not shown),
    the rows every interval in summary.json is computed from, in play order."""
    with gzip.open(path, "wt", newline="") as f:
        w = csv.writer(f)
        w.writerow(["method", "class", "state", "share"])
        for m, sh in shares.items():
            present, pos = np.asarray(sh.present), np.asarray(sh.positive, np.float64)
            for i, c in enumerate(sh.classes):
                for t in range(len(pos)):
                    w.writerow([m, c, t, f"{pos[t, i]:.6g}" if present[t, i] and np.isfinite(pos[t, i]) else ""])


def figure(summary, obs, maps, boxes, out_png):
    """Bars: each method's share per class with its 95% interval, chance as a tick; plus one
    state's frame with boxes and two maps."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxsal.game_objects.draw import draw_boxes

    classes, methods = summary["classes"], list(summary["methods"])
    fig, axes = plt.subplots(1, 2, figsize=(12, 4), gridspec_kw={"width_ratios": [3, 1]})
    ax = axes[0]
    width = 0.8 / len(methods)
    for j, m in enumerate(methods):
        s = [summary["methods"][m][c]["share"] for c in classes]
        lo = [summary["methods"][m][c]["ci"][0] for c in classes]
        hi = [summary["methods"][m][c]["ci"][1] for c in classes]
        x = np.arange(len(classes)) + j * width
        ax.bar(x, s, width, label=m, yerr=[np.subtract(s, lo), np.subtract(hi, s)], capsize=2)
    ch = [summary["methods"][methods[0]][c]["chance"] for c in classes]
    ax.scatter(np.arange(len(classes)) + 0.4 - width / 2, ch, marker="_", s=600, color="k", label="chance (area)", zorder=3)
    ax.set_xticks(np.arange(len(classes)) + 0.4 - width / 2)
    ax.set_xticklabels(classes)
    ax.set_ylabel("share of positive attribution")
    ax.set_title(f"{summary['game']}: {summary['agent']} ({summary['states']} states)")
    ax.legend(fontsize=7)
    i = int(np.argmax(np.asarray(boxes.labels[:, -1] >= 0).sum(1)))
    axes[1].imshow(draw_boxes(obs[i, :, :, -1], boxes.boxes[i, -1], boxes.labels[i, -1], scale=3))
    axes[1].set_title("newest frame, RAM boxes", fontsize=8)
    axes[1].axis("off")
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)


SCOPE = ("One agent per game was explained (the shipped one), on the states of one play session per game ({policy}). "
         "Every interval resamples those states, so it describes **these states of one agent**, not the agent's play "
         "in general or other agents.")
OLD_INTERVAL = ("**The intervals of {games} are too short, and they cannot be recomputed.** They resample fixed blocks of 25 "
                "states, that is 75 steps of one environment's play. On the Paper B reproduction's consecutive states "
                "the dependence reaches further: even 100-state block means stay autocorrelated there, and the series "
                "drift within an episode. So these intervals are too narrow. The run that wrote them kept only the "
                "means and intervals, not the per-state shares, so they cannot be recomputed at the automatic block "
                "length; no such numbers are given here. A new run of `python -m experiments.objects.run` keeps "
                "them (`shares_per_state.csv.gz`) and computes its intervals at the automatic length.")


def _num(x) -> str:
    return f"{x:.3f}" if np.isfinite(x) else "-"


def block_range(s) -> str:
    """' Block lengths: a-b states.' over a game's intervals (the automatic ones record theirs)."""
    b = [row[c]["block_len"] for row in s["methods"].values() for c in s["classes"]
         if np.isfinite(row[c].get("block_len", np.nan))]
    return f" Automatic block lengths: {min(b):.0f}-{max(b):.0f} states." if b else ""


def provenance_line(s) -> str:
    p = s.get("provenance")
    if not p:
        return ""
    return (f" Run at {str(p.get('git_commit', '?'))[:8]}{' (uncommitted changes)' if p.get('git_dirty') else ''} "
            f"on {p.get('cpu', '?')}, {p.get('cpu_count', '?')} cores, {s['seconds']:.0f} s.")


STAGES = ("Other training stages of the same network, explained on the same states (`training_stages`): mean "
          "shares only, no intervals, occlusion not computed; `random_init` is one draw of the initial weights "
          "(`PRNGKey(seed + 1)`), no training. Where that draw reaches a share as large as the trained agent's, the "
          "share does not show what the agent learned (one draw: not how much random weights give in general).")


def stages_table(s) -> list[str]:
    """The shares of the stages before training (random init, an early snapshot) beside the table, or []."""
    stages = {k: v for k, v in s.get("training_stages", {}).items() if k != "trained"}
    if not stages:
        return []
    lines = ["", STAGES, "", "| stage | method | " + " | ".join(s["classes"]) + " |",
             "|---|---|" + "---|" * len(s["classes"])]
    for stage, rows in stages.items():
        for m, row in rows.items():
            lines.append(f"| {stage} | {m} | " + " | ".join(_num(row[c]) for c in s["classes"]) + " |")
    return lines


def write_readme(out_dir):
    """experiments/results/objects/README.md from every game's summary.json."""
    summaries = [json.loads(f.read_text()) for f in sorted(Path(out_dir).glob("*/summary.json"))]
    lines = ["# Object-level saliency: what the shipped agents look at", "",
             "`python -m experiments.objects.run` (see its docstring). Shares of positive attribution per object "
             "class (mean over states showing the class, with a 95% interval), chance = the class's area share, "
             "random = a uniform random map on the same states.", ""]
    if summaries:
        lines += [SCOPE.format(policy="; ".join(sorted({s["policy"] for s in summaries}))), ""]
    old = [s["game"] for s in summaries if "blocks of 25" in s["interval"]]
    if old:
        lines += [OLD_INTERVAL.format(games=", ".join(old)), ""]
    for s in summaries:
        lines += [f"## {s['game']} ({s['agent']}, {s['states']} states)", "",
                  f"N: 1 agent, {s['states']} states of one play session. Intervals: {s['interval']}."
                  + block_range(s) + provenance_line(s), ""]
        lines += ["| method | " + " | ".join(s["classes"]) + " |", "|---|" + "---|" * len(s["classes"])]
        for m, row in s["methods"].items():
            cells = [f"{row[c]['share']:.3f} [{row[c]['ci'][0]:.3f}, {row[c]['ci'][1]:.3f}]"
                     if np.isfinite(row[c]["share"]) else "not in these states" for c in s["classes"]]
            lines.append(f"| {m} | " + " | ".join(cells) + " |")
        first = next(iter(s["methods"].values()))
        lines.append("| chance | " + " | ".join(_num(first[c]["chance"]) for c in s["classes"]) + " |")
        lines.append("| random map | " + " | ".join(_num(first[c]["random_map_share"]) for c in s["classes"]) + " |")
        if all("states" in first[c] for c in s["classes"]):
            lines.append("| states showing the class (N of each mean) | "
                         + " | ".join(str(first[c]["states"]) for c in s["classes"]) + " |")
        lines += stages_table(s)
        lines += ["", "Pointing game (map maximum on any object): " + ", ".join(
            f"{m} {v['on_any_object']:.2f}" for m, v in s["pointing"].items()) +
            f" (chance {s['pointing']['random_map']['chance']:.2f}).", ""]
        if "agreement_with_occlusion" in s:
            k = sum(np.isfinite(s["methods"][REFERENCE][c]["share"]) for c in s["classes"]) \
                if REFERENCE in s["methods"] else len(s["classes"])
            lines += [f"Agreement with occlusion (top class per state / Spearman of the {k} classes' mean shares, "
                      "no interval): " + ", ".join(
                f"{m} {v['top_class_agreement']:.2f}/{v['spearman_mean_shares']:.2f}"
                for m, v in s["agreement_with_occlusion"].items()) + ".", ""]
        lines += [f"![{s['game']}]({s['game']}/shares.png)", ""]
    (Path(out_dir) / "README.md").write_text("\n".join(lines))


def main(argv=None):
    import jaxsal_agents
    import jaxsal
    from jaxsal.game_objects import TABLES

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--game", action="append", help="game(s) (default: every game with a table and a shipped agent)")
    p.add_argument("--agent", default=None, help="shipped agent name (default: the game's name)")
    p.add_argument("--states", type=int, default=500)
    p.add_argument("--methods", default=",".join(METHODS), help=f"comma list out of {','.join(METHODS)}")
    p.add_argument("--early-params", default=None, help="msgpack of an early training snapshot of the agent")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args(argv)
    provenance()   # pins the commit of the code this process loaded (recorded in each summary)
    jaxsal.cpu.use_fast_kernels()
    unknown = [m for m in a.methods.split(",") if m not in METHODS]
    if unknown:
        p.error(f"unknown methods {unknown}; choose from {list(METHODS)}")
    methods = {m: METHODS[m] for m in a.methods.split(",")}
    games = a.game or [g for g in TABLES if g in jaxsal_agents.available()]
    if not games:
        p.error("no game has both an object table and a shipped agent")
    for g in games:
        name = a.agent or g
        if g not in TABLES:
            p.error(f"no object table for {g}; tables: {sorted(TABLES)}")
        if name not in jaxsal_agents.available():
            p.error(f"no shipped agent {name!r}; shipped: {jaxsal_agents.available()}")
        summary, obs, maps, boxes, shares = study_game(g, name, a.states, methods, a.seed, a.early_params)
        out = Path(a.out) / g
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        write_per_state(shares, out / "shares_per_state.csv.gz")
        figure(summary, obs, maps, boxes, out / "shares.png")
        print(f"{g}: {summary['states']} states, {summary['seconds']} s -> {out / 'summary.json'}")
    write_readme(a.out)


if __name__ == "__main__":
    main()
