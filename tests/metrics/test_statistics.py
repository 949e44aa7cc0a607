"""Block bootstrap, paired block test and Holm against slow references from their definitions."""
import itertools

import numpy as np
import pytest
from scipy import stats
from scipy.signal import lfilter

from jaxsal import SaliencyInputError
from jaxsal.metrics.statistics import (batch_means_test, block_bootstrap_ci, block_means, blocks, holm,
                                       optimal_block_length, paired_block_test, rank_interaction_test,
                                       stationary_blocks, stationary_bootstrap_ci, stationary_bootstrap_means)


def _ar1(n, phi, seed):
    """x_i = phi x_{i-1} + e_i, e ~ N(0, 1), x_0 = e_0."""
    return lfilter([1.0], [1.0, -phi], np.random.default_rng(seed).normal(size=n))


def _ar1_stationary(n, phi, seed, burn=500):
    """AR(1) started in its stationary distribution (burn-in dropped), so the mean is exactly 0."""
    return _ar1(n + burn, phi, seed)[burn:]


def _sb_target(phi, n):
    """Politis-White optimal stationary-bootstrap block length of AR(1): (G / g(0))^(2/3) n^(1/3),
    G / g(0) = 2 phi / (1 - phi^2)."""
    return (2 * phi / (1 - phi ** 2)) ** (2 / 3) * n ** (1 / 3)


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


@pytest.mark.parametrize("nan", ["omit", "count"])
def test_holm_matches_the_step_down_definition(nan):
    p = np.array([0.01, 0.04, 0.03, np.nan, 0.005, 0.5, np.nan])
    got = holm(p, nan=nan)
    ok = [i for i in range(len(p)) if not np.isnan(p[i])]
    m = len(ok) if nan == "omit" else len(p)          # "count": the two NaN tests are in the family
    order = sorted(ok, key=lambda i: p[i])
    want = np.full(len(p), np.nan)
    running = 0.0
    for k, i in enumerate(order):             # adjusted p_(k) = max_{j<=k} (m - j) p_(j), capped at 1
        running = max(running, (m - k) * p[i])
        want[i] = min(running, 1.0)
    np.testing.assert_allclose(got, want)
    assert np.isnan(got[3]) and np.isnan(got[6])
    # rejecting at 0.05 = Holm's procedure: reject while p_(k) <= alpha / (m - k)
    rejected = set()
    for k, i in enumerate(order):
        if p[i] <= 0.05 / (m - k):
            rejected.add(i)
        else:
            break
    assert rejected == {i for i in ok if got[i] <= 0.05}
    assert list(itertools.chain(holm([], nan=nan))) == [] and np.isnan(holm([np.nan], nan=nan)).all()


def test_holm_refuses_an_unknown_nan_rule():
    with pytest.raises(ValueError, match='nan must be "omit" or "count"'):
        holm([0.1], nan="drop")


def test_the_registered_analyses_keep_their_nan_rule():
    """The frame-stack rule's view and the Paper B across-agents analysis count a NaN p in the family
    (as they did when registered); the across-agents one reports it as 1."""
    from experiments.frame_stack_bug import detection_rule
    from experiments.paper_b import agents_analysis
    p = [0.01, np.nan, 0.02]
    np.testing.assert_allclose(detection_rule.holm(p), [0.03, np.nan, 0.04])
    assert agents_analysis.holm(p) == pytest.approx([0.03, 1.0, 0.04])
    np.testing.assert_allclose(holm(p), [0.02, np.nan, 0.02])          # the library's default omits it


def test_automatic_block_length_grows_with_rho_and_tracks_the_ar1_target():
    n = 1000
    med = {}
    for phi in (0.0, 0.5, 0.8, 0.9):
        med[phi] = np.median([optimal_block_length(_ar1_stationary(n, phi, 300 + s)) for s in range(40)])
    assert med[0.0] == 1.0                                    # no dependence: the i.i.d. bootstrap
    assert med[0.0] < med[0.5] < med[0.8] < med[0.9]
    for phi in (0.5, 0.8):                                    # within 25 % of the AR(1) target (12.1, 27.0)
        assert med[phi] == pytest.approx(_sb_target(phi, n), rel=0.25)
    # unbounded memory (a random walk): the lag window stops at m_max = ceil(sqrt(n)) + 5, so the
    # estimate saturates near its ceiling with autocorrelation 1 up to m_max: 59.1 states for
    # 1,000 states, 22.9 for 200 (the cap b_max = 95 / 43 never binds)
    walk = [optimal_block_length(np.cumsum(np.random.default_rng(s).normal(size=1000))) for s in range(5)]
    assert all(50 < b < 59.2 for b in walk)
    assert 18 < optimal_block_length(np.cumsum(np.random.default_rng(0).normal(size=200))) < 23
    assert optimal_block_length(np.ones(50)) == 1.0


def _ma_lag4(n, seed):
    """x_t = e_t + e_{t-4}: autocorrelation 0.5 at lag 4 only, none at lags 1-3."""
    e = np.random.default_rng(seed).normal(size=n + 4)
    return e[4:] + e[:-4]


@pytest.mark.parametrize("series", ["ar1", "lag4"])
def test_automatic_block_length_matches_its_formula_on_a_hand_case(series):
    # ar1: strong lag-1 dependence that dies out. lag4: dependence first seen at lag 4, which the
    # K_n = 5 lags of the band check catch (m = 4, not 0). Recompute b from the definition
    x = _ar1_stationary(400, 0.6, 5) if series == "ar1" else _ma_lag4(400, 5)
    n, eps = len(x), x - x.mean()
    acv = [eps[k:] @ eps[:n - k] / n for k in range(40)]
    band = 2 * np.sqrt(np.log10(n) / n)
    m = next(m for m in range(30) if all(abs(acv[m + k] / acv[0]) < band for k in range(1, 6)))
    big_m = min(2 * m, int(np.ceil(np.sqrt(n))) + 5)
    lam = lambda t: 1.0 if t <= 0.5 else 2 * (1 - t)        # noqa: E731
    g = sum(2 * lam(k / big_m) * k * acv[k] for k in range(1, big_m + 1))
    g0 = acv[0] + sum(2 * lam(k / big_m) * acv[k] for k in range(1, big_m + 1))
    assert optimal_block_length(x) == pytest.approx((g * g / (g0 * g0)) ** (1 / 3) * n ** (1 / 3))
    assert m == (3 if series == "ar1" else 4)


@pytest.mark.parametrize("n, period", [(1000, 60), (60, 20), (1000, 50), (60, 12)])
def test_automatic_block_length_is_capped_at_b_max(n, period):
    """b_max = ceil(min(3 sqrt(n), n / 3)): 95 for 1,000 states (3 sqrt(n) binds), 20 for 60 (n / 3).
    Noisy sines, both ways of reaching it: periods 60 (n = 1,000) and 20 (n = 60) give g(0) > 0 and a
    formula value above b_max (~160 and ~26); periods 50 and 12 give g(0) < 0 (negative
    autocorrelations at the longer lags of the window)."""
    t = np.arange(n)
    x = np.sin(2 * np.pi * t / period) + 0.1 * np.random.default_rng(2).normal(size=n)
    assert optimal_block_length(x) == {60: 20.0, 1000: 95.0}[n]


def test_stationary_blocks_follow_the_definition():
    rng = np.random.default_rng(3)
    starts, lengths = stationary_blocks(103, 7.0, 400, rng)
    assert np.all(lengths.sum(1) == 103) and np.all(lengths >= 0)
    assert np.all((starts >= 0) & (starts < 103))
    # each of positions 1..n-1 starts a new block with probability 1/7: 1 + 102 / 7 blocks expected
    assert (lengths > 0).sum(1).mean() == pytest.approx(1 + 102 / 7, rel=0.03)
    # the fast means equal the means of the explicit resamples (blocks laid end to end, wrapping)
    y = np.random.default_rng(1).normal(size=103)
    fast = stationary_bootstrap_means(y, 7.0, 50, seed=3)
    st, ln = stationary_blocks(103, 7.0, 50, np.random.default_rng(3))
    ref = [y[np.concatenate([(a + np.arange(k)) % 103 for a, k in zip(sr, lr) if k > 0])].mean()
           for sr, lr in zip(st, ln)]
    np.testing.assert_allclose(fast, ref)
    # a block starts at any of the n states with equal probability (the last one included)
    st5, ln5 = stationary_blocks(5, 2.0, 4000, np.random.default_rng(4))
    freq = np.bincount(st5[ln5 > 0], minlength=5) / (ln5 > 0).sum()
    np.testing.assert_allclose(freq, 0.2, atol=0.02)
    # mean block 1: every position a new block = the i.i.d. bootstrap
    _, l1 = stationary_blocks(50, 1.0, 20, rng)
    assert np.all(l1[:, :50] == 1) and np.all(l1[:, 50:] == 0)
    with pytest.raises(SaliencyInputError, match="mean_block"):
        stationary_blocks(10, 0.5, 2, rng)


def test_stationary_interval_covers_near_nominal_where_25_state_blocks_are_too_narrow():
    # AR(1), phi 0.9 (autocorrelation time 19 states), 1,000 states, true mean 0. Same series for both.
    sb, nbb, width = 0, 0, []
    for s in range(200):
        x = _ar1_stationary(1000, 0.9, 1000 + s)
        r = stationary_bootstrap_ci(x, None, 1000, seed=s)
        _, lo, hi = block_bootstrap_ci(x, 25, 1000, seed=s)
        sb += r["low"] <= 0 <= r["high"]
        nbb += lo <= 0 <= hi
        width.append((r["high"] - r["low"]) / (hi - lo))
    assert sb / 200 >= 0.87                                   # 0.895 here (nominal 0.95)
    assert sb / 200 - nbb / 200 >= 0.03                       # committed 25-state blocks: 0.855
    assert np.median(width) > 1.05


def test_batch_means_test_is_a_t_test_on_block_means_and_keeps_its_level():
    rng = np.random.default_rng(4)
    x, y = rng.normal(size=300) + 0.2, rng.normal(size=300)
    r = batch_means_test(x, y, 30)
    d = block_means(x - y, 30)
    assert r["blocks"] == 10 and r["p"] == pytest.approx(stats.ttest_1samp(d, 0).pvalue)
    assert r["diff"] == pytest.approx((x - y).mean())
    assert np.isnan(batch_means_test(y, y, 30)["p"])
    assert batch_means_test(np.ones(100), None, 10)["p"] == 0.0
    assert np.isnan(batch_means_test(x[:20], y[:20], 30)["p"])   # one block
    # null, AR(1) phi 0.95 (autocorrelation time 39 states): Wilcoxon on 25-state blocks (the
    # committed test) rejects 15 % of true nulls, the automatic blocks 9.5 % (better, still above 5 %:
    # the automatic length stays near 47 here), 100-state blocks hold the level (6 %)
    auto, w25, b100 = [], [], []
    for s in range(400):
        d = _ar1_stationary(1000, 0.95, 5000 + s)
        auto.append(batch_means_test(d)["p"])
        b100.append(batch_means_test(d, None, 100)["p"])
        w25.append(paired_block_test(d, np.zeros(1000), 25)["p"])
    auto, b100, w25 = (np.mean(np.array(v) < 0.05) for v in (auto, b100, w25))
    assert w25 >= 0.13 and auto <= 0.12 and b100 <= 0.085
    assert auto < w25 - 0.03
    shifted = _ar1_stationary(1000, 0.9, 9) + 1.5
    assert batch_means_test(shifted)["p"] < 1e-3


def _settings_data(n, means, scale, noise, rho, seed):
    """(n, settings, methods): scale_s * (means[s, m] + shared state effect) + AR(1) noise_s."""
    rng = np.random.default_rng(seed)
    n_s, n_m = means.shape
    shared = _ar1_stationary(n, rho, int(rng.integers(1 << 30)))
    out = np.empty((n, n_s, n_m))
    for s in range(n_s):
        for m in range(n_m):
            e = _ar1_stationary(n, rho, int(rng.integers(1 << 30))) * np.sqrt(1 - rho ** 2)
            out[:, s, m] = scale[s] * (means[s, m] + 0.5 * shared) + noise[s] * e
    return out


def test_rank_interaction_detects_a_planted_interaction_and_holds_its_level():
    n, mu = 600, np.tile(np.linspace(0, 1, 6), (4, 1))
    planted = mu.copy()
    planted[2:, [0, 5]] = planted[2:, [5, 0]]                 # first and last swap in two settings
    scale, noise = [1, 0.2, 3, 0.5], [1.0, 0.2, 3.0, 0.5]     # equal noise-to-signal in every setting
    p = rank_interaction_test(_settings_data(n, planted, scale, noise, 0.8, 1), 50, 999)["p"]
    assert p < 0.01
    ps = [rank_interaction_test(_settings_data(n, mu, scale, noise, 0.8, 100 + s), 50, 199, seed=s)["p"]
          for s in range(100)]
    assert np.mean(np.array(ps) <= 0.05) <= 0.10              # null: same order, rescaled settings
    with pytest.raises(SaliencyInputError, match="settings"):
        rank_interaction_test(np.zeros((10, 1, 3)), 5)


def test_rank_interaction_also_rejects_when_one_setting_is_only_noisier():
    # same order everywhere, one setting 6x noisier: its mean ranks are compressed, so the
    # exchangeability null is false although no winner changes (why it is not the winner rule)
    mu = np.tile(np.linspace(0, 1, 6), (4, 1))
    ps = [rank_interaction_test(_settings_data(600, mu, [1, 1, 1, 1], [0.5, 0.5, 0.5, 3.0], 0.8, 200 + s),
                                50, 199, seed=s)["p"] for s in range(30)]
    assert np.mean(np.array(ps) <= 0.05) > 0.5
