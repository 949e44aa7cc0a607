"""Integrated Gradients (Sundararajan 2017): the path integral (jaxsal.engine.path_integral) of the
input gradient."""
from __future__ import annotations

from jaxsal import engine
from jaxsal.backprop.single_backward import RULED_GRADIENT

integrated_gradients = engine.register(engine.path_integral(
    RULED_GRADIENT, steps=50, baseline="black", quadrature_option="method", name="integrated_gradients", doc=(
        """Integrated Gradients (Sundararajan 2017): (x - x0) * sum_k w_k dy/dx(x0 + a_k (x - x0)).

    baseline: "black" (zeros), "blur" (spatial Gaussian blur of x, blur_sigma px), "uniform"
    (U(min x, max x) per state, needs key) or an array broadcastable to obs. method: the
    quadrature (default right Riemann, alpha in (0, 1]). return_error=True also returns the
    per-state completeness error sum(attributions) - (y(x) - y(x0)), shape (N,).
    rule="guided"/"deconvnet": path gradients through guided/deconvnet ReLUs (guided IG; then
    completeness does not hold). fast_conv as for `gradient`. fast_prefix: the model's affine
    input prefix (e.g. a first conv) runs on the two end points and is transposed once per state
    instead of once per step, exactly (`jaxsal.backprop.pathavg`); False runs every step whole.
    Any other method: `jaxsal.path_integral(method)`.
    """)), module=__name__)
