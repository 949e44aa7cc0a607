"""experiments.frame_stack_bug: the statistic, separation analysis and summary on synthetic runs."""
import numpy as np
import pytest

from experiments import frame_stack_bug as fsb


def rows(newest, returns, steps=(100, 200, 300, 400)):
    return fsb.add_statistic([{"step": s, "update": i + 1, "newest_share": n, "return_mean": r}
                              for i, (s, n, r) in enumerate(zip(steps, newest, returns))])


def test_statistic_is_gain_over_first_snapshot():
    r = rows([0.3, 0.35, 0.5, 0.2], [0, 0, 0, 0])
    np.testing.assert_allclose([x[fsb.STATISTIC] for x in r], [0.0, 0.05, 0.2, -0.1])


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
    assert per_bug["reuse"]["saliency_separation_step"] == 200
    assert per_bug["reuse"]["saliency_direction"] == "+"
    assert per_bug["reuse"]["reward_separation_step"] == 400
    assert per_bug["reuse"]["reward_direction"] == "-"
    assert per_bug["reversed"]["saliency_separation_step"] is None
    assert per_bug["reversed"]["reward_separation_step"] is None
    assert fsb.overall(per_bug, "saliency_separation_step") is None
    assert fsb.overall({"a": {"k": 200}, "b": {"k": 300}}, "k") == 300


def test_bad_arguments_are_clear():
    with pytest.raises(SystemExit):
        fsb.main(["--bugs", "none"])
    with pytest.raises(Exception, match="unknown frame-stack bug 'sideways'"):
        fsb.main(["--bugs", "sideways"])
