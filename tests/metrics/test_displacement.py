"""displacement_effects / map_follows on known answers, without an emulator: an agent that reads
only one region changes its output when the object in it moves out and not when an object it
ignores moves; a map that is the moved object's box indicator follows it in every state, a map
that never changes or ignores the object never does. Tiny 24x24 frames: seconds."""
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsal.errors import SaliencyInputError
from jaxsal.metrics import displacement_effects, map_follows
from jaxsal.game_objects import ObjectBoxes

N, H, W, F = 6, 24, 24, 4
READ = (2, 2, 10, 12)          # (y0, x0, y1, x1): the only pixels Q_0 reads


def apply_fn(params, obs):
    """Q_0 = mean of READ over the stack (nonlinear), Q_1 a constant between 'ball in READ' and not."""
    y0, x0, y1, x1 = READ
    q0 = jnp.tanh(jnp.asarray(obs, jnp.float32)[:, y0:y1, x0:x1].mean((1, 2, 3)) * params / 50.0) * 10.0
    return jnp.stack([q0, jnp.full_like(q0, 7.0)], -1)


def _pair(dx_ball: int, dx_paddle: int):
    """(obs, moved_obs, boxes, moved_boxes): a 2x2 ball at (4, 4 + j) in frame j and a 2x6 paddle at
    row 20; the moved stacks have the ball dx_ball and the paddle dx_paddle px to the right."""
    def stack(db, dp):
        x = np.full((N, H, W, F), 10, np.uint8)
        b = np.zeros((N, F, 2, 4), np.int16)
        for j in range(F):
            bx, px = 4 + j + db, 6 + dp
            x[:, 4:6, bx:bx + 2, j] = 250
            x[:, 20:22, px:px + 6, j] = 250
            b[:, j, 0], b[:, j, 1] = (4, bx, 6, bx + 2), (20, px, 22, px + 6)
        return x, ObjectBoxes(b, np.tile(np.int8([0, 1]), (N, F, 1)), ("ball", "paddle"), H, W)
    x, b = stack(0, 0)
    xm, bm = stack(dx_ball, dx_paddle)
    return x, xm, b, bm


def test_moving_the_read_object_changes_the_output_and_an_ignored_one_does_not():
    params = jnp.float32(3.0)
    x, xm, _, _ = _pair(10, 0)                       # ball leaves READ (cols 14..19)
    eff = displacement_effects(apply_fn, params, x, xm)
    q = np.asarray(apply_fn(params, x))[:, 0]
    qm = np.asarray(apply_fn(params, xm))[:, 0]
    np.testing.assert_allclose(eff.effect, q - qm, rtol=1e-6)      # the definition, by hand
    assert (np.asarray(eff.effect) > 0.5).all() and np.asarray(eff.flips).all()
    x, xm, _, _ = _pair(0, 5)                        # only the paddle moves: Q_0 reads none of it
    eff = displacement_effects(apply_fn, params, x, xm)
    assert np.all(np.asarray(eff.effect) == 0) and not np.asarray(eff.flips).any()


def test_batched_equals_per_pair_and_actions_are_fixed_on_the_original():
    params = jnp.float32(3.0)
    x, xm, _, _ = _pair(10, 0)
    xm[::2] = x[::2]                                  # half the pairs unchanged
    whole = displacement_effects(apply_fn, params, x, xm, batch_size=4)
    for i in range(N):
        one = displacement_effects(apply_fn, params, x[i:i + 1], xm[i:i + 1])
        np.testing.assert_allclose(whole.effect[i], one.effect[0], rtol=1e-6)
        assert bool(whole.flips[i]) == bool(one.flips[0])
    assert not np.asarray(whole.flips)[::2].any() and np.asarray(whole.flips)[1::2].all()
    given = displacement_effects(apply_fn, params, x, xm, target="q_action", actions=np.ones(N, int))
    assert np.all(np.asarray(given.effect) == 0)      # Q_1 is a constant: moving anything leaves it


def test_an_indicator_map_of_the_ball_follows_it_in_every_state():
    x, xm, b, bm = _pair(10, 0)
    m0 = np.asarray(b.masks(frame="union"))[:, 0].astype(np.float32)
    m1 = np.asarray(bm.masks(frame="union"))[:, 0].astype(np.float32)
    fol = map_follows(m0, m1, b, bm, "ball")
    assert fol.valid.all() and fol.rate() == 1.0
    np.testing.assert_allclose(fol.moved_on_new, 1.0)    # the places do not overlap here
    np.testing.assert_allclose(fol.shift, 2.0)
    np.testing.assert_allclose(fol.chance_new, 2 * 5 / (H * W))   # 2 rows x (4 frames, 1 px apart: 5 cols)
    same = map_follows(m0, m0, b, bm, "ball")            # a map that does not move: shift 0, never follows
    assert same.rate() == 0.0 and np.allclose(same.shift, 0.0)
    flat = np.ones((N, H, W), np.float32)                # blind to objects
    assert map_follows(flat, flat, b, bm, "ball").rate() == 0.0


def test_per_frame_maps_are_scored_on_each_frames_boxes():
    x, xm, b, bm = _pair(10, 0)
    m0 = np.moveaxis(np.asarray(b.masks())[:, :, 0], 1, -1).astype(np.float32)   # (N, H, W, F)
    m1 = np.moveaxis(np.asarray(bm.masks())[:, :, 0], 1, -1).astype(np.float32)
    fol = map_follows(m0, m1, b, bm, "ball")
    assert fol.rate() == 1.0 and np.allclose(fol.moved_on_new, 1.0)
    wrong = map_follows(m1, m0, b, bm, "ball")           # mass moving the other way
    assert wrong.rate() == 0.0 and np.allclose(wrong.shift, -2.0)


def test_signed_maps_absolute_and_positive_shares():
    x, xm, b, bm = _pair(10, 0)
    m0 = -np.asarray(b.masks(frame="union"))[:, 0].astype(np.float32)      # all mass negative, on the ball
    m1 = -np.asarray(bm.masks(frame="union"))[:, 0].astype(np.float32)
    assert map_follows(m0, m1, b, bm, "ball").rate() == 1.0
    pos = map_follows(m0, m1, b, bm, "ball", share="positive")              # no positive mass: not scored
    assert not pos.valid.any() and pos.share == "positive"
    m0[:, 0, 0], m1[:, 0, 0] = 1.0, 1.0                                      # positive mass off the ball only
    assert map_follows(m0, m1, b, bm, "ball", share="positive").rate() == 0.0


def test_a_paddle_that_did_not_move_is_not_scored():
    x, xm, b, bm = _pair(10, 0)
    m = np.ones((N, H, W), np.float32)
    fol = map_follows(m, m, b, bm, "paddle")
    assert not fol.valid.any() and np.isnan(fol.rate()) and np.isnan(fol.shift).all()


def test_bad_input_names_the_fix():
    x, xm, b, bm = _pair(10, 0)
    with pytest.raises(SaliencyInputError, match="same shape"):
        displacement_effects(apply_fn, jnp.float32(1.0), x, xm[:2])
    with pytest.raises(SaliencyInputError, match="no class 'brick'"):
        map_follows(np.ones((N, H, W)), np.ones((N, H, W)), b, bm, "brick")
    with pytest.raises(SaliencyInputError, match="both be"):
        map_follows(np.ones((N, H, W)), np.ones((N, H, W, 2)), b, bm, "ball")
    with pytest.raises(SaliencyInputError, match="'absolute' or 'positive'"):
        map_follows(np.ones((N, H, W)), np.ones((N, H, W)), b, bm, "ball", share="signed")
    with pytest.raises(SaliencyInputError, match="ObjectBoxes"):
        map_follows(np.ones((N, H, W)), np.ones((N, H, W)), np.zeros((N, F, 2, 4)), bm, "ball")


def test_places_chance_levels_and_validity_on_hand_made_boxes():
    """Pair 0: a 2x2 ball drawn 2x4 at its new place (e.g. clipped or stretched): the old place is 4 px, the new
    8 px, chance levels in proportion; the indicator maps move all their mass. Pair 1: the new box lies inside
    the old one, so the new place is empty: not scored (valid False), whatever the maps do."""
    def boxes(rows):
        return ObjectBoxes(np.array(rows, np.int16).reshape(2, 1, 1, 4), np.zeros((2, 1, 1), np.int8), ("ball",), H, W)
    old = boxes([(4, 4, 6, 6), (4, 4, 6, 12)])
    new = boxes([(10, 14, 12, 18), (4, 6, 6, 8)])
    m0 = np.asarray(old.masks(frame="union"))[:, 0].astype(np.float32)
    m1 = np.asarray(new.masks(frame="union"))[:, 0].astype(np.float32)
    fol = map_follows(m0, m1, old, new, "ball")
    np.testing.assert_allclose([fol.chance_old[0], fol.chance_new[0]], [4 / (H * W), 8 / (H * W)])
    np.testing.assert_allclose([fol.moved_on_new[0], fol.moved_on_old[0], fol.orig_on_new[0], fol.orig_on_old[0]],
                               [1.0, 0.0, 0.0, 1.0])
    assert fol.shift[0] == pytest.approx(2.0) and fol.follows[0] and fol.valid[0]
    assert fol.chance_new[1] == 0.0 and not fol.valid[1] and np.isnan(fol.shift[1]) and fol.rate() == 1.0
