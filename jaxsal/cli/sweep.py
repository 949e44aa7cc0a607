"""`jaxsal sweep`: one resumable explain job per agent x checkpoint x input x method of a TOML config,
with statistics and metrics, into one table (the cells run in jaxsal.cli.sweep_run)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from jaxsal.cli._common import EXIT_INTERNAL, check_positive, say
from jaxsal.cli.sweep_run import RAY_HINT, import_ray, ray_address, run_ray, run_sweep_cell, run_workers
from jaxsal.errors import CLIError


def _verify_inputs(cells):
    """Every buffer the sweep reads, opened and verified once (each member's checksum) before any cell runs."""
    from jaxsal.io import open_source
    from jaxsal.io.readers import verify_input

    for path in dict.fromkeys(c.input_spec["path"] for c in cells if "path" in c.input_spec):
        verify_input(open_source(Path(path)))


def cmd_sweep(args) -> int:
    from jaxsal.io import sweep as sw

    check_positive("--workers", args.workers)
    if args.ray is None and (args.cpus_per_cell is not None or args.gpus_per_cell is not None):
        raise CLIError("--cpus-per-cell and --gpus-per-cell are for --ray; add --ray local or --ray ADDRESS")
    cpus = 1.0 if args.cpus_per_cell is None else args.cpus_per_cell
    gpus = 0.0 if args.gpus_per_cell is None else args.gpus_per_cell
    if args.ray is not None:
        if args.workers != 1:
            raise CLIError("--workers is for local processes; with --ray the cluster's CPUs and --cpus-per-cell "
                           "decide how many cells run at once")
        if not cpus > 0 or gpus < 0:
            raise CLIError(f"--cpus-per-cell must be positive and --gpus-per-cell not negative, got {cpus:g} and "
                           f"{gpus:g}")
        ray_address(args.ray)
        import_ray()  # before anything is written
    path = Path(args.config)
    raw = sw.read_config(path)
    base = path.absolute().parent
    cells, metrics, sett = sw.plan(raw, base)  # every check before anything is written
    _verify_inputs(cells)
    out = Path(args.out)
    stored = sw.stored_config(raw, base)
    sw.check_dir(out, stored, path.name)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / sw.CONFIG_JSON).exists():
        from jaxsal.io.store import atomic_write

        atomic_write(out / sw.CONFIG_TOML, path.read_bytes())
        atomic_write(out / sw.CONFIG_JSON, json.dumps(stored, indent=2, sort_keys=True).encode())
    done = [c for c in cells if (sw.read_record(out, c) or {}).get("status") == "ok"]
    todo = [c for c in cells if c not in done]
    how = f"Ray tasks ({args.ray}, {cpus:g} CPU(s)" + (f", {gpus:g} GPU(s)" if gpus else "") + " each)" \
        if args.ray is not None else f"{args.workers} worker(s)"
    say(f"sweep: {len(cells)} cells ({len(done)} done already), {len(todo)} to run with {how} into {out}",
        args.quiet)
    sw.write_table(out, cells, metrics, sett, base)

    def finished(cell):
        rec = sw.read_record(out, cell) or {}
        say(f"  {cell.path}: {rec.get('status')}" + (f" ({rec.get('error')})" if rec.get("error") else
                                                       f" in {rec.get('seconds')}s"), args.quiet)
        sw.write_table(out, cells, metrics, sett, base)

    if args.ray is not None:
        run_ray(todo, out, metrics, sett, args.ray, cpus, gpus, finished)
    elif args.workers == 1:
        for cell in todo:
            run_sweep_cell(cell, out, metrics, sett)
            finished(cell)
    else:
        run_workers(todo, out, metrics, sett, args.workers, finished)
    table = sw.write_table(out, cells, metrics, sett, base)
    failed = [c for c in cells if (sw.read_record(out, c) or {}).get("status") != "ok"]
    for c in failed:
        print(f"jaxsal: error: cell {c.path} failed: {(sw.read_record(out, c) or {}).get('error')}", file=sys.stderr)
    say(f"sweep done: {len(cells) - len(failed)} of {len(cells)} cells ok; table {table} "
        f"(jaxsal.load_sweep('{out}'))" + ("; rerun the same command to retry the failed cells" if failed else ""),
        args.quiet)
    return EXIT_INTERNAL if failed else 0


SWEEP_EPILOG = """config (TOML; docs/guides/sweeps.md):
  agents = ["breakout", "runs/pong/*.msgpack"]   # any --agent SPEC; a glob: its checkpoints, step_2 before step_10
  inputs = ["buffer.npy", { play = 500, seed = 1 }]
  metrics = ["insertion", "deletion"]            # also sanity; objects, effects: inputs with boxes
  [methods]
  gradcam = { layer = "conv3" }
  occlusion = { patch = 6 }
outputs: DIR/cells/AGENT/CHECKPOINT/INPUT/METHOD/job (a `jaxsal explain` output: jaxsal.load_maps),
  DIR/results.csv (one row per cell: jaxsal.load_sweep(DIR)), DIR/sweep.toml (the config)
pictures: jaxsal render DIR (curves.png: each metric against checkpoint; grid.png: a frame per cell)
ray: --ray local:4 or --ray ADDRESS (pip install 'jaxsal[ray]'; --out shared by every node)"""


def add_parser(sub):
    """The `jaxsal sweep` command and its flags."""
    w = sub.add_parser("sweep", help="explain every agent x checkpoint x input x method of a TOML config into "
                                     "one table",
                       description="Run one resumable explain job per agent x checkpoint x input x method of a TOML "
                                   "config, with map statistics and the config's metrics, into DIR/results.csv "
                                   "(jaxsal.load_sweep). A rerun computes only what is missing.",
                       epilog=SWEEP_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    w.add_argument("config", help="the sweep's .toml file (paths in it are relative to its folder)")
    w.add_argument("--out", required=True, help="output directory (a rerun with the same config resumes)")
    w.add_argument("--workers", type=int, default=1, help="cells run at once, each in a process of its own "
                                                          "(default 1: one after another, in this process)")
    w.add_argument("--ray", metavar="ADDRESS", help="run the cells as tasks on the Ray cluster at ADDRESS (e.g. "
                                                    "ray://head:10001 or auto), or on a Ray instance started here: "
                                                    "local (every CPU) or local:CPUS; --out must be a folder every "
                                                    f"node shares (needs {RAY_HINT})")
    w.add_argument("--cpus-per-cell", type=float, help="CPUs each Ray task asks for (default 1; with --ray)")
    w.add_argument("--gpus-per-cell", type=float, help="GPUs each Ray task asks for (default 0; with --ray)")
    w.add_argument("--quiet", action="store_true", help="no progress lines")
    w.set_defaults(fn=cmd_sweep)
