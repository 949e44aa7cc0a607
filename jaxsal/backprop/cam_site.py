"""Where a CAM method reads its activations A: the module output, or the post-ReLU activation.

`layer_activation="module"` (same as None, the default) takes A = the named module's output,
as Captum's LayerGradCam and pytorch-grad-cam do when handed a module. On our agents (conv ->
LayerNorm -> ReLU) that is before the LayerNorm and the ReLU, so A can be negative.
`layer_activation="post_relu"` takes A = ReLU of what the ReLU actually sees: the named
module's output, or, when normalisation modules follow it directly (same output shape, class
name containing "Norm", e.g. our `conv3_norm`), the outermost of those; its gradient is dY/dA
at that point. This is the A of Selvaraju et al. and of Paper A's method description (feature maps
after the ReLU). It assumes the network applies a ReLU right there, as the Nature CNN does;
flax ReLUs are functions, not modules, so this cannot be checked from the module calls.
As with any `layer_activation`, dY/dA is read through the network's own ReLU, so it is 0 where
A = 0; a hook on a separate ReLU module (pytorch-grad-cam) keeps the next layer's gradient there,
which changes the channel weights w_k (tests/backprop/test_cam_site.py checks against the masked form).

Why the default stays "module": it needs no assumption about the network, matches the peers a
user compares with (Captum, pytorch-grad-cam on a conv module), and keeps earlier results
reproducible; Paper B reproductions report both (experiments/paper_b/run.py).
"""
from __future__ import annotations

from jaxsal.errors import SaliencyInputError
from jaxsal.backprop.layers import layer_calls, resolve_layer

CAM_ACTIVATIONS = ("module", "post_relu")


def cam_site(apply_fn, params, x, layer, activation):
    """(layer to tap, activation for layers.tap) for layer_activation = "module" / "post_relu"."""
    if activation == "module":
        return layer, None
    if activation != "post_relu":
        raise SaliencyInputError(f"cam_site handles {CAM_ACTIVATIONS}, got {activation!r}")
    name = resolve_layer(apply_fn, params, x, layer)
    calls = layer_calls(apply_fn, params, x)
    idx = [i for i, c in enumerate(calls) if name in (c.name, c.qualified)]
    if len(idx) != 1:
        raise SaliencyInputError(f"layer {name!r} is called {len(idx)} times; post_relu needs one call")
    i = j = idx[0]
    while (j + 1 < len(calls) and calls[j + 1].shape == calls[i].shape
           and "norm" in calls[j + 1].kind.lower()):
        j += 1
    site = calls[j]
    unique = sum(c.name == site.name for c in calls) == 1
    return (site.name if unique else site.qualified), "relu"
