"""Strided convolutions whose input gradient runs as matrix products (space-to-depth).

On XLA:CPU the input gradient of a strided conv like the Nature-CNN's 8x8/4 (a transposed,
lhs-dilated conv) runs ~3x slower than the same arithmetic as a reshape plus matrix products
(space-to-depth), while the forward conv is as fast or faster as a conv (much faster with
YNNPACK, see `jaxsal.cpu`). The gradient and CAM methods apply this by default as a rule on
the traced function (`conv_rule`, used by `jaxsal.backprop.rules.rewrite`): every eligible
`conv_general_dilated` of any apply_fn keeps its forward and gets the matmul input gradient.
`fast_apply(apply_fn)` is the older per-model form (flax `nn.Conv` only), kept for callers.
"""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jaxsal.caching import LRU, fn_key, memo

__all__ = ["fast_apply", "conv_s2d", "conv_hybrid", "conv_eligible", "conv_rule",
           "conv_rule_eligible"]


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


def conv_rule_eligible(params: dict, x_aval, k_aval, min_stride: int = 2) -> bool:
    """True for a `conv_general_dilated` equation (its params and operand avals) that
    `conv_rule` serves exactly: 2-D, stride >= min_stride on some axis, no dilation or groups,
    non-negative padding, float32 operands and result. Anything else keeps XLA's gradient."""
    strides = tuple(params.get("window_strides", ()))
    if len(strides) != 2 or max(strides) < min_stride:
        return False
    if any(d != 1 for d in params.get("lhs_dilation", (1, 1))) \
            or any(d != 1 for d in params.get("rhs_dilation", (1, 1))):
        return False
    if params.get("feature_group_count", 1) != 1 or params.get("batch_group_count", 1) != 1:
        return False
    if getattr(x_aval, "dtype", None) != jnp.float32 or getattr(k_aval, "dtype", None) != jnp.float32:
        return False
    pet = params.get("preferred_element_type")
    if pet is not None and jnp.dtype(pet) != jnp.float32:
        return False
    pads = params.get("padding", ())
    try:
        return len(pads) == 2 and all(int(lo) >= 0 and int(hi) >= 0 for lo, hi in pads)
    except (TypeError, ValueError):
        return False


def _perm(spec):
    """(N|O, C|I, S0, S1) spec -> permutation to NHWC (lhs/out) order."""
    return (spec[0], spec[2], spec[3], spec[1])


@memo("strided conv rules", 256)
def _rule_for(items: tuple):
    params = dict(items)
    dn = params["dimension_numbers"]
    x_perm, o_perm = _perm(dn.lhs_spec), _perm(dn.out_spec)
    k_perm = (dn.rhs_spec[2], dn.rhs_spec[3], dn.rhs_spec[1], dn.rhs_spec[0])  # -> HWIO
    x_inv = tuple(int(i) for i in np.argsort(x_perm))
    strides = tuple(params["window_strides"])
    pads = tuple(tuple(int(q) for q in p) for p in params["padding"])
    precision = params.get("precision")

    def conv(x, k):
        return lax.conv_general_dilated_p.bind(x, k, **params)

    @jax.custom_vjp
    def f(x, k):
        return conv(x, k)

    def fwd(x, k):
        return conv(x, k), (x, k)

    def bwd(res, dy):
        x, k = res
        xn, kn = jnp.transpose(x, x_perm), jnp.transpose(k, k_perm)
        dxn = jax.vjp(lambda u: conv_s2d(u, kn, strides, pads, precision), xn)[1](
            jnp.transpose(dy, o_perm))[0]
        dk = jax.vjp(lambda kk: conv(x, kk), k)[1](dy)[0]
        return jnp.transpose(dxn, x_inv), dk

    f.defvjp(fwd, bwd)
    return f


def conv_rule(params: dict):
    """`f(x, kernel)`: the `conv_general_dilated` equation with these params, same forward
    (the very primitive), input gradient through `conv_s2d`'s matmuls in NHWC order (operands
    transposed as the dimension numbers say), kernel gradient XLA's own. Check
    `conv_rule_eligible` first. Reverse mode only (custom VJP)."""
    return _rule_for(tuple(sorted(params.items())))


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


_WRAPPED = LRU("fast-conv wrappers", 256)  # apply_fn -> wrapper (bound methods are fresh objects, so no weakrefs)


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
    try:
        key = (fn_key(apply_fn), int(min_stride))
        hit = _WRAPPED.get(key)
    except TypeError:  # a callable that captures an array: wrap without memoising
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
