"""Opt-in fast path: strided flax `nn.Conv` layers with a matmul input-gradient.

On XLA:CPU the input gradient of a strided conv like the Nature-CNN's 8x8/4 (a transposed,
lhs-dilated conv) runs ~3x slower than the same arithmetic as a reshape plus matrix products
(space-to-depth), while the forward conv is as fast or faster as a conv (much faster with
YNNPACK, see `jaxsal.cpu`). `fast_apply(apply_fn)` returns an apply_fn with the same signature
and the same outputs (up to float rounding) whose eligible convs run `conv_hybrid`: lax.conv
forward, space-to-depth matmul backward. Everything else is unchanged, so layer taps, guided
rules and the incremental perturbation path (flax interceptors / jaxpr rewrites) still work.
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

__all__ = ["fast_apply", "conv_s2d", "conv_hybrid", "conv_eligible"]


def as_pair(v, default=1):
    """A conv attribute (None, int or sequence) as an (h, w) int pair."""
    if v is None:
        return (default, default)
    if isinstance(v, int):
        return (v, v)
    return tuple(int(a) for a in v)


def conv_s2d(x, kernel, strides=(1, 1), padding="VALID", precision=None):
    """lax.conv_general_dilated(x, kernel, strides, padding) for NHWC x, HWIO kernel, as a matmul.

    The kernel is zero-padded to a multiple of the stride, the input is folded stride x stride
    into channels (space-to-depth), so the conv becomes a stride-1 conv with a ceil(k/s) kernel,
    done as ceil(k/s)^2 summed matrix products. Same result as the conv up to float rounding.
    """
    n, h, w, c = x.shape
    kh, kw, kc, o = kernel.shape
    if kc != c:
        raise ValueError(f"kernel expects {kc} input channels, input has {c}")
    sh, sw = as_pair(strides)
    pads = _pads((h, w), (kh, kw), (sh, sw), padding)
    if any(p != (0, 0) for p in pads):
        x = jnp.pad(x, ((0, 0), pads[0], pads[1], (0, 0)))
        n, h, w, c = x.shape
    oh, ow = (h - kh) // sh + 1, (w - kw) // sw + 1
    qh, qw = -(-kh // sh), -(-kw // sw)
    hn, wn = (oh + qh - 1) * sh, (ow + qw - 1) * sw
    # crop rows no output reads, or zero-pad up to the folded size (they meet zero weights)
    x = x[:, :min(h, hn), :min(w, wn)]
    if hn > x.shape[1] or wn > x.shape[2]:
        x = jnp.pad(x, ((0, 0), (0, hn - x.shape[1]), (0, wn - x.shape[2]), (0, 0)))
    if (sh, sw) == (1, 1):
        kernel = kernel.reshape(qh, qw, c, o)
    else:
        x = x.reshape(n, hn // sh, sh, wn // sw, sw, c).transpose(0, 1, 3, 2, 4, 5)
        x = x.reshape(n, hn // sh, wn // sw, sh * sw * c)
        k = jnp.pad(kernel, ((0, qh * sh - kh), (0, qw * sw - kw), (0, 0), (0, 0)))
        k = k.reshape(qh, sh, qw, sw, c, o).transpose(0, 2, 1, 3, 4, 5)
        kernel = k.reshape(qh, qw, sh * sw * c, o)
    # one matmul per kernel block, summed: measured faster here than concatenating the
    # blocks into a single im2col matrix (no copy of the input, forward and gradient)
    y = None
    for p in range(qh):
        for q in range(qw):
            t = lax.dot_general(x[:, p:p + oh, q:q + ow, :], kernel[p, q].astype(x.dtype),
                                (((3,), (0,)), ((), ())), precision=precision)
            y = t if y is None else y + t
    return y


def _pads(x_hw, k_hw, strides, padding):
    if isinstance(padding, str):
        return tuple(tuple(p) for p in lax.padtype_to_pads(x_hw, k_hw, strides, padding))
    return tuple(tuple(int(q) for q in p) for p in padding)


def conv_hybrid(x, kernel, strides=(1, 1), padding="VALID", precision=None):
    """lax.conv_general_dilated(x, kernel, strides, padding) (NHWC, HWIO) whose gradient with
    respect to x runs through `conv_s2d`'s matrix products instead of XLA's transposed conv.

    Same values and gradients up to float rounding (the kernel's gradient is lax.conv's own).
    Reverse mode only (a custom VJP): jax.jvp / jacfwd through it raise.
    """
    strides = as_pair(strides)
    pads = _pads(x.shape[1:3], kernel.shape[:2], strides, padding)
    return _conv_hybrid(x, kernel, strides, pads, precision)


def _lax_conv(x, kernel, strides, pads, precision):
    return lax.conv_general_dilated(x, kernel.astype(x.dtype), strides, pads,
                                    dimension_numbers=("NHWC", "HWIO", "NHWC"), precision=precision)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _conv_hybrid(x, kernel, strides, pads, precision):
    return _lax_conv(x, kernel, strides, pads, precision)


def _hybrid_fwd(x, kernel, strides, pads, precision):
    return _lax_conv(x, kernel, strides, pads, precision), (x, kernel)


def _hybrid_bwd(strides, pads, precision, res, dy):
    x, kernel = res
    dx = jax.vjp(lambda u: conv_s2d(u, kernel, strides, pads, precision), x)[1](dy)[0]
    dk = jax.vjp(lambda k: _lax_conv(x, k, strides, pads, precision), kernel)[1](dy)[0]
    return dx, dk


_conv_hybrid.defvjp(_hybrid_fwd, _hybrid_bwd)


def conv_eligible(module, x, min_stride: int = 2) -> bool:
    """True for a plain 2-D strided flax nn.Conv on a float32 NHWC batch: stride >= min_stride
    on some axis, no dilation, groups, mask, circular/causal padding or dtype change (anything
    else runs flax's own conv; stride-1 convs measured no faster as matmuls on XLA:CPU)."""
    if max(as_pair(getattr(module, "strides", 1))) < min_stride:
        return False
    if type(module) is not nn.Conv or getattr(x, "ndim", 0) != 4 or x.dtype != jnp.float32:
        return False
    if len(tuple(module.kernel_size)) != 2 or module.feature_group_count != 1:
        return False
    if module.mask is not None or as_pair(module.input_dilation) != (1, 1) \
            or as_pair(module.kernel_dilation) != (1, 1):
        return False
    if module.dtype not in (None, jnp.float32) or module.param_dtype != jnp.float32:
        return False
    pad = module.padding
    if isinstance(pad, str):
        return pad.upper() in ("VALID", "SAME")
    if isinstance(pad, int):
        return True
    try:
        return len(pad) == 2 and all(
            isinstance(p, int) or (len(p) == 2 and all(isinstance(q, int) for q in p)) for p in pad)
    except TypeError:
        return False


def _module_pads(pad):
    if isinstance(pad, str):
        return pad.upper()
    if isinstance(pad, int):
        return [(pad, pad), (pad, pad)]
    return [(p, p) if isinstance(p, int) else tuple(p) for p in pad]


def _interceptor(next_fun, args, kwargs, ctx, min_stride: int = 2):
    if ctx.method_name != "__call__" or kwargs or len(args) != 1 \
            or not conv_eligible(ctx.module, args[0], min_stride):
        return next_fun(*args, **kwargs)
    mod = ctx.module
    p = mod.variables["params"]
    y = conv_hybrid(args[0], p["kernel"], as_pair(mod.strides), _module_pads(mod.padding),
                    mod.precision)
    if mod.use_bias:
        y = y + p["bias"].reshape((1, 1, 1, -1))
    return y


_WRAPPED: dict = {}  # apply_fn -> wrapper (bound methods are fresh objects, so no weakrefs)


def fast_apply(apply_fn, min_stride: int = 2):
    """apply_fn(params, obs) with every eligible flax nn.Conv run as `conv_hybrid` (lax.conv
    forward, space-to-depth matmul input gradient).

    min_stride=1 also routes stride-1 convs that way, else they keep lax.conv.

    Same outputs up to float rounding (tested against the plain path). Memoised per apply_fn,
    so jaxsal's compiled-function caches keyed on apply_fn keep hitting. Functions without
    flax convs run unchanged.
    """
    if getattr(apply_fn, "_jaxsal_fastconv", False):
        return apply_fn
    key = (apply_fn, int(min_stride))
    try:
        hit = _WRAPPED.get(key)
    except TypeError:  # unhashable callable: wrap without memoising
        hit, cacheable = None, False
    else:
        cacheable = True
    if hit is not None:
        return hit

    interceptor = functools.partial(_interceptor, min_stride=int(min_stride))

    @functools.wraps(apply_fn)
    def wrapped(params, obs, *args, **kwargs):
        with nn.intercept_methods(interceptor):
            return apply_fn(params, obs, *args, **kwargs)

    wrapped._jaxsal_fastconv = True
    wrapped.__wrapped_apply__ = apply_fn
    if cacheable:
        _WRAPPED[key] = wrapped
    return wrapped
