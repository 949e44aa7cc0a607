"""Block bootstrap, paired block test and Holm against slow references from their definitions."""
import itertools

import numpy as np
import pytest
from scipy import stats
from scipy.signal import lfilter

from jaxsal import SaliencyInputError
from jaxsal.metrics.statistics import block_bootstrap_ci, block_means, blocks, holm, paired_block_test


def _ar1(n, phi, seed):
    """x_i = phi x_{i-1} + e_i, e ~ N(0, 1), x_0 = e_0."""
    return lfilter([1.0], [1.0, -phi], np.random.default_rng(seed).normal(size=n))


def test_blocks_are_contiguous_near_equal_and_cover_everything():
    b = blocks(1000, 25)
    assert len(b) == 40 and all(len(x) == 25 for x in b)
    b = blocks(210, 25)                      # round(8.4) = 8 blocks of 26 or 27
    assert len(b) == 8 and {len(x) for x in b} <= {26, 27}
    assert np.array_equal(np.concatenate(b), np.arange(210))
    assert all(np.all(np.diff(x) == 1) for x in b)
    assert len(blocks(7, 25)) == 1
    with pytest.raises(SaliencyInputError, match="block_len"):
        blocks(10, 0)


def test_bootstrap_equals_a_loop_over_resampled_blocks():
    x = np.random.default_rng(0).normal(size=103)
    mean, lo, hi = block_bootstrap_ci(x, 10, 500, seed=3)
    idx = blocks(103, 10)
    rng = np.random.default_rng(3)
    pick = rng.integers(0, len(idx), (500, len(idx)))
    ref = []
    for row in pick:                          # definition: concatenate the drawn blocks, take the mean
        ref.append(np.concatenate([x[idx[j]] for j in row]).mean())
    assert mean == pytest.approx(x.mean())
    assert (lo, hi) == pytest.approx(tuple(np.quantile(ref, [0.025, 0.975])))


def test_block_interval_is_wider_than_iid_on_autocorrelated_data_and_covers():
    # AR(1) with phi 0.9: the iid bootstrap (block_len 1) understates the spread of the mean;
    # blocks of 50 capture it and cover the true mean 0 in most of 40 series
    widths, covered = [], 0
    for s in range(40):
        x = _ar1(1000, 0.9, s)
        _, lo1, hi1 = block_bootstrap_ci(x, 1, 1000, seed=s)
        _, lo, hi = block_bootstrap_ci(x, 50, 1000, seed=s)
        widths.append((hi - lo) / (hi1 - lo1))
        covered += lo <= 0 <= hi
    assert np.median(widths) > 2.5
    assert covered >= 30


def test_paired_test_is_wilcoxon_on_block_mean_differences():
    rng = np.random.default_rng(1)
    y = rng.normal(size=200)
    x = y + 0.3 + rng.normal(size=200)
    r = paired_block_test(x, y, 25)
    d = np.array([(x - y)[i * 25:(i + 1) * 25].mean() for i in range(8)])
    assert r["blocks"] == 8 and r["diff"] == pytest.approx((x - y).mean())
    assert r["p"] == pytest.approx(stats.wilcoxon(d).pvalue)
    np.testing.assert_allclose(block_means(x - y, 25), d)
    same = paired_block_test(y, y, 25)
    assert np.isnan(same["p"]) and same["diff"] == 0
    assert np.isnan(paired_block_test(x[:10], y[:10], 25)["p"])      # one block: no test
    with pytest.raises(SaliencyInputError, match="equal lengths"):
        paired_block_test(x, y[:5], 25)


def test_paired_test_rejects_a_real_shift_and_keeps_its_level_under_autocorrelation():
    base = _ar1(1000, 0.8, 7)
    shifted = base + 0.5 + 0.5 * np.random.default_rng(2).normal(size=1000)
    assert paired_block_test(shifted, base, 25)["p"] < 1e-4
    # null: x - y is AR(1) noise with mean 0 (phi 0.8, correlation length ~5 states). Blocks
    # of 25 keep the type-I error near 5 %; treating states as independent (block_len 1) does not
    p_block, p_state = [], []
    for s in range(200):
        d = _ar1(1000, 0.8, 100 + s)
        p_block.append(paired_block_test(d, np.zeros(1000), 25)["p"])
        p_state.append(paired_block_test(d, np.zeros(1000), 1)["p"])
    assert np.mean(np.array(p_block) < 0.05) < 0.10
    assert np.mean(np.array(p_state) < 0.05) > 0.25


def test_holm_matches_the_step_down_definition():
    p = np.array([0.01, 0.04, 0.03, np.nan, 0.005, 0.5])
    got = holm(p)
    ok = [i for i in range(len(p)) if not np.isnan(p[i])]
    m = len(ok)
    order = sorted(ok, key=lambda i: p[i])
    want = np.full(len(p), np.nan)
    running = 0.0
    for k, i in enumerate(order):             # adjusted p_(k) = max_{j<=k} (m - j) p_(j), capped at 1
        running = max(running, (m - k) * p[i])
        want[i] = min(running, 1.0)
    np.testing.assert_allclose(got, want)
    assert np.isnan(got[3])
    # rejecting at 0.05 = Holm's procedure: reject while p_(k) <= alpha / (m - k)
    rejected = set()
    for k, i in enumerate(order):
        if p[i] <= 0.05 / (m - k):
            rejected.add(i)
        else:
            break
    assert rejected == {i for i in ok if got[i] <= 0.05}
    assert list(itertools.chain(holm([]))) == []
