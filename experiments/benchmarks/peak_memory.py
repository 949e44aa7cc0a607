"""Peak memory per method and vanilla-gradient maps/s at growing N, each in a fresh process.

    python -m experiments.benchmarks.peak_memory --case gradient --side jaxsal --n 256   # one child, JSON out
    python -m experiments.benchmarks.peak_memory --scaling 1000 10000 100000            # streamed gradient

Peak memory is the child's VmHWM (peak resident set of its process image, includes the jax/torch runtime and
compilation) minus its RSS just before the timed call's inputs are built (`base`), so `extra`
is what the method itself needs. The scaling child streams random uint8 states in chunks of
1,024 through `jaxsal.explain` and keeps only a per-map statistic on the host, so its memory
must stay flat in N; it reports maps/s and peak RSS after each N.
"""
from __future__ import annotations

import argparse
import json
import resource
import sys
import time


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def _peak_mb() -> float:
    """This process image's peak RSS (VmHWM; ru_maxrss would carry the parent's over exec)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _device_peak_mb(side: str, device: str) -> dict:
    """Peak accelerator memory in use by this process's side, where there is one (else {})."""
    if side == "peer":
        if device != "cuda":
            return {}
        import torch
        return {"device_peak_mb": torch.cuda.max_memory_allocated() / 2**20}
    from experiments.common.machine import device_peak_mb
    peak = device_peak_mb()
    return {} if peak is None else {"device_peak_mb": peak}


def child_case(case: str, side: str, n: int, device: str = "cpu") -> dict:
    """One against_peers case on n random states in this (fresh) process: peak RSS (and peak
    device memory on an accelerator)."""
    import jax
    from experiments.benchmarks import against_peers as A
    apply_fn, params, tmodel = A.build(device=device)
    table = A.cases(tmodel, jax.random.PRNGKey(0), device)
    family, kw, peer, label, _ = table[case]
    base = _rss_mb()
    obs = A._obs(n, 2)
    t = time.perf_counter()
    if side == "jaxsal":
        import jaxsal
        fn, kw = A.jaxsal_fn(apply_fn, kw)
        A._block(jaxsal.explain(fn, params, obs, **kw))
    else:
        from experiments.benchmarks.peers.torch_nature import to_nchw
        peer(to_nchw(obs, device))
        A.sync(device)
    return {"case": case, "side": side, "n": n, "seconds_incl_compile": time.perf_counter() - t,
            "base_rss_mb": base, "peak_rss_mb": _peak_mb(), "extra_mb": _peak_mb() - base,
            **_device_peak_mb(side, device)}


def child_scaling(sizes, chunk: int = 1024, seed: int = 5) -> list:
    """Vanilla-gradient maps/s and peak RSS at each N, states generated chunk by chunk."""
    import jax
    import numpy as np
    import jaxsal
    from experiments.benchmarks import against_peers as A
    apply_fn, params, _ = A.build()
    rng = np.random.default_rng(seed)
    A._block(jaxsal.explain(apply_fn, params, A._obs(chunk, 0), method="gradient"))  # compile
    base = _rss_mb()
    rows = []
    for n in sizes:
        t = time.perf_counter()
        total = 0.0
        for s in range(0, n, chunk):
            obs = rng.integers(0, 256, (min(chunk, n - s), 84, 84, 4), dtype=np.uint8)
            maps = jaxsal.explain(apply_fn, params, obs, method="gradient")
            total += float(jax.numpy.abs(maps).mean())  # pulls the result: the chunk is done
        dt = time.perf_counter() - t
        rows.append({"n": n, "chunk": chunk, "maps_per_s": n / dt, "seconds": dt,
                     "base_rss_mb": base, "peak_rss_mb": _peak_mb(), "checksum": total})
        print(f"scaling: gradient N={n}: {n / dt:.0f} maps/s, peak RSS {_peak_mb():.0f} MB",
              file=sys.stderr, flush=True)
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case")
    ap.add_argument("--side", choices=["jaxsal", "peer"], default="jaxsal")
    ap.add_argument("--n", type=int, default=256)
    ap.add_argument("--scaling", type=int, nargs="*")
    ap.add_argument("--torch-device", choices=["cpu", "cuda"], default="cpu")
    args = ap.parse_args(argv)
    if args.scaling:
        out = child_scaling(args.scaling)
    else:
        out = child_case(args.case, args.side, args.n, args.torch_device)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
