"""Record a buffer together with its ground-truth object boxes, for `jaxsal explain --objects`.

    python -m jaxsal_agents.record_objects --agent pong --steps 500 --out buf/
    jaxsal explain --agent pong --methods gradient,gradcam --input buf/obs.npy --objects --out maps/

A replay buffer of preprocessed frames has no RAM, so its objects are unknown. This plays the
agent on ale-py with EnvPool's preprocessing (agents.ale: frames equal EnvPool's bit for bit)
and reads every stacked frame's objects from the emulator's RAM (jaxsal.game_objects tables). It
writes DIR/obs.npy (N, 84, 84, 4) uint8, DIR/obs.objects.npz (the objects file of
`jaxsal.io.object_files`: boxes, labels, classes, size, game) and DIR/actions.npy. Games without a
shipped agent (mspacman, frostbite) play with `--random-init` (an untrained network).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np


def _agent(name: str | None, game: str | None, random_init: bool, seed: int):
    import jax
    import jax.numpy as jnp

    from . import build_model, load
    from .zoo import Agent

    if not random_init:
        return load(name or game)
    from .ale import ROM_NAMES, ale_module

    ale_py = ale_module()
    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)
    ale.loadROM(ale_py.roms.get_rom_path(ROM_NAMES[game]))
    n_act = len(ale.getMinimalActionSet())
    model = build_model(game, "dqn", n_act)
    params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 84, 84, 4), jnp.float32))
    card = {"game": game, "arch": "dqn", "num_actions": n_act, "obs_shape": [84, 84, 4], "layer_norm": True,
            "note": "random init (untrained)"}
    return Agent(name=f"{game}-random-init", model=model, params=params, card=card)


def record(agent, steps: int, out, epsilon: float = 0.05, seed: int = 0, num_envs: int = 1) -> dict:
    """Play `agent` for `steps` steps per env on ale-py and write obs.npy, obs.objects.npz and
    actions.npy into `out` (module doc). Returns {"obs", "objects", "actions"} paths."""
    from .ale import collect_objects

    out = Path(out)
    paths = {"obs": out / "obs.npy", "objects": out / "obs.objects.npz", "actions": out / "actions.npy"}
    if any(p.exists() for p in paths.values()):
        raise FileExistsError(f"{out} already holds a recorded buffer; choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    batch, boxes = collect_objects(agent, steps, epsilon=epsilon, num_envs=num_envs, seed=seed)
    for key, write in (("obs", lambda f: np.save(f, np.asarray(batch.obs, np.uint8))),
                       ("actions", lambda f: np.save(f, np.asarray(batch.actions))),
                       ("objects", lambda f: boxes.save(f, game=agent.game))):
        tmp = paths[key].with_name(f".{paths[key].name}.tmp")
        with open(tmp, "wb") as f:   # a handle: np.save(path) would append .npy to the name
            write(f)
        os.replace(tmp, paths[key])
    return paths


def parser() -> argparse.ArgumentParser:
    """The command's flags (`python -m jaxsal_agents.record_objects --help`)."""
    p = argparse.ArgumentParser(prog="python -m jaxsal_agents.record_objects", description=__doc__.split("\n")[0])
    p.add_argument("--agent", help="shipped agent name or card .json (default: the shipped agent of --game)")
    p.add_argument("--game", help="game (default: the agent's); needs an object table (jaxsal.game_objects.games())")
    p.add_argument("--random-init", action="store_true", help="an untrained network (games without an agent)")
    p.add_argument("--steps", type=int, default=500, help="steps per env")
    p.add_argument("--num-envs", type=int, default=1)
    p.add_argument("--epsilon", type=float, default=0.05, help="random actions (keeps greedy play from looping)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="directory for obs.npy, obs.objects.npz, actions.npy")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    from .errors import AgentLoadError
    from jaxsal.game_objects import games

    if not (args.agent or args.game):
        p.error("give --agent NAME or --game GAME")
    game = args.game
    if game is None:
        from . import load

        game = load(args.agent).game
    key = game.lower().replace("_", "").replace("-", "")
    if key not in games():
        print(f"record_objects: error: game {game!r} has no object table, so its boxes cannot be read from RAM "
              f"(games with one: {', '.join(games())}); give `jaxsal explain --objects FILE` your own boxes",
              file=sys.stderr)
        return 2
    try:
        agent = _agent(args.agent, key, args.random_init, args.seed)
        if agent.game != key:
            raise ValueError(f"agent {agent.name!r} plays {agent.game}, not {key}")
        paths = record(agent, args.steps, args.out, args.epsilon, args.seed, args.num_envs)
    except (FileExistsError, ValueError, OSError, AgentLoadError) as e:
        print(f"record_objects: error: {e}", file=sys.stderr)
        return 2
    n = len(np.load(paths["obs"], mmap_mode="r"))
    spec = "AGENT" if args.random_init else (args.agent or agent.name)
    print(f"recorded {n} frames of {key} with {agent.name}: {paths['obs']}, {paths['objects']}\n"
          f"next: jaxsal explain --agent {spec} --methods gradient --input {paths['obs']} --objects --out maps/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
