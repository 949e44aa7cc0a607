"""Map statistics that expose frame-stacking bugs: attribution mass per stacked frame.

Why it works: a frame-stacked agent that learns from a correct stack puts most of its
attribution on the newest frame (where the objects are now) and some on older frames (how
they move); the per-frame mass profile is skewed towards the newest slot. The bugs make that
profile degenerate in a direction the maps alone show:
  - frames reversed: the newest frame sits in slot 0, so the mass moves to slot 0;
  - stack never updated (all slots = current frame): identical inputs get identical weight
    updates, so the learned part of the attribution spreads evenly (newest share -> 1/k);
  - stack reusing the state stack (older slots frozen at the episode's first frame): the
    frozen slots carry no information, so the mass collapses onto the newest slot (-> 1).
At initialisation all agents have the same random profile, so the statistic separates runs
only once the agent has learned what to look at: that moment is what we measure.

`frame_shares` (maps -> (N, k) shares), `newest_share`, `age_centroid`, and the separation
machinery (`auc`, `separation_step`) used by experiments.frame_stack_bug.
"""
from __future__ import annotations

import numpy as np

from jaxsal.errors import SaliencyInputError


def frame_shares(per_frame_maps, num_frames: int) -> np.ndarray:
    """(N, H, W, C) per-channel maps of a frame-major stack of `num_frames` frames -> (N, k)
    share of absolute attribution per stacked frame (rows sum to 1; all-zero rows -> 1/k)."""
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
    """Share of attribution on the newest slot (the last one in our oldest-first stacks)."""
    return np.asarray(shares)[..., -1]


def age_centroid(shares) -> np.ndarray:
    """Mass-weighted mean age of the attended frames, 0 (newest) .. k-1 (oldest)."""
    s = np.asarray(shares)
    ages = np.arange(s.shape[-1])[::-1]
    return (s * ages).sum(-1)


def auc(pos, neg) -> float:
    """P(pos > neg) + 0.5 P(pos == neg) over all pairs (Mann-Whitney AUC)."""
    pos, neg = np.asarray(pos, float).ravel(), np.asarray(neg, float).ravel()
    if pos.size == 0 or neg.size == 0:
        raise SaliencyInputError("auc needs at least one value in each group")
    d = pos[:, None] - neg[None, :]
    return float(((d > 0).sum() + 0.5 * (d == 0).sum()) / d.size)


def auc_curve(buggy, correct) -> np.ndarray:
    """Per-checkpoint AUC of buggy vs correct runs; inputs (runs, checkpoints), NaN-free."""
    buggy, correct = np.asarray(buggy, float), np.asarray(correct, float)
    if buggy.ndim != 2 or correct.ndim != 2 or buggy.shape[1] != correct.shape[1]:
        raise SaliencyInputError(f"need (runs, checkpoints) arrays with equal checkpoints, "
                                 f"got {buggy.shape} and {correct.shape}")
    return np.array([auc(buggy[:, t], correct[:, t]) for t in range(buggy.shape[1])])


def separation_step(steps, buggy, correct, threshold: float = 0.9):
    """Earliest step from which the groups stay separated, in one direction, to the end.

    Separated at a checkpoint means AUC >= threshold (buggy above) or AUC <= 1 - threshold
    (buggy below); the direction is not fixed in advance (bugs move the statistic either
    way) but must not flip afterwards. Requiring it to hold at every later checkpoint guards
    against chance separations of few seeds (3 vs 3: a random one-sided split has p = 1/20).
    Returns (step or None, direction "+"/"-" or None, the AUC curve).
    """
    curve = auc_curve(buggy, correct)
    steps = list(steps)
    if len(steps) != curve.size:
        raise SaliencyInputError(f"{len(steps)} steps for {curve.size} checkpoints")
    up, down = curve >= threshold, curve <= 1.0 - threshold
    for sign, ok in (("+", up), ("-", down)):
        if ok.size and ok[-1]:
            t = ok.size - 1
            while t > 0 and ok[t - 1]:
                t -= 1
            return steps[t], sign, curve
    return None, None, curve
