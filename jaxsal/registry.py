"""Method registry: every saliency method registers under its name for `jaxsal.explain`."""
from __future__ import annotations

import difflib
import importlib
import inspect
import pkgutil
from typing import Callable

import numpy as np

from jaxsal import caching
from jaxsal.errors import SaliencyInputError
from jaxsal.checks import resolve_layout

METHODS: dict[str, Callable] = {}
STOCHASTIC: set[str] = set()
SPECS: dict = {}
"""name -> jaxsal.engine.Spec of the methods the engine runs (jaxsal.engine.register)."""
EXAMPLES: dict[str, dict] = {}
"""name -> tiny options of a function method's generated conformance case (a spec carries its own)."""
TABLES: list[dict] = []
"""Other tables keyed by method name (jaxsal.backprop.cam.CAMS): `unregister` clears them too."""
REPLACED: dict[str, list] = {}
"""name -> the entries that `replace=True` registrations shadowed, newest last (`unregister` restores)."""
SHIPPED: dict[str, Callable] = {}
"""name -> method function of the methods jaxsal itself registers (`discover`, at `import jaxsal`)."""
METHOD_PACKAGES = ("jaxsal.backprop", "jaxsal.perturbation")
"""The packages whose modules hold jaxsal's own methods (`discover` imports each of them)."""
_discovered = False
"""Whether `discover` ran (its first call, from `import jaxsal`, counts earlier registrations too)."""


def discover(packages: tuple = METHOD_PACKAGES) -> list[str]:
    """Import every public module of the method packages, so that a method's file registers it
    with no import line in a package `__init__`; the methods registered meanwhile are shipped.

    Packages in the given order, modules by name; a module whose name starts with "_" is a helper,
    imported by the modules that use it. A module already imported is not run again, so a later
    call imports only files added since. `import jaxsal` calls it last (a method file can use all
    of `jaxsal`, `jaxsal.register` included); that first call also counts as shipped the methods
    that jaxsal's own imports registered before it.

    Args:
        packages (tuple[str, ...]): the packages to search.

    Returns:
        list[str]: the names of the methods registered (or re-registered) meanwhile, sorted.
    """
    global _discovered
    before = dict(METHODS) if _discovered else {}
    for package in packages:
        path = importlib.import_module(package).__path__
        for name in sorted(m.name for m in pkgutil.iter_modules(path)):
            if not name.startswith("_"):
                importlib.import_module(f"{package}.{name}")
    _discovered = True
    found = {name: fn for name, fn in METHODS.items() if before.get(name) is not fn}
    SHIPPED.update(found)
    return sorted(found)


def identity(fn) -> tuple:
    """Who defined a registered method: (module, qualified name); a CAM variant names its weights."""
    return getattr(fn, "jaxsal_identity", (getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)))


def check_free(name: str, ident: tuple, replace: bool = False):
    """Refuses a method name that another definition holds (unless `replace`): registering a taken
    name would silently swap a built-in method for every caller. The same definition run again
    (a reloaded module, a re-run notebook cell) may register again."""
    if not isinstance(name, str) or not name:
        raise SaliencyInputError(f"a method name must be a non-empty string, got {name!r}")
    old = METHODS.get(name)
    if old is not None and not replace and identity(old) != tuple(ident):
        raise SaliencyInputError(
            f"method {name!r} is already registered ({'.'.join(map(str, identity(old)))}); choose another "
            f"name, or pass replace=True to replace it for every caller")


def register(name: str, stochastic: bool = False, *, replace: bool = False, example: dict | None = None):
    """Decorator: make `fn(apply_fn, params, obs, **kwargs)` available as `explain(method=name)`;
    `example`: tiny options for its generated conformance case. A name that another method holds
    is refused unless `replace=True` (jaxsal.register is the public way in)."""
    def wrap(fn):
        check_free(name, identity(fn), replace)
        if name in METHODS and identity(METHODS[name]) != identity(fn):
            REPLACED.setdefault(name, []).append(_entry(name))
        _drop(name)
        METHODS[name] = fn
        if stochastic:
            STOCHASTIC.add(name)
        if example is not None:
            EXAMPLES[name] = dict(example)
        return fn
    return wrap


def _entry(name: str) -> tuple:
    """Everything registered under `name`: (method, spec, stochastic, example, row of each table)."""
    return (METHODS.get(name), SPECS.get(name), name in STOCHASTIC, EXAMPLES.get(name),
            [t.get(name) for t in TABLES])


def _drop(name: str) -> tuple:
    """Remove `name` from every table; returns what was there (_entry)."""
    entry = _entry(name)
    for table in (METHODS, SPECS, EXAMPLES, *TABLES):
        table.pop(name, None)
    STOCHASTIC.discard(name)
    return entry


def _restore(name: str, entry: tuple):
    fn, spec, stochastic, example, rows = entry
    for table, value in [(METHODS, fn), (SPECS, spec), (EXAMPLES, example), *zip(TABLES, rows)]:
        if value is not None:
            table[name] = value
    if stochastic:
        STOCHASTIC.add(name)


def unregister(name: str) -> None:
    """Remove a method added with `jaxsal.register` (or `jaxsal.register_cam`), with the compiled
    programs cached for it; a method it replaced (`replace=True`) is registered again.

    Args:
        name (str): the method's name.

    Raises:
        jaxsal.SaliencyInputError: no method has this name, or it ships with jaxsal (replace it with
            `jaxsal.register(..., replace=True)` instead).
    """
    if not isinstance(name, str) or name not in METHODS:
        raise SaliencyInputError(f"no method {name!r} is registered; registered: {', '.join(sorted(METHODS))}")
    if SHIPPED.get(name) is METHODS[name]:
        raise SaliencyInputError(f"method {name!r} ships with jaxsal and cannot be unregistered; register "
                                 "another under its name with jaxsal.register(..., replace=True)")
    fn, spec, _, _, rows = _drop(name)
    shadowed = REPLACED.get(name)
    if shadowed:
        _restore(name, shadowed.pop())
        if not shadowed:
            del REPLACED[name]
    pieces = [fn, spec, *rows] + [p for s in (spec, *rows) if isinstance(s, tuple) for p in s if callable(p)]
    kept = [*METHODS.values(), *SPECS.values(), *(r for t in TABLES for r in t.values())]
    kept = {id(p) for p in kept} | {id(p) for s in kept if isinstance(s, tuple) for p in s}
    caching.forget([p for p in pieces if id(p) not in kept])  # pieces a method still uses stay cached


def get_method(name: str) -> Callable:
    if not isinstance(name, str) or name not in METHODS:
        raise SaliencyInputError(f"unknown method {name!r}; available: {', '.join(sorted(METHODS))}")
    return METHODS[name]


def accepted_options(fn: Callable) -> list[str]:
    """Keyword options a method accepts (beyond apply_fn, params, obs)."""
    params = list(inspect.signature(fn).parameters.values())[3:]
    return [p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)]


def check_options(name: str, accepted, options, shown=None) -> None:
    """Options a method does not take are one error naming them (with the closest accepted name)
    and what it accepts (`shown`, default all of `accepted`): the one check of unknown options,
    for jaxsal.explain, a method function, the batch job and sweeps."""
    accepted = list(accepted)
    unknown = [k for k in options if k not in accepted]
    if unknown:
        shown = accepted if shown is None else list(shown)
        close = difflib.get_close_matches(str(unknown[0]), shown, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SaliencyInputError(f"method {name!r} has no option {', '.join(map(repr, unknown))}{hint}; it "
                                 f"accepts: {', '.join(shown)}")


FRONT_DEFAULTS = {"target": "q_chosen", "actions": None, "layout": None, "key": None, "batch_size": None,
                  "per_frame": False, "layer": None, "precision": "float32"}
"""The common arguments of `jaxsal.explain` with its defaults (tests/test_explain.py checks they agree)."""


def is_default(name: str, value) -> bool:
    """True for common argument `name` left at the front door's default."""
    d = FRONT_DEFAULTS.get(name, None)
    return value is d or (isinstance(value, str) and isinstance(d, str) and value == d)


def call_method(method, apply_fn, params, obs, common: dict, options: dict):
    """Call a method (a registered name, or a method function) with the common arguments it
    takes and the user's options.

    A common argument a method does not take is dropped when left at its default (None/False);
    set explicitly, or an unknown option, it is an error naming what the method accepts.
    """
    fn = method if callable(method) else get_method(method)
    name = method if isinstance(method, str) else fn.__name__
    accepted = accepted_options(fn)
    check_options(name, accepted, options)
    kwargs = dict(options)
    if "layout" in accepted and common.get("layout") is None:
        # resolved (and checked against the frames' shape) here, so a registered method of the
        # user's gets "NHWC"/"NCHW" as before; a method that does not take layout= is left alone
        common = dict(common, layout=_model_layout(apply_fn, obs))
    for k, v in common.items():
        if k in accepted:
            kwargs[k] = v
        elif k == "layout" and v is not None and v == _model_layout(apply_fn, obs):
            continue  # the layout the model's frames have anyway: nothing for the method to take
        elif not is_default(k, v):
            raise SaliencyInputError(f"method {name!r} does not take {k}={v!r}; it accepts: "
                                     f"{', '.join(accepted)}")
    return fn(apply_fn, params, obs, **kwargs)


COMMON_ARGS = tuple(FRONT_DEFAULTS)


def _model_layout(apply_fn, obs) -> str:
    """The layout a call with layout=None uses: the model's declared one, else NHWC (checked
    against the frames' shape)."""
    shape = tuple(obs.shape) if hasattr(obs, "shape") else np.shape(obs)
    return resolve_layout(shape, None, getattr(apply_fn, "jaxsal_layout", None))


def method_options(name: str) -> dict:
    """A method's own options with their defaults, e.g. method_options("rise") -> {"n_masks": 1000, ...}.

    The common arguments of `jaxsal.explain` (target, layer, layout, per_frame, key, batch_size,
    actions, precision) are left out.

    Args:
        name (str): a method name, one of `jaxsal.methods()`.

    Returns:
        dict: option name -> its default (None where the option has no default).

    Raises:
        jaxsal.SaliencyInputError: `name` is not a registered method.
    """
    fn = get_method(name)
    sig = inspect.signature(fn)
    return {k: (None if p.default is inspect.Parameter.empty else p.default)
            for k, p in list(sig.parameters.items())[3:]
            if k not in COMMON_ARGS and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}


def options_table() -> str:
    """Every registered method and its options with defaults, one line each.

    Returns:
        str: lines "name: option=default, ..." ("no options" for a method without any), sorted by name.
    """
    lines = []
    for name in sorted(METHODS):
        opts = method_options(name)
        lines.append(f"        {name}: " + (", ".join(f"{k}={v!r}" for k, v in opts.items()) or "no options"))
    return "\n".join(lines)
