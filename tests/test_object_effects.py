"""object_effects / effect_agreement on known answers: an agent that reads only the pixels of one
region gets a nonzero effect from the class inside it and exactly zero from the others; removing
it flips the greedy action where the object carries the Q-value; a map on that object agrees 1
within states. Tiny 16x16 frames, 4 stacked frames, 5 states: each test takes seconds."""
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsal.errors import SaliencyInputError
from jaxsal.metrics import ObjectEffects, effect_agreement, object_attribution, object_effects
from jaxsal.objects import ObjectBoxes

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


def test_background_is_each_frames_mode_outside_the_objects():
    obs, masks = _obs()
    apply_fn, params = _agent()
    bg = object_effects(apply_fn, params, obs, masks, classes=("ball", "paddle", "score"))
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
    page = (Path(__file__).resolve().parents[1] / "docs" / "guides" / "objects.md").read_text()
    section = page.split("## Causal effects", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    exec(compile(code, "docs/guides/objects.md", "exec"), {})
    out = capsys.readouterr().out.splitlines()
    effect = [float(v) for v in re.findall(r"-?\d+\.?\d*", out[0])]
    assert effect == pytest.approx([75.5556, 0.0], abs=1e-3) and out[1].split() == ["[", "True", "False]"], out
    assert "'mean': 1.0, 'low': 1.0, 'high': 1.0, 'states': 8" in out[2], out


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
