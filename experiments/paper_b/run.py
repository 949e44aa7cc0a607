"""Reproduction of Paper B (Huber, Limmer, Andre 2022) on our agents: sanity checks by cascading
randomisation and insertion/deletion AUCs for the perturbation and gradient/CAM methods, with
block-bootstrap intervals and paired tests (experiments/paper_b/stats.py, pre-declared).

    python -m experiments.paper_b.run --game breakout          # Paper B's size: 1,000 states, sanity on 200, 3 draws
    python -m experiments.paper_b.run --game breakout --states 32 --sanity-states 8 --draws 2 --out /tmp/pb   # small
    python -m experiments.paper_b.run --report                 # results README from the games already run

Outputs under experiments/results/paper_b/<game>/: sanity.csv (+ sanity_per_state.csv.gz) and
sanity.png (similarity along the randomisation cascade as lines, one panel per metric and
method family), auc.csv (mean with 95 % CI and the test against the random map, per mode x
substrate x score), auc_per_state.csv.gz, significance.md (+ pairwise.csv: every pair of
methods, Holm-adjusted), curves.csv + insertion.png + deletion.png, timing.csv, maps.png,
summary.md, meta.json. A game needs a trained agent: the shipped one (agents/shipped/) or
--agent-file; without either the run stops and names the command that trains one.
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
import os
import platform
import sys
import time
from pathlib import Path

import jax
import numpy as np

import jaxsal_agents
import jaxsal
from experiments.common.paths import RESULTS
from experiments.paper_b import charts
from experiments.paper_b import report as R
from experiments.paper_b import stats as S
from jaxsal.metrics import deletion, insertion, sanity_check
from jaxsal.metrics.sanity import group_norms

OUT = RESULTS / "paper_b"
GAMES = ("mspacman", "breakout", "spaceinvaders", "frostbite")
FIRST_TO_RERUN = "../../paper_b_rerun/summary.md"  # from a game folder of the first study to the re-run's summary
LAYERS = ("q", "fc1", "conv3", "conv2", "conv1")
CAM = {"layer": "conv3"}
# (label, registered method, options, family); Paper B's parameters are the methods' defaults.
METHODS = [
    ("occlusion", "occlusion", {}, "perturbation"),
    ("noise_sensitivity_original", "noise_sensitivity", {"score": "output_l2"}, "perturbation"),
    ("noise_sensitivity", "noise_sensitivity", {"score": "chosen_action"}, "perturbation"),
    ("rise", "rise", {}, "perturbation"),
    ("lime_slic", "lime", {"segmentation": "slic"}, "perturbation"),
    ("lime_quickshift", "lime", {"segmentation": "quickshift"}, "perturbation"),
    ("lime_felzenszwalb", "lime", {"segmentation": "felzenszwalb"}, "perturbation"),
    ("sarfa", "sarfa", {}, "perturbation"),
    ("sarfa_blurred", "sarfa", {"mask_shape": "gaussian"}, "perturbation"),
    ("gradient", "gradient", {}, "gradient"),
    ("grad_x_input", "grad_x_input", {}, "gradient"),
    ("integrated_gradients", "integrated_gradients", {}, "gradient"),
    ("smoothgrad", "smoothgrad", {}, "gradient"),
    ("guided_backprop", "guided_backprop", {}, "gradient"),
    ("gradcam", "gradcam", CAM, "cam"),
    ("gradcam_pp", "gradcam_pp", CAM, "cam"),
    ("g1gradcam", "g1gradcam", CAM, "cam"),
    # the spec's A (after the ReLU; on our agents after LayerNorm + ReLU) beside the module output
    ("gradcam_post_relu", "gradcam", {**CAM, "layer_activation": "post_relu"}, "cam"),
    ("g1gradcam_post_relu", "g1gradcam", {**CAM, "layer_activation": "post_relu"}, "cam"),
    ("guided_gradcam", "guided_gradcam", CAM, "cam"),
]
FAMILY_TITLES = {"perturbation": "perturbation (Paper B)", "gradient": "gradient", "cam": "CAM (conv3)"}
SETTINGS = [("black", "q_value"), ("black", "advantage"), ("random", "q_value"), ("random", "advantage")]
MODES = ("insertion", "deletion")
METRICS = ("spearman", "ssim_flat", "ssim", "hog")
GROUPS = list(LAYERS) + ["random_uniform", "random_gaussian"]


class NoAgent(SystemExit):
    """No trained agent for a game: the run stops before doing any work."""


def families(labels=None) -> dict:
    """{family title: [labels]} in METHODS order (only `labels` when given)."""
    out = {}
    for label, _, _, fam in METHODS:
        if labels is None or label in labels:
            out.setdefault(FAMILY_TITLES[fam], []).append(label)
    return out


def load_agent(game: str, agent_file: str | None):
    """(agent, name, card): --agent-file, else the shipped agent; else stop with the command
    that trains one (Paper B needs an agent that plays; a random network says nothing)."""
    if agent_file:
        path = Path(agent_file)
        card = path.with_suffix(".json") if path.suffix == ".msgpack" else path
        agent = jaxsal_agents.load(str(card), params_path=str(path) if path.suffix == ".msgpack" else None)
        return agent, str(card), agent.card
    if game in jaxsal_agents.available():
        agent = jaxsal_agents.load(game)
        return agent, game, agent.card
    raise NoAgent(
        f"paper_b: no trained agent for {game!r} (shipped: {jaxsal_agents.available()}). Train and export one:\n"
        f"  python -m jaxsal_agents.train --game {game} --steps 5000000 --run-dir runs/{game}\n"
        f"  python -m jaxsal_agents.export --run-dir runs/{game} --name {game}\n"
        f"or pass --agent-file CARD.json")


def time_maps(agent, obs, method, opts, key, n_time: int = 4):
    """(maps on all states, first-call seconds incl. compile, steady seconds per map on n_time
    states: the second call of the same shape, so compilation is excluded)."""
    kw = dict(opts)
    if method in jaxsal.registry.STOCHASTIC:
        kw["key"] = key
    t0 = time.perf_counter()
    maps = jax.block_until_ready(jaxsal.explain(agent.apply_fn, agent.params, obs, method=method, **kw))
    first = time.perf_counter() - t0
    sub = obs[:n_time]
    jax.block_until_ready(jaxsal.explain(agent.apply_fn, agent.params, sub, method=method, **kw))
    t0 = time.perf_counter()
    jax.block_until_ready(jaxsal.explain(agent.apply_fn, agent.params, sub, method=method, **kw))
    return maps, first, (time.perf_counter() - t0) / len(sub)


def method_result(cache: Path, label, agent, obs, method, opts, key, n_sanity, draws, skip_sanity):
    """Maps, timing and per-draw sanity results {draw: {group: {metric: (n,)}}} of one method,
    cached in `cache` (npz, no pickle) so an interrupted run resumes where it stopped."""
    f = cache / f"{label}.npz"
    if f.exists():
        z = dict(np.load(f))
        sanity = {}
        for k, v in z.items():
            if k.startswith("sanity/"):
                _, d, g, metric = k.split("/")
                sanity.setdefault(int(d), {}).setdefault(g, {})[metric] = v
        return z["maps"], {"first_call_s": float(z["first_call_s"]), "ms_per_map": float(z["ms_per_map"]),
                           "load_avg_1min": float(z["load_avg_1min"])}, sanity
    print(f"[{label}] maps", flush=True)
    load = os.getloadavg()[0]
    maps, first, per_map = time_maps(agent, obs, method, opts, key)
    timing = {"first_call_s": round(first, 3), "ms_per_map": round(1000 * per_map, 3),
              "load_avg_1min": round(load, 2)}
    sanity = {}
    if not skip_sanity:
        layers = group_norms(agent.params, LAYERS)
        for d in range(draws):
            print(f"[{label}] sanity check on {n_sanity} states, draw {d + 1}/{draws}", flush=True)
            # the maps of the first n_sanity states are the original maps of every draw (rows
            # keep their keys: explain's maps of a prefix of the states are the prefix of its maps)
            r = sanity_check(agent.model, agent.params, obs[:n_sanity], method=method, layers=layers,
                             key=key, draw=d, metrics=METRICS, original=maps[:n_sanity], **opts)
            sanity[d] = {g: {k: np.asarray(v) for k, v in res.items()} for g, res in r.items()}
    np.savez(f, maps=np.asarray(maps), **timing,
             **{f"sanity/{d}/{g}/{k}": v for d, r in sanity.items() for g, res in r.items()
                for k, v in res.items()})
    return np.asarray(maps), timing, sanity


def write_csv(path, rows):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "wt", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def read_csv(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


def _r(x, nd=4):
    return round(float(x), nd) if np.isfinite(x) else float("nan")


def sanity_tables(sanity, block_len):
    """(summary rows with mean and CI over states of the draw-averaged similarity, per-state rows)."""
    rows, per_state = [], []
    for m, by_draw in sanity.items():
        draws = sorted(by_draw)
        for g in GROUPS:
            for metric in METRICS:
                stack = np.stack([np.asarray(by_draw[d][g][metric], np.float64) for d in draws])
                mean, lo, hi = S.ci(stack.mean(0), block_len)
                rows.append({"method": m, "randomised": g, "metric": metric, "mean": _r(mean),
                             "low": _r(lo), "high": _r(hi), "draw_sd": _r(stack.mean(1).std()),
                             "states": stack.shape[1], "draws": len(draws)})
                per_state.extend({"method": m, "randomised": g, "metric": metric, "draw": d, "state": i,
                                  "similarity": round(float(v), 5)}
                                 for d, vals in zip(draws, stack) for i, v in enumerate(vals))
    return rows, per_state


def fidelity(agent, obs, maps, key, batch_size):
    """{(mode, substrate, score): {method: (aucs (N,), mean curve (S+1,))}}: every map set into
    the same substrates (the random substrate is the same draw for every method). An AUC is NaN where
    its score is undefined (a ratio score where the clean Q <= 0); the mean curve is over the other states."""
    out = {}
    for label, m in maps.items():
        for mode, fn in (("insertion", insertion), ("deletion", deletion)):
            for sub in ("black", "random"):
                both = fn(agent.apply_fn, agent.params, obs, m, substrate=sub, score="all",
                          key=jax.random.fold_in(key, 11), batch_size=batch_size)
                for score in ("q_value", "advantage"):
                    c = np.asarray(both[score]["curves"], np.float64)  # a NaN row: the score is undefined there
                    ok = np.isfinite(c).all(1)
                    mean_curve = c[ok].mean(0) if ok.any() else np.full(c.shape[1], np.nan)
                    out.setdefault((mode, sub, score), {})[label] = (c.mean(1), mean_curve)
        auc = out["insertion", "black", "q_value"][label][0]  # NaN where the ratio score is undefined
        print(f"  fidelity {label}: insertion black/q {np.nanmean(auc):.3f} "
              f"({int(np.isnan(auc).sum())} of {auc.size} states where the ratio score is undefined)", flush=True)
    return out


def fidelity_tables(fid, block_len):
    """(auc rows: CI + test against the random map, pairwise rows, per-state rows, curve rows)."""
    auc_rows, pair_rows, per_state, curve_rows = [], [], [], []
    for (mode, sub, score), res in fid.items():
        aucs = {m: v[0] for m, v in res.items()}
        for r in S.against_random(aucs, "random", block_len):
            auc_rows.append({"mode": mode, "substrate": sub, "score": score, "method": r["method"],
                             "mean": _r(r["mean"]), "low": _r(r["low"]), "high": _r(r["high"]),
                             "diff_vs_random": _r(r["diff"]), "p": _r(r["p"], 6),
                             "p_holm": _r(r["p_holm"], 6), "significant": r["significant"]})
        for r in S.pairwise(aucs, block_len):
            pair_rows.append({"mode": mode, "substrate": sub, "score": score, "a": r["a"], "b": r["b"],
                              "diff": _r(r["diff"]), "p": _r(r["p"], 6), "p_holm": _r(r["p_holm"], 6),
                              "significant": r["significant"]})
        for m, (a, c) in res.items():
            per_state.extend({"mode": mode, "substrate": sub, "score": score, "method": m, "state": i,
                              "auc": round(float(v), 5)} for i, v in enumerate(a))
            curve_rows.extend({"mode": mode, "substrate": sub, "score": score, "method": m, "step": t,
                               "mean": round(float(v), 5)} for t, v in enumerate(c))
    return auc_rows, pair_rows, per_state, curve_rows


def _fmt_ci(r):
    return f"{float(r['mean']):.3f} [{float(r['low']):.3f}, {float(r['high']):.3f}]"


def auc_markdown(auc_rows, mode):
    """Markdown table of one mode: mean [95 % CI] per setting; * = differs from the random map
    (Holm-adjusted Wilcoxon on block means); best non-random mean per column in bold."""
    cols = [(s, c) for s, c in SETTINGS]
    by = {(r["method"], r["substrate"], r["score"]): r for r in auc_rows if r["mode"] == mode}
    methods = list(dict.fromkeys(r["method"] for r in auc_rows if r["mode"] == mode))
    better = max if mode == "insertion" else min
    best = {sc: better((m for m in methods if m != "random" and (m,) + sc in by),
                       key=lambda m: float(by[(m,) + sc]["mean"]), default=None) for sc in cols}
    lines = ["| method | " + " | ".join(f"{s} / {c}" for s, c in cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for m in methods:
        cells = []
        for sc in cols:
            r = by.get((m,) + sc)
            if r is None:
                cells.append("")
                continue
            c = _fmt_ci(r) + (" *" if str(r["significant"]) == "True" else "")
            cells.append(f"**{c}**" if best[sc] == m else c)
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return lines


def run_game(game, args):
    out = Path(args.out) / game
    agent, agent_name, card = load_agent(game, args.agent_file)
    out.mkdir(parents=True, exist_ok=True)
    key = jax.random.PRNGKey(args.seed)
    agent_return = card.get("eval", {}).get("mean_return")
    print(f"[{game}] agent {agent_name} (return {agent_return}); collecting {args.states} greedy states",
          flush=True)
    batch = jaxsal_agents.collect(agent, args.states, game=game, epsilon=0.0, seed=args.seed)
    obs = np.asarray(batch.obs)
    n_sanity = 0 if args.skip_sanity else min(len(obs), args.sanity_states)
    available = set(jaxsal.methods())
    chosen = [m for m in METHODS if (not args.methods or m[0] in args.methods)]
    skipped = [m[0] for m in chosen if m[1] not in available]
    chosen = [m for m in chosen if m[1] in available]
    if skipped:
        print(f"[{game}] skipping methods not registered with jaxsal: {skipped}", file=sys.stderr)

    maps, timing, sanity, failed = {}, [], {}, {}
    cache = out / "cache" / f"{agent.name}_s{len(obs)}_k{n_sanity}_d{args.draws}_seed{args.seed}"
    cache.mkdir(parents=True, exist_ok=True)
    for label, method, opts, _ in chosen:
        try:
            maps[label], t, san = method_result(cache, label, agent, obs, method, opts, key, n_sanity,
                                                args.draws, args.skip_sanity)
        except Exception as e:   # one broken method must not lose the others' results
            failed[label] = f"{type(e).__name__}: {e}"
            print(f"[{game}] {label} FAILED: {failed[label]}", file=sys.stderr, flush=True)
            continue
        timing.append({"method": label, "states_timed": min(4, len(obs)), **t})
        if san:
            sanity[label] = san
    maps["random"] = np.asarray(jax.random.uniform(jax.random.fold_in(key, 7), (len(obs), 84, 84)))

    fid = fidelity(agent, obs, maps, key, args.batch_size)
    auc_rows, pair_rows, per_state, curve_rows = fidelity_tables(fid, args.block_len)
    write_csv(out / "auc.csv", auc_rows)
    write_csv(out / "pairwise.csv", pair_rows)
    write_csv(out / "auc_per_state.csv.gz", per_state)
    write_csv(out / "curves.csv", curve_rows)
    write_csv(out / "timing.csv", timing)
    labels = list(maps)
    sig = [f"# Which methods differ? {game}, {len(obs)} states", "", R.first_study_banner(FIRST_TO_RERUN), "",
           f"Cell (row, column): `>` row significantly better than column, `<` worse, `.` not significant "
           f"({S.TEST} over all pairs of a setting, alpha {S.ALPHA}, blocks of {args.block_len} states). "
           "Better = higher AUC for insertion, lower for deletion."]
    for mode in MODES:
        for sub, score in SETTINGS:
            pairs = [r for r in pair_rows if (r["mode"], r["substrate"], r["score"]) == (mode, sub, score)]
            sig += ["", f"## {mode}, {sub} substrate, {score}", ""]
            sig += S.significance_matrix(labels, pairs, higher_is_better=(mode == "insertion"))
    (out / "significance.md").write_text("\n".join(sig) + "\n")

    tag = f"{game}, agent {agent_name} (return {R.fmt_return(agent_return)})"
    summary = [f"# Paper B on {game}: {len(obs)} states", "", R.first_study_banner(FIRST_TO_RERUN), "",
               f"Agent: {agent_name}, mean return {R.fmt_return(agent_return)} (its card). AUC = mean of the 85-point "
               f"curve (84 px per step), mean over states [95 % block-bootstrap CI, blocks of {args.block_len} "
               f"states, {S.N_RESAMPLES} resamples]; `*` = differs from the random map ({S.TEST}, alpha "
               f"{S.ALPHA}). Best mean per column in bold (insertion: highest; deletion: lowest)."]
    for mode in MODES:
        summary += ["", f"## {mode.capitalize()} AUC", ""] + auc_markdown(auc_rows, mode)
    summary += ["", f"## Time per map ({jax.default_backend()}, {platform.processor() or platform.machine()}; "
                "steady state on 4 states, second call; 1-min load average when timed)", "",
                "| method | ms / map | first call on all states incl. compile (s) | load avg |", "|---|---|---|---|"]
    summary += [f"| {t['method']} | {t['ms_per_map']:.1f} | {t['first_call_s']:.1f} | {t['load_avg_1min']:.1f} |"
                for t in timing]
    draws = 0
    if sanity:
        rows, per = sanity_tables(sanity, args.block_len)
        draws = int(rows[0]["draws"])
        write_csv(out / "sanity.csv", rows)
        write_csv(out / "sanity_per_state.csv.gz", per)
        charts.sanity_chart(out / "sanity.png", rows, families(sanity), LAYERS, METRICS,
                            f"Sanity check (cascading randomisation), {tag}: {n_sanity} states x {draws} draws; "
                            "mean and 95 % block-bootstrap band")
        by = {(r["method"], r["randomised"], r["metric"]): r for r in rows}
        for metric in METRICS:
            summary += ["", f"## Sanity check, {metric} to the original map ({n_sanity} states x {draws} draws; "
                        "mean [95 % CI])", "", "| method | " + " | ".join(GROUPS) + " |",
                        "|---" * (len(GROUPS) + 1) + "|"]
            summary += [f"| {m} | " + " | ".join(_fmt_ci(by[m, g, metric]) for g in GROUPS) + " |"
                        for m in sanity]
    curves = read_csv(out / "curves.csv")
    for mode in MODES:
        charts.curve_chart(out / f"{mode}.png", curves, families(labels), SETTINGS, mode,
                           f"{mode.capitalize()} curves, {tag}: mean over {len(obs)} states")
    (out / "summary.md").write_text("\n".join(summary) + "\n")
    charts.maps_figure(out / "maps.png", obs, maps, f"{game}: state 0")
    meta = {"game": game, "agent": agent_name, "agent_return": agent_return,
            "agent_frames_trained": card.get("frames_trained"), "layer_norm": bool(card.get("layer_norm", False)),
            "states": len(obs), "sanity_states": n_sanity, "sanity_draws": draws,
            "block_len": args.block_len, "n_resamples": S.N_RESAMPLES, "seed": args.seed,
            "methods": [m[0] for m in chosen], "skipped_methods": skipped, "failed_methods": failed,
            "layers_randomised": [list(g) if isinstance(g, tuple) else g for g in group_norms(agent.params, LAYERS)],
            "episode_returns": batch.episode_returns, "episodes_ended": int(np.sum(batch.dones)),
            "jax": jax.__version__, "backend": jax.default_backend(), "device": str(jax.devices()[0]),
            "python": platform.python_version(), "command": " ".join(sys.argv)}
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    print(f"[{game}] wrote {out}", flush=True)


def replot(game, out):
    """Redraw the charts of a finished run from its CSV files."""
    d = Path(out) / game
    meta = json.loads((d / "meta.json").read_text())
    tag = f"{game}, agent {meta['agent']} (return {R.fmt_return(meta['agent_return'])})"
    if (d / "sanity.csv").exists():
        rows = read_csv(d / "sanity.csv")
        charts.sanity_chart(d / "sanity.png", rows, families({r["method"] for r in rows}), LAYERS, METRICS,
                            f"Sanity check (cascading randomisation), {tag}: {meta['sanity_states']} states x "
                            f"{meta['sanity_draws']} draws; mean and 95 % block-bootstrap band")
    curves = read_csv(d / "curves.csv")
    labels = {r["method"] for r in curves}
    for mode in MODES:
        charts.curve_chart(d / f"{mode}.png", curves, families(labels), SETTINGS, mode,
                           f"{mode.capitalize()} curves, {tag}: mean over {meta['states']} states")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--game", nargs="+", default=["breakout"], choices=GAMES, help="games")
    p.add_argument("--states", type=int, default=1000, help="consecutive greedy-play states per game")
    p.add_argument("--sanity-states", type=int, default=200,
                   help="states used for the sanity check (the first ones; at most --states)")
    p.add_argument("--draws", type=int, default=3, help="independent randomisation draws per layer")
    p.add_argument("--block-len", type=int, default=S.BLOCK_LEN,
                   help=f"states per bootstrap block (pre-declared: {S.BLOCK_LEN}; change only for smoke runs)")
    p.add_argument("--agent-file", default=None,
                   help="agent card .json (or its .msgpack) instead of the shipped agent (one game)")
    p.add_argument("--methods", nargs="*", default=None,
                   help=f"subset of method labels: {[m[0] for m in METHODS]}")
    p.add_argument("--skip-sanity", action="store_true")
    p.add_argument("--batch-size", type=int, default=1020,
                   help="model rows per insertion/deletion forward pass (memory knob)")
    p.add_argument("--replot", action="store_true", help="only redraw the charts from the CSV files")
    p.add_argument("--report", action="store_true",
                   help="only write the results README from the games already run under --out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    if args.agent_file and len(args.game) > 1:
        p.error("--agent-file applies to one --game")
    if args.draws < 1 or args.states < 1 or args.block_len < 1:
        p.error("--draws, --states and --block-len must be >= 1")
    if args.methods:
        unknown = set(args.methods) - {m[0] for m in METHODS}
        if unknown:
            p.error(f"unknown method labels {sorted(unknown)}; choose from {[m[0] for m in METHODS]}")
    if args.report:
        R.write(Path(args.out))
        return
    for game in args.game:
        if args.replot:
            replot(game, args.out)
            continue
        run_game(game, args)
    from experiments.paper_b import report as paper_b_report
    paper_b_report.write(Path(args.out))


if __name__ == "__main__":
    main()
