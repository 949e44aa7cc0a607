"""The object study's states as a buffer with boxes, for the sweep configs beside this file.

    python -m experiments.objects.sweep.record --game breakout            # the study's 500 states
    python -m experiments.objects.sweep.record --game pong --first 4 --out /tmp/slice

Plays the shipped agent exactly as experiments.objects.run does (play_states: epsilon 0.05 on
ale-py, 4 envs, subsampled evenly to --states) and writes OUT/obs.npy and OUT/obs.objects.npz (the
RAM boxes, found by the sweep's objects metric beside the buffer); --first K keeps the first K of
those states (a slice of the study's states, not a shorter rollout). OUT defaults to data/GAME here,
the input the GAME.toml sweep reads.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


def record(game: str, out, states: int = 500, first: int | None = None, seed: int = 0) -> Path:
    """Write the study's states of `game` (the first `first` of them) to out/obs.npy + out/obs.objects.npz."""
    import jaxsal_agents
    from experiments.objects.run import play_states

    agent = jaxsal_agents.load(game)
    obs, boxes, _ = play_states(agent, states, seed)
    if first is not None:
        obs, boxes = obs[:first], boxes[:first]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for path, write in ((out / "obs.npy", lambda f: np.save(f, np.asarray(obs, np.uint8))),
                        (out / "obs.objects.npz", lambda f: boxes.save(f, game=agent.game))):
        tmp = path.with_name(f".{path.name}.tmp")
        with open(tmp, "wb") as f:
            write(f)
        os.replace(tmp, path)
    return out / "obs.npy"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--game", required=True, choices=["breakout", "pong", "spaceinvaders"])
    p.add_argument("--states", type=int, default=500, help="the study's number of states (default 500)")
    p.add_argument("--first", type=int, help="keep only the first K of them")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="folder (default: data/GAME beside this file)")
    a = p.parse_args(argv)
    path = record(a.game, a.out or HERE / "data" / a.game, a.states, a.first, a.seed)
    print(f"{a.game}: {len(np.load(path, mmap_mode='r'))} states -> {path}")


if __name__ == "__main__":
    main()
