"""object_attribution / object_pointing / boxes_to_masks on known answers, and a synthetic agent
that reads only one object: occlusion and the gradient must put (nearly) all their mass on it."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.errors import SaliencyInputError
from jaxsal.metrics import object_attribution, object_pointing
from jaxsal.game_objects import ObjectBoxes, boxes_to_masks, screen_to_obs
from tests._support.object_agent import one_object_agent

H = W = 84


def _boxes(n=2, f=4):
    """Class 0 'ball' at rows 10..14, cols 20..24 (moves 2 px right per frame); class 1 'paddle'
    at rows 70..74, cols 40..56; padding slot."""
    b = np.zeros((n, f, 3, 4), np.int16)
    lab = np.full((n, f, 3), -1, np.int8)
    for j in range(f):
        b[:, j, 0] = (10, 20 + 2 * j, 14, 24 + 2 * j)
        b[:, j, 1] = (70, 40, 74, 56)
        lab[:, j, :2] = (0, 1)
    return ObjectBoxes(b, lab, ("ball", "paddle"))


def test_boxes_to_masks_matches_numpy():
    rng = np.random.default_rng(0)
    y0, x0 = rng.integers(0, 80, (2, 5, 7)), rng.integers(0, 80, (2, 5, 7))
    boxes = np.stack([y0, x0, y0 + rng.integers(0, 9, (2, 5, 7)), x0 + rng.integers(0, 9, (2, 5, 7))], -1)
    labels = rng.integers(-1, 3, (2, 5, 7))
    ref = np.zeros((2, 5, 3, H, W), bool)
    for i, j, k in np.ndindex(2, 5, 7):
        if labels[i, j, k] >= 0:
            a, b, c, d = boxes[i, j, k]
            ref[i, j, labels[i, j, k], a:c, b:d] = True
    np.testing.assert_array_equal(np.asarray(boxes_to_masks(boxes, labels, 3, H, W)), ref)


def test_screen_to_obs_covers_every_touched_pixel():
    # a 2x4 Pong ball at screen x 100, y 100: obs cols 100*84/160 = 52.5 -> 52, rows 40..42
    assert screen_to_obs((100, 100, 2, 4)) == (40, 52, 42, 54)
    assert screen_to_obs((0, 0, 160, 210)) == (0, 0, 84, 84)


def test_known_shares_union_newest_and_negative_mass():
    ob = _boxes()
    maps = np.zeros((2, H, W), np.float32)
    maps[0, 10:14, 20:30] = 1.0        # the ball's whole path over the 4 frames (4 x 10 px)
    maps[1, 10:14, 26:30] = 3.0        # only where the ball is in the newest frame
    maps[1, 70:74, 40:56] = -1.0       # negative mass on the paddle
    res = object_attribution(maps, ob)
    assert res.classes == ("ball", "paddle")
    np.testing.assert_allclose(res.positive, [[1, 0], [1, 0]], atol=1e-6)
    np.testing.assert_allclose(res.absolute[1], [48 / (48 + 64), 64 / (48 + 64)], atol=1e-6)
    np.testing.assert_allclose(res.chance[0], [40 / H / W, 64 / H / W], atol=1e-7)
    newest = object_attribution(maps, ob, frame=-1)
    np.testing.assert_allclose(newest.positive[:, 0], [16 / 40, 1.0], atol=1e-6)
    np.testing.assert_allclose(newest.chance[0, 0], 16 / H / W, atol=1e-7)
    assert np.asarray(res.present).all()


def test_per_frame_maps_use_each_frames_masks():
    ob = _boxes(n=1)
    pf = np.zeros((1, H, W, 4), np.float32)
    pf[0, 10:14, 26:30, 3] = 1.0       # the ball in the newest frame, seen in the newest frame
    pf[0, 10:14, 26:30, 0] = 1.0       # the same pixels in the oldest frame: the ball is not there yet
    res = object_attribution(pf, ob)
    np.testing.assert_allclose(res.per_frame_positive[0, :, 0], [0, 0, 0, 0.5], atol=1e-6)
    np.testing.assert_allclose(res.positive[0], [0.5, 0.0], atol=1e-6)
    np.testing.assert_allclose(res.per_frame_chance[0, :, 0], [16 / (H * W * 4)] * 4, atol=1e-8)


def test_zero_map_is_nan_and_mean_skips_absent_classes():
    ob = _boxes()
    ob.labels[1, :, 1] = -1            # no paddle in state 1
    maps = np.zeros((2, H, W), np.float32)
    maps[1, 10:14, 20:24] = 1.0
    res = object_attribution(maps, ob)
    assert np.isnan(np.asarray(res.positive[0])).all()
    assert not bool(res.present[1, 1])
    m = res.mean()
    assert m["ball"]["positive"] == pytest.approx(1.0) and m["paddle"]["states"] == 1


def test_jit_vmap_and_chunking_agree():
    ob = _boxes(n=5)
    maps = np.random.default_rng(1).normal(size=(5, H, W)).astype(np.float32)
    masks = np.asarray(ob.masks())
    eager = object_attribution(maps, ob, batch_size=2)
    jitted = jax.jit(lambda m, k: object_attribution(m, k, classes=("ball", "paddle")))(maps, masks)
    vm = jax.vmap(lambda m, k: object_attribution(m[None], k[None], classes=("ball", "paddle")).positive[0])(
        jnp.asarray(maps), jnp.asarray(masks))
    np.testing.assert_allclose(eager.positive, jitted.positive, rtol=1e-5)
    np.testing.assert_allclose(eager.positive, vm, rtol=1e-5)
    assert jitted.classes == ("ball", "paddle")


def test_pointing_game():
    ob = _boxes(n=3)
    maps = np.zeros((3, H, W), np.float32)
    maps[0, 11, 21] = 5.0              # on the ball
    maps[1, 71, 50] = 5.0              # on the paddle
    maps[2, 40, 40] = 5.0              # on nothing
    hits, classes = object_pointing(maps, ob)
    np.testing.assert_array_equal(np.asarray(hits), [[True, False], [False, True], [False, False]])
    pf = np.zeros((1, H, W, 4), np.float32)
    pf[0, 11, 21, 3] = 1.0             # the ball's frame-0 spot, but the max is in frame 3
    assert not np.asarray(object_pointing(pf, ob[:1])[0]).any()


def test_bad_input_names_the_fix():
    ob = _boxes()
    with pytest.raises(SaliencyInputError, match="maps must be"):
        object_attribution(np.zeros((2, H)), ob)
    with pytest.raises(SaliencyInputError, match="boxes are for 84x84"):
        object_attribution(np.zeros((2, 42, 42)), ob)
    with pytest.raises(SaliencyInputError, match="per-frame masks"):
        object_attribution(np.zeros((2, H, W, 4)), np.zeros((2, 2, H, W), bool))
    with pytest.raises(SaliencyInputError, match="frame must be"):
        object_attribution(np.zeros((2, H, W)), ob, frame="newest")


def test_synthetic_agent_reading_one_object():
    box = (10, 20, 22, 32)             # the object the agent reads: 12x12 px
    n = 6
    b = np.zeros((n, 4, 2, 4), np.int16)
    b[:, :, 0], b[:, :, 1] = box, (60, 50, 72, 62)
    ob = ObjectBoxes(b, np.tile(np.array([0, 1], np.int8), (n, 4, 1)), ("target", "other"))
    obs = np.random.default_rng(0).integers(0, 256, (n, H, W, 4)).astype(np.uint8)
    apply_fn, params = one_object_agent(box)
    for method, opts in (("gradient", {}), ("occlusion", {"score": "drop"})):   # drop: Q_a(x) - Q_a(x')
        maps = jaxsal.explain(apply_fn, params, obs, method=method, **opts)
        res = object_attribution(maps, ob)
        share = np.asarray(res.absolute)[:, 0]
        # gradient: exactly the box; occlusion: 2x2 patches aligned with the box, but its 42x42
        # grid is upsampled bilinearly, which spills a pixel around the box
        assert share.min() > (0.999 if method == "gradient" else 0.8), (method, share)
        assert np.asarray(res.absolute)[:, 1].max() < 1e-3
        assert res.chance[0, 0] == pytest.approx(144 / (H * W))
        hits, _ = object_pointing(maps, ob)
        assert np.asarray(hits)[:, 0].all()


@pytest.mark.parametrize("fn", ["object_pointing", "object_attribution"])
def test_masks_that_do_not_fit_the_maps_are_refused_by_both(fn):
    """Pointing checked nothing of the masks' size: 5x5 masks on 10x10 maps gave a silent wrong hit."""
    import jaxsal.metrics as M
    from jaxsal.errors import SaliencyInputError

    f = getattr(M, fn)
    maps = np.random.default_rng(0).random((2, 10, 10), np.float32)
    with pytest.raises(SaliencyInputError, match="pixels"):
        f(maps, np.zeros((2, 1, 5, 5), bool))
    with pytest.raises(SaliencyInputError, match="frame must be"):
        f(maps, np.zeros((2, 1, 10, 10), bool), frame=[0])
    per_frame = np.random.default_rng(1).random((2, 10, 10, 4), np.float32)
    with pytest.raises(SaliencyInputError, match="leave frame='union'"):
        f(per_frame, np.zeros((2, 4, 1, 10, 10), bool), frame=-1)
    with pytest.raises(SaliencyInputError, match="frames, masks"):
        f(per_frame, np.zeros((2, 3, 1, 10, 10), bool))


def test_mean_leaves_out_the_states_without_the_class():
    """A class's mean share is over the states where it has pixels: state 2 has no paddle and its map has mass
    (so a paddle share of 0 there), which must not pull the paddle's mean down."""
    ob = _boxes(n=3)
    ob.labels[2, :, 1] = -1                      # no paddle in state 2
    maps = np.zeros((3, H, W), np.float32)
    maps[:, 10:14, 20:24] = 1.0                  # 16 px on the ball in every state
    maps[0, 70:74, 40:56] = 1.0                  # state 0: 64 px on the paddle too
    m = object_attribution(maps, ob).mean()
    assert m["paddle"]["positive"] == pytest.approx((64 / 80 + 0.0) / 2) and m["paddle"]["states"] == 2
    assert m["paddle"]["chance"] == pytest.approx(64 / (H * W))
    assert m["ball"]["positive"] == pytest.approx((16 / 80 + 1.0 + 1.0) / 3) and m["ball"]["states"] == 3


def test_pointing_on_maps_that_are_not_square():
    """The maximum's row and column on a 6x10 frame (and its stacked frame for per-frame maps)."""
    b = np.array([[[(4, 7, 6, 9), (0, 0, 3, 4)], [(0, 0, 1, 1), (0, 6, 2, 10)]]], np.int16)   # (1, F=2, K=2, 4)
    ob = ObjectBoxes(b, np.array([[[0, 1], [0, 1]]], np.int8), ("ball", "paddle"), 6, 10)
    maps = np.zeros((1, 6, 10), np.float32)
    maps[0, 4, 7] = 1.0                          # on the ball, row 4 col 7
    np.testing.assert_array_equal(np.asarray(object_pointing(maps, ob)[0]), [[True, False]])
    maps = np.zeros((1, 6, 10), np.float32)
    maps[0, 1, 8] = 1.0                          # row 1 col 8: the paddle's frame-1 box only
    np.testing.assert_array_equal(np.asarray(object_pointing(maps, ob)[0]), [[False, True]])
    pf = np.zeros((1, 6, 10, 2), np.float32)
    pf[0, 1, 8, 0] = 1.0                         # the same spot in frame 0, where no paddle is
    np.testing.assert_array_equal(np.asarray(object_pointing(pf, ob)[0]), [[False, False]])
    pf[0, 5, 8, 0] = 2.0                         # row 5 col 8 in frame 0: the ball
    np.testing.assert_array_equal(np.asarray(object_pointing(pf, ob)[0]), [[True, False]])
