"""Reproduction of Paper B (Huber, Limmer, Andre 2022) on our agents: sanity checks by cascading
randomisation and insertion AUCs for the perturbation and gradient/CAM methods.

    python -m experiments.paper_b --game breakout --states 1000      # the paper's size
    python -m experiments.paper_b --game breakout --states 20        # small version

Outputs under experiments/results/paper_b/<game>/: sanity.csv + sanity.png (bar chart per
randomised layer), insertion.csv + insertion.md (black/random x q_value/advantage, random-map
baseline), timing.csv, maps.png, summary.md, meta.json. Without a shipped agent for the game
(agents/shipped/) and without --agent-file it falls back to a randomly initialised DQN and says
so loudly in every output: such numbers test the pipeline, not the methods.
"""
from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import agents
import jaxsal
from jaxsal.metrics import insertion, sanity_check

OUT = Path(__file__).parent / "results" / "paper_b"
LAYERS = ("q", "fc1", "conv3", "conv2", "conv1")
CAM = {"layer": "conv3"}
# (label, registered method, options); Paper B's parameters are the methods' defaults.
METHODS = [
    ("occlusion", "occlusion", {}),
    ("noise_sensitivity_original", "noise_sensitivity", {"score": "output_l2"}),
    ("noise_sensitivity", "noise_sensitivity", {"score": "chosen_action"}),
    ("rise", "rise", {}),
    ("lime_slic", "lime", {"segmentation": "slic"}),
    ("lime_quickshift", "lime", {"segmentation": "quickshift"}),
    ("lime_felzenszwalb", "lime", {"segmentation": "felzenszwalb"}),
    ("sarfa", "sarfa", {}),
    ("gradient", "gradient", {}),
    ("grad_x_input", "grad_x_input", {}),
    ("integrated_gradients", "integrated_gradients", {}),
    ("smoothgrad", "smoothgrad", {}),
    ("guided_backprop", "guided_backprop", {}),
    ("gradcam", "gradcam", CAM),
    ("gradcam_pp", "gradcam_pp", CAM),
    ("g1gradcam", "g1gradcam", CAM),
    ("guided_gradcam", "guided_gradcam", CAM),
]
SETTINGS = [("black", "q_value"), ("black", "advantage"), ("random", "q_value"), ("random", "advantage")]
METRICS = ("spearman", "ssim", "hog")


def load_agent(game: str, agent_file: str | None, seed: int):
    """(agent, description, trained?): --agent-file, else the shipped agent, else random init."""
    if agent_file:
        path = Path(agent_file)
        card = path.with_suffix(".json") if path.suffix == ".msgpack" else path
        agent = agents.load(str(card), params_path=str(path) if path.suffix == ".msgpack" else None)
        return agent, f"{card} (from --agent-file)", True
    if game in agents.available():
        agent = agents.load(game)
        return agent, f"shipped agent {game!r} ({agent.card.get('arch', '?')})", True
    from agents.envs import make_env
    num_actions = make_env(game, 1, train=False).num_actions
    model = agents.build_model(game, "dqn", num_actions)
    params = jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.zeros((1, 84, 84, 4), jnp.float32))
    card = {"game": game, "arch": "dqn", "num_actions": num_actions, "obs_shape": [84, 84, 4]}
    print(f"WARNING: no shipped agent for {game!r} (agents/shipped/ has {agents.available()}) and no "
          "--agent-file: using a RANDOMLY INITIALISED DQN. Results test the pipeline only.",
          file=sys.stderr)
    return agents.Agent(f"{game}-random-init", model, params, card), "random init (UNTRAINED)", False


def layer_groups(params, layers=LAYERS):
    """Each layer with its norm layer when the agent has one (randomised together)."""
    names = set(params["params"])
    return tuple((l, f"{l}_norm") if f"{l}_norm" in names else l for l in layers)


def time_maps(agent, obs, method, opts, key, n_time: int = 4):
    """(maps on all states, first-call seconds incl. compile, steady ms per map on n_time states)."""
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


def method_result(cache: Path, label, agent, obs, method, opts, key, n_sanity, groups, skip_sanity):
    """Maps, timing and sanity results of one method, cached in `cache` (npz, no pickle) so an
    interrupted run resumes where it stopped."""
    f = cache / f"{label}.npz"
    if f.exists():
        z = dict(np.load(f))
        sanity = {}
        for k, v in z.items():
            if k.startswith("sanity/"):
                _, g, metric = k.split("/")
                sanity.setdefault(g, {})[metric] = v
        return z["maps"], {"first_call_s": float(z["first_call_s"]), "ms_per_map": float(z["ms_per_map"])}, sanity
    print(f"[{label}] maps", flush=True)
    maps, first, per_map = time_maps(agent, obs, method, opts, key)
    timing = {"first_call_s": round(first, 3), "ms_per_map": round(1000 * per_map, 3)}
    sanity = {}
    if not skip_sanity:
        print(f"[{label}] sanity check on {n_sanity} states", flush=True)
        r = sanity_check(agent.model, agent.params, obs[:n_sanity], method=method, layers=groups,
                         key=key, **opts)
        sanity = {g: {k: np.asarray(v) for k, v in d.items()} for g, d in r.items()}
    np.savez(f, maps=np.asarray(maps), **timing,
             **{f"sanity/{g}/{k}": v for g, d in sanity.items() for k, v in d.items()})
    return np.asarray(maps), timing, sanity


def mean_std(x):
    x = np.asarray(x, np.float64)
    return float(x.mean()), float(x.std())


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def sanity_chart(path, rows, title):
    """Grouped bars (one per method) of the mean similarity per randomised layer and baseline,
    one panel per metric, from sanity.csv rows (so `--replot` can redraw it)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in rows))
    groups = list(LAYERS) + ["random_uniform", "random_gaussian"]
    stat = {(r["method"], r["randomised"], r["metric"]): (float(r["mean"]), float(r["std"])) for r in rows}
    fig, axes = plt.subplots(len(METRICS), 1, figsize=(max(12, 0.2 * len(groups) * len(methods)), 10),
                             sharex=True)
    width = 0.8 / len(methods)
    cmap = plt.get_cmap("tab20")
    for ax, metric in zip(axes, METRICS):
        for j, m in enumerate(methods):
            ms = [stat.get((m, g, metric), (np.nan, np.nan)) for g in groups]
            ax.bar(np.arange(len(groups)) + (j - len(methods) / 2 + 0.5) * width, [v[0] for v in ms],
                   width, yerr=[v[1] for v in ms], label=m, color=cmap(j % 20), error_kw={"lw": 0.5})
        ax.set_ylabel(metric)
        ax.set_ylim(-0.1, 1.05)
        ax.axhline(0, color="k", lw=0.5)
    axes[-1].set_xticks(np.arange(len(groups)))
    axes[-1].set_xticklabels([f"randomised\nup to {g}" if g in LAYERS else g for g in groups])
    axes[0].set_title(title)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, ncol=min(len(methods), 6), fontsize=8, loc="lower center")
    fig.tight_layout(rect=(0, 0.03 + 0.025 * int(np.ceil(len(methods) / 6)), 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def maps_figure(path, obs, maps, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(maps)
    cols = 6
    rows = int(np.ceil((len(names) + 1) / cols))
    fig, axes = plt.subplots(rows, cols, figsize=(2.2 * cols, 2.3 * rows))
    axes = np.atleast_1d(axes).ravel()
    axes[0].imshow(np.asarray(obs[0, :, :, -1]), cmap="gray")
    axes[0].set_title("state (last frame)", fontsize=8)
    for ax, n in zip(axes[1:], names):
        ax.imshow(np.asarray(maps[n][0]), cmap="inferno")
        ax.set_title(n, fontsize=8)
    for ax in axes:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def run_game(game, args):
    out = Path(args.out) / game
    out.mkdir(parents=True, exist_ok=True)
    key = jax.random.PRNGKey(args.seed)
    agent, agent_desc, trained = load_agent(game, args.agent_file, args.seed)
    tag = "" if trained else " [UNTRAINED random-init agent: pipeline check only]"
    print(f"[{game}] agent: {agent_desc}; collecting {args.states} greedy states", flush=True)
    batch = agents.collect(agent, args.states, game=game, epsilon=0.0, seed=args.seed)
    obs = np.asarray(batch.obs)
    n_sanity = min(len(obs), args.sanity_states)
    available = set(jaxsal.methods())
    chosen = [m for m in METHODS if (not args.methods or m[0] in args.methods)]
    skipped = [m[0] for m in chosen if m[1] not in available]
    chosen = [m for m in chosen if m[1] in available]
    if skipped:
        print(f"[{game}] skipping methods not registered with jaxsal: {skipped}", file=sys.stderr)

    maps, timing, sanity, failed = {}, [], {}, {}
    groups = layer_groups(agent.params)
    cache = out / "cache" / f"{agent.name}_s{len(obs)}_k{n_sanity}_seed{args.seed}"
    cache.mkdir(parents=True, exist_ok=True)
    for label, method, opts in chosen:
        try:
            maps[label], t, san = method_result(cache, label, agent, obs, method, opts, key, n_sanity,
                                                groups, args.skip_sanity)
        except Exception as e:   # one broken method must not lose the others' results
            failed[label] = f"{type(e).__name__}: {e}"
            print(f"[{game}] {label} FAILED: {failed[label]}", file=sys.stderr, flush=True)
            continue
        timing.append({"method": label, "states_timed": min(4, len(obs)), **t})
        if san:
            sanity[label] = san
    maps["random"] = jax.random.uniform(jax.random.fold_in(key, 7), (len(obs), 84, 84))

    ins_rows, per_state = [], []
    for label in maps:
        row = {"method": label}
        for sub in ("black", "random"):
            both = insertion(agent.apply_fn, agent.params, obs, maps[label], substrate=sub, score="all",
                             key=jax.random.fold_in(key, 11), batch_size=args.batch_size)
            for score in ("q_value", "advantage"):
                auc = np.asarray(both[score]["auc"])
                mu, sd = mean_std(auc)
                row[f"{sub}_{score}_mean"], row[f"{sub}_{score}_std"] = round(mu, 4), round(sd, 4)
                per_state.extend({"method": label, "substrate": sub, "score": score, "state": i,
                                  "auc": float(a)} for i, a in enumerate(auc))
        row = {"method": label, **{f"{s}_{c}_{k}": row[f"{s}_{c}_{k}"] for s, c in SETTINGS
                                   for k in ("mean", "std")}}
        ins_rows.append(row)
        print(f"[{game}] insertion {label}: " + ", ".join(
            f"{s}/{c} {row[f'{s}_{c}_mean']:.3f}" for s, c in SETTINGS), flush=True)

    write_csv(out / "insertion.csv", ins_rows)
    write_csv(out / "insertion_per_state.csv", per_state)
    write_csv(out / "timing.csv", timing)
    md = [f"# Paper B insertion AUCs: {game}, {len(obs)} states{tag}", "",
          f"Agent: {agent_desc}. AUC = mean of the 85-point insertion curve (84 px per step); "
          "mean +- std over states. Best method per column in bold; `random` = U(0,1) maps.", "",
          "| method | " + " | ".join(f"{s} / {c}" for s, c in SETTINGS) + " |",
          "|---" * (len(SETTINGS) + 1) + "|"]
    best = {sc: max((r for r in ins_rows if r["method"] != "random"),
                    key=lambda r: r[f"{sc[0]}_{sc[1]}_mean"], default=None) for sc in SETTINGS}
    for r in ins_rows:
        cells = []
        for sc in SETTINGS:
            c = f"{r[f'{sc[0]}_{sc[1]}_mean']:.3f} +- {r[f'{sc[0]}_{sc[1]}_std']:.3f}"
            cells.append(f"**{c}**" if best[sc] is r else c)
        md.append(f"| {r['method']} | " + " | ".join(cells) + " |")
    (out / "insertion.md").write_text("\n".join(md) + "\n")

    summary = md + ["", f"## Time per map ({jax.default_backend()}; steady state on 4 states, and the first "
                    f"call on all {len(obs)} states including compilation)", "",
                    "| method | ms / map | first call incl. compile (s) |", "|---|---|---|"]
    summary += [f"| {t['method']} | {t['ms_per_map']:.1f} | {t['first_call_s']:.1f} |" for t in timing]
    if sanity:
        rows = []
        for m, res in sanity.items():
            for g, d in res.items():
                for metric, v in d.items():
                    mu, sd = mean_std(v)
                    rows.append({"method": m, "randomised": g, "metric": metric, "mean": round(mu, 4),
                                 "std": round(sd, 4), "states": len(v)})
        write_csv(out / "sanity.csv", rows)
        sanity_chart(out / "sanity.png", rows,
                     f"Sanity check (cascading randomisation), {game}, {n_sanity} states{tag}")
        summary += ["", f"## Sanity check ({n_sanity} states): mean Spearman / SSIM / HOG to the original map",
                    "", "| method | " + " | ".join(list(LAYERS) + ["U(0,1)", "N(0,1)"]) + " |",
                    "|---" * (len(LAYERS) + 3) + "|"]
        for m, res in sanity.items():
            cells = ["/".join(f"{np.mean(res[g][k]):.2f}" for k in METRICS)
                     for g in list(LAYERS) + ["random_uniform", "random_gaussian"]]
            summary.append(f"| {m} | " + " | ".join(cells) + " |")
        ns = {m: float(np.mean(sanity[m]["q"]["spearman"])) for m in
              ("noise_sensitivity_original", "noise_sensitivity") if m in sanity}
        if ns:
            summary += ["", "Output-layer check (Spearman after randomising only `q`; Paper B: original "
                        "noise sensitivity ~0.7-0.8 = fails, chosen-action fix low = passes): " +
                        ", ".join(f"{m} {v:.2f}" for m, v in ns.items())]
    (out / "summary.md").write_text("\n".join(summary) + "\n")
    maps_figure(out / "maps.png", obs, {k: v for k, v in maps.items()}, f"{game}: state 0{tag}")
    meta = {"game": game, "agent": agent_desc, "trained": trained, "states": len(obs),
            "sanity_states": n_sanity if sanity else 0, "seed": args.seed,
            "methods": [m[0] for m in chosen], "skipped_methods": skipped, "failed_methods": failed,
            "layers_randomised": [list(g) if isinstance(g, tuple) else g for g in groups],
            "episode_returns": batch.episode_returns, "jax": jax.__version__,
            "backend": jax.default_backend(), "python": platform.python_version()}
    (out / "meta.json").write_text(json.dumps(meta, indent=2))
    print(f"[{game}] wrote {out}", flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--game", nargs="+", default=["breakout"],
                   help="games (breakout mspacman spaceinvaders frostbite)")
    p.add_argument("--states", type=int, default=1000, help="greedy-play states per game")
    p.add_argument("--sanity-states", type=int, default=1000,
                   help="states used for the sanity check (at most --states)")
    p.add_argument("--agent-file", default=None,
                   help="agent card .json (or its .msgpack) instead of the shipped agent (one game)")
    p.add_argument("--methods", nargs="*", default=None,
                   help=f"subset of method labels: {[m[0] for m in METHODS]}")
    p.add_argument("--skip-sanity", action="store_true")
    p.add_argument("--batch-size", type=int, default=1020,
                   help="model rows per insertion forward pass (memory knob)")
    p.add_argument("--replot", action="store_true",
                   help="only redraw sanity.png from an existing sanity.csv")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    if args.agent_file and len(args.game) > 1:
        p.error("--agent-file applies to one --game")
    if args.methods:
        unknown = set(args.methods) - {m[0] for m in METHODS}
        if unknown:
            p.error(f"unknown method labels {sorted(unknown)}; choose from {[m[0] for m in METHODS]}")
    for game in args.game:
        if args.replot:
            out = Path(args.out) / game
            with open(out / "sanity.csv") as f:
                rows = list(csv.DictReader(f))
            meta = json.loads((out / "meta.json").read_text())
            tag = "" if meta["trained"] else " [UNTRAINED random-init agent: pipeline check only]"
            sanity_chart(out / "sanity.png", rows, f"Sanity check (cascading randomisation), {game}, "
                         f"{meta['sanity_states']} states{tag}")
            continue
        run_game(game, args)


if __name__ == "__main__":
    main()
