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

Fixed blocks of a chosen length are only as good as that length: when the dependence outlasts
the block, neighbouring blocks are correlated and intervals come out too narrow. For that case:

- `optimal_block_length`: the automatic (mean) block length of the stationary bootstrap from the
  data, Politis & White (2004) with the correction of Patton, Politis & White (2009).
- `stationary_bootstrap_ci`: Politis & Romano's (1994) stationary bootstrap: blocks of random,
  geometric length (mean `block_len`, default the automatic one) starting anywhere, wrapping
  around the end; percentile interval of the mean.
- `batch_means_test`: two-sided one-sample t-test on the means of contiguous blocks of the
  automatic length (the batch-means method of simulation output analysis), x or x - y.
- `rank_interaction_test`: does the ranking of methods depend on the setting? A permutation test
  on per-block ranks, settings permuted within blocks.

numpy/scipy on host: these are a few thousand numbers, not maps.
"""
from __future__ import annotations

import numpy as np
from scipy import stats

from jaxsal.checks import check_positive_int
from jaxsal.errors import SaliencyInputError


def blocks(n: int, block_len: int) -> list[np.ndarray]:
    """Index arrays of the contiguous blocks of n states (near-equal sizes, about block_len)."""
    if n < 1:
        raise SaliencyInputError(f"need at least one state, got n={n}")
    block_len = check_positive_int("block_len", block_len)
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


def holm(pvalues, *, nan: str = "omit") -> np.ndarray:
    """Holm-adjusted p-values, in the order given; a NaN p stays NaN. nan="omit" leaves NaNs out of
    the family size m; nan="count" counts them in it (conservative: a test that gave no p still
    costs the others its share of alpha)."""
    if nan not in ("omit", "count"):
        raise ValueError(f'nan must be "omit" or "count", got {nan!r}')
    p = np.asarray(pvalues, np.float64)
    out = np.full(p.shape, np.nan)
    ok = np.flatnonzero(~np.isnan(p))
    m = p.size if nan == "count" else len(ok)
    if len(ok) == 0:
        return out
    order = ok[np.argsort(p[ok], kind="stable")]
    adj = np.maximum.accumulate((m - np.arange(len(ok))) * p[order])
    out[order] = np.minimum(adj, 1.0)
    return out


def optimal_block_length(x) -> float:
    """Automatic mean block length of the stationary bootstrap for the mean of x (in order).

    Politis & White (2004), "Automatic block-length selection for the dependent bootstrap",
    with the correction of Patton, Politis & White (2009) (D_SB = 2 g(0)^2):

        b = (2 G^2 / D_SB)^(1/3) n^(1/3),   G = sum_{|k|<=M} lambda(k/M) |k| R(k),
        g(0) = sum_{|k|<=M} lambda(k/M) R(k),  lambda = flat-top (1 on |t|<=1/2, 2(1-|t|) to 1),

    with R(k) = n^-1 sum_t (x_t - mean)(x_{t+k} - mean). M = 2 m, where m is the smallest lag
    after which K_n = max(5, sqrt(log10 n)) consecutive autocorrelations lie inside
    +-2 sqrt(log10(n) / n); when no lag up to m_max = ceil(sqrt(n)) + K_n qualifies, M = m_max
    (M is capped at m_max). b is capped at b_max = ceil(min(3 sqrt(n), n / 3)) and floored at 1
    (m = 0, no detectable dependence, gives b = 1: the i.i.d. bootstrap). The same choices as
    `arch.bootstrap.optimal_block_length` except the autocorrelation estimate (here the usual
    R(k) / R(0)). For AR(1) with coefficient rho the target is (2 rho / (1 - rho^2))^(2/3) n^(1/3).

    Limits: the lag window ends at m_max, so with non-negative autocorrelations the estimate
    saturates below the b that dependence longer than m_max calls for: ~59 states for n = 1,000
    and ~23 for n = 200 (autocorrelation 1 up to m_max); series whose dependence outlasts that
    get too short blocks (compare with a longer fixed block length). Negative autocorrelations
    at longer lags can make |G| / g(0) large and b reach b_max. Dependence that stays inside the
    band at the first K_n lags (many small positive autocorrelations) gives m = 0 and b = 1.
    `arch` takes M = 2 max(m, 1), so it returns b > 1 where this returns 1.
    """
    x = _vector(x)
    n = len(x)
    eps = x - x.mean()
    r0 = float(eps @ eps) / n
    if n < 4 or r0 <= 0:
        return 1.0
    kn = max(5, int(np.ceil(np.sqrt(np.log10(n)))))
    m_max = min(int(np.ceil(np.sqrt(n))) + kn, n - 1)
    acv = np.array([float(eps[k:] @ eps[:n - k]) / n for k in range(m_max + 1)])
    rho = np.abs(acv / r0)
    band = 2.0 * np.sqrt(np.log10(n) / n)
    m_hat = None
    for m in range(0, m_max - kn + 1):
        if np.all(rho[m + 1:m + kn + 1] < band):
            m_hat = m
            break
    big_m = m_max if m_hat is None else min(2 * m_hat, m_max)
    if big_m == 0:
        return 1.0
    k = np.arange(1, big_m + 1)
    t = k / big_m
    lam = np.where(t <= 0.5, 1.0, 2.0 * (1.0 - t))
    g = 2.0 * np.sum(lam * k * acv[1:big_m + 1])
    g0 = acv[0] + 2.0 * np.sum(lam * acv[1:big_m + 1])
    if g0 <= 0:
        return float(np.ceil(min(3 * np.sqrt(n), n / 3)))
    b = (2.0 * g * g / (2.0 * g0 * g0)) ** (1.0 / 3.0) * n ** (1.0 / 3.0)
    return float(min(max(b, 1.0), np.ceil(min(3 * np.sqrt(n), n / 3))))


def stationary_blocks(n: int, mean_block: float, n_resamples: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths), both (n_resamples, K): the blocks of stationary-bootstrap resamples of
    n states (Politis & Romano 1994). Block j of a resample starts at a uniformly drawn state
    and runs for a Geometric(1 / mean_block) number of states (>= 1), wrapping from the last
    state to the first; blocks are laid end to end and the resample is cut at n states (the
    cut block is shortened, later blocks get length 0). Equivalently: each position starts a
    new block with probability 1 / mean_block."""
    if not mean_block >= 1:
        raise SaliencyInputError(f"mean_block must be >= 1, got {mean_block!r}")
    r, p = int(n_resamples), 1.0 / float(mean_block)
    k = int(np.ceil(n * p + 10.0 * np.sqrt(n * p) + 10))          # expected n p blocks are needed
    lengths = rng.geometric(p, (r, k)).astype(np.int64)
    short = lengths.sum(1) < n
    while np.any(short):                                           # (practically never) top up
        extra = rng.geometric(p, (r, k)).astype(np.int64)
        extra[~short] = 0
        lengths = np.concatenate([lengths, extra], 1)
        short = lengths.sum(1) < n
    starts = rng.integers(0, n, lengths.shape)
    before = np.cumsum(lengths, 1) - lengths
    lengths = np.clip(n - before, 0, lengths)
    return starts, lengths


def stationary_bootstrap_means(x, mean_block: float, n_resamples: int, seed: int = 0) -> np.ndarray:
    """(n_resamples,) means of stationary-bootstrap resamples of x (`stationary_blocks`), from
    circular prefix sums: O(n_resamples n / mean_block), not O(n_resamples n)."""
    x = _vector(x)
    n = len(x)
    starts, lengths = stationary_blocks(n, mean_block, n_resamples, np.random.default_rng(seed))
    prefix = np.concatenate([[0.0], np.cumsum(np.concatenate([x, x]))])
    full, rem = np.divmod(lengths, n)
    sums = full * prefix[n] + prefix[starts + rem] - prefix[starts]
    return sums.sum(1) / n


def stationary_bootstrap_ci(x, block_len: float | None = None, n_resamples: int = 10_000,
                            level: float = 0.95, seed: int = 0) -> dict:
    """Mean of x over states with a percentile stationary-bootstrap interval.

    block_len: the mean block length; None = `optimal_block_length(x)`. Returns {"mean",
    "low", "high", "block_len"}."""
    x = _vector(x)
    b = optimal_block_length(x) if block_len is None else float(block_len)
    boot = stationary_bootstrap_means(x, b, n_resamples, seed)
    alpha = (1.0 - level) / 2.0
    lo, hi = np.quantile(boot, [alpha, 1.0 - alpha])
    return {"mean": float(x.mean()), "low": float(lo), "high": float(hi), "block_len": b}


def batch_means_test(x, y=None, block_len: float | None = None) -> dict:
    """Two-sided one-sample t-test that the mean of x (or of x - y, paired states) is 0, on the
    means of contiguous blocks (`blocks`) of round(block_len) states; block_len None = the
    automatic length of the tested series (`optimal_block_length`).

    The batch-means method: block means of blocks long against the dependence are nearly
    independent and normal, so their t statistic has n_blocks - 1 degrees of freedom. Unlike a
    signed-rank test on few blocks, its p-value has no floor (Holm over many pairs stays
    possible with ~10 blocks). Returns {"diff", "blocks", "block_len", "t", "p"}; p is NaN with
    one block or when every block mean is 0, 0 when they are all equal and non-zero."""
    x = _vector(x)
    if y is not None:
        y = _vector(y)
        if x.shape != y.shape:
            raise SaliencyInputError(f"paired scores need equal lengths, got {x.shape} and {y.shape}")
        x = x - y
    b = optimal_block_length(x) if block_len is None else float(block_len)
    length = max(1, int(round(b)))
    d = block_means(x, length)
    t, p = np.nan, np.nan
    if len(d) > 1:
        sd = d.std(ddof=1)
        if sd > 0:
            t = float(d.mean() / (sd / np.sqrt(len(d))))
            p = float(2.0 * stats.t.sf(abs(t), len(d) - 1))
        elif np.any(d != 0):
            t, p = float(np.sign(d.mean()) * np.inf), 0.0
    return {"diff": float(x.mean()), "blocks": int(len(d)), "block_len": b, "t": t, "p": p}


def rank_interaction_test(values, block_len: int, n_permutations: int = 10_000, seed: int = 0) -> dict:
    """Method x setting interaction of per-state scores `values` (n_states, n_settings,
    n_methods), the states in play order and the same states in every setting (paired).

    Unit: contiguous blocks of block_len states (`blocks`). Per block and setting, the
    methods' block-mean scores are ranked (1 = lowest). Statistic T = sum over methods and
    settings of (mean rank of the method in the setting - its mean rank over settings)^2: 0
    when every setting ranks the methods alike on average. Null: within each block, the
    settings' rank vectors are exchangeable (the ranking does not depend on the setting);
    the reference distribution permutes the settings independently within each block,
    p = (1 + #{T* >= T}) / (1 + n_permutations).

    Why ranks: the claim is about which method wins, and settings have different scales
    (Q-value vs advantage AUCs); a setting that only rescales every method's score creates an
    additive interaction but no change of ranking, and leaves T unchanged. Why within-block
    permutation: the settings of a block are measured on the same states, so the paired
    dependence is kept; blocks are treated as independent, so block_len must outlast the
    dependence (callers pass an automatic length). Returns {"T", "p", "blocks",
    "mean_ranks" (n_settings, n_methods)}."""
    v = np.asarray(values, np.float64)
    if v.ndim != 3 or v.shape[1] < 2 or v.shape[2] < 2:
        raise SaliencyInputError(f"values must be (states, settings >= 2, methods >= 2), got {v.shape}")
    if not np.all(np.isfinite(v)):
        raise SaliencyInputError("per-state scores contain NaN or inf")
    idx = blocks(v.shape[0], block_len)
    bm = np.stack([v[b].mean(0) for b in idx])                     # (blocks, settings, methods)
    ranks = stats.rankdata(bm, axis=2)

    def statistic(r):
        mr = r.mean(0)                                               # (settings, methods)
        return float(((mr - mr.mean(0, keepdims=True)) ** 2).sum())

    t_obs = statistic(ranks)
    rng = np.random.default_rng(seed)
    n_b, n_s = ranks.shape[:2]
    count = 0
    for _ in range(int(n_permutations)):
        perm = np.argsort(rng.random((n_b, n_s)), axis=1)            # a permutation of settings per block
        count += statistic(np.take_along_axis(ranks, perm[:, :, None], 1)) >= t_obs - 1e-12
    return {"T": t_obs, "p": (1 + count) / (1 + int(n_permutations)), "blocks": int(n_b),
            "mean_ranks": ranks.mean(0)}


def _vector(x) -> np.ndarray:
    x = np.asarray(x, np.float64)
    if x.ndim != 1 or len(x) == 0:
        raise SaliencyInputError(f"expected a non-empty 1-D array of per-state scores, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise SaliencyInputError("per-state scores contain NaN or inf")
    return x
