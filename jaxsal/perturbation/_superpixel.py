"""Exact fast forward pass for superpixel on/off perturbations (LIME): the first conv as a sum
over the superpixels its windows see.

A LIME sample sets every pixel either to the state's value or to the fill, superpixel by
superpixel. Where the code feeding the model's first conv is pixelwise (x / 255, a per-pixel
LayerNorm: proven at trace time by jaxsal.perturbation._locality), the conv's input is then,
pixel by pixel, either u_x (the clean state's) or u_f (the fill image's), so, the conv being
linear in its input,

    conv(u(z)) = conv(u_f) + sum_s z_s conv_nobias((u_x - u_f) * [segment == s]).

Each output window sees only a few superpixels (5-15 of Paper B's 130-490 on Atari frames), so
per window the sum has a few terms, computed once per state: a sample's conv output is a
(k slots) x (out channels) product per window instead of the conv over every input pixel, and
the perturbed frames are never built (XLA drops them when nothing else reads them). The rest of
the model runs as it is. Results equal the plain path up to float rounding; a model whose first
conv is not a flax `nn.Conv` (VALID, no dilation or groups) fed pixelwise keeps the plain path.
"""
from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from jaxsal.backprop.strided_conv import as_pair
from jaxsal.perturbation._incremental import _eligible, _is_conv_call, proven_local

SLOT_MULTIPLE = 4
"""Slots per window are rounded up to a multiple of this: the slot count is part of the compiled
program, and states with a few more superpixels per window should not compile a new one."""


class FirstConv(NamedTuple):
    """The first conv's geometry (static: part of the compile-cache key) and its slot count."""
    kernel_hw: tuple
    strides: tuple
    out_hw: tuple
    slots: int


def first_conv(apply_fn, params, x_shape, layout: str):
    """(kernel (kh, kw), strides, output (oh, ow)) of the model's first flax conv when the exact
    path applies to it: VALID, no dilation or groups, its input the image's size and pixelwise
    in the frames (x_shape: one call's frames, NHWC or NCHW as `layout`); else None."""
    record = {}
    spec = jax.ShapeDtypeStruct((1,) + tuple(x_shape[1:]), jnp.float32)
    shape_of = lambda a: jax.ShapeDtypeStruct(jnp.shape(a), jnp.result_type(a))  # noqa: E731
    try:
        # a new function each time: eval_shape caches its traces, and a cached one records nothing
        jax.eval_shape(lambda p, x: record.update(_first_conv_call(apply_fn, p, x)), jax.tree.map(shape_of, params),
                       spec)
    except Exception:  # noqa: BLE001 - a model that will not trace this way keeps the plain path
        return None
    if "u" not in record:
        return None
    u, y, module, extra_args = record["u"], record["y"], record["module"], record["extra_args"]
    hw = tuple(x_shape[1:3]) if layout == "NHWC" else tuple(x_shape[2:4])
    if extra_args or not _eligible(module, u) or tuple(u.shape[1:3]) != hw or y.ndim != 4:
        return None
    record_specs = [(shape_of(u), shape_of(y))]
    if not proven_local(apply_fn, params, spec, record_specs, layout)[0]:
        return None
    return tuple(module.kernel_size), as_pair(module.strides), tuple(y.shape[1:3])


def _windows(kernel_hw, strides, out_hw):
    """(rows, cols) (P, kh * kw) of the input pixels each output window reads, P = oh * ow."""
    (kh, kw), (sh, sw), (oh, ow) = kernel_hw, strides, out_hw
    r = (np.arange(oh) * sh)[:, None, None, None] + np.arange(kh)[None, None, :, None]
    c = (np.arange(ow) * sw)[None, :, None, None] + np.arange(kw)[None, None, None, :]
    r, c = np.broadcast_arrays(r, c)
    return r.reshape(oh * ow, kh * kw), c.reshape(oh * ow, kh * kw)


def slot_tables(segments: np.ndarray, geometry, dummy: int = 0):
    """Per state and output window, its superpixels as slots, on the host.

    Returns (FirstConv, pixel_slot (N, P, kh * kw) int32: the slot of each pixel the window reads,
    slot_segment (N, P, slots) int32: the superpixel of each slot, `dummy` where the window has
    fewer: no pixel is in those slots, so their terms are 0 whatever the sample says)."""
    kernel_hw, strides, out_hw = geometry
    rows, cols = _windows(kernel_hw, strides, out_hw)
    win = np.asarray(segments)[:, rows, cols].astype(np.int64)      # (N, P, q)
    n, p, q = win.shape
    flat = win.reshape(n * p, q)
    srt = np.sort(flat, axis=1)
    first = np.ones_like(srt, dtype=bool)
    first[:, 1:] = srt[:, 1:] != srt[:, :-1]
    rank = np.cumsum(first, axis=1) - 1                               # slot of each sorted entry
    slots = int(rank.max()) + 1
    slots = min(q, -(-slots // SLOT_MULTIPLE) * SLOT_MULTIPLE)
    # each pixel's slot: the rank of its label's first sorted occurrence in its window
    span = int(srt.max()) + 1
    keys = srt + np.arange(n * p)[:, None] * span
    at = np.searchsorted(keys.ravel(), (flat + np.arange(n * p)[:, None] * span).ravel())
    pixel_slot = rank.ravel()[at].reshape(n, p, q)
    slot_segment = np.full((n * p, slots), dummy, np.int64)
    row_of = np.broadcast_to(np.arange(n * p)[:, None], srt.shape)
    slot_segment[row_of[first], rank[first]] = srt[first]
    return (FirstConv(tuple(kernel_hw), tuple(strides), tuple(out_hw), slots),
            pixel_slot.astype(np.int32), slot_segment.reshape(n, p, slots).astype(np.int32))


def _first_conv_call(apply_fn, params, x) -> dict:
    """The model's first flax conv call on x: its input u, output y, module and whether it took other
    arguments than u; {} where the model has none (the rest of the model is dead code under jit)."""
    rec = {}

    def recorder(next_fun, args, kwargs, ctx):
        out = next_fun(*args, **kwargs)
        if _is_conv_call(args, ctx) and "u" not in rec:
            rec.update(u=args[0], y=out, module=ctx.module, extra_args=bool(kwargs) or len(args) != 1)
        return out

    with jax.disable_jit(), nn.intercept_methods(recorder):
        apply_fn(params, x)
    return rec


def _first_conv_io(apply_fn, params, x):
    """(input, output, kernel) of the model's first flax conv on x."""
    rec = _first_conv_call(apply_fn, params, x)
    return rec["u"], rec["y"], rec["module"].variables["params"]["kernel"]


def per_chunk(apply_fn, params, x, x_fill, pixel_slot, conv: FirstConv):
    """What every sample of a chunk's states reads: the fill image's conv output (S, oh, ow, O) and
    each window's per-slot terms (S, P, slots, O). x, x_fill: the states and their fill images in
    the model's layout."""
    u_x, _, kernel = _first_conv_io(apply_fn, params, x)
    u_f, y_f, _ = _first_conv_io(apply_fn, params, x_fill)
    rows, cols = _windows(conv.kernel_hw, conv.strides, conv.out_hw)
    delta = (u_x - u_f)[:, rows, cols]                                 # (S, P, q, C)
    kernel = kernel.reshape(-1, *kernel.shape[2:]).astype(delta.dtype)  # (q, C, O)
    hi = jax.lax.Precision.HIGHEST
    terms = jnp.einsum("spqc,qco->spqo", delta, kernel, precision=hi)
    onehot = jax.nn.one_hot(pixel_slot, conv.slots, dtype=terms.dtype)  # (S, P, q, slots)
    return y_f, jnp.einsum("spqo,spqj->spjo", terms, onehot, precision=hi)


def apply(apply_fn, params, x_pert, on, slot_segment, y_fill, slot_terms, conv: FirstConv):
    """apply_fn(params, x_pert) for x_pert (S * k rows, state-major) = k superpixel samples of each
    of S states; on (k, d): each sample's superpixels on (1) or off (0). The first conv's output
    comes from the slots; x_pert feeds any other use of the frames (none in a plain CNN: XLA then
    never builds it)."""
    s, k = slot_segment.shape[0], on.shape[0]
    z = jax.vmap(lambda seg: on[:, seg])(slot_segment)                 # (S, k, P, slots)
    # a multiply-add over the few slots, fused into one pass writing the output: as a dot batched
    # over windows, XLA:CPU ran it 3.5x slower (400 tiny products, then a transpose)
    dy = jnp.sum(z[..., None] * slot_terms[:, None], axis=3)           # (S, k, P, O)
    y = y_fill[:, None] + dy.reshape((s, k) + y_fill.shape[1:])
    y = y.reshape((s * k,) + y.shape[2:])
    seen = {"first": True}

    def swap(next_fun, args, kwargs, ctx):
        if not (_is_conv_call(args, ctx) and seen["first"]):
            return next_fun(*args, **kwargs)
        seen["first"] = False
        out = next_fun(*args, **kwargs)  # dead code under jit where y stands in for it
        return y.astype(out.dtype) if out.shape == y.shape else out

    with jax.disable_jit(), nn.intercept_methods(swap):
        return apply_fn(params, x_pert)
