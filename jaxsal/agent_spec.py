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

from jaxsal.errors import SaliencyInputError, brief

LAYOUTS = ("NHWC", "NCHW")


class AgentSpecError(SaliencyInputError):
    """An --agent SPEC that cannot be loaded or does not give (apply_fn, params)."""


class DeclaredFn:
    """`apply_fn` plus what jaxsal checks its inputs against: `jaxsal_layout` ("NHWC"/"NCHW")
    and `jaxsal_pixels` ("uint8": frames on the 0..255 scale, or None). Equal wrappers of the
    same function compare equal, so compiled-function caches keep hitting."""

    def __init__(self, fn: Callable, layout: str | None = None, pixels: str | None = None):
        self.fn = getattr(fn, "fn", fn) if isinstance(fn, DeclaredFn) else fn
        self.jaxsal_layout = layout
        self.jaxsal_pixels = pixels
        self.__name__ = getattr(self.fn, "__name__", "apply_fn")
        self.__doc__ = getattr(self.fn, "__doc__", None)

    def __call__(self, params, obs, *args, **kwargs):
        return self.fn(params, obs, *args, **kwargs)

    def _key(self):
        return (self.fn, self.jaxsal_layout, self.jaxsal_pixels)

    def __eq__(self, other):
        return isinstance(other, DeclaredFn) and self._key() == other._key()

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return f"DeclaredFn({self.__name__}, layout={self.jaxsal_layout!r}, pixels={self.jaxsal_pixels!r})"


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
    except Exception as e:
        raise AgentSpecError(f"--agent {spec}: {fname}() failed: {brief(e)}") from None
    return as_agent(obj, default_name=fname, layout=layout, where=f"--agent {spec}")


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
    if lay not in LAYOUTS:
        raise AgentSpecError(f"{where}: layout must be one of {LAYOUTS}, got {lay!r}")
    pixels = fields.get("pixels", getattr(apply_fn, "jaxsal_pixels", None))
    card = dict(fields.get("card") or {})
    name = str(fields.get("name") or card.get("name") or default_name)
    num_actions = fields.get("num_actions") or card.get("num_actions")
    return LoadedAgent(name=name, apply_fn=DeclaredFn(apply_fn, lay, pixels), params=fields["params"],
                       layout=lay, num_actions=None if num_actions is None else int(num_actions),
                       pixels=pixels, card=card)
