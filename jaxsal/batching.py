"""The one chunk runner: any per-chunk function over any number of states, eager or traced.

Eager (concrete inputs): a Python loop over a jitted function, each chunk padded to one of a
few bucket sizes (1, 4, 16, ... up to the chunk size) so that calls with N = 64, 63, 50 or 17
states reuse one compiled program; each chunk's batch axis is sharded over the local devices.
Traced (inside the caller's jit / vmap / scan): the same chunks run in `lax.map`, so
`batch_size` still bounds the rows per step (measured 10-20% slower than the Python loop for the
Nature CNN's gradient on XLA:CPU, jax 0.10). Results stay on device. The sizes come from
jaxsal.sizing, the compiled functions from jaxsal.caching.
"""
from __future__ import annotations

from typing import Callable

import chex
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from jaxsal import sizing
from jaxsal.caching import cached_jit


def batch_sharding():
    """NamedSharding splitting axis 0 over all local devices, or None with a single device."""
    devices = jax.local_devices()
    if len(devices) == 1:
        return None
    return NamedSharding(Mesh(devices, ("batch",)), PartitionSpec("batch"))


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


def on_device(tree):
    """tree with its host (numpy) arrays put on the default device once: a jitted program given a
    numpy array transfers it on every call, so a checkpoint's numpy params were copied again by
    each of a call's programs (the shipped agents' RISE: 80 transfers, ~15% of the call)."""
    leaves, treedef = jax.tree.flatten(tree)
    if not any(isinstance(v, np.ndarray) for v in leaves):
        return tree
    return jax.tree.unflatten(treedef, [jax.device_put(v) if isinstance(v, np.ndarray) else v for v in leaves])


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
    return map_batched(fn, consts, *arrays, batch_size=sizing.rows(batch_size))


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
    """fn(params, *chunks) over the leading axis of `arrays` in chunks of at most batch_size model
    rows, rows_per_state per state (jaxsal.sizing.plan; None: one chunk); outputs concatenated.

    fn must be jitted and batch-independent (row i of the output depends only on row i of the
    inputs), so chunking and padding never change a result. Works eagerly and traced.
    """
    size = sizing.plan(arrays[0].shape[0], batch_size, rows_per_state).states
    traced = is_traced(params, arrays)
    params = params if traced else on_device(params)
    return run(lambda chunk: fn(params, *chunk), list(arrays), size, traced=traced)
