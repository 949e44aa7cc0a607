"""Where in the frame stack a map looks: the share of attribution on each stacked frame.

`frame_shares` turns per-channel maps (`per_frame=True`) of a frame-major stack of k frames
into each frame's share of absolute attribution, (N, k); `newest_share` and `age_centroid`
summarise a share profile (the newest frame is the last slot of an oldest-first stack). An
agent trained on a correct stack reads the newest frame most; a profile that collapses onto
one slot, or tilts to the oldest, points at a frame-stacking bug.
"""
from __future__ import annotations

import numpy as np

from jaxsal.errors import SaliencyInputError


def frame_shares(per_frame_maps, num_frames: int) -> np.ndarray:
    """Each stacked frame's share of a map's absolute attribution: where in time a map looks.

    Args:
        per_frame_maps (jax.Array | numpy.ndarray): per-channel maps (N, H, W, C), as
            `per_frame=True` gives them, of a frame-major stack: channels
            [f * C / k, (f + 1) * C / k) belong to frame f (oldest first).
        num_frames (int): k, the number of stacked frames; must divide C.

    Returns:
        numpy.ndarray: shape (N, k), float64; each row sums to 1 (a map with no attribution at
            all gets 1/k per frame).

    Raises:
        jaxsal.SaliencyInputError: the maps are not 4-D or hold NaN or inf; `num_frames` is not
            a positive int dividing C.
    """
    m = np.asarray(per_frame_maps, np.float64)
    if m.ndim != 4:
        raise SaliencyInputError(f"per-frame maps must be (N, H, W, C) (use per_frame=True), got {m.shape}")
    if not isinstance(num_frames, (int, np.integer)) or num_frames < 1 or m.shape[-1] % num_frames:
        raise SaliencyInputError(
            f"num_frames={num_frames!r} must be a positive int dividing the channel count {m.shape[-1]}")
    if not np.all(np.isfinite(m)):
        raise SaliencyInputError("per-frame maps contain NaN or inf")
    n, h, w, c = m.shape
    mass = np.abs(m).reshape(n, h * w, num_frames, c // num_frames).sum(axis=(1, 3))
    total = mass.sum(-1, keepdims=True)
    return np.where(total > 0, mass / np.where(total > 0, total, 1.0), 1.0 / num_frames)


def newest_share(shares) -> np.ndarray:
    """The newest frame's share of attribution: the last slot of an oldest-first stack.

    Args:
        shares (numpy.ndarray): share profiles (..., k), e.g. `frame_shares`'s (N, k).

    Returns:
        numpy.ndarray: shape (...), e.g. (N,): `shares[..., -1]`.
    """
    return np.asarray(shares)[..., -1]


def age_centroid(shares) -> np.ndarray:
    """Mass-weighted mean age of the attended frames: 0 when a map reads only the newest frame,
    k - 1 when it reads only the oldest.

    Args:
        shares (numpy.ndarray): share profiles (..., k) of an oldest-first stack, e.g.
            `frame_shares`'s (N, k).

    Returns:
        numpy.ndarray: shape (...), e.g. (N,): sum over slots of share x age, the newest slot
            aged 0.
    """
    s = np.asarray(shares)
    ages = np.arange(s.shape[-1])[::-1]
    return (s * ages).sum(-1)
