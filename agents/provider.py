"""This package's side of jaxsal's plugin boundary (`jaxsal.plugins`): the shipped agents and games.

jaxsal never imports this package. pyproject.toml registers this module under the entry-point
group `jaxsal.agents`, and `jaxsal agents`, `jaxsal demo`, `jaxsal explain --agent NAME` and
`--play` reach the shipped agents and EnvPool/gymnax games only through the names below (the
interface is documented in `jaxsal.plugins.AgentProvider`). `ERRORS` are the user errors this
package raises; jaxsal turns them into its own `AgentProviderError` (one line, exit status 2).
"""
from __future__ import annotations

import json

from . import envs
from .collect import collect
from .envs import check_game
from .errors import AgentInputError, AgentLoadError
from .weights import fetch as _fetch
from .weights import find
from .zoo import SHIPPED_DIR, available, load, random_agent

ERRORS = (AgentLoadError, AgentInputError)

__all__ = ["ERRORS", "available", "card", "check_game", "collect", "fetch", "load", "make_env", "random_agent",
           "record_objects", "weights"]


def card(name: str) -> dict:
    """The JSON card of the shipped agent `name` (game, arch, training, 30-game evaluation)."""
    if name not in available():
        raise AgentLoadError(f"unknown agent {name!r}; shipped agents: {', '.join(available()) or 'none'}")
    return json.loads((SHIPPED_DIR / f"{name}.json").read_text())


def weights(name: str) -> str | None:
    """Where this install has shipped agent `name`'s weights (None: `fetch` them first)."""
    path = find(name)
    return None if path is None else str(path)


def fetch(name: str, source: str) -> tuple[str, bool]:
    """Copy or download agent `name`'s weights from `source` (a folder or a URL of one), checked against
    the manifest's sha256: (path, fetched), fetched False when this install already has them."""
    path, fetched = _fetch(name, source)
    return str(path), fetched


def make_env(game: str, seed: int = 0):
    """One evaluation env of `game` (true game, unclipped rewards) with `obs_shape`, `num_actions`."""
    return envs.make_env(game, 1, train=False, seed=seed)


def record_objects(agent, steps: int, game: str, seed: int = 0, until_done: bool = False):
    """Greedy play of `agent` on ale-py with EnvPool's preprocessing (the same frames), reading every
    stacked frame's object boxes from the emulator's RAM: (Batch, jaxsal.game_objects ObjectBoxes)."""
    from jaxsal.game_objects import games

    from .ale import collect_objects

    if game not in games():
        raise AgentInputError(f"{game} has no object table, so its boxes cannot be recorded; games with one: "
                              f"{', '.join(games())}")
    return collect_objects(agent, steps, game=game, seed=seed, until_done=until_done)
