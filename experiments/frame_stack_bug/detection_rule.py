"""The pre-registered decision rule of the frame-stack-bug study (experiments/frame_stack_bug/preregistration.md).

One question per (bug, signal): do the runs with the bug differ from the correct runs, and from
which checkpoint on? Data: one value per run (seed) and pre-declared checkpoint, e.g. the
`stack_age_gain` map statistic or the mean of the last 20 full-game returns.

1. At every checkpoint, an exact two-sided permutation test over seeds: the test statistic is
   the difference of the group means (bug minus correct); its null distribution comes from
   every relabelling of the pooled runs into groups of the same sizes (all C(n, n_bug) of them
   when there are at most `MAX_EXACT`, else `n_random` random relabellings plus the observed
   one). p = share of relabellings with |difference| >= the observed |difference|.
2. Across checkpoints, the fixed-sequence procedure (Maurer, Hothorn & Lehmacher 1995;
   Westfall & Krishen 2001), tested from the LAST checkpoint backwards, each at the full level
   `alpha`, stopping at the first non-rejection. This controls the family-wise error over all
   checkpoints at `alpha` without splitting it (a later hypothesis is only tested when every
   earlier-tested one was rejected), and its result is exactly "the first checkpoint from which
   the test rejects at every later checkpoint": the detection step. A bug whose last checkpoint
   does not reject is not detected (null). Bugs that are flagged for a moment and then lose it
   are not detections: a detector whose flag disappears is not one a user could act on.
3. Across bugs (one signal's family), Bonferroni: `alpha = family_alpha / number_of_bugs`.
   The map statistic and the returns are two separate families, each at `family_alpha`.

Also returned, descriptive only (never a detection): the raw and Holm-adjusted p-values of
every checkpoint, the mean difference and its direction, the smallest attainable p (with few
seeds the test cannot reject at all: 3 vs 3 seeds give p >= 0.1), and a seed-bootstrap
interval of the detection step (`bootstrap_detection_interval`), which measures how stable
the step is under resampling of seeds (a stability interval, not a coverage-guaranteed CI:
resampled duplicate seeds make groups look tighter than they are).

`false_positive_rate` simulates the whole rule on null data (both groups from the same
autocorrelated process) to check that a no-effect bug is detected at most ~`alpha` of the time.
"""
from __future__ import annotations

import itertools
import math

import numpy as np

from jaxsal.metrics import statistics

MAX_EXACT = 50_000          # enumerate every relabelling up to this many, else sample
N_RANDOM = 20_000           # random relabellings when enumeration is too large
_REL_TOL = 1e-9             # |d_perm| >= |d_obs| (1 - tol): float ties count as ties


def _as_groups(bug, correct):
    bug, correct = np.asarray(bug, np.float64), np.asarray(correct, np.float64)
    if bug.ndim == 1:
        bug = bug[:, None]
    if correct.ndim == 1:
        correct = correct[:, None]
    if bug.ndim != 2 or correct.ndim != 2 or bug.shape[1] != correct.shape[1]:
        raise ValueError(f"need (runs, checkpoints) arrays with equal checkpoints, got {bug.shape} and {correct.shape}")
    if bug.shape[0] < 1 or correct.shape[0] < 1:
        raise ValueError("each group needs at least one run")
    if not (np.all(np.isfinite(bug)) and np.all(np.isfinite(correct))):
        raise ValueError("values must be finite (fill games not yet finished before calling the rule)")
    return bug, correct


def relabellings(n: int, k: int, n_random: int = N_RANDOM, seed: int = 0) -> np.ndarray:
    """(P, n) 0/1 matrix: which of the n pooled runs go to the first group (k of them). Row 0 is
    the observed labelling (the first k runs). All C(n, k) rows when <= MAX_EXACT, else the
    observed one plus `n_random` random ones."""
    if not 1 <= k < n:
        raise ValueError(f"need 1 <= k < n, got k={k}, n={n}")
    if math.comb(n, k) <= MAX_EXACT:
        rows = np.zeros((math.comb(n, k), n), np.float64)
        for i, c in enumerate(itertools.combinations(range(n), k)):
            rows[i, list(c)] = 1.0
        return rows            # combinations start with (0, .., k-1): row 0 is the observed one
    rng = np.random.default_rng(seed)
    rows = np.zeros((n_random + 1, n), np.float64)
    rows[0, :k] = 1.0
    for i in range(1, n_random + 1):
        rows[i, rng.permutation(n)[:k]] = 1.0
    return rows


def permutation_test(bug, correct, n_random: int = N_RANDOM, seed: int = 0, _labels=None):
    """Two-sided permutation p-value per checkpoint for the difference of means.
    bug (n_b, K), correct (n_c, K) -> (p (K,), mean difference bug - correct (K,), min attainable p)."""
    bug, correct = _as_groups(bug, correct)
    nb, nc = bug.shape[0], correct.shape[0]
    pooled = np.concatenate([bug, correct], 0)
    lab = relabellings(nb + nc, nb, n_random, seed) if _labels is None else _labels
    s = lab @ pooled                                       # (P, K) sums of the "bug" group
    d = s / nb - (pooled.sum(0) - s) / nc
    obs = np.abs(d[0])
    ge = np.abs(d) >= obs * (1 - _REL_TOL)
    p = ge.mean(0)
    min_p = 2.0 / lab.shape[0] if nb == nc else 1.0 / lab.shape[0]
    return p, d[0], min_p


def fixed_sequence(p_values, alpha: float):
    """Index of the first checkpoint from which every later one rejects (p <= alpha), testing
    from the last backwards and stopping at the first non-rejection; None if the last one
    does not reject."""
    p = np.asarray(p_values, float)
    t = p.size
    while t > 0 and p[t - 1] <= alpha:
        t -= 1
    return None if t == p.size else t


def holm(p_values) -> np.ndarray:
    """Holm step-down adjusted p-values (descriptive: a per-checkpoint view next to the rule); as
    registered, a NaN counts in the family and stays NaN."""
    return statistics.holm(p_values, nan="count")


def detect(steps, bug, correct, alpha: float, n_random: int = N_RANDOM, seed: int = 0) -> dict:
    """The rule for one (bug, signal): detection step (first checkpoint of the unbroken run of
    rejections that reaches the last checkpoint) or None, with everything reported next to it."""
    steps = [int(s) for s in steps]
    bug, correct = _as_groups(bug, correct)
    if len(steps) != bug.shape[1]:
        raise ValueError(f"{len(steps)} steps for {bug.shape[1]} checkpoints")
    p, diff, min_p = permutation_test(bug, correct, n_random, seed)
    t = fixed_sequence(p, alpha)
    return {
        "detection_step": None if t is None else steps[t],
        "direction": None if t is None else ("+" if diff[-1] > 0 else "-"),
        "alpha": alpha, "min_attainable_p": min_p, "can_reject": bool(min_p <= alpha),
        "p_values": [float(x) for x in p], "holm_p_values": [float(x) for x in holm(p)],
        "mean_difference": [float(x) for x in diff],
        "bug_mean": [float(x) for x in bug.mean(0)], "correct_mean": [float(x) for x in correct.mean(0)],
        "n_bug": int(bug.shape[0]), "n_correct": int(correct.shape[0]), "steps": steps,
    }


def bootstrap_detection_interval(steps, bug, correct, alpha: float, n_boot: int = 1000, seed: int = 0,
                                 level: float = 0.95, n_random: int = 2_000) -> dict:
    """Stability of the detection step under resampling seeds (with replacement, within each
    group): the `level` percentile interval of the step, with "never detected" ranked after the
    last checkpoint (a bound that falls there is None), and the share of resamples that never
    detect. Enumeration is reused across resamples; large groups use `n_random` relabellings."""
    steps = [int(s) for s in steps]
    bug, correct = _as_groups(bug, correct)
    nb, nc = bug.shape[0], correct.shape[0]
    lab = relabellings(nb + nc, nb, n_random, seed)
    rng = np.random.default_rng(seed)
    k = len(steps)
    idx = np.empty(n_boot, int)
    for b in range(n_boot):
        bb = bug[rng.integers(0, nb, nb)]
        cc = correct[rng.integers(0, nc, nc)]
        p, _, _ = permutation_test(bb, cc, _labels=lab)
        t = fixed_sequence(p, alpha)
        idx[b] = k if t is None else t                     # k = never
    lo, hi = np.quantile(idx, [(1 - level) / 2, (1 + level) / 2], method="inverted_cdf")
    as_step = lambda i: None if int(i) >= k else steps[int(i)]   # noqa: E731
    return {"low": as_step(lo), "high": as_step(hi), "never_share": float((idx == k).mean()),
            "n_boot": n_boot, "level": level}


def null_runs(rng, n_runs: int, n_checkpoints: int, rho: float = 0.9) -> np.ndarray:
    """(n_runs, n_checkpoints) AR(1) curves with unit marginal variance: the null model of one
    group (training noise that persists between checkpoints, like a trailing mean's)."""
    x = np.empty((n_runs, n_checkpoints))
    x[:, 0] = rng.standard_normal(n_runs)
    s = math.sqrt(1 - rho ** 2)
    for t in range(1, n_checkpoints):
        x[:, t] = rho * x[:, t - 1] + s * rng.standard_normal(n_runs)
    return x


def false_positive_rate(n_bug: int, n_correct: int, n_checkpoints: int, alpha: float, sims: int = 500,
                        rho: float = 0.9, seed: int = 0) -> float:
    """Share of simulated no-effect studies (both groups from `null_runs`) in which the rule
    reports a detection; the rule promises <= alpha."""
    rng = np.random.default_rng(seed)
    lab = relabellings(n_bug + n_correct, n_bug, 2_000, seed)
    hits = 0
    for _ in range(sims):
        x = null_runs(rng, n_bug + n_correct, n_checkpoints, rho)
        # the rule detects iff the last checkpoint rejects (fixed_sequence tests it first)
        p, _, _ = permutation_test(x[:n_bug, -1:], x[n_bug:, -1:], _labels=lab)
        hits += fixed_sequence(p, alpha) is not None
    return hits / sims
