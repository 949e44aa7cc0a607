"""Integrated Gradients (Sundararajan 2017): the path integral (jaxsal.engine.path_integral) of the
input gradient."""
from __future__ import annotations

from jaxsal import engine
from jaxsal.backprop.single_backward import RULED_GRADIENT

integrated_gradients = engine.register(engine.path_integral(
    RULED_GRADIENT, steps=50, baseline="black", quadrature_option="method", name="integrated_gradients", doc=(
        """Integrated Gradients (Sundararajan 2017): (x - x0) * sum_k w_k dy/dx(x0 + a_k (x - x0)).

    The gradient is summed over a quadrature (`method`, default right Riemann, alpha in (0, 1])
    of the straight path from the baseline x0 to each state x. With rule="guided" or "deconvnet"
    the path gradients go through rewritten ReLUs (guided IG; completeness then does not hold).
    Any other method: `jaxsal.path_integral(method)`.
    """)), module=__name__)
