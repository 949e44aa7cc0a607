"""jaxsal's bounded caches: the registered LRU every cache is, `memo`, and the compile cache
`cached_jit`, keyed by `static_key` of everything a built function depends on."""
from __future__ import annotations

import functools
import os
import types
from collections import OrderedDict
from typing import Callable

import jax
import numpy as np

class LRU(OrderedDict):
    """A dict bounded to `maxsize` entries, least recently used evicted first, registered under
    `name`. Every cache of jaxsal is one (built functions, traced structure, loaded agents,
    small matrices), so long sessions (many models, shapes, options) never grow memory
    without bound, and `clear_caches` empties them all."""

    def __init__(self, name: str, maxsize: int):
        super().__init__()
        self.name, self.maxsize = name, maxsize
        _CACHES.append(self)

    def get_or_build(self, key, build: Callable[[], object]):
        if key in self:
            self.move_to_end(key)
            return self[key]
        value = build()
        self[key] = value
        return value

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        while len(self) > self.maxsize:
            self.popitem(last=False)


_CACHES: list[LRU] = []


def caches() -> list[LRU]:
    """Every jaxsal cache (each has a `name` and a `maxsize`; for tests and memory accounting)."""
    return list(_CACHES)


def clear_caches() -> None:
    """Empty every jaxsal cache, as in a fresh process.

    The caches hold built functions, traced model structure, loaded agents and small matrices;
    all are bounded, so clearing them is only needed to free memory or to time cold calls.
    """
    for c in _CACHES:
        c.clear()


def forget(objects) -> int:
    """Drop every cache entry whose key refers to one of `objects` (the object, its static_key, or
    a function defined inside it: a closure it builds per call): what `jaxsal.unregister` leaves
    behind of a removed method. Returns how many entries were dropped."""
    objects = [o for o in objects if o is not None]
    ids = {id(o) for o in objects}
    keys = set()
    for o in objects:
        try:
            keys.add(static_key(o))
        except TypeError:  # holds an array or an unhashable value: matched by identity only
            pass
    inner = tuple((f.__module__, f.__qualname__ + ".<locals>.") for f in objects
                  if isinstance(f, types.FunctionType))

    def refers(k) -> bool:
        if id(k) in ids:
            return True
        try:
            if k in keys:
                return True
        except TypeError:
            pass
        if isinstance(k, types.FunctionType):
            return any(k.__module__ == m and k.__qualname__.startswith(q) for m, q in inner)
        if isinstance(k, _Ref):
            return refers(k.obj)
        if isinstance(k, (tuple, list, frozenset, set)):
            return any(refers(v) for v in k)
        if isinstance(k, dict):
            return any(refers(a) or refers(b) for a, b in k.items())
        return isinstance(k, functools.partial) and refers((k.func, k.args, k.keywords))

    dropped = 0
    for cache in _CACHES:
        for key in [key for key in cache if refers(key)]:
            del cache[key]
            dropped += 1
    return dropped


def memo(name: str, maxsize: int, key: Callable[..., object] | None = None):
    """functools.lru_cache in a registered LRU: the function's result memoised on `key(*args,
    **kwargs)` (default static_key of the arguments), so it is bounded and `clear_caches`
    empties it; `key` must name everything the result depends on (e.g. an environment variable)."""
    def wrap(fn):
        cache = LRU(name, maxsize)
        make_key = key or (lambda *a, **kw: static_key((a, kw)))

        @functools.wraps(fn)
        def cached(*args, **kwargs):
            return cache.get_or_build(make_key(*args, **kwargs), lambda: fn(*args, **kwargs))
        cached.cache = cache
        cached.cache_clear = cache.clear
        return cached
    return wrap


JIT_CACHE_SIZE = 256
_JIT_CACHE = LRU("jit", JIT_CACHE_SIZE)


class _Ref:
    """Identity key of an object that is not (or must not be) compared by value: a user's
    function, an unhashable object. Holds the object, so its id cannot be reused meanwhile."""
    __slots__ = ("obj",)

    def __init__(self, obj):
        self.obj = obj

    def __hash__(self):
        return id(self.obj)

    def __eq__(self, other):
        return isinstance(other, _Ref) and other.obj is self.obj

    def __repr__(self):
        return f"_Ref({self.obj!r})"


_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep  # jaxsal's own code lives here
_ATOMS = (type(None), bool, int, float, complex, str, bytes, type, types.CodeType,
          type(Ellipsis), np.dtype, np.generic)


def static_key(value, _active=None):
    """A hashable key for everything `value` can make a traced function do.

    Numbers and strings by type and value; tuples, lists, dicts, partials by their contents;
    jaxsal's own functions (closures built per call) by code, defaults and the values they
    close over, recursively, so a built function's every captured shape, option and callable
    is in its key; any other function by identity (a user's apply_fn or target: it may read
    globals that change, so equal code is not equal behaviour); other objects by their own
    equality if hashable, else by identity. Arrays and tracers raise TypeError: a built
    function must take them as traced arguments, never capture them.
    """
    if isinstance(value, _ATOMS):
        return (type(value), value)
    if isinstance(value, (np.ndarray, jax.Array, jax.core.Tracer)):
        raise TypeError(f"cached_jit: a built function must not capture an array "
                        f"(shape {getattr(value, 'shape', '?')}); pass it as a traced argument")
    _active = set() if _active is None else _active
    if id(value) in _active:  # a recursive closure: its own code is already in the key
        return ("cycle", getattr(value, "__qualname__", type(value).__name__))
    _active.add(id(value))
    try:
        return _static_key(value, _active)
    finally:
        _active.discard(id(value))


def _static_key(value, active):
    k = lambda v: static_key(v, active)  # noqa: E731
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(k(v) for v in value))
    if isinstance(value, dict):
        return (type(value), tuple((k(a), k(b)) for a, b in value.items()))
    if isinstance(value, (set, frozenset)):
        return (type(value), frozenset(k(v) for v in value))
    if isinstance(value, functools.partial):
        return ("partial", k(value.func), k(value.args), k(value.keywords))
    if isinstance(value, types.FunctionType) and value.__code__.co_filename.startswith(_PKG_DIR):
        cells = []
        for c in value.__closure__ or ():
            try:
                cells.append(k(c.cell_contents))
            except ValueError:  # an empty cell (a name assigned after the closure was made)
                cells.append(("empty",))
        return ("fn", value.__module__, value.__qualname__, value.__code__,
                k(value.__defaults__), k(value.__kwdefaults__), tuple(cells))
    if isinstance(value, types.MethodType):
        return ("method", k(value.__func__), _Ref(value.__self__))
    try:  # any other object by its own equality (e.g. agent_spec.DeclaredFn), else identity
        hash(value)
    except TypeError:
        return _Ref(value)
    return ("obj", type(value), value)


def fn_key(fn):
    """A cache key for a function a cached result depends on, cheap on the hot path: jaxsal's
    own functions and partials by static_key (a closure built per call by what it captures),
    any other hashable callable as itself (its own equality: a user's function by identity),
    an unhashable one by identity."""
    f = getattr(fn, "__func__", fn)
    if isinstance(fn, functools.partial) or (isinstance(f, types.FunctionType)
                                             and f.__code__.co_filename.startswith(_PKG_DIR)):
        return static_key(fn)
    try:
        hash(fn)
    except TypeError:
        return _Ref(fn)
    return fn


def cached_jit(build: Callable[..., Callable], *args, **jit_kwargs) -> Callable:
    """jax.jit(build(*args), **jit_kwargs), memoised on `static_key` of (build, args, jit_kwargs).

    The key is derived from the build function (its code and everything it closes over) and
    its arguments, never written by hand, so nothing a built function depends on can be left
    out of it. Shapes and dtypes are best not captured at all (take them from the traced
    arguments: jax.jit retraces per input shape); what is captured is in the key anyway.
    The cache is an LRU of JIT_CACHE_SIZE entries.
    """
    key = (getattr(build, "__qualname__", type(build).__name__),
           static_key((build, args, tuple(sorted(jit_kwargs.items())))))
    return _JIT_CACHE.get_or_build(key, lambda: jax.jit(build(*args), **jit_kwargs))


def cache_names() -> list[str]:
    """The build functions' names of the cached jitted functions, oldest first (for tests)."""
    return [k[0] for k in _JIT_CACHE]
