"""experiments.frame_stack_bug.run: the statistics, separation analysis and summary on synthetic runs."""
import numpy as np
import pytest

from experiments.frame_stack_bug import run as fsb


def shares_for(newest, methods=2, probes=3):
    """(T, M, N, 4) shares with `newest` on the newest slot and the rest spread evenly, so the
    age centroid is 2 (1 - newest)."""
    out = np.zeros((len(newest), methods, probes, 4))
    for t, p in enumerate(newest):
        out[t] = [(1 - p) / 3] * 3 + [p]
    return out


def rows(newest, returns, steps=(100, 200, 300, 400), window=1):
    r = [{"step": s, "update": i + 1, "newest_share": n, "return_mean": x}
         for i, (s, n, x) in enumerate(zip(steps, newest, returns))]
    return fsb.add_statistic(r, shares_for(newest), window)


def test_statistics_gain_over_first_snapshot():
    r = rows([0.3, 0.35, 0.5, 0.2], [0, 0, 0, 0])
    np.testing.assert_allclose([x[fsb.OLD_STATISTIC] for x in r], [0.0, 0.05, 0.2, -0.1])
    # age centroid 2 (1 - p): its gain is -2 x the newest-share gain (window 1)
    np.testing.assert_allclose([x[fsb.STATISTIC] for x in r], [0.0, -0.1, -0.4, 0.2])
    # window 2: causal mean of the last two gains
    r2 = rows([0.3, 0.35, 0.5, 0.2], [0, 0, 0, 0], window=2)
    np.testing.assert_allclose([x[fsb.STATISTIC] for x in r2], [0.0, -0.05, -0.25, -0.1])
    with pytest.raises(ValueError, match="3 snapshots of shares for 4 rows"):
        fsb.add_statistic(r, shares_for([0.3, 0.3, 0.3]))


def test_analyse_finds_saliency_before_reward_and_overall_steps():
    seeds = [0, 1, 2]
    res = {}
    for s in seeds:
        base = 0.25 + 0.01 * s
        res[(None, s)] = rows([base, base, base + 0.01, base + 0.02], [1 + s, 2 + s, 3 + s, 4 + s])
        # "reuse": newest share climbs from step 200; returns fall below correct only at 400
        res[("reuse", s)] = rows([base, base + 0.2, base + 0.3, base + 0.3], [1 + s, 2 + s, 3 + s, -5])
        # "reversed": never separated (statistic like correct, returns like correct)
        res[("reversed", s)] = rows([base, base + 0.001 * (s - 1), base + 0.01, base + 0.02 - 0.001 * s],
                                    [1 + s, 2 + s, 3 + s, 4 + s])
    steps, per_bug = fsb.analyse(res, ["reuse", "reversed"], seeds, 0.9)
    assert steps == [100, 200, 300, 400]
    reuse, rev = per_bug["reuse"], per_bug["reversed"]
    assert (reuse["saliency_separation_step"], reuse["saliency_direction"]) == (200, "-")   # age falls
    assert (reuse["saliency_old_separation_step"], reuse["saliency_old_direction"]) == (200, "+")
    assert (reuse["reward_separation_step"], reuse["reward_direction"]) == (400, "-")
    assert rev["saliency_separation_step"] is None and rev["saliency_old_separation_step"] is None
    assert rev["reward_separation_step"] is None
    # overall: the step by which every separated bug is, plus the ones never separated
    assert fsb.overall(per_bug, "saliency_separation_step") == (200, ["reversed"], None)
    assert fsb.overall(per_bug, "reward_separation_step") == (400, ["reversed"], None)
    assert fsb.overall({"a": {"k": 200}, "b": {"k": 300}}, "k") == (300, [], 300)
    assert fsb.overall({"a": {"k": None}}, "k") == (None, ["a"], None)
    block = fsb.overall_block(per_bug)
    assert block["saliency_separation_step"] == 200
    assert block["saliency_bugs_not_separated"] == ["reversed"]
    assert block["saliency_separation_step_all_bugs"] is None
    # a subset of seeds (the held-out evaluation) is analysed on its own
    _, sub = fsb.analyse(res, ["reuse"], [1, 2], 0.9)
    assert sub["reuse"]["saliency_auc"] == [0.5, 0.0, 0.0, 0.0]


def test_bad_arguments_are_clear():
    with pytest.raises(SystemExit):
        fsb.main(["--bugs", "none"])
    with pytest.raises(Exception, match="unknown frame-stack bug 'sideways'"):
        fsb.main(["--bugs", "sideways"])
