"""Throughput of the perturbation methods at Paper B's parameters (maps per second).

    python -m experiments.benchmarks.throughput_perturbation --states 8             # CPU-sized
    python -m experiments.benchmarks.throughput_perturbation --states 256 --batch-size 8192   # accelerator

Each case times `jaxsal.explain` on a Nature-CNN DQN (random init: throughput does not depend
on the weights) for N states of 84x84x4 uint8 frames: compile+first call, then the best of
--repeats warm calls. The roofline is the plain forward pass of the same model: a method needing
R model rows per map cannot exceed rows_per_s / R maps/s; `efficiency` is the fraction of that
bound reached (above 100% for the incremental local methods, which skip most conv work).
Writes experiments/results/throughput_perturbation/{throughput.csv,throughput.md}.
"""
from __future__ import annotations

import argparse
import csv
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxsal_agents
import jaxsal
from experiments.common.paths import RESULTS

OUT = RESULTS / "throughput_perturbation"
KEY = jax.random.PRNGKey(0)
# (label, method, options, model rows per map at 84x84): Paper B's parameters are the defaults.
CASES = [
    ("occlusion", "occlusion", {}, 42 * 42),  # default incremental=None: auto (on for 2x2)
    ("occlusion_plain", "occlusion", {"incremental": False}, 42 * 42),
    ("noise_sensitivity", "noise_sensitivity", {"score": "chosen_action"}, 28 * 28),
    ("noise_sensitivity_original", "noise_sensitivity", {"score": "output_l2"}, 28 * 28),
    ("sarfa", "sarfa", {}, 42 * 42),
    ("sarfa_plain", "sarfa", {"incremental": False}, 42 * 42),
    ("rise", "rise", {"key": KEY}, 1000),
    ("lime_slic", "lime", {"key": KEY, "segmentation": "slic"}, 2000),
    ("lime_quickshift", "lime", {"key": KEY, "segmentation": "quickshift"}, 1500),
    ("lime_felzenszwalb", "lime", {"key": KEY, "segmentation": "felzenszwalb"}, 1000),
]


def _block(x):
    return jax.block_until_ready(x)


def forward_rows_per_s(apply, params, rows: int, repeats: int) -> float:
    """Plain forward throughput (rows/s) of the model on `rows` float frames."""
    x = jnp.asarray(np.random.default_rng(0).random((rows, 84, 84, 4), np.float32) * 255)
    f = jax.jit(apply)
    _block(f(params, x))
    best = min(_timed(lambda: _block(f(params, x))) for _ in range(repeats))
    return rows / best


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--states", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=None, help="model rows per forward pass")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--only", nargs="*", help="case labels to run")
    ap.add_argument("--layer-norm", action="store_true", help="the LayerNorm DQN (shipped agents)")
    args = ap.parse_args(argv)

    model = jaxsal_agents.build_model("breakout", "dqn", 4, layer_norm=args.layer_norm)
    obs = np.random.default_rng(0).integers(0, 256, (args.states, 84, 84, 4), dtype=np.uint8)
    params = model.init(jax.random.PRNGKey(0), obs[:1])
    roof_rows = args.batch_size or jaxsal.sizing.default_rows()
    rows_s = forward_rows_per_s(model.apply, params, roof_rows, args.repeats)
    print(f"forward: {rows_s:,.0f} rows/s ({roof_rows} rows per call) on {jax.devices()[0].device_kind}")

    rows = []
    for label, method, opts, per_map in CASES:
        if args.only and label not in args.only:
            continue
        call = lambda: _block(jaxsal.explain(model.apply, params, obs, method=method,  # noqa: E731
                                             batch_size=args.batch_size, **opts))
        first = _timed(call)
        warm = min(_timed(call) for _ in range(args.repeats))
        maps_s = args.states / warm
        eff = maps_s * per_map / rows_s
        rows.append(dict(case=label, method=method, states=args.states, batch_size=args.batch_size,
                         rows_per_map=per_map, first_call_s=round(first, 3), warm_s=round(warm, 4),
                         maps_per_s=round(maps_s, 3), efficiency=round(eff, 3)))
        print(f"{label:28s} {maps_s:10.2f} maps/s  (first call {first:.1f}s, {eff:.0%} of forward bound)")

    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / "throughput.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    dev = f"{jax.devices()[0].platform} ({jax.devices()[0].device_kind}, {jax.device_count()} devices)"
    lines = ["# Perturbation-method throughput\n",
             f"Device: {dev}; host {platform.node()}; jax {jax.__version__}; {args.states} states; "
             f"batch_size {args.batch_size}; forward {rows_s:,.0f} rows/s.\n",
             "| case | rows/map | maps/s | first call (s) | of forward bound |",
             "|---|---:|---:|---:|---:|"]
    lines += [f"| {r['case']} | {r['rows_per_map']} | {r['maps_per_s']} | {r['first_call_s']} | "
              f"{r['efficiency']:.0%} |" for r in rows]
    (OUT / "throughput.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}/throughput.csv and throughput.md")


if __name__ == "__main__":
    main()
