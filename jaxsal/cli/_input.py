"""The frames a job explains besides a buffer: the agent's own rollout (--play), the first N of a
source (--limit)."""
from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from jaxsal.cli._agent import check_agent, check_frames
from jaxsal.cli._common import say
from jaxsal.errors import CLIError


def _game_agent(agent):
    """An agent object for the provider's collect (NHWC frames), whatever the model's layout."""
    import types

    fn = agent.apply_fn
    if agent.layout == "NCHW":
        def fn(params, x, _f=agent.apply_fn):
            return _f(params, x.transpose(0, 3, 1, 2))
    return types.SimpleNamespace(apply_fn=fn, params=agent.params, name=agent.name,
                                 num_actions=agent.num_actions, game=agent.card.get("game"))


def play(agent, steps: int, out: Path, game: str | None = None, seed: int = 0, until_done: bool = False,
         quiet: bool = False, target: str | None = None, layout_given: str | None = None, objects: bool = False):
    """Play `steps` steps with the agents provider's game (EnvPool / gymnax) and save the frames as
    out/input/obs.npy (reused on rerun). With `objects`, play on the provider's env that reads each
    state's object boxes (ale-py: the same frames) and save them beside as out/input/obs.objects.npz,
    where `--objects` finds them. The model is checked on the game's frames (layout, `target`) before
    playing."""
    from jaxsal.checks import num_actions
    from jaxsal.io import open_source
    from jaxsal.plugins import agent_provider
    from jaxsal.io.store import MANIFEST

    path = Path(out).absolute() / "input" / "obs.npy"  # recorded in the manifest: render finds it from anywhere
    boxes_path = path.with_name("obs.objects.npz")     # the name --objects looks for beside an input
    if (out / MANIFEST).exists() and path.exists():
        if objects and not boxes_path.exists():
            raise CLIError(f"the rollout in {path.parent} was recorded without object boxes: give --play "
                           f"--objects a new --out")
        say(f"reusing the rollout saved in {path}", quiet)
        return open_source(path)
    if steps < 1:
        raise CLIError(f"--play needs a positive number of steps, got {steps}")
    provider = agent_provider()
    game = provider.check_game(game or agent.card.get("game") or "breakout")
    if objects:
        from jaxsal.game_objects import games
        if game not in games():
            raise CLIError(f"--objects: {game} has no object table, so its boxes are unknown; games with one: "
                           f"{', '.join(games())}")
    env = provider.make_env(game, seed=seed)
    shape = (1,) + tuple(env.obs_shape)
    model_shape = shape if agent.layout == "NHWC" else (1, shape[3], shape[1], shape[2])
    model_out = check_agent(agent, model_shape, layout_given, target)
    n_act = agent.num_actions or num_actions(model_out)
    if n_act is not None and env.num_actions != n_act:
        raise CLIError(f"agent {agent.name!r} has {n_act} actions but {game} has "
                       f"{env.num_actions}: choose the agent trained on {game}")
    check_frames(agent, model_shape)
    t = time.perf_counter()
    if objects:
        batch, boxes = provider.record_objects(_game_agent(agent), steps, game, seed=seed, until_done=until_done)
    else:
        batch = provider.collect(_game_agent(agent), steps, env=env, seed=seed, until_done=until_done)
    say(f"played {len(batch)} steps of {game} in {time.perf_counter() - t:.1f}s "
        f"(returns of finished games: {batch.episode_returns or 'none finished'})", quiet)
    path.parent.mkdir(parents=True, exist_ok=True)
    if objects:  # the boxes first: frames without their boxes are never left as a finished rollout
        _write_atomic(boxes_path, lambda f: boxes.save(f, game=game))
    _write_atomic(path, lambda f: np.save(f, np.asarray(batch.obs, np.uint8)))
    return open_source(path)


def _write_atomic(path: Path, write):
    """`write(file)` into a temporary file beside `path`, then rename it into place."""
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:  # a file handle: np.save(path) would append ".npy" to the name
        write(f)
    os.replace(tmp, path)


class Limited:
    """The first `n` frames of a source (for quick tries on a big buffer)."""

    def __init__(self, source, n: int):
        if n < 1:
            raise CLIError(f"--limit must be positive, got {n}")
        self.source, self.n = source, min(n, len(source))
        if hasattr(source, "actions"):
            self.actions = lambda a, b: source.actions(a, min(b, self.n))
        if hasattr(source, "row_ids"):
            self.row_ids = lambda a, b: source.row_ids(a, min(b, self.n))

    def __len__(self):
        return self.n

    @property
    def shape(self):
        return (self.n,) + tuple(self.source.shape[1:])

    def read(self, a, b):
        return self.source.read(a, min(b, self.n))

    def fingerprint(self):
        return f"{self.source.fingerprint()}[:{self.n}]"

    def describe(self):
        return dict(self.source.describe(), limit=self.n)
