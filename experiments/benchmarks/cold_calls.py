"""Why one call after an idle pause is slower than back-to-back calls on a small VM (batch 64).

    python -m experiments.benchmarks.cold_calls            # ~2 min on 2 cores; run it on a quiet machine
    python -m experiments.benchmarks.cold_calls --quick    # batch 4, 3 calls per cell (checks the script)

The peer benchmark times each call after about 0.2 s idle (`against_peers.py`, its main table). Here
jaxsal's Guided Backprop and Grad-CAM (conv3) on the peer benchmark's Nature CNN at batch 64 are
timed after 0 s and after 0.2 s idle, in three fresh processes: on all cores; pinned to one core; and
on all cores while a busy loop at SCHED_IDLE priority runs on every core (it yields at once to any
other thread, but its cores never halt). Per cell: the median ms per call and the median involuntary
context switches of the process per call. Writes experiments/results/cold_calls.{json,md} with the
machine, its load and the commit.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from experiments.common.paths import ROOT, RESULTS, write_results

OUT = RESULTS / "cold_calls"
MODES = ("all cores", "one core", "all cores, idle-priority spinners")
METHODS = (("guided_backprop", {}), ("gradcam", {"layer": "conv3"}))
SPIN = ("import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\n"
        "os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))\nwhile True:\n    pass\n")


def child(batch: int, calls: int, idles: tuple) -> dict:
    """ms per call and involuntary switches per call, per method and idle pause, in this process."""
    import jaxsal
    import jax.numpy as jnp
    import numpy as np

    from experiments.benchmarks.against_peers import build
    apply_fn, params, _ = build()
    obs = jnp.asarray(np.random.default_rng(0).integers(0, 256, (batch, 84, 84, 4)).astype(np.float32))
    out = {}
    for name, kw in METHODS:
        f = lambda: jaxsal.explain(apply_fn, params, obs, method=name, **kw).block_until_ready()  # noqa: E731
        for _ in range(3):
            f()
        for idle in idles:
            ms, sw = [], []
            for _ in range(calls):
                if idle:
                    time.sleep(idle)
                r0, t = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
                f()
                ms.append(1e3 * (time.perf_counter() - t))
                sw.append(resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw - r0.ru_nivcsw)
            out[f"{name}@{idle}"] = {"method": name, "idle_s": idle, "ms": float(np.median(ms)),
                                     "involuntary_switches": float(np.median(sw))}
    return out


def run_mode(mode: str, batch: int, calls: int, idles: tuple) -> dict:
    cores = sorted(os.sched_getaffinity(0))
    cmd = [sys.executable, "-m", "experiments.benchmarks.cold_calls", "--child", "--batch", str(batch),
           "--calls", str(calls), "--idles", ",".join(map(str, idles))]
    spinners = []
    try:
        if mode == MODES[2]:
            for c in cores:
                spinners.append(subprocess.Popen([sys.executable, "-c", SPIN, str(c)]))
            time.sleep(0.5)
        if mode == MODES[1]:
            cmd += ["--pin", str(cores[0])]
        r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    finally:
        for s in spinners:
            s.kill()
            s.wait()
    if r.returncode:
        raise SystemExit(f"child ({mode}) failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def report(res: dict) -> str:
    m = res["machine_at_start"]
    idles = res["idles"]
    lines = [f"# One call after an idle pause ({m['date_utc']})", "",
             f"Machine: {m.get('cpu', '?')}, {m['cpu_count']} cores, jax {m['jax']}; load average at start "
             f"{[round(x, 1) for x in m.get('load_avg_1_5_15', [])]}, at end "
             f"{[round(x, 1) for x in res.get('load_avg_at_end') or []]}; commit {str(res.get('git_commit'))[:10]}"
             f"{' (dirty)' if res.get('git_dirty') else ''}. Batch {res['batch']}, the peer benchmark's Nature CNN, "
             f"median of {res['calls']} calls per cell; `switches`: involuntary context switches of the process "
             "per call.", "",
             "| method | " + " | ".join(f"{mode}: ms after {i} s idle (switches)" for mode in res["modes"] for i in idles)
             + " |", "|---|" + "---:|" * (len(res["modes"]) * len(idles))]
    for name, _ in METHODS:
        cells = []
        for mode in res["modes"]:
            for i in idles:
                c = res["modes"][mode][f"{name}@{i}"]
                cells.append(f"{c['ms']:.1f} ({c['involuntary_switches']:.0f})")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--calls", type=int, default=15)
    p.add_argument("--idles", default="0,0.2", help="idle pauses before each call, in seconds")
    p.add_argument("--quick", action="store_true", help="batch 4, 3 calls per cell, output under /tmp")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--pin", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=OUT)
    a = p.parse_args(argv)
    idles = tuple(float(x) for x in a.idles.split(","))
    if a.quick:
        a.batch, a.calls, a.out = 4, 3, Path("/tmp/jaxsal-cold-calls")
    if a.child:
        if a.pin is not None:  # before JAX starts its thread pools
            os.sched_setaffinity(0, {a.pin})
        print(json.dumps(child(a.batch, a.calls, idles)))
        return
    from experiments.common.machine import git_state, machine_info
    start = machine_info()
    modes = {}
    for mode in MODES:
        modes[mode] = run_mode(mode, a.batch, a.calls, idles)
        print(mode, json.dumps({k: round(v["ms"], 1) for k, v in modes[mode].items()}), flush=True)
    res = {"batch": a.batch, "calls": a.calls, "idles": list(idles), "machine_at_start": start,
           "load_avg_at_end": machine_info().get("load_avg_1_5_15"), **git_state(), "modes": modes}
    write_results(a.out, res, report(res), "cold_calls.json", "cold_calls.md")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
