"""SmoothGrad (Smilkov 2017): the noise tunnel (jaxsal.engine.noise_tunnel) of the input gradient."""
from __future__ import annotations

from jaxsal import engine
from jaxsal.backprop.single_backward import RULED_GRADIENT

smoothgrad = engine.register(engine.noise_tunnel(RULED_GRADIENT, n=50, sigma=0.15, name="smoothgrad", doc=(
    """SmoothGrad (Smilkov 2017): the mean input gradient over n_samples noisy copies x + N(0, s^2).

    s = sigma * (max(x) - min(x)) per state, the paper's noise level. Noise for state i, sample j
    comes from fold_in(fold_in(key, i), j), so maps do not depend on batch_size. `variant` gives
    SmoothGrad^2 or VarGrad instead, `rule` guided or deconvnet gradients (guided SmoothGrad).
    Any other method: `jaxsal.noise_tunnel(method)`.
    """)), module=__name__)
