"""Throughput benchmark: saliency maps per second per method for the Nature-CNN DQN.

    python -m experiments.benchmarks.throughput            # batches 256 and 4096
    python -m experiments.benchmarks.throughput --quick    # batches 32 and 128
    python -m experiments.benchmarks.throughput --against captum   # vs Captum etc. (experiments.benchmarks.against_peers)

A script, not a timed test. Methods are a table of cases (name -> `jaxsal.explain` kwargs):
append yours to CASES. Each case is compiled once (timed separately), then timed on fresh
observations; a case whose estimated time exceeds --budget seconds is timed on fewer states
(recorded as `measured_states`). Writes experiments/results/throughput_<backend>.{json,md}.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import jax
import numpy as np

import jaxsal
from experiments.common.paths import RESULTS
from experiments.common.machine import device_peak_mb, machine_info

# name -> explain kwargs. `method` may be a list (one shared call, maps/s counts states).
CASES: dict[str, dict] = {
    "gradient": dict(method="gradient"),
    "grad_x_input": dict(method="grad_x_input"),
    "guided_backprop": dict(method="guided_backprop"),
    "deconvnet": dict(method="deconvnet"),
    "gradcam": dict(method="gradcam"),
    "gradcam_pp": dict(method="gradcam_pp"),
    "g1gradcam": dict(method="g1gradcam"),
    "g2gradcam": dict(method="g2gradcam"),
    "guided_gradcam": dict(method="guided_gradcam"),
    "gradcam_conv1": dict(method="gradcam", layer="conv1"),
    "cam_family+guided (shared, 6 maps)": dict(
        method=["gradcam", "gradcam_pp", "g1gradcam", "g2gradcam", "guided_gradcam",
                "guided_backprop"]),
    "smoothgrad (n=50)": dict(method="smoothgrad", n_samples=50, key=0),
    "integrated_gradients (steps=50)": dict(method="integrated_gradients", steps=50),
    # perturbation methods at Paper B's parameters (issue 4; see also throughput_perturbation.py)
    "occlusion (2x2/2)": dict(method="occlusion"),  # default: incremental conv windows (auto)
    "occlusion (2x2/2, plain path)": dict(method="occlusion", incremental=False),
    "noise_sensitivity (r3/3)": dict(method="noise_sensitivity"),
    "sarfa (r2/2)": dict(method="sarfa"),
    "rise (1000 masks)": dict(method="rise", key=0),
    "lime (slic, 2000 samples)": dict(method="lime", segmentation="slic", key=0),
}


def _kwargs(case: dict) -> dict:
    kw = dict(case)
    if "key" in kw and isinstance(kw["key"], int):
        kw["key"] = jax.random.PRNGKey(kw["key"])
    return kw


def _block(out):
    jax.tree.map(lambda a: a.block_until_ready() if hasattr(a, "block_until_ready") else a, out)


def _model(num_actions: int = 6):
    from jaxsal_agents.networks import NatureDQN
    m = NatureDQN(num_actions)
    params = m.init(jax.random.PRNGKey(0), np.zeros((1, 84, 84, 4), np.uint8))
    return m.apply, params


def _obs(n: int, seed: int):
    return np.random.default_rng(seed).integers(0, 256, (n, 84, 84, 4), dtype=np.uint8)


def bench_case(apply_fn, params, kw: dict, batch: int, budget: float, probe: int = 16,
               repeats: int = 3):
    """Compile time and maps/s of one case at one batch size."""
    t0 = time.perf_counter()
    _block(jaxsal.explain(apply_fn, params, _obs(min(probe, batch), 0), **kw))
    t1 = time.perf_counter()
    _block(jaxsal.explain(apply_fn, params, _obs(min(probe, batch), 1), **kw))
    per_state = (time.perf_counter() - t1) / min(probe, batch)
    budget = budget / repeats
    n = batch if per_state * batch <= budget else max(probe, int(budget / per_state))
    n = min(n, batch)
    if n != min(probe, batch):
        _block(jaxsal.explain(apply_fn, params, _obs(n, 2), **kw))  # compile for this shape
    times = []
    for rep in range(repeats):
        x = _obs(n, 3 + rep)
        t2 = time.perf_counter()
        _block(jaxsal.explain(apply_fn, params, x, **kw))
        times.append(time.perf_counter() - t2)
    dt = min(times)
    return {"batch": batch, "measured_states": n, "seconds": dt, "maps_per_s": n / dt,
            "median_maps_per_s": n / float(np.median(times)), "repeats": repeats,
            "first_call_s": t1 - t0}


def write(results: dict, out_dir: Path, tag: str):
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"throughput_{tag}.json").write_text(json.dumps(results, indent=2))
    info = results["machine"]
    lines = [f"# jaxsal throughput ({info['backend']}, {info['date_utc']})", "",
             f"Nature-CNN DQN (6 actions, random weights), uint8 (N, 84, 84, 4) observations, "
             f"batch_size {results.get('batch_size') or 'default'}. Machine: {info.get('cpu', '?')}, {info['cpu_count']} cores, "
             f"load average at start {info.get('load_avg_1_5_15')} (at end "
             f"{results.get('load_avg_end')}); jax {info['jax']}, flax {info.get('flax')}, "
             f"Python {info['python']}.", "",
             "maps/s = states explained per second after compilation, best and median of the timed "
             "calls (a list case counts each "
             "state once for all its maps). `measured` < batch: timed on fewer states to fit the "
             "time budget.", "",
             "| method | batch | measured | maps/s (best) | maps/s (median) | best s | "
             "first call s (16 states, incl. compile) | device peak MB so far |",
             "|---|---|---|---|---|---|---|---|"]
    for name, rows in results["cases"].items():
        for r in rows:
            if "error" in r:
                lines.append(f"| {name} | {r['batch']} | - | error: {r['error']} | | |")
                continue
            lines.append(f"| {name} | {r['batch']} | {r['measured_states']} | "
                         f"{r['maps_per_s']:.1f} | {r['median_maps_per_s']:.1f} | {r['seconds']:.2f} | "
                         f"{r['first_call_s']:.1f} | {r.get('device_peak_mb_so_far', '-')} |")
    if results.get("notes"):
        lines += ["", *(f"- {n}" for n in results["notes"])]
    (out_dir / f"throughput_{tag}.md").write_text("\n".join(lines) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batches 32 and 128")
    ap.add_argument("--batches", type=int, nargs="*", default=None)
    ap.add_argument("--methods", nargs="*", default=None, help="case names (default: all)")
    ap.add_argument("--budget", type=float, default=60.0,
                    help="max seconds of timed calls per case and batch; bigger cases are "
                         "timed on fewer states")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per case (best kept)")
    ap.add_argument("--note", action="append", default=[], help="note for the results file")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="model rows per compiled call (explain's batch_size; default: backend's)")
    ap.add_argument("--tag", default=None, help="results file suffix (default: the backend name)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--against", choices=["captum"], default=None,
                    help="side by side with Captum/pytorch-grad-cam/torch (bench extra): runs "
                         "experiments.benchmarks.against_peers with the remaining arguments")
    args, rest = ap.parse_known_args(argv)
    if args.against:
        from experiments.benchmarks import against_peers
        import sys
        fwd = list(argv if argv is not None else sys.argv[1:])
        return against_peers.main(fwd)
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    batches = args.batches or ([32, 128] if args.quick else [256, 4096])
    names = args.methods or list(CASES)
    apply_fn, params = _model()
    results = {"machine": machine_info(), "batches": batches, "cases": {}, "notes": list(args.note)}
    tag = args.tag or jax.default_backend()
    results["batch_size"] = args.batch_size
    extra = {} if args.batch_size is None else {"batch_size": args.batch_size}
    for name in names:
        rows = []
        for b in batches:
            try:
                r = bench_case(apply_fn, params, {**_kwargs(CASES[name]), **extra}, b, args.budget,
                               repeats=args.repeats)
            except Exception as e:  # noqa: BLE001 (recorded, the benchmark goes on)
                r = {"batch": b, "error": f"{type(e).__name__}: {e}"[:200]}
            peak = device_peak_mb()   # process-wide: one case per process gives its own peak
            if peak is not None:
                r["device_peak_mb_so_far"] = peak
            rows.append(r)
            print(f"{name:40s} batch {b:5d}: " + (f"{r['maps_per_s']:9.1f} maps/s "
                  f"({r['measured_states']} states in {r['seconds']:.2f}s)" if "error" not in r
                  else r["error"]), flush=True)
        results["cases"][name] = rows
        try:
            results["load_avg_end"] = list(os.getloadavg())
        except OSError:
            pass
        write(results, args.out, tag)
    print(f"wrote {args.out}/throughput_{tag}.json and .md")
    return results


if __name__ == "__main__":
    main()
