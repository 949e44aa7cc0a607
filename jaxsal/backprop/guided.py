"""Guided backpropagation (Springenberg 2015) and deconvnet: input gradients through rewritten ReLUs.

Guided: R_in = 1[x > 0] 1[R_out > 0] R_out at every ReLU; deconvnet: R_in = 1[R_out > 0] R_out.
The rules act on any apply_fn via `jaxsal.backprop.rules.with_rule`. Signed maps.
"""
from __future__ import annotations

from jaxsal.backprop.family import compute
from jaxsal.registry import register


def _family(name, apply_fn, params, obs, **kw):
    return compute((name,), apply_fn, params, obs, **kw)[name]


@register("guided_backprop")
def guided_backprop(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None,
                    key=None, batch_size=None, per_frame=False, fast_conv=True):
    """Guided-backprop input attributions: (N, H, W) summed over frames, or (N, H, W, C)."""
    return _family("guided_backprop", apply_fn, params, obs, target=target, actions=actions,
                   layout=layout, batch_size=batch_size, per_frame=per_frame,
                   fast_conv=fast_conv)


@register("deconvnet")
def deconvnet(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None, key=None,
              batch_size=None, per_frame=False, fast_conv=True):
    """Deconvnet input attributions: (N, H, W) summed over frames, or (N, H, W, C)."""
    return _family("deconvnet", apply_fn, params, obs, target=target, actions=actions,
                   layout=layout, batch_size=batch_size, per_frame=per_frame,
                   fast_conv=fast_conv)
