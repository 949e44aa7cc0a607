"""The one chunk runner: any per-chunk function over any number of states, eager or traced.

Eager (concrete inputs): a Python loop over a jitted function, each chunk padded to one of a
few bucket sizes (1, 4, 16, ... up to the chunk size) so that calls with N = 64, 63, 50 or 17
states reuse one compiled program; each chunk's batch axis is sharded over the local devices.
Traced (inside the caller's jit / vmap / scan): the same chunks run in `lax.map`, so
`batch_size` still bounds the rows per step (measured 10-20% slower than the Python loop for the
Nature CNN's gradient on XLA:CPU, jax 0.10). Results stay on device.
"""
from __future__ import annotations

import functools
import math
import os
import types
from collections import OrderedDict
from typing import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxsal.errors import SaliencyInputError

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


def batch_sharding():
    """NamedSharding splitting axis 0 over all local devices, or None with a single device."""
    devices = jax.local_devices()
    if len(devices) == 1:
        return None
    return NamedSharding(Mesh(devices, ("batch",)), PartitionSpec("batch"))


def default_rows() -> int:
    """Model rows per compiled call when the caller gives no batch_size.

    XLA:CPU runs the Nature-CNN ~2x faster per row at 32-64 rows than at 256-1024 (cache-sized
    working set; measured on the 2-core dev VM: gradient 577 vs 301 maps/s, occlusion 6.2 vs
    2.8), so small chunks on CPU; accelerators want large batches.
    """
    per_device = 64 if jax.default_backend() == "cpu" else 4096
    return per_device * jax.local_device_count()


BUCKET_BASE = 4
"""Chunk sizes below the full chunk are powers of 4: at most 4x padding for a small batch,
and at most four compiled programs below 64 states (a compile costs ~2 s, 64 rows ~40 ms)."""


def bucket(n: int, cap: int) -> int:
    """The smallest of 1, 4, 16, ... (below cap) or cap itself that holds n states (n <= cap)."""
    b = 1
    while b < n and b * BUCKET_BASE < cap:
        b *= BUCKET_BASE
    return b if b >= n else cap


def chunk_size(n: int, batch_size: int | None, rows_per_state: int = 1) -> int:
    """States per chunk: at most batch_size model rows (states x samples), a bucket size for a
    batch smaller than one chunk, a multiple of the device count."""
    if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(batch_size, int)
                                   or batch_size < 1):
        raise SaliencyInputError(f"batch_size must be a positive integer, got {batch_size!r}")
    per = n if batch_size is None else max(1, batch_size // max(1, rows_per_state))
    if n < per:
        per = bucket(n, per)
    ndev = jax.local_device_count()
    return int(math.ceil(per / ndev) * ndev)


def is_traced(*trees) -> bool:
    """True if any leaf is a tracer: the call runs inside the caller's jit / vmap / scan /
    grad, so value checks and host work must wait (or be skipped) and chunks run in lax.map."""
    return any(isinstance(leaf, jax.core.Tracer) for leaf in jax.tree.leaves(trees))


def in_host_memory(x) -> bool:
    """A concrete jax array whose every shard lives on a CPU device: numpy views it without a copy."""
    return (isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)
            and all(d.platform == "cpu" for d in x.devices()))


def head(x, k: int = 1):
    """x's first k rows, through numpy for arrays in host memory (a device slice compiles one
    program per new number of states); for probing shapes and structure."""
    return (np.asarray(x) if in_host_memory(x) else x)[:k]


def pad_rows(x, size):
    """x (m, ...) padded to `size` rows by repeating its last row (results of padded rows are
    cut off; repeating a real row keeps them finite)."""
    m = x.shape[0]
    if m == size:
        return x
    if isinstance(x, np.ndarray):  # host input: pad on the host (no per-shape XLA program)
        return np.concatenate([x, np.repeat(x[-1:], size - m, axis=0)], axis=0)
    return jnp.concatenate([x, jnp.repeat(x[-1:], size - m, axis=0)], axis=0)


def iter_chunks(arrays, size: int):
    """Yield (chunk arrays padded to `size` rows and sharded over local devices, real rows)."""
    n = arrays[0].shape[0]
    sharding = batch_sharding()
    # a jax array in host memory is sliced and padded as a numpy view: device slices and pads
    # would compile a program per new number of states
    arrays = [np.asarray(a) if in_host_memory(a) else a for a in arrays]
    for start in range(0, n, size):
        chunk = [pad_rows(a[start:start + size], size) for a in arrays]
        # always device arrays, so every chunk hits the same jit cache entry (numpy and jax
        # arguments of one shape are separate entries); a host array through device_put, which
        # is a copy, where jnp.asarray compiles a program per new shape and dtype
        chunk = [jax.device_put(c, sharding) if sharding is not None or isinstance(c, np.ndarray)
                 else jnp.asarray(c) for c in chunk]
        yield chunk, min(size, n - start)


def cut(x, m: int):
    """x's first m rows. On CPU devices through numpy: a device slice is one XLA program per
    new (shape, m), compiled at ~0.2 s, so every new number of states would pay a compile."""
    if x.shape[0] == m:
        return x
    if in_host_memory(x):
        return jax.device_put(np.asarray(x)[:m])
    return x[:m]


def concat(outs: list):
    """Concatenate per-chunk output pytrees along axis 0 (on CPU devices in numpy, for the
    reason `cut` gives: a device concatenate compiles once per new number of chunks)."""
    if len(outs) == 1:
        return outs[0]

    def cat(*xs):
        if all(in_host_memory(x) for x in xs):
            return jax.device_put(np.concatenate([np.asarray(x) for x in xs], axis=0))
        return jnp.concatenate(xs, axis=0)
    return jax.tree.map(cat, *outs)


def run(chunk_fn: Callable, arrays, size: int, traced: bool | None = None):
    """chunk_fn(chunk) over chunks of `size` states of `arrays` (a pytree of arrays with a
    common leading axis N); chunk_fn returns a pytree with leading axis `size`. Outputs are
    concatenated and cut to N rows.

    chunk_fn must be batch-independent (row i of its output depends only on row i of the
    chunk), so chunking and padding never change a result. Eager: a Python loop (chunk_fn
    should call jitted functions); traced: `lax.map` over the padded chunks.
    """
    leaves, tree = jax.tree.flatten(arrays)
    chex.assert_equal_shape_prefix(leaves, 1)  # trace-time: one leading axis of N states
    n = leaves[0].shape[0]
    if traced is None:
        traced = is_traced(arrays)
    if not traced:
        outs = [jax.tree.map(lambda o: cut(o, m), chunk_fn(jax.tree.unflatten(tree, chunk)))
                for chunk, m in iter_chunks(leaves, size)]
        return concat(outs)
    if n <= size:  # one program over the whole batch: nothing to pad under the caller's jit
        return chunk_fn(arrays)
    k = -(-n // size)
    stacked = [pad_rows(a, k * size).reshape((k, size) + a.shape[1:]) for a in leaves]
    out = jax.lax.map(lambda c: chunk_fn(jax.tree.unflatten(tree, c)), stacked)
    return jax.tree.map(lambda o: o.reshape((k * size,) + o.shape[2:])[:n], out)


def per_state(build: Callable[..., Callable], args: tuple, consts, *arrays, batch_size: int | None = None):
    """build(*args)(consts, *chunks) over the states of `arrays`, jitted once per build and
    args and run in bucket-padded chunks: glue after a method's main program (reshapes,
    resizes, weighted sums) compiles no new program for a new number of states. Traced: one
    call inside the caller's program."""
    fn = cached_jit(build, *args)
    if is_traced(consts, arrays):
        return fn(consts, *arrays)
    return map_batched(fn, consts, *arrays, batch_size=default_rows() if batch_size is None else batch_size)


def accumulate(fn: Callable, statics: list, traced: bool, first=None):
    """first + sum_g fn(statics[g]) over groups of equal-shaped statics (e.g. sample offsets;
    first None: no first term): a Python loop eagerly, `lax.scan` when traced (one traced copy
    of fn, not one per group)."""
    acc = first
    if not statics:
        return acc
    if not traced or len(statics) == 1:
        for st in statics:
            part = fn(st)
            acc = part if acc is None else jax.tree.map(jnp.add, acc, part)
        return acc
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *statics)
    if acc is None:
        acc = fn(jax.tree.map(lambda v: v[0], stacked))
        stacked = jax.tree.map(lambda v: v[1:], stacked)
    acc, _ = jax.lax.scan(lambda c, st: (jax.tree.map(jnp.add, c, fn(st)), None), acc, stacked)
    return acc


def map_batched(fn: Callable, params, *arrays, batch_size: int | None = None,
                rows_per_state: int = 1):
    """fn(params, *chunks) over the leading axis of `arrays` in chunks; outputs concatenated.

    fn must be jitted and batch-independent (row i of the output depends only on row i of the
    inputs), so chunking and padding never change a result. Works eagerly and traced.
    """
    size = chunk_size(arrays[0].shape[0], batch_size, rows_per_state)
    return run(lambda chunk: fn(params, *chunk), list(arrays), size,
               traced=is_traced(params, arrays))
