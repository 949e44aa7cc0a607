"""Does a sweep of GAME.toml give the object study's per-method object shares? Checked on a tiny slice.

    python -m experiments.objects.sweep.check --game breakout --first 4

Records the first K of the study's states (record.py: the study's own play and subsampling), runs
`jaxsal sweep` on them with GAME.toml's agents, methods and metrics (only the input replaced by the
slice), and computes the same slice's maps and shares with the study's own code
(object_saliency.explain_all and class_table). Per method, the sweep's maps must equal the study's
to float32 noise (max |difference| <= 1e-5 x max |map|), and per class the sweep's
objects_CLASS_positive the study's "share" and objects_CLASS_chance its "chance" to 1e-3 (absolute,
on a share in [0, 1]); exit 1 otherwise. The share tolerance is not 0 because occlusion's "drop"
maps hold many pixels at 0 +- 1e-7 whose sign follows the batch size of the model calls (the
sweep's batch_size, not explain's): the positive mass moves by ~1e-4 of the total. The committed 500-state
shares (results/objects/GAME/summary.json) are printed beside them for reference only: a slice of K
states is not expected to give the 500-state means, and the check does not rerun the full study.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import tomllib
from pathlib import Path

import numpy as np
from experiments.common.paths import RESULTS

HERE = Path(__file__).parent
COMMITTED = RESULTS / "objects"
SHARE_ATOL, MAP_RTOL = 1e-3, 1e-5


def compare(game: str, first: int = 4, work=None, seed: int = 0) -> tuple[list[dict], bool]:
    """(rows, all equal): one row per method x class with the study code's and the sweep's numbers."""
    import jax

    import jaxsal
    import jaxsal_agents
    from experiments.objects.run import class_table, explain_all
    from experiments.objects.sweep.record import record
    from jaxsal.cli import main as cli
    from jaxsal.io.object_files import read_objects
    from jaxsal.io.sweep import _slug
    from jaxsal.metrics import object_attribution

    work = Path(work or tempfile.mkdtemp(prefix=f"objects-sweep-{game}-"))
    obs_path = record(game, work / "slice", first=first, seed=seed)
    raw = tomllib.loads((HERE / f"{game}.toml").read_text())
    methods = {k: {o: v for o, v in opts.items()} for k, opts in raw["methods"].items()}
    cfg = work / "sweep.toml"
    body = (HERE / f"{game}.toml").read_text().replace(f'inputs = ["data/{game}/obs.npy"]',
                                                       f'inputs = [{json.dumps(str(obs_path))}]')
    assert str(obs_path) in body, "GAME.toml's inputs line is not the one record.py writes"
    cfg.write_text(body)
    if cli(["sweep", str(cfg), "--out", str(work / "out"), "--quiet"]) != 0:
        raise SystemExit(f"the sweep failed; see {work / 'out' / 'results.csv'}")
    table = jaxsal.load_sweep(work / "out")
    # the study's code on the same states
    agent = jaxsal_agents.load(game)
    obs = np.load(obs_path)
    boxes = read_objects(obs_path.with_name("obs.objects.npz")).boxes
    maps = explain_all(agent, obs, methods)
    rand = np.asarray(jax.random.uniform(jax.random.PRNGKey(seed), (len(obs), 84, 84)))
    rnd = object_attribution(rand, boxes)
    committed = json.loads((COMMITTED / game / "summary.json").read_text())["methods"]
    rows, ok = [], True
    for m in methods:
        r = list(table["method"]).index(m)
        job = work / "out" / "cells" / table["agent"][r] / table["checkpoint"][r] / table["input"][r] / m / "job"
        swept = np.asarray(jaxsal.load_maps(job, m), np.float64)
        map_diff = float(np.abs(swept - maps[m]).max() / (np.abs(maps[m]).max() or 1.0))
        study = class_table(object_attribution(maps[m], boxes), boxes, rnd)
        for c, v in study.items():
            got = {k: float(table[f"objects_{_slug(c)}_{k}"][r]) for k in ("positive", "chance")}
            same = map_diff <= MAP_RTOL and all(np.isclose(got[k], v[s], rtol=0, atol=SHARE_ATOL, equal_nan=True)
                                                for k, s in (("positive", "share"), ("chance", "chance")))
            ok &= bool(same)
            rows.append({"method": m, "class": c, "states": v["states"], "study": v["share"], "sweep": got["positive"],
                         "study_chance": v["chance"], "sweep_chance": got["chance"], "map_diff": map_diff,
                         "committed_500": committed[m][c]["share"], "same": bool(same)})
    return rows, ok


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--game", required=True, choices=["breakout", "pong", "spaceinvaders"])
    p.add_argument("--first", type=int, default=4, help="states of the slice (default 4)")
    p.add_argument("--work", help="folder for the slice and the sweep (default: a new temporary folder)")
    a = p.parse_args(argv)
    rows, ok = compare(a.game, a.first, a.work)
    print(f"{'method':22s} {'class':12s} {'states':>6s} {'study':>9s} {'sweep':>9s} {'chance':>9s} "
          f"{'map diff':>9s} {'500 states':>10s}")
    for r in rows:
        print(f"{r['method']:22s} {r['class']:12s} {r['states']:6d} {r['study']:9.5f} {r['sweep']:9.5f} "
              f"{r['study_chance']:9.5f} {r['map_diff']:9.1e} {r['committed_500']:10.5f}"
              f"{'' if r['same'] else '  DIFFERS'}")
    print(("the sweep gives the study's shares on this slice" if ok else "the sweep DIFFERS from the study") +
          f" ({a.first} states of {a.game}; '500 states': the committed means, for reference)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
