"""The plugin boundaries of the `jaxsal` command: saliency methods of other packages, and the
shipped agents and games.

Methods: a module that registers methods when imported (`jaxsal.register`) reaches the command
through the entry-point group `jaxsal.methods` of an installed package,

    [project.entry-points."jaxsal.methods"]
    mine = "my_package.saliency"

or, without installing anything, through JAXSAL_METHODS, a comma list of module names or .py
files (`JAXSAL_METHODS=my_methods.py jaxsal explain --methods mine ...`). `load_methods` imports
them; the command calls it before it reads `--methods`.

Agents:

jaxsal computes saliency for any `apply_fn(params, obs)` and never imports an agents package:
imports point one way (agents use jaxsal's public API, not the reverse). Packages that ship
trained agents and playable games register a provider module under the entry-point group
`jaxsal.agents`; this repository's `jaxsal_agents` does so in pyproject.toml:

    [project.entry-points."jaxsal.agents"]
    shipped = "jaxsal_agents.provider"

A provider module has these names (see `AgentProvider` for what each returns):

    available() -> list[str]                      shipped agent names
    card(name) -> dict                            a shipped agent's JSON card
    load(name_or_card, params_path=None)          an agent: apply_fn, params, name, card (+ layout, ...)
    random_agent(game, seed) -> agent             an untrained agent (the demo's fallback)
    check_game(game) -> str                       the canonical game name, or a user error
    make_env(game, seed) -> env                   one env with obs_shape and num_actions
    collect(agent, steps, env=, seed=, until_done=) -> batch with obs and episode_returns
    ERRORS                                        the provider's user-error classes

and optionally `record_objects` (`--play --objects`), and `weights(name) -> path | None` with
`fetch(name, source) -> (path, fetched)` for agents whose weight files an install may lack
(`jaxsal agents fetch`).

Set JAXSAL_AGENT_PROVIDER to an entry-point name or a module path to pick one when several are
installed (or to use a provider that is importable but not installed).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

from jaxsal.caching import memo
from jaxsal.errors import SaliencyInputError

GROUP = "jaxsal.agents"
ENV_VAR = "JAXSAL_AGENT_PROVIDER"
METHODS_GROUP = "jaxsal.methods"
METHODS_ENV_VAR = "JAXSAL_METHODS"
_NAMES = ("available", "card", "load", "random_agent", "check_game", "make_env", "collect")


class AgentProviderError(SaliencyInputError):
    """A user error from the agents provider (unknown agent or game, bad card or parameters),
    or no provider at all; the CLI prints it in one line and exits with status 2."""


class MethodPluginError(SaliencyInputError):
    """A method plugin (JAXSAL_METHODS or a `jaxsal.methods` entry point) that cannot be imported."""


@memo("method plugins", 4, key=lambda: os.environ.get(METHODS_ENV_VAR))  # imported once per setting
def load_methods() -> tuple[str, ...]:
    """Import every method plugin, so its methods are registered: the modules of the installed
    `jaxsal.methods` entry points, then those JAXSAL_METHODS names (module names or .py files).

    Returns:
        tuple[str, ...]: the plugins imported (entry-point names and JAXSAL_METHODS items).

    Raises:
        MethodPluginError: a plugin that cannot be found or fails while it is imported.
    """
    loaded = []
    for ep in entry_points(group=METHODS_GROUP):
        _import_plugin(f"entry point {ep.name!r} ({ep.value})", ep.load)
        loaded.append(ep.name)
    for item in (s.strip() for s in os.environ.get(METHODS_ENV_VAR, "").split(",")):
        if item:
            _import_plugin(f"{METHODS_ENV_VAR} item {item!r}", lambda: import_module_or_file(item))
            loaded.append(item)
    return tuple(loaded)


def _import_plugin(what: str, load):
    try:
        load()
    except SaliencyInputError:
        raise
    except ModuleNotFoundError as e:
        raise MethodPluginError(f"method plugin {what}: cannot import {e.name!r}; put it on PYTHONPATH or give "
                                "the path of its .py file") from None
    except Exception as e:  # the plugin's own code failed: one line, as every user error
        raise MethodPluginError(f"method plugin {what} failed while imported: {type(e).__name__}: {e}") from e


def import_module_or_file(name: str):
    """A module by name, or a .py file by path, imported once (under a name of its own, kept in
    sys.modules so that what it registers names a module that resolves)."""
    if not name.endswith(".py"):
        return importlib.import_module(name)
    path = Path(name).resolve()
    if not path.is_file():
        raise MethodPluginError(f"{name}: no such file")
    module_name = f"_jaxsal_plugin_{path.stem}_{abs(hash(str(path)))}"
    if module_name not in sys.modules:
        exec_file(path, module_name, keep=True)
    return sys.modules[module_name]


def exec_file(path: Path, module_name: str, keep: bool = False):
    """Run a .py file as module `module_name` (its folder on sys.path meanwhile, so its sibling
    modules import too); `keep`: it is in sys.modules while it runs (and after, unless it fails)."""
    spec = importlib.util.spec_from_file_location(module_name, path)
    module = importlib.util.module_from_spec(spec)
    if keep:
        sys.modules[module_name] = module
    sys.path.insert(0, str(Path(path).resolve().parent))
    try:
        spec.loader.exec_module(module)
    except BaseException:
        if keep:
            del sys.modules[module_name]
        raise
    finally:
        sys.path.remove(str(Path(path).resolve().parent))
    return module


class AgentProvider:
    """A provider module behind jaxsal's interface: each call translates the provider's own
    user errors (`module.ERRORS`) into `AgentProviderError`, so jaxsal needs no agents types."""

    def __init__(self, module, name: str):
        missing = [n for n in _NAMES if not callable(getattr(module, n, None))]
        if missing:
            raise AgentProviderError(f"agent provider {name!r} ({module.__name__}) lacks {', '.join(missing)}; "
                                     f"see jaxsal.plugins for the interface")
        self.module, self.name = module, name
        self.errors = tuple(getattr(module, "ERRORS", ()))

    def _call(self, fn: str, *args, **kwargs):
        try:
            return getattr(self.module, fn)(*args, **kwargs)
        except self.errors as e:
            raise AgentProviderError(str(e)) from e

    def available(self) -> list[str]:
        """Names of the shipped agents."""
        return list(self._call("available"))

    def card(self, name: str) -> dict:
        """The JSON card of a shipped agent."""
        return self._call("card", name)

    def load(self, name: str, params_path: str | None = None):
        """A shipped agent by name, or an agent card (.json) with its parameters beside it or at
        `params_path`; the result has apply_fn, params, name and card (jaxsal.agent_spec.as_agent)."""
        return self._call("load", name, params_path=params_path)

    def random_agent(self, game: str, seed: int = 0):
        """An untrained agent for `game`."""
        return self._call("random_agent", game, seed)

    def check_game(self, game: str) -> str:
        """The canonical name of `game`; an unknown game is an AgentProviderError naming the known ones."""
        return self._call("check_game", game)

    def make_env(self, game: str, seed: int = 0):
        """One evaluation env of `game` with `obs_shape` (H, W, C) and `num_actions`."""
        return self._call("make_env", game, seed)

    def collect(self, agent, steps: int, env, seed: int = 0, until_done: bool = False):
        """Greedy play of `agent` (apply_fn on NHWC frames, params, num_actions) in `env`: a batch
        with `obs` (N, H, W, C) and `episode_returns`."""
        return self._call("collect", agent, steps, env=env, seed=seed, until_done=until_done)

    def record_objects(self, agent, steps: int, game: str, seed: int = 0, until_done: bool = False):
        """Greedy play as `collect`, on an env that also reads each state's object boxes: (batch,
        boxes), boxes a `jaxsal.game_objects` ObjectBoxes with one row per state. Optional: a provider
        without it cannot serve `--play --objects`."""
        if not callable(getattr(self.module, "record_objects", None)):
            raise AgentProviderError(f"the agents provider {self.name!r} cannot record object boxes, so --play "
                                     f"cannot be used with --objects; record frames and boxes yourself and give "
                                     f"--input FILE --objects BOXES")
        return self._call("record_objects", agent, steps, game, seed=seed, until_done=until_done)

    def installed(self, name: str) -> bool:
        """Whether this install has shipped agent `name`'s weights (False: `fetch` them first); a
        provider without `weights` comes with all of them."""
        return not callable(getattr(self.module, "weights", None)) or self._call("weights", name) is not None

    def fetch(self, name: str, source: str) -> tuple[str, bool]:
        """Shipped agent `name`'s weights from `source` (a folder or a URL of one) into this install,
        checked: (path, fetched), fetched False when it had them already."""
        if not callable(getattr(self.module, "fetch", None)):
            raise AgentProviderError(f"the agents provider {self.name!r} has no weights to fetch; its agents come "
                                     "with it")
        return self._call("fetch", name, source)


_NO_PROVIDER = ("no agents provider is installed (entry-point group 'jaxsal.agents'), so shipped agents, "
                "--play and `jaxsal demo` are unavailable; fix: install the checkout with `pip install -e .` "
                "(it registers jaxsal_agents), or give --agent path/to/file.py:FUNCTION or a checkpoint "
                "file and --input BUFFER")


@memo("agents provider", 4, key=lambda: os.environ.get(ENV_VAR))  # the choice depends on it
def agent_provider() -> AgentProvider:
    """The installed agents provider (cached). Raises AgentProviderError naming the fix when none
    is installed, or when several are and JAXSAL_AGENT_PROVIDER does not pick one."""
    eps = {ep.name: ep for ep in entry_points(group=GROUP)}
    wanted = os.environ.get(ENV_VAR)
    if wanted:
        if wanted in eps:
            return AgentProvider(eps[wanted].load(), wanted)
        try:
            return AgentProvider(importlib.import_module(wanted), wanted)
        except ModuleNotFoundError as e:
            raise AgentProviderError(f"{ENV_VAR}={wanted}: neither an installed provider ({', '.join(eps) or 'none'}) "
                                     f"nor an importable module ({e.name!r} not found)") from None
    if not eps:
        raise AgentProviderError(_NO_PROVIDER)
    if len(eps) > 1:
        raise AgentProviderError(f"several agents providers are installed ({', '.join(sorted(eps))}); pick one "
                                 f"with {ENV_VAR}=NAME")
    (name, ep), = eps.items()
    try:
        module = ep.load()
    except ModuleNotFoundError as e:
        raise AgentProviderError(f"the agents provider {name!r} is registered as {ep.value} but {e.name!r} cannot "
                                 "be imported; reinstall with `pip install -e .`") from None
    return AgentProvider(module, name)
