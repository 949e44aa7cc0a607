"""SmoothGrad (Smilkov 2017): the noise tunnel (jaxsal.engine.noise_tunnel) of the input gradient."""
from __future__ import annotations

from jaxsal import engine
from jaxsal.backprop.single_backward import RULED_GRADIENT

smoothgrad = engine.register(engine.noise_tunnel(RULED_GRADIENT, n=50, sigma=0.15, name="smoothgrad", doc=(
    """SmoothGrad (Smilkov 2017): gradients of n_samples noisy copies x + N(0, s^2).

    s = sigma * (max(x) - min(x)) per state (the paper's noise level; 0.15 default).
    variant "mean": mean gradient; "sg2" (or "squared"): mean squared gradient (SmoothGrad^2);
    "vargrad": variance of the gradients. Noise for state i, sample j comes from
    fold_in(fold_in(key, i), j), so results do not depend on batch_size. rule="guided"/"deconvnet"
    takes each gradient through guided/deconvnet ReLUs (guided SmoothGrad); fast_conv as for
    `gradient`. fast_prefix (variant "mean"): the model's affine input prefix (e.g. a first conv)
    is transposed once per state instead of once per sample, exactly (`jaxsal.backprop.pathavg`);
    False runs every sample's full backward. Any other method: `jaxsal.noise_tunnel(method)`.
    """)), module=__name__)
