"""Inference for per-state scores of consecutive states (insertion/deletion AUCs, similarities).

Consecutive greedy-play states are autocorrelated, so single states are not independent
samples. Everything here works on *blocks of consecutive states*: the states (in play order)
are cut into `n_blocks = max(1, round(n / block_len))` contiguous blocks of near-equal size
(sizes differ by at most one, `numpy.array_split`), and blocks, not states, are the units.

- `block_bootstrap_ci`: mean over states with a percentile interval from resampling whole
  blocks with replacement (Kuensch / Carlstein non-overlapping block bootstrap); a resample's
  mean is the sum of its blocks' sums over the sum of their sizes.
- `paired_block_test`: two-sided Wilcoxon signed-rank test of the per-block means of the paired
  differences x_i - y_i (same states, two methods), exact p-value for fewer than 50 blocks
  (scipy's default), zeros dropped ("wilcox" zero method).
- `holm`: Holm's step-down adjustment of a family of p-values (controls the family-wise error).

numpy/scipy on host: these are a few thousand numbers, not maps.
"""
from __future__ import annotations

import numpy as np
from scipy import stats

from jaxsal.errors import SaliencyInputError


def blocks(n: int, block_len: int) -> list[np.ndarray]:
    """Index arrays of the contiguous blocks of n states (near-equal sizes, about block_len)."""
    if n < 1:
        raise SaliencyInputError(f"need at least one state, got n={n}")
    if isinstance(block_len, bool) or not isinstance(block_len, (int, np.integer)) or block_len < 1:
        raise SaliencyInputError(f"block_len must be a positive int, got {block_len!r}")
    return np.array_split(np.arange(n), max(1, int(round(n / block_len))))


def block_means(x, block_len: int) -> np.ndarray:
    """Mean of x over each block of consecutive states: (n_blocks,)."""
    x = _vector(x)
    return np.array([x[b].mean() for b in blocks(len(x), block_len)])


def block_bootstrap_ci(x, block_len: int, n_resamples: int, level: float = 0.95, seed: int = 0):
    """(mean, low, high): the mean of x over states and its percentile block-bootstrap interval.

    With a single block the interval collapses to the mean (no information on its spread)."""
    x = _vector(x)
    idx = blocks(len(x), block_len)
    sums = np.array([x[b].sum() for b in idx])
    sizes = np.array([len(b) for b in idx], np.float64)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(idx), (int(n_resamples), len(idx)))
    boot = sums[pick].sum(1) / sizes[pick].sum(1)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [alpha, 1.0 - alpha])
    return float(x.mean()), float(lo), float(hi)


def paired_block_test(x, y, block_len: int) -> dict:
    """Two-sided Wilcoxon signed-rank test of the per-block means of x - y (paired states).

    Returns {"diff": mean over states of x - y, "blocks": n_blocks, "p": p-value}; p is NaN
    when every block difference is 0 or there is a single block (no test possible)."""
    x, y = _vector(x), _vector(y)
    if x.shape != y.shape:
        raise SaliencyInputError(f"paired scores need equal lengths, got {x.shape} and {y.shape}")
    d = block_means(x - y, block_len)
    p = np.nan
    if len(d) > 1 and np.any(d != 0):
        p = float(stats.wilcoxon(d, zero_method="wilcox", alternative="two-sided").pvalue)
    return {"diff": float((x - y).mean()), "blocks": int(len(d)), "p": p}


def holm(pvalues) -> np.ndarray:
    """Holm-adjusted p-values (same order as given; NaN stays NaN and is not counted)."""
    p = np.asarray(pvalues, np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    m = len(ok)
    if m == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    adj = np.maximum.accumulate((m - np.arange(m)) * p[order])
    out[order] = np.minimum(adj, 1.0)
    return out


def _vector(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if x.ndim != 1 or len(x) == 0:
        raise SaliencyInputError(f"expected a non-empty 1-D array of per-state scores, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise SaliencyInputError("per-state scores contain NaN or inf")
    return x
