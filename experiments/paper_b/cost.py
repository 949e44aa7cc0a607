"""Paper B's per-game cost at two commits, interleaved method by method: is the study cheaper now?

    python -m experiments.paper_b.cost --before COMMIT [--after HEAD]

Every method of the study (experiments.paper_b.run.METHODS of the checkout running this, with the
study's options; a method an older commit cannot run is left out of both totals) times its
maps on the same 4 Breakout states (the shipped Breakout agent, real frames from
docs/images/data/method_frames.npz and one of them mirrored) at both commits, each side in a
persistent process of its own (its own checkout, same venv), at the library's default batch size
(as the study computes its maps and sanity checks) or one given per side, alternating which side
goes first,
for several rounds: the steady ms per map as the study's `time_maps` measures it (the second call
of a shape). The sanity check is then timed as each side's study runs it (--sanity-rounds, default 1):
10 draws of the 5-layer cascade on the same states with the study's four similarity metrics, draw by
draw, or in one `sanity_check(draws=...)` where that commit's library has it (the study's runner then
calls it so). Its time less the time JAX spent tracing and compiling (JAX's compile events) gives
the sanity maps' steady speed; the compiling is counted once per game and method, as the study
makes one such call per method and game. The per-game hours follow from the re-run's counts
(experiments.paper_b.rerun.estimate: states maps at the maps' speed + draws x layers x sanity states
at the sanity check's speed, per method). The maps of both sides are compared (the largest absolute
difference per method), since a cheaper study must compute the same maps.
Writes experiments/results/paper_b_cost/{paper_b_cost.json,paper_b_cost.md}.
"""
from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

from experiments.common.checkouts import ROOT, Worker, checkout_at, median, remove
from experiments.common.machine import machine_info
from experiments.common.paths import write_results

WORKER = r'''
import inspect, json, sys, time
import numpy as np
import jax
import jaxsal, jaxsal_agents

z = np.load("docs/images/data/method_frames.npz")
obs = np.concatenate([z["breakout_obs"], z["breakout_obs"][:1, :, ::-1]])
agent = jaxsal_agents.load("breakout")
key = jax.random.PRNGKey(0)
print(json.dumps({"ready": jaxsal.__file__, "agents": jaxsal_agents.__file__}), flush=True)

from jaxsal.metrics import sanity as S
LAYERS = S.group_norms(agent.params, ("q", "fc1", "conv3", "conv2", "conv1"))
METRICS = ("spearman", "ssim_flat", "ssim", "hog")
original = {}
COMPILE_EVENTS = ("/jax/core/compile/jaxpr_trace_duration", "/jax/core/compile/jaxpr_to_mlir_module_duration",
                  "/jax/core/compile/backend_compile_duration")
compiling = [0.0]
jax.monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: compiling.__setitem__(0, compiling[0] + secs) if event in COMPILE_EVENTS else None)

def call(method, opts, batch_size):
    kw = dict(opts, batch_size=batch_size)
    if method in jaxsal.registry.STOCHASTIC:
        kw["key"] = key
    maps = np.asarray(jaxsal.explain(agent.apply_fn, agent.params, obs, method=method, **kw))
    original[method, json.dumps(opts, sort_keys=True)] = maps
    return maps

def sanity(method, opts, batch_size, draws):
    """The study's sanity check of these states: the draws in one call where this commit can."""
    kw = dict(opts, batch_size=batch_size, layers=LAYERS, metrics=METRICS, key=key,
              original=original[method, json.dumps(opts, sort_keys=True)])
    if "draws" in inspect.signature(S.sanity_check).parameters:
        jax.block_until_ready(S.sanity_check(agent.model, agent.params, obs, method=method, draws=range(draws), **kw))
    else:
        for d in range(draws):
            jax.block_until_ready(S.sanity_check(agent.model, agent.params, obs, method=method, draw=d, **kw))
    return draws * len(LAYERS)

for line in sys.stdin:
    req = json.loads(line)
    try:
        t0, c0 = time.perf_counter(), compiling[0]
        if req.get("sanity_draws"):
            n = sanity(req["method"], req["options"], req["batch_size"], req["sanity_draws"]) * len(obs)
        else:
            maps, n = call(req["method"], req["options"], req["batch_size"]), len(obs)
        dt, dc = time.perf_counter() - t0, compiling[0] - c0
    except Exception as e:  # an option this commit lacks: reported, the driver leaves the method out
        print(json.dumps({"error": f"{type(e).__name__}: {e}"[:300]}), flush=True)
        continue
    if req.get("maps_to"):
        np.save(req["maps_to"], maps)
    print(json.dumps({"s": dt, "compile_s": dc, "ms_per_map": 1000 * dt / n,
                      "steady_ms_per_map": 1000 * max(dt - dc, 0.0) / n}), flush=True)
'''


def hours_per_game(ms_per_map: float, sanity_ms_per_map: float | None = None) -> float:
    """Hours of maps per game at the re-run's counts (experiments.paper_b.rerun.estimate's formula):
    its states at the maps' speed, its sanity maps at the sanity check's (None: the maps')."""
    from experiments.paper_b import rerun
    sanity = ms_per_map if sanity_ms_per_map is None else sanity_ms_per_map
    return (rerun.STATES * ms_per_map + rerun.DRAWS * 5 * rerun.SANITY_STATES * sanity) / 3.6e6


def rerun_draws() -> int:
    from experiments.paper_b import rerun
    return rerun.DRAWS


def main(argv=None):
    import numpy as np

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="commit of the earlier code")
    ap.add_argument("--after", default="HEAD", help="commit of the later code (default HEAD)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size-before", type=int, default=None,
                    help="rows per forward pass of the earlier side (default: the library's, as the study's maps)")
    ap.add_argument("--batch-size-after", type=int, default=None,
                    help="rows per forward pass of the later side (default: the library's, as the study's maps)")
    ap.add_argument("--labels", nargs="*", default=None, help="a subset of the study's method labels")
    ap.add_argument("--sanity-rounds", type=int, default=1,
                    help="sanity checks timed per method and side (10 draws each); 0: priced at the maps' speed")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "paper_b_cost")
    args = ap.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="paper_b_cost_"))
    script = tmp / "worker.py"
    script.write_text(WORKER)
    dirs, sides, made = [], {}, []
    try:
        for name, commit in (("before", args.before), ("after", args.after)):
            d, sha = checkout_at(commit, tmp / name)
            dirs.append(d)
            made.append((name, sha))
            sides[name] = Worker(name, d, script)
        from experiments.paper_b.run import METHODS          # the study as this checkout defines it
        bs = {"before": args.batch_size_before, "after": args.batch_size_after}
        table = {label: (method, opts) for label, method, opts, _ in METHODS}
        labels = args.labels or list(table)
        unknown = set(labels) - set(table)
        if unknown:
            raise SystemExit(f"unknown labels {sorted(unknown)}; the study's: {list(table)}")
        load_start = os.getloadavg()
        rows, skipped, sanity_errors = [], {}, {}
        for label in labels:
            method, opts = table[label]
            warm = {n: s.ask(method=method, options=opts, batch_size=bs[n], maps_to=str(tmp / f"{n}_{label}.npy"))
                    for n, s in sides.items()}
            errors = {n: w["error"] for n, w in warm.items() if "error" in w}
            if errors:
                skipped[label] = errors
                print(f"{label:28s} left out: {errors}", flush=True)
                continue
            for n, s in sides.items():
                s.ask(method=method, options=opts, batch_size=bs[n])   # the second call of the shape
            times = {"before": [], "after": []}
            for r in range(args.rounds):
                for n in (("before", "after") if r % 2 == 0 else ("after", "before")):
                    times[n].append(sides[n].ask(method=method, options=opts, batch_size=bs[n])["ms_per_map"])
            sanity, sanity_compile = {"before": [], "after": []}, {"before": [], "after": []}
            for r in range(args.sanity_rounds):
                first = ("before", "after") if (len(rows) + r) % 2 == 0 else ("after", "before")
                for n in first:
                    reply = sides[n].ask(method=method, options=opts, batch_size=bs[n], sanity_draws=rerun_draws())
                    if "error" in reply:   # both sides' sanity then priced at their maps' speed, and said so
                        sanity_errors[label] = {**sanity_errors.get(label, {}), n: reply["error"]}
                    else:
                        sanity[n].append(reply["steady_ms_per_map"])
                        sanity_compile[n].append(reply["compile_s"])
            if label in sanity_errors:
                sanity = {"before": [], "after": []}
            a, b = (np.load(tmp / f"{n}_{label}.npy") for n in ("before", "after"))
            ratios = [x / y for x, y in zip(times["before"], times["after"])]
            row = {"label": label, "before_ms_per_map": median(times["before"]),
                   "after_ms_per_map": median(times["after"]), "speed_up": median(ratios),
                   "speed_up_min": min(ratios), "speed_up_max": max(ratios),
                   "max_abs_map_difference": float(np.max(np.abs(a.astype(np.float64) - b))),
                   "max_abs_map": float(np.max(np.abs(a))),
                   "first_call_s": {n: w["s"] for n, w in warm.items()}, "load_avg_1": os.getloadavg()[0]}
            for n in sanity:
                row[f"{n}_sanity_ms_per_map"] = median(sanity[n]) if sanity[n] else None
                row[f"{n}_sanity_compile_s"] = median(sanity_compile[n]) if sanity_compile[n] else 0.0
            # compiling once per game (the study makes one sanity call per method and game)
            row["hours"] = {n: hours_per_game(row[f"{n}_ms_per_map"], row[f"{n}_sanity_ms_per_map"])
                            + row[f"{n}_sanity_compile_s"] / 3600 for n in sanity}
            rows.append(row)
            print(f"{label:28s} before {row['before_ms_per_map']:8.1f}  after {row['after_ms_per_map']:8.1f} ms/map  "
                  f"x{row['speed_up']:.2f} [{row['speed_up_min']:.2f}-{row['speed_up_max']:.2f}]  "
                  f"max |diff| {row['max_abs_map_difference']:.2e}  load {row['load_avg_1']:.1f}"
                  + (f"  sanity {row['before_sanity_ms_per_map']:.1f} -> {row['after_sanity_ms_per_map']:.1f} ms/map"
                     if sanity["after"] and sanity["before"] else ""), flush=True)
    finally:
        for s in sides.values():
            s.close()
        for d in dirs:
            remove(d)
        shutil.rmtree(tmp, ignore_errors=True)
    total = {n: sum(r[f"{n}_ms_per_map"] for r in rows) for n in ("before", "after")}
    hours = {n: sum(r["hours"][n] for r in rows) for n in ("before", "after")}
    res = {"commits": dict(made), "batch_size": bs, "rounds": args.rounds, "states": 4, "agent": "breakout",
           "machine": machine_info(), "load_avg_start": load_start, "load_avg_end": os.getloadavg(),
           "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "methods": rows,
           "sanity_rounds": args.sanity_rounds, "sanity_draws": rerun_draws(),
           "sanity_errors": sanity_errors, "left_out": skipped, "total_ms_per_map": total, "hours_per_game": hours,
           "per_game_speed_up": hours["before"] / hours["after"]}
    write_results(args.out, res, render(res), "paper_b_cost.json", "paper_b_cost.md")
    print(f"per game: {res['hours_per_game']['before']:.2f} h -> {res['hours_per_game']['after']:.2f} h "
          f"(x{res['per_game_speed_up']:.2f}); wrote {args.out}/paper_b_cost.json, .md")


def render(res: dict) -> str:
    c, m = res["commits"], res["machine"]
    la, le = res["load_avg_start"], res["load_avg_end"]
    out = [f"# Paper B's per-game cost: {c['before'][:8]} (before) against {c['after'][:8]} (after)", "",
           f"Machine: {m.get('cpu', '?')}, {m.get('cpu_count', '?')} cores, jax {m.get('jax', '?')}; load (1/5/15 min) "
           f"at start {la[0]:.1f}, {la[1]:.1f}, {la[2]:.1f}, at end {le[0]:.1f}, {le[1]:.1f}, {le[2]:.1f}. "
           f"Rows per forward pass (batch_size): {res['batch_size']['before'] or 'the library default'} before, "
           f"{res['batch_size']['after'] or 'the library default'} after. "
           f"{res['rounds']} rounds per method, sides alternating; steady ms per map on {res['states']} Breakout "
           f"states (the shipped agent), as the study times them. Sanity check: "
           + (f"{res['sanity_rounds']} timed call(s) per method and side of {res['sanity_draws']} draws x 5 layers on the "
              f"same states (the study's four similarity metrics included), each side as its study runs it (draws "
              f"in one call where its library has `draws=`), at its steady speed (the call's time less JAX's "
              f"tracing and compiling, which is counted once per game and method)"
              if res.get("sanity_rounds") else "priced at the maps' speed") +
           f". Hours per game: the re-run's 1,000 states at the maps' speed plus its 10 draws x 5 layers x 200 "
           f"sanity states at the sanity check's, summed over methods.", "",
           "| method | before (ms/map) | after (ms/map) | speed-up (median) | range over rounds | sanity before (ms/map) "
           "| sanity after (ms/map) | hours before | hours after | max abs map difference |",
           "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|"]
    ms = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    for r in res["methods"]:
        hb, ha = (r.get("hours") or {}).get("before"), (r.get("hours") or {}).get("after")
        out.append(f"| {r['label']} | {r['before_ms_per_map']:.1f} | {r['after_ms_per_map']:.1f} | {r['speed_up']:.2f} | "
                   f"{r['speed_up_min']:.2f}-{r['speed_up_max']:.2f} | {ms(r.get('before_sanity_ms_per_map'))} | "
                   f"{ms(r.get('after_sanity_ms_per_map'))} | {'-' if hb is None else f'{hb:.2f}'} | "
                   f"{'-' if ha is None else f'{ha:.2f}'} | {r['max_abs_map_difference']:.1e} |")
    t, h = res["total_ms_per_map"], res["hours_per_game"]
    out += [f"| **all methods** | {t['before']:.0f} | {t['after']:.0f} | {t['before'] / t['after']:.2f} | | | | "
            f"{h['before']:.2f} | {h['after']:.2f} | |", "",
            f"Per game: {h['before']:.2f} h before, {h['after']:.2f} h after (x{res['per_game_speed_up']:.2f}), "
            f"on this machine's 2 cores.", ""]
    for label, errors in res.get("sanity_errors", {}).items():
        out.append(f"Sanity check priced at the maps' speed on both sides: {label} "
                   f"({'; '.join(f'{n}: {e}' for n, e in errors.items())}).")
    for label, errors in res.get("left_out", {}).items():
        out.append(f"Left out of both sides' totals: {label} ({'; '.join(f'{n}: {e}' for n, e in errors.items())}).")
    return "\n".join(out)


if __name__ == "__main__":
    main()
