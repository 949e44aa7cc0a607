"""`jaxsal explain` end to end on a replay buffer on disk: read, explain, write the maps.

    python -m experiments.benchmarks.buffer_end_to_end                       # 1M frame stacks, gradcam and gradient
    python -m experiments.benchmarks.buffer_end_to_end --frames 4096 --out /tmp/e2e   # a small check (any backend)

Writes a uint8 (N, 84, 84, 4) .npy buffer (random frame stacks tiled from one block: the content
does not change the work), then times one fresh `python -m jaxsal.cli explain` process per method
on it (process start, JAX start-up and compilation included) with float16 maps, checks that every
frame has a finite map, and deletes the maps before the next method. Where the disk (or /dev/shm)
cannot hold the buffer and one method's maps, the buffer is made smaller to fit and the results
say so. Results: buffer_end_to_end_<tag>.{json,md} under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import jaxsal  # before any JAX computation (library default: XLA:CPU's fast kernels)
from experiments.common.paths import RESULTS
from experiments.common.machine import machine_info

FRAME_BYTES = 84 * 84 * 4
MAP_BYTES = 84 * 84 * 2  # float16 maps
SLACK = 2 * 2**30


def need_bytes(frames: int) -> int:
    """Disk for the buffer plus one method's float16 maps (they are deleted between methods)."""
    return frames * (FRAME_BYTES + MAP_BYTES) + SLACK


def place(frames: int, where: str | None) -> tuple[Path, int, str]:
    """(directory, frames that fit there, note): --dir if given, else /dev/shm when it holds the
    whole job, else the temporary directory; fewer frames where the space is short."""
    candidates = [Path(where)] if where else [Path("/dev/shm"), Path(tempfile.gettempdir())]
    best = None
    for c in candidates:
        if not c.is_dir() or not os.access(c, os.W_OK):
            continue
        free = shutil.disk_usage(c).free
        fits = max(0, (free - SLACK) // (FRAME_BYTES + MAP_BYTES))
        if fits >= frames:
            return c, frames, ""
        if best is None or fits > best[1]:
            best = (c, int(fits))
    if best is None or best[1] < 1024:
        raise SystemExit(f"buffer_end_to_end: no writable directory with room for 1,024 frames "
                         f"(tried {[str(c) for c in candidates]}); pass --dir")
    c, fits = best
    fits = fits // 1024 * 1024
    return c, fits, (f"{c} has room for {fits:,} of the {frames:,} frames asked for "
                     f"(buffer + one method's float16 maps): measured on {fits:,}")


def write_buffer(path: Path, frames: int, block: int = 8192, seed: int = 0) -> float:
    """A .npy of `frames` uint8 frame stacks (one random block, tiled); returns seconds taken."""
    t = time.perf_counter()
    base = np.random.default_rng(seed).integers(0, 256, (min(block, frames), 84, 84, 4), dtype=np.uint8)
    arr = np.lib.format.open_memmap(path, mode="w+", dtype=np.uint8, shape=(frames, 84, 84, 4))
    for s in range(0, frames, len(base)):
        n = min(len(base), frames - s)
        arr[s:s + n] = base[:n]
    arr.flush()
    del arr
    return time.perf_counter() - t


def explain_once(buffer: Path, method: str, out: Path, agent: str, batch_size: int | None,
                 timeout: float) -> dict:
    """One `jaxsal explain` process on the whole buffer; wall time and a check of the maps."""
    cmd = [sys.executable, "-m", "jaxsal.cli", "explain", "--agent", agent, "--input", str(buffer),
           "--methods", method, "--out", str(out), "--dtype", "float16", "--quiet"]
    if batch_size:
        cmd += ["--batch-size", str(batch_size)]
    env = dict(os.environ)
    env.setdefault("JAXSAL_AGENT_PROVIDER", "jaxsal_agents.provider")  # works uninstalled too
    t = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"method": method, "error": f"timed out after {timeout:.0f} s"}
    wall = time.perf_counter() - t
    if p.returncode != 0:
        return {"method": method, "error": (p.stderr.strip().splitlines() or ["?"])[-1][:300],
                "seconds": wall}
    maps = jaxsal.load_maps(out, method)
    n = len(maps)
    finite = all(np.isfinite(np.asarray(maps[s:s + 65536], np.float32)).all() for s in range(0, n, 65536))
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    return {"method": method, "frames": n, "seconds": wall, "maps_per_s": n / wall,
            "all_finite": bool(finite), "maps_gb": size / 1e9, "command": " ".join(cmd[1:])}


def write(res: dict, out: Path, tag: str):
    out.mkdir(parents=True, exist_ok=True)
    (out / f"buffer_end_to_end_{tag}.json").write_text(json.dumps(res, indent=2))
    L = [f"# `jaxsal explain` end to end on a {res['frames']:,}-frame buffer ({res['machine']['backend']}, "
         f"{res['machine']['devices'][0]}, {res['machine']['date_utc']})", "",
         f"uint8 (N, 84, 84, 4) .npy buffer ({res['buffer_gb']:.1f} GB) in {res['dir']} (written in "
         f"{res['write_s']:.0f} s, not counted); agent `{res['agent']}`; one fresh "
         "`python -m jaxsal.cli explain --dtype float16` process per method: the wall time includes "
         "start-up, compilation, reading the buffer and writing the maps.", ""]
    if res.get("note"):
        L += [f"**{res['note']}**", ""]
    L += ["| method | frames | seconds | maps/s | maps GB | all maps finite |", "|---|---|---|---|---|---|"]
    for r in res["runs"]:
        if "error" in r:
            L.append(f"| {r['method']} | - | {r.get('seconds', float('nan')):.0f} | error: {r['error']} | | |")
        else:
            L.append(f"| {r['method']} | {r['frames']:,} | {r['seconds']:.1f} | {r['maps_per_s']:,.0f} | "
                     f"{r['maps_gb']:.1f} | {r['all_finite']} |")
    (out / f"buffer_end_to_end_{tag}.md").write_text("\n".join(L) + "\n")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=2**20, help="frame stacks in the buffer (default 1,048,576)")
    ap.add_argument("--methods", nargs="+", default=["gradcam", "gradient"])
    ap.add_argument("--agent", default="breakout", help="--agent of jaxsal explain (default: shipped breakout)")
    ap.add_argument("--batch-size", type=int, default=None, help="--batch-size of jaxsal explain (default: its own)")
    ap.add_argument("--dir", default=None, help="where the buffer and maps go (default: /dev/shm if it fits, else TMPDIR)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per method")
    ap.add_argument("--tag", default=None, help="results file suffix (default: the backend name)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    if args.frames < 1:
        ap.error("--frames must be >= 1")
    root, frames, note = place(args.frames, args.dir)
    if note:
        print(f"buffer_end_to_end: {note}", file=sys.stderr, flush=True)
    # a time box's SIGTERM still removes the buffer and the maps (the finally below)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="jaxsal-e2e-", dir=root))
    info = machine_info()
    tag = args.tag or info["backend"]
    res = {"machine": info,
           "frames": frames, "frames_asked": args.frames, "note": note, "dir": str(root), "agent": args.agent,
           "buffer_gb": frames * FRAME_BYTES / 1e9, "runs": []}
    try:
        buf = work / "buffer.npy"
        res["write_s"] = write_buffer(buf, frames)
        print(f"buffer: {frames:,} frames ({res['buffer_gb']:.1f} GB) in {root}, written in {res['write_s']:.0f} s",
              flush=True)
        for m in args.methods:
            r = explain_once(buf, m, work / f"maps-{m}", args.agent, args.batch_size, args.timeout)
            shutil.rmtree(work / f"maps-{m}", ignore_errors=True)
            res["runs"].append(r)
            print(f"{m}: " + (f"{r['frames']:,} maps in {r['seconds']:.1f} s = {r['maps_per_s']:,.0f} maps/s"
                              if "error" not in r else r["error"]), flush=True)
            write(res, args.out, tag)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write(res, args.out, tag)
    return res


if __name__ == "__main__":
    main()
