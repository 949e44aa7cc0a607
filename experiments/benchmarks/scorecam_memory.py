"""Peak host memory of Score-CAM vs Grad-CAM as N grows, each run in a fresh process.

    python -m experiments.benchmarks.scorecam_memory                 # N = 256 and 4,096 -> results/scorecam_memory.json
    python -m experiments.benchmarks.scorecam_memory --child scorecam 256   # one child, JSON out

The shipped-size Nature CNN (random init, 6 actions) on 84x84x4 uint8 states held in memory.
Each child reports its VmHWM (peak resident set of its process image) minus its RSS before the
states are built (`extra_mb`: what the input, the method and its maps need) and the maps' and
input's own bytes; ru_maxrss of the child (resource.getrusage, RUSAGE_SELF) is recorded too.
Score-CAM's memory is bounded by batch_size when its extra peak over Grad-CAM's does not grow
with N (both hold the same input and the same (N, 84, 84) float32 maps). "engine_loop" is the
eager chunk loop alone (jaxsal.batching.run of a channel sum, 64 states per chunk, the same
input and output sizes): what every in-memory call grows by, whatever its method.

    python -m experiments.benchmarks.scorecam_memory --methods engine_loop --merge   # add one method's runs
"""
from __future__ import annotations

import argparse
import json
import resource
import socket
import subprocess
import sys
from pathlib import Path
from experiments.common.paths import RESULTS

OUT = RESULTS / "scorecam_memory.json"


def child(method: str, n: int) -> dict:
    import jax
    import numpy as np

    import jaxsal
    from experiments.benchmarks.peak_memory import _peak_mb, _rss_mb
    from jaxsal_agents.networks import NatureDQN

    model = NatureDQN(6)
    params = model.init(jax.random.PRNGKey(0), np.zeros((1, 84, 84, 4), np.uint8))
    loop = jax.jit(lambda x: x.astype(jax.numpy.float32).sum(-1))
    base = _rss_mb()
    obs = np.random.default_rng(0).integers(0, 256, (n, 84, 84, 4), dtype=np.uint8)
    if method == "engine_loop":
        maps = jax.block_until_ready(jaxsal.batching.run(loop, obs, 64))
    else:
        maps = jax.block_until_ready(jaxsal.explain(model.apply, params, obs, method=method, layer="conv3"))
    return {"method": method, "n": n, "base_rss_mb": round(base, 1), "peak_rss_mb": round(_peak_mb(), 1),
            "extra_mb": round(_peak_mb() - base, 1), "ru_maxrss_mb": round(
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "input_mb": round(obs.nbytes / 2**20, 1), "maps_mb": round(maps.nbytes / 2**20, 1)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, metavar=("METHOD", "N"))
    ap.add_argument("--n", type=int, nargs="*", default=[256, 4096])
    ap.add_argument("--methods", nargs="*", default=["gradcam", "scorecam", "engine_loop"])
    ap.add_argument("--merge", action="store_true", help="keep the other methods' runs of the JSON")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child[0], int(args.child[1]))))
        return
    from experiments.common.machine import machine_info
    runs = json.loads(OUT.read_text())["runs"] if args.merge and OUT.exists() else []
    runs = [r for r in runs if r["method"] not in args.methods]
    for n in args.n:
        for method in args.methods:
            out = subprocess.run([sys.executable, "-m", "experiments.benchmarks.scorecam_memory", "--child", method, str(n)],
                                 capture_output=True, text=True, check=True)
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(runs[-1], file=sys.stderr, flush=True)
    by = {(r["method"], r["n"]): r["extra_mb"] for r in runs}
    over = {n: round(by["scorecam", n] - by["gradcam", n], 1) for n in args.n}
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    result = {"runs": runs, "scorecam_extra_over_gradcam_mb": over,
              "growth_256_to_4096_mb": {m: round(by[m, 4096] - by[m, 256], 1) for m, _ in by if (m, 4096) in by},
              "git_commit": commit, "host": socket.gethostname(), "machine": machine_info()}
    OUT.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(over))


if __name__ == "__main__":
    main()
