"""Paper A claim 2's re-analysis (experiments/paper_a/claim2_reanalysis.py): the joint stationary
bootstrap of a ratio of means with a missing last pair, its coverage on autocorrelated series, the
pre-declared readings, and the stop when recomputed means differ from the committed ones."""
import numpy as np
import pytest

from experiments.paper_a import claim2_reanalysis as C
from jaxsal.metrics.statistics import optimal_block_length


def _ar1(rng, n, phi, mean, sd):
    e = rng.normal(size=n)
    x = np.empty(n)
    x[0] = e[0]
    for i in range(1, n):
        x[i] = phi * x[i - 1] + np.sqrt(1 - phi ** 2) * e[i]
    return mean + sd * x


def _values(rng, n=64, act=0.1, state=0.3, act_r=0.3, state_r=0.3, phi=0.6):
    def net(a, s):
        st = _ar1(rng, n, phi, s, 0.05)
        st[-1] = np.nan
        return {"action": _ar1(rng, n, phi, a, 0.03), "state": st}
    return {"trained": net(act, state), "random_init": net(act_r, state_r)}


def test_resampled_means_drop_the_missing_pair_and_equal_the_mean_on_the_identity_resample():
    x = np.array([1.0, 2.0, 3.0, np.nan])
    starts, lengths = np.array([[0]]), np.array([[4]])
    assert C._resampled_means(x, starts, lengths)[0] == pytest.approx(2.0)
    starts, lengths = np.array([[3, 0]]), np.array([[2, 2]])   # probes 3, 0, 0, 1 (wrapping)
    assert C._resampled_means(x, starts, lengths)[0] == pytest.approx((1 + 1 + 2) / 3)


def test_block_length_is_the_largest_automatic_one():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=64), _ar1(rng, 64, 0.9, 0, 1)
    assert C.block_length([a, b]) == pytest.approx(max(optimal_block_length(a), optimal_block_length(b)))


def test_ratio_intervals_cover_the_true_ratios_on_autocorrelated_series():
    rng = np.random.default_rng(1)
    hits = {"trained": 0, "trained_minus_random": 0}
    sims = 60
    for s in range(sims):
        v = _values(rng)
        iv = C.ratio_intervals(v, C.block_length([v[n][p] for n in C.NETS for p in ("action", "state")]),
                               n_resamples=1000, seed=s)
        hits["trained"] += iv["trained"]["low"] <= 1 / 3 <= iv["trained"]["high"]
        hits["trained_minus_random"] += iv["trained_minus_random"]["low"] <= 1 / 3 - 1 <= iv["trained_minus_random"]["high"]
    assert hits["trained"] / sims >= 0.8 and hits["trained_minus_random"] / sims >= 0.8


def _committed(values):
    return {net: {m: {"action_change": {"mean": float(np.nanmean(values[net][m]["action"]))},
                      "state_change": {"mean": float(np.nanmean(values[net][m]["state"]))}} for m in values[net]}
            for net in C.NETS}


def test_readings_follow_the_intervals_and_can_reject():
    rng = np.random.default_rng(2)
    clear, equal = _values(rng), _values(rng, act=0.3, state=0.3, act_r=0.3, state_r=0.3)
    values = {net: {"clear": clear[net], "equal": equal[net]} for net in C.NETS}
    res = C.analyse(values, _committed(values))
    assert res["clear"]["less_than_state"] and res["clear"]["training_lowers_it"]
    assert not res["equal"]["less_than_state"] and not res["equal"]["training_lowers_it"]
    iv = res["equal"]["intervals"]["auto"]["trained"]
    assert iv["low"] < 1 < iv["high"]
    md = C.markdown(res, {"probes": 64})
    assert "| clear |" in md and "| equal |" in md and "N: 1 agent, 64 probe states" in md


def test_a_recomputed_mean_that_differs_from_the_committed_one_stops_the_run():
    rng = np.random.default_rng(3)
    v = _values(rng)
    values = {net: {"gradient": v[net]} for net in C.NETS}
    committed = _committed(values)
    committed["trained"]["gradient"]["state_change"]["mean"] += 1e-3
    with pytest.raises(SystemExit, match="trained/gradient/state_change: recomputed mean"):
        C.analyse(values, committed)
