"""Adopt the agents that agents/train_gpu.sh brought back: cards, parameters and curves.

    python -m jaxsal_agents.adopt_gpu DIR [--force]     # from a checkout's root

DIR holds <name>.tgz files (each: <name>.msgpack, <name>.json with a 30-game evaluation,
returns.csv, the training log). An agent replaces the shipped one when its evaluated mean
return is at least the shipped card's (or with --force); its training returns are appended to
experiments/results/training/<name>.csv (env steps continue from the shipped card, since the
GPU run started from it) and the curve is redrawn.
"""
from __future__ import annotations

import argparse
import csv
import io
import json
import sys
import tarfile
from pathlib import Path

from .export import plot_curve
from .weights import refresh_manifest
from .zoo import load


def read_bundle(path: Path) -> dict:
    """The members of one <name>.tgz as bytes (plain files only; no paths outside it)."""
    out = {}
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            if m.isfile():
                out[Path(m.name).name] = tar.extractfile(m).read()
    return out


def adopt(path: Path, shipped, curves, force: bool = False) -> str:
    """Adopt one <name>.tgz into the `shipped` folder (cards, params) and `curves` (training curves)."""
    files = read_bundle(path)
    name = path.name[:-len(".tgz")]
    card = json.loads(files[f"{name}.json"])
    new = card["eval"]["mean_return"]
    old_path = Path(shipped) / f"{name}.json"
    old = json.loads(old_path.read_text())["eval"]["mean_return"] if old_path.exists() else None
    if old is not None and new < old and not force:
        return f"{name}: kept the shipped agent ({old:.1f}); the GPU run evaluated {new:.1f}"
    card["training_curve"] = f"experiments/results/training/{name}.png"
    (Path(shipped) / f"{name}.msgpack").write_bytes(files[f"{name}.msgpack"])
    old_path.write_text(json.dumps(card, indent=1) + "\n")
    load(str(old_path))  # the adopted files load and match the card's architecture
    refresh_manifest(shipped)
    if "returns.csv" in files:
        curve = Path(curves) / f"{name}.csv"
        rows = list(csv.reader(io.StringIO(files["returns.csv"].decode())))[1:]
        if not curve.exists():
            curve.write_text("step,return,wall_s\n")
        with open(curve, "a", newline="") as f:
            csv.writer(f).writerows(rows)
        plot_curve(curve, Path(curves) / f"{name}.png", f"{name}: training returns")
    was = f"{old:.1f}" if old is not None else "none"
    return f"{name}: adopted, {new:.1f} over {card['eval']['episodes']} games (shipped was {was})"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("dir")
    p.add_argument("--force", action="store_true", help="adopt even when the shipped agent scored higher")
    p.add_argument("--shipped", default="agents/shipped", help="the checkout's shipped-agent folder")
    p.add_argument("--curves", default="experiments/results/training", help="the checkout's training curves")
    a = p.parse_args(argv)
    for folder in (a.shipped, a.curves):
        if not Path(folder).is_dir():
            raise SystemExit(f"{folder} is not a folder: run from a checkout's root or pass --shipped/--curves")
    bundles = sorted(Path(a.dir).glob("*.tgz"))
    if not bundles:
        raise SystemExit(f"no <name>.tgz files in {a.dir}")
    for b in bundles:
        print(adopt(b, a.shipped, a.curves, a.force), flush=True)


if __name__ == "__main__":
    sys.exit(main())
