"""Any agent, by one SPEC string: `path/to/file.py:FUNCTION` or `package.module:FUNCTION`.

FUNCTION() takes no arguments and returns an object with `apply_fn` and `params` (optionally
`layout`, `name`, `num_actions`, `pixels`, `card`) or a tuple `(apply_fn, params)`. The result
is a `LoadedAgent`; its `apply_fn` carries the declared layout and pixel scale, so
`jaxsal.explain` checks the frames against them. Shipped names and cards are resolved by the
caller (the CLI), which keeps this module free of the example `agents` package.
"""
from __future__ import annotations

import dataclasses
import importlib
from pathlib import Path
from typing import Any, Callable

from jaxsal.errors import SaliencyInputError, brief, name_fault, one_line

LAYOUTS = ("NHWC", "NCHW")


class AgentSpecError(SaliencyInputError):
    """An --agent SPEC that cannot be loaded or does not give (apply_fn, params)."""


class DeclaredFn:
    """`apply_fn` plus what jaxsal checks its inputs and outputs against: `jaxsal_layout` ("NHWC"/"NCHW"),
    `jaxsal_pixels` ("uint8": frames on the 0..255 scale, or None) and `jaxsal_num_actions` (the action
    count the model must output, or None; jaxsal.checks.check_model). Equal wrappers of the same function
    compare equal, so compiled-function caches keep hitting."""

    def __init__(self, fn: Callable, layout: str | None = None, pixels: str | None = None,
                 num_actions: int | None = None):
        self.fn = getattr(fn, "fn", fn) if isinstance(fn, DeclaredFn) else fn
        self.jaxsal_layout = layout
        self.jaxsal_pixels = pixels
        self.jaxsal_num_actions = num_actions
        self.__name__ = getattr(self.fn, "__name__", "apply_fn")
        self.__doc__ = getattr(self.fn, "__doc__", None)

    def __call__(self, params, obs, *args, **kwargs):
        return self.fn(params, obs, *args, **kwargs)

    def _key(self):
        return (self.fn, self.jaxsal_layout, self.jaxsal_pixels, self.jaxsal_num_actions)

    def __eq__(self, other):
        return isinstance(other, DeclaredFn) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return (f"DeclaredFn({self.__name__}, layout={self.jaxsal_layout!r}, pixels={self.jaxsal_pixels!r}, "
                f"num_actions={self.jaxsal_num_actions!r})")


@dataclasses.dataclass(frozen=True)
class LoadedAgent:
    """What the CLI explains with: `apply_fn(params, obs)` in `layout`, and a card for provenance."""
    name: str
    apply_fn: Callable
    params: Any
    layout: str = "NHWC"
    num_actions: int | None = None
    pixels: str | None = None
    card: dict = dataclasses.field(default_factory=dict)


def is_function_spec(spec: str) -> bool:
    """`file.py:FUNCTION` or `package.module:FUNCTION` (not a card path or a shipped name)."""
    head, sep, tail = spec.rpartition(":")
    return bool(sep and head and tail.isidentifier()
                and (head.endswith(".py") or all(p.isidentifier() for p in head.split("."))))


def _import(head: str):
    if head.endswith(".py"):
        path = Path(head)
        if not path.exists():
            raise AgentSpecError(f"--agent {head}: no such file")
        from jaxsal.plugins import exec_file  # run afresh each time: a changed file is reloaded
        return exec_file(path, f"_jaxsal_agent_{abs(hash(str(path.resolve())))}")
    try:
        return importlib.import_module(head)
    except ModuleNotFoundError as e:
        raise AgentSpecError(f"--agent {head}: cannot import module {e.name!r}; give a file "
                             "path/to/file.py:FUNCTION or put the package on PYTHONPATH") from None


def load_function_spec(spec: str, layout: str | None = None) -> LoadedAgent:
    """Call FUNCTION of `file.py:FUNCTION` / `package.module:FUNCTION` and wrap its agent."""
    head, _, fname = spec.rpartition(":")
    try:
        module = _import(head)
    except SaliencyInputError:
        raise
    except SystemExit as e:  # a training script run on import: argparse refusing jaxsal's own arguments, say
        raise AgentSpecError(f"--agent {spec}: importing {head} called sys.exit({e.code!r}) (a script that parses its "
                             "command line or runs when imported?): put its top-level code under "
                             "`if __name__ == \"__main__\":`, or load the agent from another file") from None
    except Exception as e:  # the user's module failed while importing
        raise AgentSpecError(f"--agent {spec}: importing {head} failed: {brief(e)}") from None
    fn = getattr(module, fname, None)
    if not callable(fn):
        names = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise AgentSpecError(f"--agent {spec}: {head} has no function {fname!r} (it has: "
                             f"{', '.join(names[:12]) or 'none'})")
    try:
        obj = fn()
    except SaliencyInputError:
        raise
    except SystemExit as e:
        raise AgentSpecError(f"--agent {spec}: {fname}() called sys.exit({e.code!r}); make it return the agent "
                             "(apply_fn, params) instead") from None
    except Exception as e:
        raise AgentSpecError(f"--agent {spec}: {fname}() failed: {brief(e)}") from None
    agent = as_agent(obj, default_name=fname, layout=layout, where=f"--agent {spec}")
    check_finite_params(agent.params, f"--agent {spec}")
    return agent


def check_finite_params(params, where: str):
    """Every floating-point leaf of `params` finite (the loaders check their files' alike): NaN weights would
    give NaN maps without a word. A tree jax cannot flatten is left to the model check, which names it."""
    from jaxsal.checks import first_nonfinite_leaf, named_leaves

    try:
        leaves = named_leaves(params)
    except Exception:  # noqa: BLE001
        return
    k = first_nonfinite_leaf(leaves.items())
    if k is not None:
        raise AgentSpecError(f"{where}: params{k} holds NaN or infinite values (the training diverged, or the "
                             "checkpoint is corrupt): load an earlier checkpoint")


def check_declared(layout, pixels, where: str, error=AgentSpecError):
    """An agent's declared layout (one of LAYOUTS) and pixel scale ("uint8" or None): any other pixels value
    was ignored, so the frames went unchecked."""
    if layout not in LAYOUTS:
        raise error(f"{where}: layout must be one of {LAYOUTS}, got {str(layout)[:40]!r}")
    if pixels not in (None, "uint8"):
        raise error(f"{where}: pixels must be \"uint8\" (frames on the 0..255 scale) or None, got {str(pixels)[:40]!r}")


def as_agent(obj, default_name: str = "agent", layout: str | None = None,
             where: str = "agent") -> LoadedAgent:
    """A LoadedAgent from an object with apply_fn/params (+ layout, name, num_actions, pixels,
    card) or a tuple (apply_fn, params). `layout` overrides the object's."""
    if isinstance(obj, LoadedAgent):
        fields = dataclasses.asdict(obj) | {"apply_fn": obj.apply_fn, "params": obj.params}
    elif isinstance(obj, tuple) and len(obj) == 2:
        fields = {"apply_fn": obj[0], "params": obj[1]}
    elif hasattr(obj, "apply_fn") and hasattr(obj, "params"):
        fields = {k: getattr(obj, k) for k in ("apply_fn", "params", "layout", "name", "num_actions",
                                               "pixels", "card") if getattr(obj, k, None) is not None}
    else:
        raise AgentSpecError(f"{where}: the function must return an object with apply_fn and params, or "
                             f"a tuple (apply_fn, params); got {type(obj).__name__}")
    apply_fn = fields["apply_fn"]
    if not callable(apply_fn):
        raise AgentSpecError(f"{where}: apply_fn is not callable ({type(apply_fn).__name__})")
    lay = layout or fields.get("layout") or getattr(apply_fn, "jaxsal_layout", None) or "NHWC"
    pixels = fields.get("pixels", getattr(apply_fn, "jaxsal_pixels", None))
    check_declared(lay, pixels, where)
    card = _card(fields.get("card"), where)
    name = str(fields.get("name") or card.get("name") or default_name)
    fault = name_fault(name)
    if fault:  # every message, summary and manifest names the agent on one line
        raise AgentSpecError(f"{one_line(where)}: agent name {name[:40]!r} {fault}; give the agent a name of printed "
                             "characters on one line (the function's name, its card's \"name\", or its file's)")
    num_actions = fields.get("num_actions")
    num_actions = card.get("num_actions") if num_actions is None else num_actions
    if num_actions is not None:
        from jaxsal.checks import check_positive_int

        try:  # 2.7 was taken as 2, 0 as none, -1 as -1, "four" an internal ValueError
            num_actions = check_positive_int("num_actions", num_actions)
        except SaliencyInputError as e:
            raise AgentSpecError(f"{where}: {e}; give the agent's number of actions (e.g. env.action_space.n) or "
                                 "leave it out") from None
    return LoadedAgent(name=name, apply_fn=DeclaredFn(apply_fn, lay, pixels, num_actions), params=fields["params"],
                       layout=lay, num_actions=num_actions, pixels=pixels, card=card)


def _card(card, where: str) -> dict:
    """An agent's card as the job's manifest stores it (JSON): numpy numbers and arrays as numbers and lists (a
    card of np.int64(4), a set or keys of mixed types failed the manifest's write, an internal TypeError; NaN
    or inf was written as a bare NaN, which JSON readers other than Python's refuse), an
    obs_shape of sizes and a game name checked (a bad one failed later as an internal TypeError, or named
    a shape of letters)."""
    import json

    if card is None:
        return {}
    if not isinstance(card, dict):
        raise AgentSpecError(f"{where}: card must be a dict (name, game, obs_shape, ...), got {type(card).__name__}")

    def plain(o):
        if hasattr(o, "tolist") and hasattr(o, "dtype"):  # numpy or JAX
            return o.tolist()
        raise TypeError(f"a {type(o).__name__}")

    try:
        card = json.loads(json.dumps(card, default=plain, sort_keys=True, allow_nan=False))  # NaN: not JSON
    except (TypeError, ValueError, RecursionError) as e:
        raise AgentSpecError(f"{where}: card cannot be stored as JSON ({e}): give it string keys and string, number, "
                             "list or dict values") from None
    shape = card.get("obs_shape")
    if shape is not None and not (isinstance(shape, list) and 1 <= len(shape) <= 8
                                  and all(type(d) is int and d >= 1 for d in shape)):
        raise AgentSpecError(f"{where}: card obs_shape must be the shape of one observation, e.g. [84, 84, 4], got "
                             f"{json.dumps(shape)[:80]}")
    if not isinstance(card.get("game", ""), str):
        raise AgentSpecError(f"{where}: card game must be a game name, e.g. \"breakout\", got "
                             f"{json.dumps(card['game'])[:80]}")
    return card
