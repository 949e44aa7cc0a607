"""Where bfloat16 loses on XLA:CPU: matmul kernels and the gradient map under three YNNPACK settings.

    python -m experiments.benchmarks.bf16_kernels            # ~3 min on 2 cores; run it on a quiet machine
    python -m experiments.benchmarks.bf16_kernels --quick    # tiny shapes, 2 repeats (checks the script)

XLA:CPU reads its YNNPACK setting once per process, so each setting runs in a fresh child process:
`dot` (jaxsal's default, `jaxsal.cpu.YNN_FLAG`), `dot,individual_dot`, and XLA's own default (no flag,
`JAXSAL_FAST_CPU=0`). In each: GFLOP/s of float32 and of bfloat16-operand (float32-accumulating)
matmuls at the Nature CNN's shapes at batch 256 (its convolutions as space-to-depth matmuls, fc1) and at
1024^3; then `jaxsal.explain(method="gradient")` maps/s in float32 and bfloat16 at batch 256, the
precisions interleaved; then the ceiling of any bfloat16 path (`whole_model`: the model wholly in
bfloat16). Writes experiments/results/precision/bf16_kernels.{json,md} with the machine, its load and the
commit. Not a claim about other CPUs: a diagnosis of this one.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from experiments.common.paths import ROOT, RESULTS, write_results

OUT = RESULTS / "precision"
SETTINGS = {"dot": "--xla_cpu_experimental_ynn_fusion_type=dot",
            "dot,individual_dot": "--xla_cpu_experimental_ynn_fusion_type=dot,individual_dot",
            "XLA default": None}
"""YNNPACK setting -> XLA_FLAGS of its child (None: no flag, jaxsal's own flag off)."""


def shapes(batch: int) -> dict:
    """(m, k, n) of the Nature CNN's matmuls at `batch` states, and a square one."""
    return {"conv1 (s2d block)": (batch * 400, 64, 32), "conv2 (s2d block)": (batch * 81, 128, 64),
            "conv3 (one tap)": (batch * 49, 64, 64), "fc1": (batch, 3136, 512), "square 1024": (1024, 1024, 1024)}


def _median_seconds(f, repeats: int) -> float:
    import jax
    import numpy as np
    jax.block_until_ready(f())
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(f())
        ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def child(batch: int, repeats: int) -> dict:
    """This process's matmul GFLOP/s and gradient maps/s (its XLA flags are the caller's)."""
    import jaxsal  # noqa: F401  (before JAX starts: adds jaxsal's flag unless JAXSAL_FAST_CPU=0)
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax

    from experiments.benchmarks.against_peers import build
    dn = (((1,), (0,)), ((), ()))
    f32 = jax.jit(lambda a, b: a @ b)
    bf16 = jax.jit(lambda a, b: lax.dot_general(a, b, dn, preferred_element_type=jnp.float32))
    dots = {}
    for name, (m, k, n) in shapes(batch).items():
        a, b = jnp.ones((m, k), jnp.float32), jnp.ones((k, n), jnp.float32)
        a16, b16 = a.astype(jnp.bfloat16), b.astype(jnp.bfloat16)
        t32 = _median_seconds(lambda: f32(a, b), repeats)
        t16 = _median_seconds(lambda: bf16(a16, b16), repeats)
        dots[name] = {"shape": [m, k, n], "float32_gflops": 2 * m * k * n / t32 / 1e9,
                      "bfloat16_gflops": 2 * m * k * n / t16 / 1e9}
    apply_fn, params, _ = build()
    obs = jnp.asarray(np.random.default_rng(0).integers(0, 256, (batch, 84, 84, 4)).astype(np.float32))
    maps = {"float32": [], "bfloat16": []}
    for _ in range(2):                               # interleaved: float32, bfloat16, float32, bfloat16
        for prec in maps:
            t = _median_seconds(lambda: jaxsal.explain(apply_fn, params, obs, method="gradient", precision=prec),
                                repeats)
            maps[prec].append(batch / t)
    return {"xla_flags": os.environ.get("XLA_FLAGS", ""), "dots": dots,
            "gradient_maps_per_s": {p: float(np.median(v)) for p, v in maps.items()},
            "whole_model": whole_model(apply_fn, params, obs, repeats)}


def whole_model(apply_fn, params, obs, repeats: int) -> dict:
    """The ceiling of any bfloat16 path: the gradient of the model run wholly in bfloat16 (weights and
    input cast once, every activation bfloat16, no converts between layers), with jaxsal's strided-conv
    rule and the float32 greedy actions given, against the same construction in float32 (interleaved);
    and the smallest per-map Pearson r of its maps against float32's."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from jaxsal.backprop.strided_conv import fast_apply
    fast = fast_apply(apply_fn)
    acts = jnp.argmax(fast(params, obs), -1)

    def grad_map(p, x, dtype):
        p = jax.tree.map(lambda a: a.astype(dtype), p)
        chosen = lambda x: jnp.take_along_axis(fast(p, x.astype(dtype)).astype(jnp.float32),  # noqa: E731
                                               acts[:, None], 1).sum()
        return jnp.abs(jax.grad(chosen)(x)).max(-1)

    fns = {d: jax.jit(lambda p, x, d=d: grad_map(p, x, getattr(jnp, d))) for d in ("float32", "bfloat16")}
    ts = {d: [] for d in fns}
    for _ in range(2):
        for d, f in fns.items():
            ts[d].append(_median_seconds(lambda: f(params, obs), repeats))
    a, b = (np.asarray(fns[d](params, obs)).reshape(len(obs), -1) for d in fns)
    r = min(float(np.corrcoef(x, y)[0, 1]) for x, y in zip(a, b))
    return {"maps_per_s": {d: len(obs) / float(np.median(t)) for d, t in ts.items()}, "min_map_r": r}


def run_setting(flag, batch: int, repeats: int) -> dict:
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    if flag is None:
        env["JAXSAL_FAST_CPU"] = "0"
    else:
        env["XLA_FLAGS"] = flag
    cmd = [sys.executable, "-m", "experiments.benchmarks.bf16_kernels", "--child", "--batch", str(batch),
           "--repeats", str(repeats)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=env)
    if r.returncode:
        raise SystemExit(f"child ({flag}) failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def report(res: dict) -> str:
    m = res["machine_at_start"]
    names = list(next(iter(res["settings"].values()))["dots"])
    lines = [f"# bfloat16 on XLA:CPU: matmul kernels and the gradient map ({m['date_utc']})", "",
             f"Machine: {m.get('cpu', '?')}, {m['cpu_count']} cores, jax {m['jax']}; load average at start "
             f"{[round(x, 1) for x in m.get('load_avg_1_5_15', [])]}, at end "
             f"{[round(x, 1) for x in res.get('load_avg_at_end') or []]}; commit {str(res.get('git_commit'))[:10]}"
             f"{' (dirty)' if res.get('git_dirty') else ''}. Batch {res['batch']}, median of {res['repeats']} calls.",
             "", "Matmul GFLOP/s, float32 / bfloat16 operands (float32 accumulation), per YNNPACK setting "
             "(each in its own process):", "",
             "| matmul (m, k, n) | " + " | ".join(res["settings"]) + " |",
             "|---|" + "---:|" * len(res["settings"])]
    for name in names:
        shape = next(iter(res["settings"].values()))["dots"][name]["shape"]
        cells = [f"{s['dots'][name]['float32_gflops']:.0f} / {s['dots'][name]['bfloat16_gflops']:.0f}"
                 for s in res["settings"].values()]
        lines.append(f"| {name} {tuple(shape)} | " + " | ".join(cells) + " |")
    lines += ["", "`jaxsal.explain(method=\"gradient\")` maps/s at the library defaults but the setting, "
              "float32 / bfloat16 (bf16/f32):", "",
              "| " + " | ".join(res["settings"]) + " |", "|" + "---:|" * len(res["settings"])]
    cells = []
    for s in res["settings"].values():
        g = s["gradient_maps_per_s"]
        cells.append(f"{g['float32']:.0f} / {g['bfloat16']:.0f} ({g['bfloat16'] / g['float32']:.2f})")
    lines += ["| " + " | ".join(cells) + " |", "",
              "The ceiling of any bfloat16 path: the gradient of the model run wholly in bfloat16 (weights and "
              "input cast once, every activation bfloat16, no converts between layers; jaxsal's strided-conv rule; "
              "the float32 greedy actions given), float32 / bfloat16 maps/s of that same construction "
              "(bf16/f32), and the smallest per-map Pearson r of its maps against float32's:", "",
              "| " + " | ".join(res["settings"]) + " |", "|" + "---:|" * len(res["settings"])]
    cells = []
    for s in res["settings"].values():
        w = s.get("whole_model")
        cells.append("not run" if w is None else
                     f"{w['maps_per_s']['float32']:.0f} / {w['maps_per_s']['bfloat16']:.0f} "
                     f"({w['maps_per_s']['bfloat16'] / w['maps_per_s']['float32']:.2f}), r >= {w['min_map_r']:.4f}")
    lines += ["| " + " | ".join(cells) + " |", ""]
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--quick", action="store_true", help="batch 4, 2 repeats, output under /tmp")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    if args.quick:
        args.batch, args.repeats, args.out = 4, 2, Path("/tmp/jaxsal-bf16-kernels")
    if args.child:
        print(json.dumps(child(args.batch, args.repeats)))
        return
    from experiments.common.machine import git_state, machine_info
    start = machine_info()
    settings = {}
    for name, flag in SETTINGS.items():
        settings[name] = run_setting(flag, args.batch, args.repeats)
        print(name, json.dumps(settings[name]["gradient_maps_per_s"]), flush=True)
    res = {"batch": args.batch, "repeats": args.repeats, "machine_at_start": start,
           "load_avg_at_end": machine_info().get("load_avg_1_5_15"), **git_state(), "settings": settings}
    write_results(args.out, res, report(res), "bf16_kernels.json", "bf16_kernels.md")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
