"""experiments.frame_stack_bug.detection_rule: the pre-registered rule on synthetic data with known answers."""
import math

import numpy as np
import pytest

from experiments.frame_stack_bug import detection_rule as dr
from experiments.frame_stack_bug import plan


def test_relabellings_enumerate_every_split_with_the_observed_one_first():
    lab = dr.relabellings(6, 3)
    assert lab.shape == (20, 6)
    assert np.all(lab.sum(1) == 3)
    assert len({r.tobytes() for r in lab}) == 20
    np.testing.assert_array_equal(lab[0], [1, 1, 1, 0, 0, 0])
    big = dr.relabellings(40, 20, n_random=50, seed=1)
    assert big.shape == (51, 40) and np.all(big.sum(1) == 20)
    np.testing.assert_array_equal(big[0], [1] * 20 + [0] * 20)
    with pytest.raises(ValueError):
        dr.relabellings(4, 4)


def test_permutation_p_values_known_answers():
    # 3 vs 3, completely separated: 2 of the 20 splits are as extreme (it and its mirror)
    p, d, min_p = dr.permutation_test([[5.0], [6.0], [7.0]], [[1.0], [2.0], [3.0]])
    assert p[0] == pytest.approx(0.1) and d[0] == pytest.approx(4.0) and min_p == pytest.approx(0.1)
    # identical groups: every split is at least as extreme
    p, d, _ = dr.permutation_test(np.ones((4, 2)), np.ones((4, 2)))
    np.testing.assert_allclose(p, 1.0)
    np.testing.assert_allclose(d, 0.0)
    # 8 vs 8 fully separated: 2 / C(16, 8)
    rng = np.random.default_rng(0)
    p, _, min_p = dr.permutation_test(rng.random((8, 1)) + 10, rng.random((8, 1)))
    assert p[0] == pytest.approx(2 / math.comb(16, 8)) == pytest.approx(min_p)
    with pytest.raises(ValueError, match="finite"):
        dr.permutation_test([[np.nan]], [[1.0]])
    with pytest.raises(ValueError, match="equal checkpoints"):
        dr.permutation_test(np.ones((2, 3)), np.ones((2, 2)))


def test_permutation_p_value_matches_a_brute_force_count():
    rng = np.random.default_rng(3)
    a, b = rng.normal(0.5, 1, 4), rng.normal(0, 1, 5)
    pooled = np.concatenate([a, b])
    obs = abs(a.mean() - b.mean())
    count = total = 0
    for c in __import__("itertools").combinations(range(9), 4):
        m = np.zeros(9, bool)
        m[list(c)] = True
        total += 1
        count += abs(pooled[m].mean() - pooled[~m].mean()) >= obs - 1e-12
    p, _, _ = dr.permutation_test(a[:, None], b[:, None])
    assert p[0] == pytest.approx(count / total)


def test_fixed_sequence_is_the_first_step_that_stays_rejected():
    assert dr.fixed_sequence([0.5, 0.01, 0.5, 0.01, 0.01], 0.05) == 3
    assert dr.fixed_sequence([0.01, 0.01, 0.01], 0.05) == 0
    assert dr.fixed_sequence([0.01, 0.01, 0.2], 0.05) is None    # a flag that disappears is no detection
    assert dr.fixed_sequence([0.05], 0.05) == 0                    # p <= alpha rejects


def test_holm_adjusted_p_values():
    np.testing.assert_allclose(dr.holm([0.01, 0.04, 0.03]), [0.03, 0.06, 0.06])
    np.testing.assert_allclose(dr.holm([0.5]), [0.5])


def _planted(seed, n=8, k=10, at=6, effect=3.0, sign=1.0):
    """Null AR(1) curves for both groups, plus a step of `effect` sd in the bug group from
    checkpoint `at` on."""
    rng = np.random.default_rng(seed)
    bug, correct = dr.null_runs(rng, n, k), dr.null_runs(rng, n, k)
    bug[:, at:] += sign * effect
    return bug, correct


def test_planted_effect_is_detected_at_the_planted_checkpoint():
    steps = [1000 * (i + 1) for i in range(10)]
    hits = []
    for seed in range(20):
        bug, correct = _planted(seed, effect=4.0, sign=-1.0)
        r = dr.detect(steps, bug, correct, alpha=0.0125)
        hits.append(r["detection_step"])
        if r["detection_step"] is not None:
            assert r["direction"] == "-"
    # a 4-sd step is detected exactly where it starts almost always, never before it
    assert sum(h == 7000 for h in hits) >= 17
    assert all(h is None or h >= 7000 for h in hits)
    r = dr.detect(steps, *_planted(0, effect=4.0), alpha=0.0125)
    assert r["can_reject"] and len(r["p_values"]) == 10 and r["n_bug"] == 8
    assert max(r["p_values"][6:]) <= 0.0125


def test_no_effect_rarely_detected_and_false_positive_rate_within_alpha():
    # the whole rule on null data: detection rate <= alpha (binomial slack for 400 simulations)
    rate = dr.false_positive_rate(8, 8, 23, alpha=0.0125, sims=400, seed=1)
    assert rate <= 0.0125 + 3 * math.sqrt(0.0125 * 0.9875 / 400)
    rate_uncorrelated = dr.false_positive_rate(5, 5, 25, alpha=0.025, sims=400, rho=0.0, seed=2)
    assert rate_uncorrelated <= 0.025 + 3 * math.sqrt(0.025 * 0.975 / 400)
    # ... and it is not vacuous: the per-checkpoint test alone rejects near alpha on null data
    rng = np.random.default_rng(5)
    p1 = [dr.permutation_test(*np.split(dr.null_runs(rng, 10, 1), 2))[0][0] for _ in range(400)]
    assert 0.01 < np.mean(np.array(p1) <= 0.05) < 0.1


def test_three_seeds_cannot_reject_and_say_so():
    steps = [1, 2]
    r = dr.detect(steps, [[5, 5], [6, 6], [7, 7]], [[1, 1], [2, 2], [3, 3]], alpha=0.025)
    assert r["detection_step"] is None and not r["can_reject"] and r["min_attainable_p"] == pytest.approx(0.1)


def test_bootstrap_interval_brackets_a_clean_detection_and_reports_never():
    steps = [1000 * (i + 1) for i in range(10)]
    bug, correct = _planted(0, n=6, effect=6.0)
    iv = dr.bootstrap_detection_interval(steps, bug, correct, 0.025, n_boot=100, seed=0)
    assert iv["low"] is not None and iv["low"] <= 7000 <= iv["high"]
    assert iv["never_share"] < 0.1
    null_bug, null_correct = _planted(1, n=6, effect=0.0)
    iv0 = dr.bootstrap_detection_interval(steps, null_bug, null_correct, 0.025, n_boot=50, seed=0)
    assert iv0["high"] is None and iv0["never_share"] > 0.5


def test_plan_levels_and_schedules():
    m, a = plan.MINATAR, plan.ATARI
    assert m.variants[0] == a.variants[0] == "correct"
    assert set(m.bugs) == {"reuse", "no_update", "reversed", "misaligned"} and set(a.bugs) == {"reuse", "reversed"}
    assert min(m.seeds) >= 100 and len(m.seeds) >= 8 and len(a.seeds) >= 3
    assert m.alpha == pytest.approx(0.05 / 4) and a.alpha == pytest.approx(0.05 / 2)
    for s in (m, a):
        assert s.checkpoint_every % s.snapshot_every == 0
        assert s.checkpoints == sorted(s.checkpoints) and s.checkpoints[-1] <= s.steps
        # with these seed counts the rule can reject at the per-bug level
        n = len(s.seeds)
        assert 2 / math.comb(2 * n, n) <= s.alpha
    assert m.checkpoints[0] == 4096 and m.checkpoints[-1] == 94208 and len(m.checkpoints) == 23
    assert a.checkpoints[-1] == 409_600 and a.target_every == 8 and a.arch == "dueling"
