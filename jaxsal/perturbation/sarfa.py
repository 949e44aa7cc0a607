"""SARFA (Puri et al. 2020): specific and relevant feature attribution from local perturbations."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxsal import targets as T
from jaxsal.checks import output_shape
from jaxsal.perturbation import _common as C
from jaxsal.perturbation.noise import disk_grid


def sarfa_score(q0, q1, a):
    """SARFA saliency from clean and perturbed Q-vectors (rows, A) and actions (rows,).

    dP = p_a - p'_a with p = softmax(Q); K = 1 / (1 + KL(p_rem || p'_rem)), p_rem the softmax
    over the actions other than a; S = 2 K dP / (K + dP), and 0 where dP <= 0.
    """
    q0 = q0.astype(jnp.float32)
    q1 = q1.astype(jnp.float32)
    onehot = jax.nn.one_hot(a, q0.shape[-1], dtype=bool)
    dp = jnp.take_along_axis(jax.nn.softmax(q0) - jax.nn.softmax(q1), a[:, None], -1)[:, 0]
    # a's entry (-inf) is set to 0 before the product: -inf - -inf there would make the gradient NaN
    lr0, lr1 = (jnp.where(onehot, 0.0, jax.nn.log_softmax(jnp.where(onehot, -jnp.inf, q))) for q in (q0, q1))
    kl = jnp.sum(jnp.where(onehot, 0.0, jnp.exp(lr0) * (lr0 - lr1)), axis=-1)
    k = 1.0 / (1.0 + kl)
    pos = dp > 0
    s = 2.0 * k * dp / jnp.where(pos, k + dp, 1.0)
    return jnp.where(pos, s, 0.0)


# the method's signature and docstring; the function registered below runs SPEC on the engine
def sarfa(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None,
          batch_size=None, precision="float32", radius: float = 2.0, stride: int = 2, perturbation: str = "black",
          blur_sigma: float = 3.0, fill=0.0, mask_shape: str = "hard",
          upsample: str = "bilinear", obs_max=None, incremental: bool | None = None,
          return_grid: bool = False):
    """SARFA maps (Puri et al. 2020): specific and relevant attribution of the explained action,
    from disk perturbations every `stride` px, resized to the input.

    The score combines the drop of the action's softmax probability with how little the other
    actions' distribution changes (`sarfa_score`). Defaults are Paper B's (its code and stated
    parameters): a hard black disk of radius 2 (the pixels with dy^2 + dx^2 <= radius^2 set to
    `fill` in all stacked frames, no blur), centred every 2 px.

    Args:
        apply_fn (Callable): the model, `apply_fn(params, obs) -> output` (Q-values (N, A), or a
            dict/tuple with them or policy logits).
        params (PyTree): the model's parameters.
        obs (jax.Array | numpy.ndarray): states (N, H, W, C), or (N, C, H, W) in layout "NCHW".
        target (str | Callable): what is explained (`jaxsal.targets`: a name or a callable
            `output -> (N,)`).
        actions (jax.Array | None): (N,) actions to explain (needed by "q_action"); None: the
            target's choice on the clean input, fixed once.
        layout (str | None): "NHWC" or "NCHW"; None: the model's declared layout, else NHWC.
        batch_size (int | None): model rows (states x disk positions) per forward pass; None:
            the backend's default.
        precision (str): "float32" or "bfloat16", the precision of the model's convolutions and
            matmuls (the explained action is the float32 choice).
        radius (float): the disk's radius in pixels.
        stride (int): pixels between disk centres.
        perturbation (str): "black" (default) sets the disk to `fill`; "blur" blends in the
            frame-wise blurred state (`blur_sigma`).
        blur_sigma (float): the blur's sigma for `perturbation="blur"`.
        fill (float | str): what the disk is set to: a fraction of the value range (0 black, 0.5
            grey = 127.5 for 0..255 frames; see `obs_max`), or "black", "grey", "white" or
            "mean" (each state's mean per stacked frame).
        mask_shape (str): "hard" (default) or "gaussian" (an earlier variant: Greydanus' 5-pixel
            disk blurred with sigma `radius`, divided by its max, which also dims pixels beyond
            the radius).
        upsample (str): how the score grid is resized to (H, W): "bilinear" (default) or
            "nearest" (half-pixel centres, as PIL and scikit-image).
        obs_max (float | None): the top of the observations' value range, which `fill`
            fractions scale; None: 255 for integer frames, for float frames 1.0 when every
            value is <= 1, else 255.
        incremental (bool | None): recompute only the perturbed box's receptive field in each
            flax `nn.Conv` and run the rest of the model as is (equal to the plain path up to
            float rounding: the code between convs proven local when traced, else checked at
            run time, falling back to the plain path for non-local ops). None (default): on when the box covers <= 1/4 of the image; True/False force it.
        return_grid (bool): return the (N, gy, gx) score grid instead of the resized map.

    Returns:
        jax.Array: the maps, shape (N, H, W) float32; with `return_grid=True` the grid
            (N, gy, gx).

    Raises:
        jaxsal.SaliencyInputError: the output has no Q-vector or logits; `radius` or `stride` out of
            range; an unknown `perturbation`, `mask_shape`, `fill` or `upsample`; a bad `obs_max` or
            `incremental`; or a bad call (obs, target, actions, layout, batch_size), as
            `jaxsal.explain` reports it.
    """


def _sarfa_scores(o0, o1, a):
    return sarfa_score(T.q_of(o0), T.q_of(o1), a)


def _prepare(call, apply_fn, params, **options):
    T.q_of(output_shape(apply_fn, params, call.x.shape, layout=call.layout, sig=call.params_sig))  # an error now if no Q-vector / logits
    return disk_grid(call, score_fn=_sarfa_scores, **options)


SPEC = C.perturbation_spec("sarfa", _prepare, C.options_of(sarfa), example={"radius": 1.0, "stride": 4})
sarfa = C.register(SPEC, sarfa)
