"""object_effects / effect_agreement on known answers: an agent that reads only the pixels of one
region gets a nonzero effect from the class inside it and exactly zero from the others; removing
it flips the greedy action where the object carries the Q-value; a map on that object agrees 1
within states. Tiny 16x16 frames, 4 stacked frames, 5 states: each test takes seconds."""
import dataclasses
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsal.errors import SaliencyInputError
from jaxsal.metrics import ObjectEffects, effect_agreement, object_attribution, object_effects
from jaxsal.game_objects import ObjectBoxes
from tests._support import ROOT

N, H, W, F = 5, 16, 16, 4
READ = (2, 3, 6, 11)          # (y0, x0, y1, x1): the region the agent reads
BG = np.array([30, 40, 50, 60], np.float32)   # each stacked frame's background value
THRESH = 90.0                 # Q_1: the ball's pixels lift Q_0 above it, the background alone does not


def _boxes():
    """Class 0 "ball": 4x4 inside READ, 1 px right per frame; class 1 "paddle" and class 2 "score"
    elsewhere (fixed); a padding slot."""
    b = np.zeros((N, F, 4, 4), np.int16)
    lab = np.full((N, F, 4), -1, np.int8)
    for j in range(F):
        b[:, j, 0] = (2, 4 + j, 6, 8 + j)
        b[:, j, 1] = (12, 2, 14, 9)
        b[:, j, 2] = (9, 12, 11, 15)
        lab[:, j, :3] = (0, 1, 2)
    return ObjectBoxes(b, lab, ("ball", "paddle", "score"), H, W)


def _obs(seed=0):
    """Background BG[f] per frame, a few stray pixels (fewer than the background), bright objects;
    state 0's ball is dim, so Q_0 < Q_1 there and action 1 is explained."""
    rng = np.random.default_rng(seed)
    x = np.broadcast_to(BG, (N, H, W, F)).copy()
    x[:, 0, :6] = rng.integers(0, 256, (N, 6, F))
    masks = np.asarray(_boxes().masks())                      # (N, F, C, H, W)
    for c in range(3):
        m = np.moveaxis(masks[:, :, c], 1, -1)                # (N, H, W, F)
        x = np.where(m, rng.integers(200, 256, x.shape), x)
    x[0] = np.where(np.moveaxis(masks[0, :, 0], 0, -1), 70, x[0])
    return x.astype(np.uint8), masks


def _agent():
    """Q_0 = mean of READ's pixels over the 4 frames (times params = 1); Q_1 = THRESH."""
    y0, x0, y1, x1 = READ

    def apply_fn(params, obs):
        q0 = (jnp.asarray(obs, jnp.float32)[:, y0:y1, x0:x1, :] * params).mean((1, 2, 3))
        return jnp.stack([q0, jnp.full_like(q0, THRESH)], -1)
    return apply_fn, jnp.ones((y1 - y0, x1 - x0, F))


def _reference(obs, masks, fill):
    """numpy: Q of the original and with each class removed (fill (N, F) per state and frame)."""
    y0, x0, y1, x1 = READ
    q = lambda x: np.stack([x[:, y0:y1, x0:x1].astype(np.float64).mean((1, 2, 3)), np.full(len(x), THRESH)], -1)
    q_orig = q(obs)
    a = q_orig.argmax(-1)
    eff, flips = np.zeros((N, 3)), np.zeros((N, 3), bool)
    for c in range(3):
        m = np.moveaxis(masks[:, :, c], 1, -1)
        qc = q(np.where(m, np.broadcast_to(fill[:, None, None, :], obs.shape), obs))
        eff[:, c] = q_orig[np.arange(N), a] - qc[np.arange(N), a]
        flips[:, c] = qc.argmax(-1) != a
    return eff, flips, a


def test_only_the_read_object_has_an_effect_and_its_removal_flips_the_action():
    obs, masks = _obs()
    apply_fn, params = _agent()
    res = object_effects(apply_fn, params, obs, _boxes())
    assert isinstance(res, ObjectEffects) and res.classes == ("ball", "paddle", "score")
    eff, flips, a = _reference(obs, masks, np.broadcast_to(BG, (N, F)))
    np.testing.assert_array_equal(np.asarray(res.actions), a)
    assert a[0] == 1 and (a[1:] == 0).all()
    np.testing.assert_allclose(np.asarray(res.effect), eff, atol=1e-4)
    effect = np.asarray(res.effect)
    assert (effect[1:, 0] > 50).all()                  # the ball carries Q_0 ...
    assert effect[0, 0] == 0.0                         # ... but state 0 explains action 1 (Q_1 is constant)
    assert (effect[:, 1:] == 0).all()                  # paddle and score: not read, exactly no effect
    np.testing.assert_array_equal(np.asarray(res.flips), flips)
    np.testing.assert_array_equal(np.asarray(res.flips)[:, 0], [False, True, True, True, True])
    assert not np.asarray(res.flips)[:, 1:].any()
    assert np.asarray(res.present).all()
    given = object_effects(apply_fn, params, obs, _boxes(), actions=np.zeros(N, int))   # explain Q_0 everywhere
    # state 0: its dim ball (70) over backgrounds 30..60, 16 px in each of 4 frames, averaged over READ's 4 x 32 px
    assert float(given.effect[0, 0]) == pytest.approx(16 * (40 + 30 + 20 + 10) / 128, abs=1e-4)
    np.testing.assert_allclose(given.effect[1:], res.effect[1:], atol=1e-5)


@pytest.mark.slow  # 3-8 s (a subprocess, a game or a whole job): the slow stage, which CI runs
def test_background_is_each_frames_mode_outside_the_objects():
    obs, masks = _obs()
    apply_fn, params = _agent()
    bg = object_effects(apply_fn, params, obs, masks, classes=("ball", "paddle", "score"), fill="background")
    # the same effects as the known per-frame background value, and not those of a wrong one
    np.testing.assert_allclose(bg.effect, _reference(obs, masks, np.broadcast_to(BG, (N, F)))[0], atol=1e-4)
    wrong = object_effects(apply_fn, params, obs, masks, fill=0)             # black, not the background
    assert np.abs(np.asarray(wrong.effect) - np.asarray(bg.effect)).max() > 1.0
    from jaxsal.metrics.effects import background
    for uint8 in (False, True):                       # sorted runs (any frames) and the 0..255 histogram
        est = background(jnp.asarray(obs, jnp.float32), jnp.asarray(masks), uint8)
        np.testing.assert_array_equal(np.asarray(est), np.broadcast_to(BG, (N, F)))
    as_float = object_effects(apply_fn, params, obs.astype(np.float32), masks, classes=bg.classes)
    np.testing.assert_allclose(as_float.effect, bg.effect, atol=1e-5)
    ties = np.zeros((1, 4, 4, 1), np.float32)
    ties[0, :2, :, 0] = 9.0                           # 8 pixels of 9, 8 of 0: a tie, the smaller value wins
    no_objects = np.zeros((1, 1, 1, 4, 4), bool)
    on_zeros = no_objects.copy()
    on_zeros[0, 0, 0, 2:, 1:] = True                  # an object over 6 of the zeros: 9 is the background
    for uint8 in (False, True):
        assert float(background(jnp.asarray(ties), no_objects, uint8)[0, 0]) == 0.0
        assert float(background(jnp.asarray(ties), on_zeros, uint8)[0, 0]) == 9.0


@pytest.mark.parametrize("kind", ["scalar", "per_frame", "per_state", "image"])
def test_given_fills(kind):
    obs, masks = _obs()
    apply_fn, params = _agent()
    per = np.random.default_rng(3).uniform(0, 255, (N, F)).astype(np.float32)
    fill, ref = {"scalar": (7.0, np.full((N, F), 7.0)),
                 "per_frame": (per[0], np.broadcast_to(per[0], (N, F))),
                 "per_state": (per, per),
                 "image": (np.broadcast_to(per[:, None, None, :], obs.shape), per)}[kind]
    res = object_effects(apply_fn, params, obs, masks, fill=fill)
    eff, flips, _ = _reference(obs, masks, ref)
    np.testing.assert_allclose(res.effect, eff, atol=1e-3)
    np.testing.assert_array_equal(res.flips, flips)


def test_jit_batched_per_example_and_chunking_agree():
    obs, masks = _obs()
    apply_fn, params = _agent()
    eager = object_effects(apply_fn, params, obs, _boxes())
    jitted = jax.jit(lambda o, m: object_effects(apply_fn, params, o, m, classes=("ball", "paddle", "score")))(
        obs, masks)
    assert jitted.classes == eager.classes
    jit_chunked = jax.jit(lambda o, m: object_effects(apply_fn, params, o, m, batch_size=4))(obs, masks)
    chunked = object_effects(apply_fn, params, obs, _boxes(), batch_size=4)     # C + 1 = 4 rows: one state a chunk
    boxes = _boxes()
    closed = jax.jit(lambda o: object_effects(apply_fn, params, o, boxes, batch_size=8))(obs)   # boxes closed over
    one = [object_effects(apply_fn, params, obs[i:i + 1], _boxes()[i]) for i in range(N)]
    for other in (jitted, jit_chunked, chunked, closed):
        np.testing.assert_allclose(other.effect, eager.effect, atol=1e-4)
        np.testing.assert_array_equal(other.flips, eager.flips)
        for k in ("overlap", "residue", "residue_share", "present"):
            np.testing.assert_array_equal(getattr(other, k), getattr(eager, k), err_msg=k)
    np.testing.assert_allclose(np.concatenate([r.effect for r in one]), eager.effect, atol=1e-4)
    np.testing.assert_array_equal(np.concatenate([r.flips for r in one]), eager.flips)


def test_channel_first_frames_and_masks_for_every_frame():
    obs, masks = _obs()
    apply_fn, params = _agent()
    ref = object_effects(apply_fn, params, obs, masks)
    nchw = object_effects(lambda p, o: apply_fn(p, jnp.transpose(o, (0, 2, 3, 1))), params,
                          obs.transpose(0, 3, 1, 2), masks, layout="NCHW")
    np.testing.assert_allclose(nchw.effect, ref.effect, atol=1e-4)
    union = masks.any(1)                                          # (N, C, H, W): the same mask in every frame
    res = object_effects(apply_fn, params, obs, union)
    eff, _, _ = _reference(obs, np.broadcast_to(union[:, None], masks.shape), np.broadcast_to(BG, (N, F)))
    np.testing.assert_allclose(res.effect, eff, atol=1e-3)


def test_bad_input_names_the_fix():
    obs, masks = _obs()
    apply_fn, params = _agent()
    with pytest.raises(SaliencyInputError, match="masks must be bool"):
        object_effects(apply_fn, params, obs, masks[:, :, :, :-1])
    with pytest.raises(SaliencyInputError, match="masks must be bool"):
        object_effects(apply_fn, params, obs, masks[:, :2])                # 2 frames for a 4-frame stack
    with pytest.raises(SaliencyInputError, match="boxes are for 16x16"):
        object_effects(apply_fn, params, obs[:, :8, :8], _boxes())
    with pytest.raises(SaliencyInputError, match="unknown fill 'mean'.*fill='background'"):
        object_effects(apply_fn, params, obs, masks, fill="mean")
    with pytest.raises(SaliencyInputError, match="fill of shape"):
        object_effects(apply_fn, params, obs, masks, fill=np.zeros(3))
    with pytest.raises(SaliencyInputError, match="2 class names for 3"):
        object_effects(apply_fn, params, obs, masks, classes=("a", "b"))
    with pytest.raises(SaliencyInputError, match="needs actions"):
        object_effects(apply_fn, params, obs, masks, target="q_action")


def test_a_map_on_the_read_object_agrees_within_states():
    obs, masks = _obs()
    apply_fn, params = _agent()
    names = ("ball", "paddle", "score")
    eff = object_effects(apply_fn, params, obs, masks, classes=names)
    on_ball = np.moveaxis(masks[:, :, 0], 1, -1).astype(np.float32)   # per-frame map = the agent's dependence
    good = effect_agreement(object_attribution(on_ball, masks, classes=names), eff)
    assert good["within_state"]["mean"] == pytest.approx(1.0)
    assert good["within_state"]["low"] == pytest.approx(1.0) and good["within_state"]["high"] == pytest.approx(1.0)
    assert good["within_state"]["states"] == N - 1                    # state 0: every effect 0, no ranking
    assert good["units"] == N
    assert np.isnan(good["across_states"]["paddle"]["rho"])           # effect 0 everywhere: no correlation
    on_paddle = np.moveaxis(masks[:, :, 1], 1, -1).astype(np.float32)
    bad = effect_agreement(object_attribution(on_paddle, masks, classes=names), eff)
    assert bad["within_state"]["mean"] == pytest.approx(-0.5)         # ranks (1.5, 3, 1.5) vs (3, 1.5, 1.5)
    with pytest.raises(SaliencyInputError, match="same classes"):
        effect_agreement(object_attribution(on_ball, masks), eff)     # class_0.. against ball, paddle, score


def test_agreement_across_states_and_intervals_over_the_callers_units():
    rng = np.random.default_rng(0)
    e = rng.normal(size=(8, 3))
    res = effect_agreement(e ** 3, e, n_resamples=200)                # monotone: rank correlation 1 everywhere
    assert res["within_state"]["mean"] == pytest.approx(1.0)
    for c in ("class_0", "class_1", "class_2"):
        assert res["across_states"][c]["rho"] == pytest.approx(1.0)
        assert res["across_states"][c]["low"] == pytest.approx(1.0)
    # two units: episode A's 3 states rank right (rho 1), episode B's one state backwards (rho -1).
    # Whole units are resampled: a resample's mean is 1 (AA, p 1/4), 0.5 (AB) or -1 (BB, p 1/4), so the
    # 90% interval is [-1, 1]; resampling the 4 states instead needs all four to be B's for -1 (p 1/256)
    s = np.array([[0, 1, 2]] * 4, np.float64)
    eff = np.array([[0, 1, 2]] * 3 + [[2, 1, 0]], np.float64)
    by_episode = effect_agreement(s, eff, groups=["a", "a", "a", "b"], n_resamples=500, level=0.9)
    assert by_episode["units"] == 2
    assert by_episode["within_state"]["mean"] == pytest.approx(0.5)
    assert (by_episode["within_state"]["low"], by_episode["within_state"]["high"]) == (-1.0, 1.0)
    by_state = effect_agreement(s, eff, n_resamples=500, level=0.9)
    assert by_state["units"] == 4 and by_state["within_state"]["low"] > -0.9
    one_episode = effect_agreement(s, eff, groups=[7, 7, 7, 7], n_resamples=50)   # one unit: no spread to see
    assert one_episode["within_state"]["low"] == one_episode["within_state"]["high"] == pytest.approx(0.5)
    with pytest.raises(SaliencyInputError, match="one unit id per state"):
        effect_agreement(s, eff, groups=[0, 1])
    with pytest.raises(SaliencyInputError, match="both be \\(N, C\\)"):
        effect_agreement(s[:, :2], eff)


def test_the_guides_example_runs_and_prints_what_it_says(capsys):
    page = (ROOT / "docs" / "guides" / "objects.md").read_text()
    section = page.split("## Causal effects", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "docs/guides/objects.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    effect = [float(v) for v in re.findall(r"-?\d+\.?\d*", out[0])]
    assert effect == pytest.approx([75.5556, 0.0], abs=1e-3) and out[1].split() == ["[", "True", "False]"], out
    assert "'mean': 1.0, 'low': 1.0, 'high': 1.0, 'states': 8" in out[2], out
    assert out[3].split() == ["[0.", "0.]", "[0", "0]"], out


def test_bootstrap_correlations_from_copy_counts_equal_scipy_on_the_expanded_resamples():
    from scipy import stats

    from jaxsal.metrics.effects import _weighted_spearman
    rng = np.random.default_rng(1)
    a, b = rng.integers(0, 4, 12).astype(float), rng.integers(0, 5, 12).astype(float)   # many ties
    w = rng.integers(0, 3, (6, 12)).astype(float)
    got = _weighted_spearman(a, b, w)
    want = [stats.spearmanr(np.repeat(a, r.astype(int)), np.repeat(b, r.astype(int)))[0] for r in w]
    np.testing.assert_allclose(got, want, atol=1e-12)
    assert np.isnan(_weighted_spearman(np.ones(4), np.arange(4.0), np.ones((1, 4))))[0]


# --- what each removal does: frames, overlapping boxes, the ring fill, residues ---------------------------

def _scene(ball, bricks=(2, 2, 8, 14), n=1, bg=0.0):
    """16x16 frames: bricks 150 in the `bricks` box, the ball 250 in its box (drawn last: on top),
    background `bg` (a number or an (H, W) texture); boxes of both in every frame."""
    x = np.broadcast_to(np.asarray(bg, np.float32)[..., None] if np.ndim(bg) else np.float32(bg), (H, W, F)).copy()
    y0, x0, y1, x1 = bricks
    x[y0:y1, x0:x1] = 150
    y0, x0, y1, x1 = ball
    x[y0:y1, x0:x1] = 250
    b = np.zeros((n, F, 2, 4), np.int16)
    b[:, :, 0], b[:, :, 1] = ball, bricks
    return (np.broadcast_to(x, (n, H, W, F)).astype(np.uint8),
            ObjectBoxes(b, np.tile(np.int8([0, 1]), (n, F, 1)), ("ball", "bricks"), H, W))


def _reader(box):
    """Q_0 = mean of the pixels of `box` over the stack; Q_1 = 0."""
    y0, x0, y1, x1 = box

    def apply_fn(params, obs):
        q0 = jnp.asarray(obs, jnp.float32)[:, y0:y1, x0:x1].mean((1, 2, 3))
        return jnp.stack([q0, jnp.zeros_like(q0)], -1)
    return apply_fn, None


def _removed(obs, boxes, **kw):
    """The frames with each class removed, (N, C, H, W, F), and the removal's numbers."""
    from jaxsal.metrics.effects import removals
    kw.setdefault("fill_mode", "ring")
    xi, _, present, overlap, residue, share = removals(
        jnp.asarray(obs, jnp.float32), kw.pop("fill_mode"), kw.pop("frames", "all"), kw.pop("margin", 2),
        kw.pop("ring_width", 3), obs.dtype == np.uint8, boxes=jnp.asarray(boxes.boxes),
        labels=jnp.asarray(boxes.labels), num_classes=len(boxes.classes), **kw)
    return np.asarray(xi), np.asarray(overlap), np.asarray(residue), np.asarray(share), np.asarray(present)


@pytest.mark.slow  # 3-8 s (a subprocess, a game or a whole job): the slow stage, which CI runs
def test_removing_bricks_never_erases_the_ball_inside_their_box_and_the_overlap_is_reported():
    ball = (4, 6, 6, 8)                                  # 2x2, inside the bricks' 6x12 box
    obs, ob = _scene(ball)
    apply_fn, params = _reader(ball)                     # an agent that reads only the ball's pixels
    for fill in ("ring", "background", 0.0):
        res = object_effects(apply_fn, params, obs, ob, fill=fill)
        assert float(res.effect[0, 1]) == 0.0, fill     # removing bricks leaves the ball as it was
        assert float(res.effect[0, 0]) == 0.0, fill     # the ball lies in the bricks' box: nothing removed
        np.testing.assert_allclose(res.overlap[0], [1.0, 4 / 72], rtol=1e-6)
    xi, overlap, _, _, _ = _removed(obs, ob)
    y0, x0, y1, x1 = ball
    assert (xi[0, 1, y0:y1, x0:x1] == 250).all()                                  # the ball kept
    inside = np.zeros((H, W), bool)
    inside[2:8, 2:14] = True
    inside[y0:y1, x0:x1] = False
    assert (xi[0, 1][inside] == 0).all()                                          # the bricks filled
    # the ball half out of the bricks' box (rows 7..9, bricks end at row 8): only its 4 outside pixels go
    obs2, ob2 = _scene((7, 6, 10, 8))
    xi2, overlap2, _, _, _ = _removed(obs2, ob2)
    np.testing.assert_allclose(overlap2[0], [2 / 6, 2 / 72], rtol=1e-6)
    assert (xi2[0, 0, 7, 6:8] == 250).all() and (xi2[0, 0, 8:10, 6:8] == 0).all()
    # pixel-level masks, where known: the ball's own pixels are removed, the bricks' pixels are not the ball's
    masks = np.zeros((1, F, 2, H, W), bool)
    masks[:, :, 0, 4:6, 6:8] = True
    masks[:, :, 1] = inside
    res = object_effects(apply_fn, params, obs, masks, classes=("ball", "bricks"))
    np.testing.assert_array_equal(res.overlap[0], [0.0, 0.0])
    assert float(res.effect[0, 0]) == pytest.approx(250.0) and float(res.effect[0, 1]) == 0.0


def _chebyshev(box):
    """(H, W) Chebyshev distance of each pixel from a half-open box (0 inside)."""
    y0, x0, y1, x1 = box
    ys, xs = np.arange(H)[:, None], np.arange(W)[None, :]
    dy = np.maximum(np.maximum(y0 - ys, ys - (y1 - 1)), 0)
    dx = np.maximum(np.maximum(x0 - xs, xs - (x1 - 1)), 0)
    return np.maximum(dy, dx)


def test_ring_fill_on_a_textured_background_is_the_median_of_the_ring():
    rng = np.random.default_rng(4)
    tex = rng.integers(20, 140, (H, W)).astype(np.float32)        # every pixel its own background
    ball, bricks = (7, 7, 9, 10), (1, 1, 3, 15)
    obs, ob = _scene(ball, bricks, bg=tex)
    # by hand: pixels 3..5 px (Chebyshev) from the ball, not within 2 px of any box
    ring = (_chebyshev(ball) > 2) & (_chebyshev(ball) <= 5) & (_chebyshev(bricks) > 2)
    want = np.median(tex[ring])
    assert ring.sum() > 20 and want != np.median(tex)
    for frames_dtype in (np.uint8, np.float32):                  # bisection (uint8) and sort (float) agree
        xi, _, _, _, _ = _removed(obs.astype(frames_dtype), ob)
        y0, x0, y1, x1 = ball
        np.testing.assert_allclose(xi[0, 0, y0:y1, x0:x1], want, atol=1e-5)
        outside = np.ones((H, W), bool)
        outside[y0:y1, x0:x1] = False
        np.testing.assert_array_equal(xi[0, 0][outside], np.asarray(obs, np.float32)[0][outside])
    ring_w = (_chebyshev(ball) > 1) & (_chebyshev(ball) <= 2) & (_chebyshev(bricks) > 1)   # margin 1, width 1
    xi, _, _, _, _ = _removed(obs, ob, margin=1, ring_width=1)
    np.testing.assert_allclose(xi[0, 0, 7, 7], np.median(tex[ring_w]))
    # the same through object_effects: an agent reading the ball's box loses 250 - median; the frame's
    # mode ("background") is another value
    apply_fn, params = _reader(ball)
    res = object_effects(apply_fn, params, obs, ob)
    assert float(res.effect[0, 0]) == pytest.approx(250 - want, abs=1e-4)
    assert res.fill == "ring" and res.frames == "all"
    mode = object_effects(apply_fn, params, obs, ob, fill="background")
    assert abs(float(mode.effect[0, 0]) - float(res.effect[0, 0])) > 1.0


def test_residue_counts_a_leftover_pixel_just_outside_the_box_and_nothing_without_it():
    ball = (6, 6, 8, 8)
    tex = 60 + 30 * ((np.arange(H)[:, None] + 2 * np.arange(W)[None, :]) % 3)   # three values, in every ring
    for bg in (30.0, tex):
        obs, ob = _scene(ball, bricks=(0, 0, 2, 16), bg=bg)
        for fill in ("ring", "background"):
            if fill == "background" and np.ndim(bg):
                continue                                  # the frame's mode is no model of a texture
            _, _, residue, share, present = _removed(obs, ob, fill_mode=fill)
            assert residue[0, 0] == 0 and share[0, 0] == 0.0 and present[0].all(), (fill, bg)
            left = obs.copy()
            left[0, 8, 7, 2] = 250                        # one ball pixel left 1 px below its box, frame 2
            _, _, residue, share, _ = _removed(left, ob, fill_mode=fill)
            assert residue[0, 0] == 1, (fill, bg)
            grown = 4 * (6 * 6)                           # the 2x2 box grown by 2 px, in 4 frames
            assert share[0, 0] == pytest.approx(1 / grown)
            far = obs.copy()
            far[0, 11, 7, 2] = 250                        # 4 px below: outside the grown box ...
            assert _removed(far, ob, fill_mode=fill)[2][0, 0] == 0
            assert _removed(far, ob, fill_mode=fill, margin=4)[2][0, 0] == 1   # ... inside a wider margin
            newest = _removed(left, ob, fill_mode=fill, frames="newest")          # frame 2 is not removed from
            assert newest[2][0, 0] == 0
    apply_fn, params = _reader(ball)
    res = object_effects(apply_fn, params, left, ob)
    assert int(res.residue[0, 0]) == 1 and res.residue.dtype == jnp.int32


@pytest.mark.slow  # 3-8 s (a subprocess, a game or a whole job): the slow stage, which CI runs
def test_frames_newest_changes_only_the_newest_frame():
    obs, masks = _obs()
    boxes = _boxes()
    for fill in ("ring", "background", 7.0):
        fill_mode, given = (fill, None) if isinstance(fill, str) else ("given", jnp.full(obs.shape, fill))
        xi_all = _removed(obs, boxes, fill_mode=fill_mode, fill=given)[0]
        xi_new = _removed(obs, boxes, fill_mode=fill_mode, frames="newest", fill=given)[0]
        orig = np.broadcast_to(np.asarray(obs, np.float32)[:, None], xi_new.shape)
        np.testing.assert_array_equal(xi_new[..., :F - 1], orig[..., :F - 1])     # older frames untouched
        np.testing.assert_array_equal(xi_new[..., F - 1], xi_all[..., F - 1])      # the newest as with "all"
        assert (xi_all[..., :F - 1] != orig[..., :F - 1]).any()
    apply_fn, params = _agent()
    new = object_effects(apply_fn, params, obs, boxes, frames="newest")
    eff, _, _ = _reference(obs, masks * (np.arange(F) == F - 1)[None, :, None, None, None],
                           np.broadcast_to(BG, (N, F)))
    np.testing.assert_allclose(new.effect, eff, atol=1e-4)
    assert new.frames == "newest"
    alone = np.asarray(masks).copy()
    alone[:, F - 1, 2] = False                            # "score" absent from the newest frame only
    res = object_effects(apply_fn, params, obs, alone, frames="newest", fill="background")
    assert not np.asarray(res.present)[:, 2].any() and np.isnan(np.asarray(res.overlap)[:, 2]).all()
    assert np.asarray(object_effects(apply_fn, params, obs, alone).present)[:, 2].all()


def test_removal_fields_under_jit_and_chunks_with_newest_frames():
    obs, masks = _obs()
    apply_fn, params = _agent()
    kw = dict(frames="newest", margin=1, ring_width=2)
    eager = object_effects(apply_fn, params, obs, _boxes(), **kw)
    boxes = _boxes()
    jitted = jax.jit(lambda o: object_effects(apply_fn, params, o, boxes, batch_size=4, **kw))(obs)
    as_masks = jax.jit(lambda o, m: object_effects(apply_fn, params, o, m, **kw))(obs, masks)
    for other in (jitted, as_masks):
        for k in ("effect", "flips", "overlap", "residue", "residue_share", "present"):
            np.testing.assert_allclose(np.asarray(getattr(other, k), np.float64),
                                       np.asarray(getattr(eager, k), np.float64), atol=1e-4, err_msg=k)


def test_bad_removal_options_name_the_fix():
    obs, masks = _obs()
    apply_fn, params = _agent()
    with pytest.raises(SaliencyInputError, match="frames must be 'all'.*'newest'"):
        object_effects(apply_fn, params, obs, masks, frames="last")
    with pytest.raises(SaliencyInputError, match="margin must be an integer >= 0"):
        object_effects(apply_fn, params, obs, masks, margin=-1)
    with pytest.raises(SaliencyInputError, match="ring_width must be an integer >= 1"):
        object_effects(apply_fn, params, obs, masks, ring_width=0)


def test_agreement_leaves_out_classes_that_nothing_was_removed_of():
    """A class wholly inside other boxes (overlap 1) was not removed: its effect 0 is no evidence, left out."""
    z = jnp.zeros((4, 3))
    eff = ObjectEffects(effect=jnp.tile(jnp.array([0.0, 1.0, 0.0]), (4, 1)), flips=z.astype(bool), score=z[:, 0],
                        actions=z[:, 0].astype(jnp.int32), present=jnp.ones((4, 3), bool),
                        overlap=jnp.tile(jnp.array([0.0, 0.0, 1.0]), (4, 1)), classes=("a", "b", "c"))
    shares = np.tile([0.0, 1.0, 2.0], (4, 1))
    res = effect_agreement(shares, eff, n_resamples=20)
    assert res["within_state"]["mean"] == pytest.approx(1.0)          # (0, 1) against (0, 1)
    assert res["across_states"]["c"]["states"] == 0
    kept = dataclasses.replace(eff, overlap=jnp.zeros((4, 3)))
    kept_mean = effect_agreement(shares, kept, n_resamples=20)["within_state"]["mean"]
    assert kept_mean == pytest.approx(0.0)                            # ranks (1, 2, 3) vs (1.5, 3, 1.5)


def test_overlap_is_over_the_frames_the_class_is_removed_from():
    """frames="newest": a class's overlap is the share of its newest-frame pixels under another class's box;
    an overlap in an older frame (not removed from) does not count. Hand-made masks on 12x12 frames."""
    masks = np.zeros((1, 3, 2, 12, 12), bool)
    masks[0, :, 0, 2:6, 2:6] = True              # class 0: 16 px in each of 3 frames
    masks[0, 0, 1, 2:6, 4:8] = True              # class 1 covers 8 of them in the oldest frame...
    masks[0, 2, 1, 8:10, 8:10] = True            # ...and lies elsewhere in the newest
    obs = np.full((1, 12, 12, 3), 40, np.uint8)
    apply_fn = lambda p, o: jnp.stack([o.mean((1, 2, 3)), -o.mean((1, 2, 3))], -1)    # noqa: E731
    both = object_effects(apply_fn, None, obs, masks, fill="background")
    newest = object_effects(apply_fn, None, obs, masks, fill="background", frames="newest")
    np.testing.assert_allclose(np.asarray(both.overlap)[0], [8 / 48, 8 / 20], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(newest.overlap)[0], [0.0, 0.0], atol=1e-7)
