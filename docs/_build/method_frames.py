"""Play the shipped Breakout and MsPacman agents once with a fixed seed and save a few of their states:
the committed input of every method's picture (`docs/_build/method_pictures.py`).

Needs the `agents` extra (EnvPool). The pictures themselves need only the saved file, so they are
redrawn in CI without playing:

    python docs/_build/method_frames.py          # writes docs/images/data/method_frames.npz
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "images" / "data" / "method_frames.npz"
SEED = 0
# per agent: the play steps (greedy, evaluation settings) whose states are kept; spread over the first
# few hundred steps of the game, where the ball (Breakout) and the ghosts (MsPacman) are on the screen
STATES = {"breakout": (120, 180, 260), "mspacman": (60, 140, 220)}


def collect_states(states: dict = STATES, seed: int = SEED) -> dict:
    """{agent: (obs (k, 84, 84, 4) uint8, steps (k,))} from one greedy game of each shipped agent."""
    import jaxsal_agents

    out = {}
    for name, steps in states.items():
        agent = jaxsal_agents.load(name)
        batch = jaxsal_agents.collect(agent, steps=max(steps) + 1, seed=seed)
        obs = np.asarray(batch.obs)[list(steps)]
        out[name] = (obs.astype(np.uint8), np.asarray(steps, np.int32))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args(argv)
    states = collect_states()
    arrays = {"agents": np.array(list(states)), "seed": np.int32(SEED)}
    for name, (obs, steps) in states.items():
        arrays[f"{name}_obs"], arrays[f"{name}_steps"] = obs, steps
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.out, **arrays)
    print(f"wrote {args.out} ({args.out.stat().st_size / 1e3:.0f} KB)")


if __name__ == "__main__":
    main()
