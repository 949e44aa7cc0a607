"""Agent zoo: build networks by game/architecture and load the shipped trained agents.

    agent = jaxsal_agents.load("breakout")
    q = agent.apply_fn(agent.params, obs)      # obs (N, 84, 84, 4) uint8 -> Q (N, A)
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp

from . import networks
from .checkpoint import load_params
from .envs import ATARI_GAMES, MINATAR_GAMES, check_game
from .errors import AgentLoadError
from .weights import SHIPPED_DIR, manifest, require
MINATAR_SHAPES = {"minatar-breakout": (4, 3), "minatar-spaceinvaders": (6, 4),
                  "minatar-asterix": (4, 5), "minatar-freeway": (7, 3)}  # (channels, actions)


def build_model(game: str, arch: str, num_actions: int, layer_norm: bool = True):
    """The flax module for a game ("breakout", "minatar-asterix") and arch ("dqn", "dueling", ...)."""
    game = check_game(game)
    if game in MINATAR_GAMES:
        channels = MINATAR_SHAPES[game][0]
        if arch == "actor_critic":
            return networks.MinAtarActorCritic(num_actions, channels)
        if arch == "dueling":
            return networks.MinAtarDuelingDQN(num_actions, channels, layer_norm=layer_norm)
        if arch != "dqn":
            raise AgentLoadError(f"MinAtar agents use arch 'dqn', 'dueling' or 'actor_critic', got {arch!r}")
        return networks.MinAtarDQN(num_actions, channels, layer_norm=layer_norm)
    archs = {"dqn": lambda: networks.NatureDQN(num_actions, layer_norm=layer_norm),
             "dueling": lambda: networks.DuelingDQN(num_actions, layer_norm=layer_norm),
             "actor_critic": lambda: networks.ActorCritic(num_actions),
             "split_attention": lambda: networks.SplitAttentionDQN(num_actions)}
    if arch not in archs:
        raise AgentLoadError(f"unknown architecture {arch!r}; choose one of {sorted(archs)}")
    return archs[arch]()


@dataclasses.dataclass(frozen=True)
class Agent:
    """A loaded agent: `apply_fn(params, obs)` is `model.apply`; `card` is its JSON card."""
    name: str
    model: Any
    params: Any
    card: dict

    @property
    def apply_fn(self) -> Callable:
        """`model.apply`, declaring NHWC frames and (Atari) uint8 pixels, which jaxsal.explain
        checks; equal for equal models, so jit caches keyed on it keep hitting."""
        from jaxsal.agent_spec import DeclaredFn

        return DeclaredFn(self.model.apply, "NHWC", self.pixels)

    @property
    def pixels(self) -> str | None:
        """"uint8" when the network takes 0..255 pixel frames (Atari); MinAtar frames are 0/1."""
        default = None if self.card.get("game") in MINATAR_GAMES else "uint8"
        return self.card.get("pixels", default)

    @property
    def layout(self) -> str:
        return "NHWC"

    @property
    def num_actions(self) -> int:
        return int(self.card["num_actions"])

    @property
    def game(self) -> str:
        return self.card["game"]


def available() -> list[str]:
    """Names of the shipped agents (the manifest's: those whose weights this install lacks too)."""
    return sorted(manifest())


def model_from_card(card: dict):
    return build_model(card["game"], card["arch"], card["num_actions"], card.get("layer_norm", True))


def load(name: str, params_path: str | None = None) -> Agent:
    """Load a shipped agent by name ("breakout", "pong", "minatar-breakout", "breakout-dddqn").

    `name` may also be a path to a `.json` card beside its `.msgpack` parameter file. A shipped agent
    whose weights this install lacks (the wheel carries only breakout's) is an AgentLoadError naming
    `jaxsal agents fetch`.
    """
    shipped = not str(name).endswith(".json")
    card_path = SHIPPED_DIR / f"{name}.json" if shipped else Path(name)
    if not card_path.exists() or (shipped and name not in available()):
        raise AgentLoadError(f"unknown agent {name!r}; shipped agents: {', '.join(available()) or 'none'}")
    if params_path is None:  # before any work: a shipped agent's weights may still need fetching
        params_path = require(name) if shipped else card_path.with_suffix(".msgpack")
    try:
        card = json.loads(card_path.read_text())
    except json.JSONDecodeError as e:
        raise AgentLoadError(f"agent card {card_path} is not valid JSON ({e})") from None
    model = model_from_card(card)
    obs_shape = tuple(card["obs_shape"])
    template = jax.eval_shape(model.init, jax.random.PRNGKey(0), jnp.zeros((1,) + obs_shape, jnp.float32))
    template = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), template)
    params = load_params(params_path, template)
    return Agent(name=card_path.stem, model=model, params=params, card=card)


def random_agent(game: str = "breakout", seed: int = 0) -> Agent:
    """An untrained, randomly initialised DQN agent for `game` (LayerNorm, as the shipped ones):
    `jaxsal demo`'s fallback when no trained agent ships, so the pipeline still runs end to end."""
    game = check_game(game)
    if game in MINATAR_GAMES:
        channels, num_actions = MINATAR_SHAPES[game]
        obs_shape = [10, 10, channels]
    else:
        num_actions = {"breakout": 4, "pong": 6}.get(game, 18) if game in ATARI_GAMES else 4
        obs_shape = [84, 84, 4]
    model = build_model(game, "dqn", num_actions)
    params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1,) + tuple(obs_shape), jnp.float32))
    card = {"game": game, "arch": "dqn", "num_actions": num_actions, "obs_shape": obs_shape,
            "layer_norm": True, "note": "random init (untrained)"}
    return Agent(name=f"{game}-random-init", model=model, params=params, card=card)
