"""SARFA (Puri et al. 2020): specific and relevant feature attribution from local perturbations."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxsal import targets as T
from jaxsal.perturbation import _common as C
from jaxsal.perturbation.noise import disk_grid_scores
from jaxsal.registry import register


def sarfa_score(q0, q1, a):
    """SARFA saliency from clean and perturbed Q-vectors (rows, A) and actions (rows,).

    dP = p_a - p'_a with p = softmax(Q); K = 1 / (1 + KL(p_rem || p'_rem)), p_rem the softmax
    over the actions other than a; S = 2 K dP / (K + dP), and 0 where dP <= 0.
    """
    q0 = q0.astype(jnp.float32)
    q1 = q1.astype(jnp.float32)
    onehot = jax.nn.one_hot(a, q0.shape[-1], dtype=bool)
    dp = jnp.take_along_axis(jax.nn.softmax(q0) - jax.nn.softmax(q1), a[:, None], -1)[:, 0]
    lr0 = jax.nn.log_softmax(jnp.where(onehot, -jnp.inf, q0))
    lr1 = jax.nn.log_softmax(jnp.where(onehot, -jnp.inf, q1))
    kl = jnp.sum(jnp.where(onehot, 0.0, jnp.exp(lr0) * (lr0 - lr1)), axis=-1)
    k = 1.0 / (1.0 + kl)
    pos = dp > 0
    s = 2.0 * k * dp / jnp.where(pos, k + dp, 1.0)
    return jnp.where(pos, s, 0.0)


@register("sarfa")
def sarfa(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None,
          batch_size=None, radius: float = 2.0, stride: int = 2, perturbation: str = "black",
          blur_sigma: float = 3.0, fill=0.0, mask_shape: str = "hard",
          upsample: str = "bilinear", obs_max=None, incremental: bool | None = None,
          return_grid: bool = False):
    """SARFA maps (N, H, W) on a grid of disk perturbations every `stride` px, resized.

    Defaults are Paper B's (its code and its stated parameters): a hard black disk of radius 2
    (the pixels with dy^2 + dx^2 <= radius^2 set to `fill`=0 in all stacked frames, no blur),
    centred every 2 px. mask_shape="gaussian" is our earlier variant, kept as an option:
    Greydanus' 5-pixel disk blurred with sigma `radius` and divided by its max, a soft mask
    that also dims pixels beyond the radius. perturbation="blur" blends in the frame-wise
    blurred state (blur_sigma) instead of `fill`. The action a is the target's choice on the
    clean input (argmax Q) or `actions`; the score always uses softmax over the model's
    Q-vector/logits.
    incremental: recompute only the disk's receptive field in flax convs (see
    `occlusion`; None = auto: on when the mask's nonzero box covers <= 1/4 of the image, e.g.
    the 5x5 px box of the hard disk of radius 2).
    """
    prep = C.clean_pass(apply_fn, params, obs, layout=layout, target=target, actions=actions,
                        batch_size=batch_size, obs_max=obs_max)
    T.q_of(prep.out0)  # clear error now if the output has no Q-vector / logits
    score_fn = lambda o0, o1, a: sarfa_score(T.q_of(o0), T.q_of(o1), a)  # noqa: E731
    grid = disk_grid_scores(prep, apply_fn, params, radius=radius, stride=stride,
                            perturbation=perturbation, blur_sigma=blur_sigma, fill=fill,
                            mask_shape=mask_shape, score_fn=score_fn,
                            incremental=incremental)
    if return_grid:
        return grid
    return C.upsample_grid(grid, prep.shape[1:3], upsample)
