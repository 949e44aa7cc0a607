"""bfloat16 against float32 maps: agreement and speed of every method on the shipped Breakout agent.

    python -m experiments.benchmarks.precision_agreement            # 24 states of one greedy game, seed 0
    python -m experiments.benchmarks.precision_agreement --states 8 --timing-batch 64

Per method (library defaults): the float32 and the bfloat16 maps (`jaxsal.explain(precision=...)`) of
the same states (the expensive methods on fewer), their per-map Pearson correlation and top-10% overlap (the share of the float32 map's
10% highest-|value| pixels that are also among the bfloat16 map's), median and minimum over the states;
the explained actions are the same (both chosen in float32). Speed: the median seconds of `--repeats`
timed calls after a warm-up call, precisions interleaved, and their ratio bf16/f32, on the real states
and (gradient and CAM methods) on a batch of `--timing-batch` states tiled from them. Writes
experiments/results/precision/precision_agreement.{json,md} with the machine, its load average and the
git commit.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import jax
import numpy as np

import jaxsal
from experiments.common.paths import RESULTS
from experiments.common.machine import git_state, machine_info

OUT = RESULTS / "precision"
EXPENSIVE = ("occlusion", "noise_sensitivity", "sarfa", "rise", "lime", "scorecam", "smoothgrad",
             "integrated_gradients")
"""Methods of many forward or backward passes per state: `--expensive-states` states, one timed call."""


def methods() -> list[str]:
    """jaxsal's own registered methods (not a plugin's or a test's)."""
    return sorted(m for m in jaxsal.methods() if jaxsal.registry.METHODS[m].__module__.startswith("jaxsal."))


def breakout_states(n: int, seed: int = 0, every: int = 8, skip: int = 40) -> np.ndarray:
    """n states (n, 84, 84, 4) uint8 of one greedy game of the shipped Breakout agent: every `every`-th
    step after the first `skip` (the ball in play)."""
    import jaxsal_agents

    agent = jaxsal_agents.load("breakout")
    batch = jaxsal_agents.collect(agent, steps=skip + every * n, seed=seed)
    return np.asarray(batch.obs)[skip::every][:n].astype(np.uint8)


def top_overlap(a: np.ndarray, b: np.ndarray, frac: float = 0.1) -> float:
    """Share of a's top-`frac` pixels by |value| that are also in b's."""
    k = max(1, int(round(frac * a.size)))
    ta = np.argpartition(-np.abs(a).ravel(), k - 1)[:k]
    tb = np.argpartition(-np.abs(b).ravel(), k - 1)[:k]
    return len(np.intersect1d(ta, tb)) / k


def pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    if a.std() == 0 or b.std() == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def _explain(agent, obs, method, precision):
    kw = {"key": jax.random.PRNGKey(0)} if method in jaxsal.registry.STOCHASTIC else {}
    return np.asarray(jaxsal.explain(agent.apply_fn, agent.params, obs, method=method, precision=precision, **kw))


def _seconds(agent, obs, method, repeats: int, warm: bool = False) -> dict:
    """Median seconds per call of each precision, interleaved after one warm-up call each (none
    with warm=True: both already ran on this shape)."""
    times = {"float32": [], "bfloat16": []}
    for p in times if not warm else ():
        _explain(agent, obs, method, p)
    for _ in range(repeats):
        for p in times:
            t = time.perf_counter()
            _explain(agent, obs, method, p)
            times[p].append(time.perf_counter() - t)
    med = {p: float(np.median(v)) for p, v in times.items()}
    return {"states": int(len(obs)), "f32_s": round(med["float32"], 4), "bf16_s": round(med["bfloat16"], 4),
            "ratio_bf16_over_f32": round(med["bfloat16"] / med["float32"], 3)}


def agreement(a: np.ndarray, b: np.ndarray) -> dict:
    r = np.array([pearson(u, v) for u, v in zip(a, b)])
    o = np.array([top_overlap(u, v) for u, v in zip(a, b)])
    return {"pearson_median": round(float(np.nanmedian(r)), 5), "pearson_min": round(float(np.nanmin(r)), 5),
            "top10_overlap_median": round(float(np.median(o)), 4), "top10_overlap_min": round(float(np.min(o)), 4),
            "max_abs_diff_over_max_abs": round(float(np.abs(a - b).max() / max(np.abs(a).max(), 1e-30)), 5)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--states", type=int, default=24)
    p.add_argument("--expensive-states", type=int, default=12, help="states of the EXPENSIVE methods")
    p.add_argument("--timing-batch", type=int, default=256, help="states of the gradient/CAM timing batch")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    import jaxsal_agents

    start = machine_info()
    agent = jaxsal_agents.load("breakout")
    obs = breakout_states(args.states)
    big = np.resize(obs, (args.timing_batch,) + obs.shape[1:])
    rows = {}
    for m in methods():
        t0 = time.perf_counter()
        x = obs[:args.expensive_states] if m in EXPENSIVE else obs
        f32, bf16 = _explain(agent, x, m, "float32"), _explain(agent, x, m, "bfloat16")
        row = {"states": len(x), **agreement(f32, bf16), "dtype": str(bf16.dtype)}
        if m in EXPENSIVE:
            row["time"] = [_seconds(agent, x, m, 1, warm=True)]
        else:
            row["time"] = [_seconds(agent, x, m, args.repeats), _seconds(agent, big, m, args.repeats)]
        rows[m] = row
        print(m, json.dumps(row), f"({time.perf_counter() - t0:.0f} s)", flush=True)
    result = {"what": "bfloat16 vs float32 maps of every method (library defaults) on the shipped Breakout agent",
              "states": f"{len(obs)} states of one greedy game (seed 0), every 8th step from step 40 (the first "
                        f"{args.expensive_states} for {', '.join(EXPENSIVE)})",
              "load_note": "the host was shared with other jobs while this ran (see the load averages): the "
                           "timings are indicative ratios, not a benchmark",
              "machine_at_start": start, "load_avg_at_end": machine_info().get("load_avg_1_5_15"),
              **git_state(), "methods": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "precision_agreement.json").write_text(json.dumps(result, indent=1) + "\n")
    (args.out / "precision_agreement.md").write_text(report(result))
    print(f"wrote {args.out}")


def report(res: dict) -> str:
    m = res["machine_at_start"]
    lines = [f"# bfloat16 vs float32 maps ({m['backend']}, {m['date_utc']})", "",
             f"{res['what']}; {res['states']}. Machine: {m.get('cpu', '?')}, {m['cpu_count']} cores, jax "
             f"{m['jax']}, commit {str(res.get('git_commit'))[:10]}{' (dirty)' if res.get('git_dirty') else ''}.",
             f"Load average at start {[round(x, 1) for x in m.get('load_avg_1_5_15', [])]}, at end "
             f"{[round(x, 1) for x in res.get('load_avg_at_end') or []]}: {res['load_note']}.", "",
             "Agreement per map over the states (Pearson r; top-10%: share of the float32 map's 10% highest-|value| "
             "pixels also in the bfloat16 map's); time: median seconds per call, ratio bf16/f32 (>1: bfloat16 slower).",
             "", "| method | states | r median | r min | top-10% median | top-10% min | time (states: f32 s, bf16 s, ratio) |",
             "|---|---|---|---|---|---|---|"]
    for name, r in res["methods"].items():
        t = "; ".join(f"{x['states']}: {x['f32_s']}, {x['bf16_s']}, **{x['ratio_bf16_over_f32']}**" for x in r["time"])
        lines.append(f"| {name} | {r['states']} | {r['pearson_median']} | {r['pearson_min']} | {r['top10_overlap_median']} | "
                     f"{r['top10_overlap_min']} | {t} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
