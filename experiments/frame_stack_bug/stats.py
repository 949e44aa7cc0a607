"""The frame-stack study's statistic and its separation machinery (per-frame shares come from
jaxsal.metrics.frames).

Per-frame shares. `frame_shares` turns per-channel maps of a frame-major stack into the share
of absolute attribution on each stacked frame (slot k-1 is the newest in our stacks). An
agent that learns from a correct stack reads the newest frame most (objects are there now)
and older frames less (how they move), so its share profile tilts towards the newest slot as
it learns. The bugs change which slots carry information, and so where the tilt goes:
  - frames reversed: the newest frame sits in slot 0, so the mass tilts towards slot 0;
  - stack reusing the state stack (older slots frozen at the episode's first frame): the
    frozen slots carry no motion, so the mass collapses onto the newest slot;
  - stack never updated (all slots = current frame): identical inputs get identical first-
    layer weight updates, so only the random initial filters tell the slots apart and the
    learned part of the attribution spreads evenly (mean age -> (k-1)/2);
  - stack misaligned by one step: same order, same content one step late: the profile is
    (in expectation) the correct one. No per-frame statistic can see it; only its effect on
    what the agent does (returns) can.

The detector statistic, `stack_age_gain` (the shares' mass-weighted mean frame age, 0 =
newest .. k-1 = oldest):
  1. age centroid of every probe state's share profile, averaged over the probe set AND over
     the per-frame map methods (gradient x input, gradient, Guided Backprop): the methods
     share the bug's signature but not their noise (method agreement);
  2. minus the same value at the run's first snapshot: removes the seed's random-init
     profile (the part no learning explains);
  3. causal trailing mean over the last `window` snapshots: a stable value (training noise
     between consecutive snapshots is large at small budgets), and at step t it uses only
     snapshots up to t, so it is still an online detector.
It needs correct runs as a reference: a correct agent's value falls as it learns, so the sign
alone does not say what went wrong (in the MinAtar study correct, reuse and no_update all end
below 0); a bug shows as a difference from the correct runs (above them: attention moving to
the oldest slot; below: collapse onto the newest slot). The AUC criterion against correct runs
(`separation_step`) measures how early it is reliable. The single-scalar `newest_share` (share
on the newest slot, one method, one snapshot) is the earlier statistic, kept for comparison.

Honest provenance: the three design choices above were picked on the first three seeds of
the MinAtar experiment out of a few dozen variants (per method, windows 1/4/6, age vs newest
vs newest-minus-oldest, leave-one-seed-out distances to the correct profile), so those seeds
are a development set; experiments.frame_stack_bug.run reports the held-out seeds separately.

`trailing_mean`, `stack_age_gain`, and the separation machinery (`auc`, `separation_step`).
"""
from __future__ import annotations

import math

import numpy as np

from experiments.frame_stack_bug import plan
from jaxsal.errors import SaliencyInputError
from jaxsal.metrics.frames import age_centroid


def trailing_mean(x, window: int) -> np.ndarray:
    """Causal moving average along axis 0: out[t] = mean(x[max(0, t-window+1) .. t])."""
    x = np.asarray(x, np.float64)
    if not isinstance(window, (int, np.integer)) or window < 1:
        raise SaliencyInputError(f"window must be a positive int, got {window!r}")
    if x.ndim < 1 or x.shape[0] == 0:
        raise SaliencyInputError("trailing_mean needs at least one value along axis 0")
    c = np.concatenate([np.zeros((1,) + x.shape[1:]), np.cumsum(x, axis=0)])
    t = np.arange(x.shape[0])
    lo = np.maximum(0, t + 1 - window)
    return (c[t + 1] - c[lo]) / (t + 1 - lo).reshape((-1,) + (1,) * (x.ndim - 1))


def stack_age_gain(shares, window: int = 4) -> np.ndarray:
    """The detector statistic (module docstring): `shares` (T, M, N, k) per snapshot, map
    method, probe state and stacked frame -> (T,) trailing mean over `window` snapshots of
    [mean age centroid (over methods and probes) minus its value at the first snapshot]."""
    s = np.asarray(shares, np.float64)
    if s.ndim != 4 or s.shape[0] < 1:
        raise SaliencyInputError(f"shares must be (snapshots, methods, probes, frames), got {s.shape}")
    if not np.all(np.isfinite(s)):
        raise SaliencyInputError("shares contain NaN or inf")
    a = age_centroid(s).mean(axis=(1, 2))
    return trailing_mean(a - a[0], window)


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


def at_checkpoints(rows, checkpoints, key):
    """One run's values of `key` at the checkpoint steps (no finished game yet: RETURN_IF_NO_GAME)."""
    by_step = {int(r["step"]): r for r in rows}
    missing = [c for c in checkpoints if c not in by_step]
    if missing:
        raise ValueError(f"no snapshot at checkpoint steps {missing[:3]}")
    v = np.array([by_step[c][key] for c in checkpoints], float)
    return np.where(np.isnan(v), plan.RETURN_IF_NO_GAME, v)


def t_interval(x, level=0.95):
    """(mean, std, low, high) with a Student-t interval over seeds (None bounds for one seed)."""
    from scipy import stats

    x = np.asarray(x, float)
    m = float(x.mean())
    if x.size < 2:
        return m, None, None, None
    sd = float(x.std(ddof=1))
    h = float(stats.t.ppf((1 + level) / 2, x.size - 1) * sd / math.sqrt(x.size))
    return m, sd, m - h, m + h
