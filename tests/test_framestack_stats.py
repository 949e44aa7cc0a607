"""jaxsal.frame_stats: per-frame attribution shares on synthetic maps, AUC, separation steps."""
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.errors import SaliencyInputError
from jaxsal.frame_stats import age_centroid, auc, auc_curve, frame_shares, newest_share, separation_step


def synthetic_maps(profile, n=5, hw=6, c=2, seed=0):
    """Random-sign maps whose |mass| per stacked frame follows `profile` (frame-major channels)."""
    rng = np.random.default_rng(seed)
    k = len(profile)
    m = rng.uniform(0.5, 1.5, (n, hw, hw, k * c)) * rng.choice([-1, 1], (n, hw, hw, k * c))
    for j, w in enumerate(profile):
        block = m[..., j * c:(j + 1) * c]
        m[..., j * c:(j + 1) * c] = block / np.abs(block).sum(axis=(1, 2, 3), keepdims=True) * w
    return m


def test_frame_shares_hand_computed():
    m = np.zeros((1, 2, 2, 6))
    m[0, 0, 0, 0], m[0, 1, 1, 1] = 1.0, -1.0        # frame 0: mass 2
    m[0, 0, 1, 2] = 3.0                             # frame 1: mass 3
    m[0, :, :, 4:] = -1.25                          # frame 2: mass 8 * 1.25 = 10
    np.testing.assert_allclose(frame_shares(m, 3), [[2 / 15, 3 / 15, 10 / 15]])
    np.testing.assert_allclose(frame_shares(np.zeros((2, 3, 3, 4)), 4), np.full((2, 4), 0.25))


def test_shares_follow_the_synthetic_profile_and_reference_loop():
    prof = [0.1, 0.15, 0.25, 0.5]
    m = synthetic_maps(prof, c=3)
    s = frame_shares(m, 4)
    np.testing.assert_allclose(s, np.tile(prof, (5, 1)), atol=1e-12)
    # reference: a plain loop over states and frames
    ref = np.zeros((5, 4))
    for i in range(5):
        for j in range(4):
            ref[i, j] = sum(abs(m[i, y, x, j * 3 + ch]) for y in range(6) for x in range(6) for ch in range(3))
        ref[i] /= ref[i].sum()
    np.testing.assert_allclose(s, ref, rtol=1e-12)


def test_bug_signatures_on_synthetic_maps():
    """The degenerate profiles the bugs produce are told apart from a correct one."""
    correct = frame_shares(synthetic_maps([0.1, 0.15, 0.25, 0.5]), 4)
    reversed_ = frame_shares(synthetic_maps([0.5, 0.25, 0.15, 0.1]), 4)
    no_update = frame_shares(synthetic_maps([0.25] * 4), 4)
    reuse = frame_shares(synthetic_maps([0.01, 0.01, 0.01, 0.97]), 4)
    ns = {k: newest_share(v).mean() for k, v in dict(c=correct, r=reversed_, n=no_update, u=reuse).items()}
    assert ns["u"] > ns["c"] > ns["n"] > ns["r"]
    assert np.isclose(ns["n"], 0.25)
    ac = {k: age_centroid(v).mean() for k, v in dict(c=correct, r=reversed_, n=no_update, u=reuse).items()}
    assert np.isclose(ac["n"], 1.5) and np.isclose(ac["c"] + ac["r"], 3.0) and ac["u"] < ac["c"]


def test_shares_of_real_gradient_maps_find_the_frame_the_model_reads():
    """A model that reads only stacked frame j gets all its gradient mass on frame j."""
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.normal(size=(5, 5, 2)))
    obs = rng.uniform(0, 255, (3, 5, 5, 8)).astype(np.float32)     # 4 frames x 2 channels
    for j in range(4):
        def apply_fn(params, x, j=j):
            return jnp.stack([(x[..., 2 * j:2 * j + 2] * params).sum((1, 2, 3)),
                              jnp.zeros(x.shape[0])], -1)
        maps = jaxsal.explain(apply_fn, w, obs, method="gradient", per_frame=True,
                              actions=np.zeros(3, int))
        expected = np.zeros((3, 4))
        expected[:, j] = 1.0
        np.testing.assert_allclose(frame_shares(maps, 4), expected, atol=1e-6)


def test_auc_hand_values():
    assert auc([3, 4], [1, 2]) == 1.0
    assert auc([1, 2], [3, 4]) == 0.0
    assert auc([1, 3], [2, 2]) == 0.5
    assert auc([2], [2]) == 0.5
    # pairs: 1 beats 0; 2 beats 0, ties 2; 3 beats 0 and 2 -> (1 + 1.5 + 2) / 9
    assert auc([1, 2, 3], [0, 2, 5]) == pytest.approx(4.5 / 9)


def test_separation_step_sustained_and_one_direction():
    steps = [0, 10, 20, 30, 40]
    correct = np.array([[0, 0, 0, 0, 0], [1, 1, 1, 1, 1], [2, 2, 2, 2, 2]], float)
    up = correct + np.array([0, 0, 5, 5, 5])               # above from step 20 on
    assert separation_step(steps, up, correct)[:2] == (20, "+")
    down = correct - np.array([0, 5, 5, 5, 5])
    assert separation_step(steps, down, correct)[:2] == (10, "-")
    # separated early by chance, then not, then again: only the final sustained stretch counts
    blip = correct + np.array([5, 0, 0, 5, 5])
    assert separation_step(steps, blip, correct)[:2] == (30, "+")
    # flips direction at the end: the stretch starts at the flip
    flip = correct + np.array([0, 5, 5, -5, -5])
    assert separation_step(steps, flip, correct)[:2] == (30, "-")
    # never separated (overlapping): None
    assert separation_step(steps, correct + 0.5, correct)[:2] == (None, None)
    # not separated at the end: None
    assert separation_step(steps, correct + np.array([5, 5, 5, 5, 0]), correct)[0] is None
    np.testing.assert_allclose(auc_curve(up, correct), [0.5, 0.5, 1, 1, 1])   # equal groups: 0.5


def test_errors_are_clear():
    with pytest.raises(SaliencyInputError, match="per_frame=True"):
        frame_shares(np.zeros((2, 3, 3)), 1)
    with pytest.raises(SaliencyInputError, match="dividing the channel count 6"):
        frame_shares(np.zeros((1, 2, 2, 6)), 4)
    with pytest.raises(SaliencyInputError, match="NaN"):
        frame_shares(np.full((1, 2, 2, 2), np.nan), 2)
    with pytest.raises(SaliencyInputError, match="at least one value"):
        auc([], [1])
    with pytest.raises(SaliencyInputError, match="equal checkpoints"):
        auc_curve(np.zeros((2, 3)), np.zeros((2, 4)))
    with pytest.raises(SaliencyInputError, match="2 steps for 3 checkpoints"):
        separation_step([0, 1], np.zeros((2, 3)), np.zeros((2, 3)))
