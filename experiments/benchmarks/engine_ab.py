"""jaxsal at two commits, interleaved call by call: is the current code slower than an earlier one?

    python -m experiments.benchmarks.engine_ab --before COMMIT [--after HEAD]
    python -m experiments.benchmarks.engine_ab --before HEAD --flags-after=--xla_cpu_experimental_ynn_fusion_type=individual_dot

`--flags-before=...` / `--flags-after=...` (with "=": the value starts with dashes) set a side's XLA_FLAGS (default: this process's), so one commit can be
compared with itself under another XLA setting; the result records both.

Each side runs in its own persistent process (its own checkout, same venv, same weights, same
states). The driver asks side A to time one case, then side B the same case, alternating which
side goes first, for several rounds; the ratio before/after of each round's median call time is
measured under the same load. Methods at their library defaults, a README-style Nature-CNN Q
network with random weights (timing does not depend on the weights), uint8 states. Writes
experiments/results/engine_ab/{engine_ab.json,engine_ab.md}.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from experiments.common.checkouts import ROOT, Worker, checkout_at, median, remove

# (method, options, batches): the peer benchmark's methods; the slow perturbation ones at small N
CASES = [
    ("gradient", {}, (64, 256, 1024)),
    ("guided_backprop", {}, (64, 256, 1024)),
    ("gradcam", {"layer": "conv3"}, (64, 256, 1024)),
    ("gradcam_pp", {"layer": "conv3"}, (64, 256, 1024)),
    ("integrated_gradients", {}, (64, 256)),
    ("smoothgrad", {"seed": 0}, (64,)),
    ("occlusion", {}, (64,)),
    ("noise_sensitivity", {}, (16,)),
    ("rise", {"seed": 0}, (16,)),
    ("lime", {"seed": 0}, (16,)),
]

WORKER = r'''
import json, sys, time
import numpy as np
import jax, jax.numpy as jnp, flax.linen as nn
import jaxsal

class QNet(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = x.astype(jnp.float32) / 255.0
        x = nn.relu(nn.Conv(32, (8, 8), (4, 4), padding="VALID", name="conv1")(x))
        x = nn.relu(nn.Conv(64, (4, 4), (2, 2), padding="VALID", name="conv2")(x))
        x = nn.relu(nn.Conv(64, (3, 3), (1, 1), padding="VALID", name="conv3")(x))
        x = nn.relu(nn.Dense(512, name="fc1")(x.reshape(x.shape[0], -1)))
        return nn.Dense(6, name="q")(x)

rng = np.random.default_rng(0)
STATES = rng.integers(0, 256, (1024, 84, 84, 4), dtype=np.uint8)
params = QNet().init(jax.random.PRNGKey(1), STATES[:1])
apply = QNet().apply
import os
print(json.dumps({"ready": jaxsal.__file__, "version": jaxsal.__version__, "xla_flags": os.environ.get("XLA_FLAGS")}),
      flush=True)
for line in sys.stdin:
    req = json.loads(line)
    obs = STATES[:req["batch"]]
    opts = dict(req["options"])
    if "seed" in opts:
        opts["key"] = jax.random.PRNGKey(opts.pop("seed"))
    req["options"] = opts
    t0 = time.perf_counter()
    out = jaxsal.explain(apply, params, obs, method=req["method"], **req["options"])
    np.asarray(out)
    first = time.perf_counter() - t0
    times = []
    for _ in range(req["repeats"]):
        t0 = time.perf_counter()
        np.asarray(jaxsal.explain(apply, params, obs, method=req["method"], **req["options"]))
        times.append(time.perf_counter() - t0)
    print(json.dumps({"first": first, "times": times,
                      "checksum": float(np.asarray(out, np.float64).sum())}), flush=True)
'''


class Side(Worker):
    """One persistent worker process running jaxsal from one checkout."""

    @property
    def version(self):
        return self.hello["version"]

    def time(self, method, options, batch, repeats):
        return self.ask(method=method, options=options, batch=batch, repeats=repeats)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="commit of the earlier code")
    ap.add_argument("--after", default="HEAD", help="commit of the later code (default HEAD)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per side per round")
    ap.add_argument("--methods", nargs="*", default=None)
    ap.add_argument("--batch", type=int, default=None, help="one batch size for every case (a quick check)")
    ap.add_argument("--flags-before", default=None, help="XLA_FLAGS of the before side (default: inherited)")
    ap.add_argument("--flags-after", default=None, help="XLA_FLAGS of the after side (default: inherited)")
    ap.add_argument("--out", type=Path, default=ROOT / "experiments" / "results" / "engine_ab")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from experiments.common.machine import machine_info

    cases = [(m, o, (args.batch,) if args.batch else b) for m, o, b in CASES
             if args.methods is None or m in args.methods]
    tmp = Path(tempfile.mkdtemp(prefix="engine_ab_"))
    script = tmp / "worker.py"
    script.write_text(WORKER)
    (before_dir, before_sha) = checkout_at(args.before, tmp / "before")
    (after_dir, after_sha) = checkout_at(args.after, tmp / "after")
    flags = {"before": args.flags_before, "after": args.flags_after}
    sides = {s: Side(s, d, script, flags[s]) for s, d in (("before", before_dir), ("after", after_dir))}
    load_start = os.getloadavg()
    rows = []
    try:
        for method, options, batches in cases:
            for batch in batches:
                per = {"before": [], "after": []}
                first = {}
                checks = {}
                for r in range(args.rounds):
                    order = ("before", "after") if r % 2 == 0 else ("after", "before")
                    for s in order:
                        res = sides[s].time(method, options, batch, args.repeats)
                        per[s].append(median(res["times"]))
                        first.setdefault(s, res["first"])
                        checks[s] = res["checksum"]
                ratios = [b / a for b, a in zip(per["before"], per["after"])]
                row = {"method": method, "options": options, "batch": batch,
                       "before_s": per["before"], "after_s": per["after"],
                       "speedup_per_round": ratios, "speedup_median": median(ratios),
                       "first_call_s": first, "checksum": checks,
                       "maps_equal": abs(checks["before"] - checks["after"])
                       <= 1e-4 * max(1.0, abs(checks["after"])),
                       "load_1min": os.getloadavg()[0]}
                rows.append(row)
                print(f"{method:22s} N={batch:5d}  before {median(per['before']):8.4f} s  "
                      f"after {median(per['after']):8.4f} s  before/after {median(ratios):5.2f} "
                      f"[{min(ratios):.2f}-{max(ratios):.2f}]  load {row['load_1min']:.1f}"
                      f"{'' if row['maps_equal'] else '  MAPS DIFFER'}", flush=True)
    finally:
        for s in sides.values():
            s.close()
        for d in (before_dir, after_dir):
            remove(d)
        shutil.rmtree(tmp, ignore_errors=True)
    result = {"machine": machine_info(), "before": {"ref": args.before, "commit": before_sha,
                                                    "version": sides["before"].version,
                                                    "xla_flags": sides["before"].hello.get("xla_flags")},
              "after": {"ref": args.after, "commit": after_sha, "version": sides["after"].version,
                        "xla_flags": sides["after"].hello.get("xla_flags")},
              "rounds": args.rounds, "repeats": args.repeats, "load_avg_start": list(load_start),
              "load_avg_end": list(os.getloadavg()), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "engine_ab.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [f"# jaxsal {before_sha[:7]} (before) against {after_sha[:7]} (after), interleaved",
             "", f"Machine: {result['machine'].get('cpu', '?')}, {result['machine']['cpu_count']} cores, "
             f"jax {result['machine']['jax']}; load (1/5/15 min) at start {', '.join(f'{x:.1f}' for x in load_start)}, "
             f"at end {', '.join(f'{x:.1f}' for x in result['load_avg_end'])}. {args.rounds} rounds x "
             f"{args.repeats} timed calls per side; speed-up = before / after median call time per round."
             + "".join(f" XLA_FLAGS {s}: `{result[s]['xla_flags']}`." for s in ("before", "after")),
             "", "| method | N | before (s) | after (s) | speed-up (median) | range over rounds | same maps |",
             "|---|---:|---:|---:|---:|---|---|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['batch']} | {median(r['before_s']):.4f} | {median(r['after_s']):.4f} "
                     f"| {r['speedup_median']:.2f} | {min(r['speedup_per_round']):.2f}-{max(r['speedup_per_round']):.2f} "
                     f"| {'yes' if r['maps_equal'] else 'no'} |")
    (args.out / "engine_ab.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}/engine_ab.json, .md")


if __name__ == "__main__":
    main()
