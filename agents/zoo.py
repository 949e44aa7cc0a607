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
from .errors import AgentInputError, AgentLoadError
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


CARD_FIELDS = {"game": "a game name, e.g. \"breakout\"", "arch": "an architecture, e.g. \"dqn\"",
               "num_actions": "the number of actions, e.g. 4", "obs_shape": "(H, W, C) of one frame stack, e.g. [84, 84, 4]"}
CARD_HINTS = {**CARD_FIELDS, "layer_norm": "true or false", "pixels": "\"uint8\" (0..255 frames) or left out",
              "num_actions": "an integer from 1 to 1024, e.g. 4",
              "obs_shape": "(H, W, C) of one frame stack, 3 integers from 1 to 1024, e.g. [84, 84, 4]"}


def check_card(card, path) -> dict:
    """An agent card's fields the network is built from, checked before anything is built or
    allocated: a card with a missing or mistyped field is an AgentLoadError naming the field and the fix."""
    if not isinstance(card, dict):
        raise AgentLoadError(f"agent card {path} is a JSON {type(card).__name__}, not an object with "
                             f"{', '.join(CARD_FIELDS)}")
    missing = [k for k in CARD_FIELDS if k not in card]
    if missing:
        raise AgentLoadError(f"agent card {path} has no {missing[0]!r}; add {missing[0]}: {CARD_FIELDS[missing[0]]}")
    bad = None
    if not (isinstance(card["game"], str) and isinstance(card["arch"], str)):
        bad = "game" if not isinstance(card["game"], str) else "arch"
    elif type(card["num_actions"]) is not int or not 1 <= card["num_actions"] <= 1024:
        bad = "num_actions"
    elif not (isinstance(card["obs_shape"], list) and len(card["obs_shape"]) == 3
              and all(type(d) is int and 1 <= d <= 1024 for d in card["obs_shape"])):
        bad = "obs_shape"
    elif type(card.get("layer_norm", True)) is not bool:
        bad = "layer_norm"
    elif card.get("pixels") not in (None, "uint8"):
        bad = "pixels"
    if bad:
        raise AgentLoadError(f"agent card {path}: {bad} is {json.dumps(card[bad])[:80]}; it must be {CARD_HINTS[bad]}")
    return card


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
    if not shipped and not card_path.exists():  # a path, not a name: "unknown agent" would list the shipped ones
        raise AgentLoadError(f"agent card {card_path} does not exist; give the path of the agent's .json card")
    if not card_path.exists() or (shipped and name not in available()):
        raise AgentLoadError(f"unknown agent {name!r}; shipped agents: {', '.join(available()) or 'none'}")
    if params_path is None:  # before any work: a shipped agent's weights may still need fetching
        params_path = require(name) if shipped else card_path.with_suffix(".msgpack")
    try:
        card = json.loads(card_path.read_text())
    except ValueError as e:  # JSONDecodeError, or UnicodeDecodeError: bytes that are no JSON text
        raise AgentLoadError(f"agent card {card_path} is not valid JSON ({str(e).splitlines()[0][:200]})") from None
    except RecursionError:  # [[[[...: no card nests past a few levels
        raise AgentLoadError(f"agent card {card_path} nests deeper than JSON can be parsed: it is no agent card, "
                             "give the agent's .json card") from None
    except OSError as e:  # a directory or an unreadable file: not an error of the job, which resuming cannot fix
        raise AgentLoadError(f"cannot read agent card {card_path} ({e.strerror or e}); give the path of the "
                             "agent's .json card") from None
    model = model_from_card(check_card(card, card_path))
    obs_shape = tuple(card["obs_shape"])
    try:
        template = jax.eval_shape(model.init, jax.random.PRNGKey(0),
                                  jax.ShapeDtypeStruct((1,) + obs_shape, jnp.float32))
    except AgentInputError as e:  # the card's frames are not the ones its game's network takes
        raise AgentLoadError(f"agent card {card_path}: obs_shape {list(obs_shape)} does not fit its {card['game']} "
                             f"network ({str(e).splitlines()[0]}); set obs_shape to the frames it was trained on") from None
    params = load_params(params_path, template)  # shapes checked against the abstract template: nothing allocated
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
