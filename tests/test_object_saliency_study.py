"""experiments.object_saliency helpers on known answers (the study itself runs minutes)."""
import numpy as np

from experiments.object_saliency import bootstrap_ci, top_class
from jaxsal.metrics import object_attribution
from jaxsal.objects import ObjectBoxes


def test_bootstrap_ci_brackets_the_mean_and_drops_nan():
    v = np.r_[np.random.default_rng(0).normal(0.3, 0.1, 400), np.nan]
    lo, hi = bootstrap_ci(v)
    assert lo < 0.3 < hi and hi - lo < 0.05
    assert np.isnan(bootstrap_ci([np.nan])).all()


def test_top_class_is_the_largest_lift_over_chance():
    b = np.zeros((2, 1, 2, 4), np.int16)
    b[:, 0, 0] = (0, 0, 42, 84)        # class 0: half the frame
    b[:, 0, 1] = (60, 60, 62, 62)      # class 1: 4 px
    ob = ObjectBoxes(b, np.tile(np.array([0, 1], np.int8), (2, 1, 1)), ("big", "small"))
    maps = np.zeros((2, 84, 84), np.float32)
    maps[0, :42] = 1.0                  # all on the big class: lift 0.5
    maps[1, :42] = 1.0
    maps[1, 60:62, 60:62] = 2000.0      # most mass on the small class: lift ~0.8
    np.testing.assert_array_equal(top_class(object_attribution(maps, ob)), [0, 1])
    assert top_class(object_attribution(np.zeros((2, 84, 84)), ob)).tolist() == [-1, -1]


def test_bootstrap_ci_resamples_blocks_of_consecutive_states():
    # 400 states in 16 runs of 25 identical values: only 16 independent draws, so the interval
    # must be as wide as the spread of 16 run means, not of 400 states.
    runs = np.random.default_rng(1).normal(0.0, 1.0, 16)
    v = np.repeat(runs, 25)
    lo, hi = bootstrap_ci(v)
    se_runs = runs.std(ddof=1) / np.sqrt(16)
    assert hi - lo > 2.5 * se_runs          # ~3.9 se for a 95% interval
    assert hi - lo > 3 * (2 * 1.96 * v.std() / np.sqrt(400))
