"""LIME's superpixel pass (the first conv as a sum over the superpixels its windows see) equals the
plain path; models it cannot prove keep the plain path."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsal import SaliencyInputError
from jaxsal.metrics import sanity_check
from jaxsal.perturbation import _superpixel, lime
from tests._support.perturbation_models import tiny_apply, tiny_obs, tiny_params

OBS = tiny_obs(3, seed=4)
KEY = jax.random.PRNGKey(5)


class PixelNorm(nn.Module):
    """x / 255 and a per-pixel LayerNorm before a strided conv (padding VALID), a second conv, a
    dict output; `layout="NCHW"` takes channel-first frames; `global_input` makes the first conv's
    input depend on the whole frame (its mean), which the pass must not take for pixelwise."""
    layout: str = "NHWC"
    global_input: bool = False

    @nn.compact
    def __call__(self, obs):
        x = jnp.asarray(obs, jnp.float32) / 255.0
        if self.layout == "NCHW":
            x = jnp.transpose(x, (0, 2, 3, 1))
        if self.global_input:
            x = x - x.mean(axis=(1, 2), keepdims=True)
        x = nn.LayerNorm(name="in_norm")(x)
        x = nn.relu(nn.Conv(6, (4, 4), (2, 2), padding="VALID", name="conv1")(x))
        x = nn.relu(nn.Conv(5, (2, 2), (1, 1), padding="VALID", name="conv2")(x))
        q = nn.Dense(3, name="q")(x.reshape(x.shape[0], -1)) * 4.0
        return {"q": q, "value": q.mean(-1)}


@functools.cache
def model_params(layout="NHWC", global_input=False):
    model = PixelNorm(layout, global_input)
    obs = OBS if layout == "NHWC" else OBS.transpose(0, 3, 1, 2)
    return model, jax.jit(model.init)(jax.random.PRNGKey(1), obs[:1]), obs


def segments(n=3, seed=0):
    """Blocky labels (3x3 cells, some merged) so that a 4x4 window sees 1-4 superpixels."""
    rng = np.random.default_rng(seed)
    cells = rng.integers(0, 9, (n, 4, 4))
    return np.repeat(np.repeat(cells, 3, axis=1), 3, axis=2)


def both(monkeypatch, fn):
    """(fast, plain) results of fn(fast_superpixels), and that only the fast one took the pass."""
    calls, real = [], _superpixel.apply
    monkeypatch.setattr(_superpixel, "apply", lambda *a: calls.append(1) or real(*a))
    fast = fn(True)
    assert calls, "the superpixel pass was not taken"
    calls.clear()
    plain = fn(False)
    assert not calls
    return fast, plain


@pytest.mark.parametrize("layout", ["NHWC", "NCHW"])
@pytest.mark.parametrize("opts", [dict(), dict(fill="mean", target="advantage"), dict(fill=0.5, n_samples=37)],
                         ids=["default", "mean fill", "grey fill"])
def test_superpixel_pass_equals_plain(monkeypatch, layout, opts):
    model, params, obs = model_params(layout)
    opts = dict(dict(n_samples=24), **opts)
    run = lambda fast: np.asarray(lime(model.apply, params, obs, key=KEY, segments=segments(),  # noqa: E731
                                       layout=layout, batch_size=40, fast_superpixels=fast, **opts))
    fast, plain = both(monkeypatch, run)
    np.testing.assert_allclose(fast, plain, rtol=1e-4, atol=1e-5)
    assert np.abs(plain).max() > 1e-3


def test_superpixel_pass_with_scikit_image_segments(monkeypatch):
    """Paper B's three segmentations on real 84x84 Atari frames and a Nature CNN."""
    from jaxsal_agents.networks import NatureDQN
    frames = np.load("docs/images/data/method_frames.npz")["breakout_obs"][:2]
    model = NatureDQN(4)
    params = jax.jit(model.init)(jax.random.PRNGKey(0), frames[:1])
    for seg in ("slic", "quickshift", "felzenszwalb"):
        run = lambda fast: np.asarray(lime(model.apply, params, frames, key=KEY, segmentation=seg,  # noqa: E731
                                           n_samples=48, fast_superpixels=fast))
        fast, plain = both(monkeypatch, run)
        np.testing.assert_allclose(fast, plain, rtol=1e-4, atol=1e-6, err_msg=seg)


def test_fast_superpixels_takes_true_or_false():
    model, params, obs = model_params()
    with pytest.raises(SaliencyInputError, match="fast_superpixels must be True or False, got 'yes'"):
        lime(model.apply, params, obs, key=KEY, fast_superpixels="yes")


def test_a_first_conv_fed_the_whole_frame_keeps_the_plain_path():
    model, params, obs = model_params(global_input=True)
    assert _superpixel.first_conv(model.apply, params, obs.shape, "NHWC") is None
    assert _superpixel.first_conv(tiny_apply, tiny_params(), OBS.shape, "NHWC") is None  # no flax conv
    model, params, obs = model_params()
    assert _superpixel.first_conv(model.apply, params, obs.shape, "NHWC") == ((4, 4), (2, 2), (5, 5))
    # asked again (eval_shape caches traces: a cached one would record no conv)
    assert _superpixel.first_conv(model.apply, params, obs.shape, "NHWC") == ((4, 4), (2, 2), (5, 5))


def test_slot_tables_rebuild_every_window_and_round_the_slots():
    segs = np.random.default_rng(2).integers(0, 7, (4, 12, 12))
    geometry = ((4, 4), (2, 2), (5, 5))
    conv, pixel_slot, slot_segment = _superpixel.slot_tables(segs, geometry, dummy=7)
    rows, cols = _superpixel._windows(*geometry)
    windows = segs[:, rows, cols]
    distinct = max(len(set(w)) for w in windows.reshape(-1, 16).tolist())
    assert conv.slots == -(-distinct // _superpixel.SLOT_MULTIPLE) * _superpixel.SLOT_MULTIPLE
    # each pixel's slot holds its own superpixel; each window's slots are distinct, the rest the dummy
    np.testing.assert_array_equal(np.take_along_axis(slot_segment, pixel_slot, axis=2), windows)
    for w, s in zip(windows.reshape(-1, 16), slot_segment.reshape(-1, conv.slots)):
        used = s[s != 7]
        assert sorted(used) == sorted(set(w)) and len(used) == len(set(w))


def test_traced_lime_keeps_the_plain_path_and_agrees(monkeypatch):
    from jaxsal import cpu
    monkeypatch.setattr(cpu, "usable_cores", lambda: 2)  # the host callback runs (one core refuses it)
    model, params, obs = model_params()
    eager = lime(model.apply, params, obs, key=KEY, segments=segments(), n_samples=24)
    jitted = jax.jit(lambda o, s: lime(model.apply, params, o, key=KEY, segments=s, n_samples=24,
                                       max_segments=9))(obs, segments())
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(eager), rtol=1e-4, atol=1e-5)


def test_host_segments_serve_traced_frames_and_weights_without_a_callback(monkeypatch):
    """Segments given as a host array: a call with traced frames and weights needs no max_segments,
    no host callback, takes the pass, and gives the eager maps."""
    model, params, obs = model_params()
    run = lambda p, o: lime(model.apply, p, o, key=KEY, segments=segments(), n_samples=24)  # noqa: E731
    calls, real = [], _superpixel.apply
    monkeypatch.setattr(_superpixel, "apply", lambda *a: calls.append(1) or real(*a))
    assert "callback" not in str(jax.make_jaxpr(run)(params, obs))
    assert calls
    jitted = jax.jit(run)(params, obs)
    np.testing.assert_allclose(np.asarray(jitted), np.asarray(run(params, obs)), rtol=1e-4, atol=1e-5)


def test_sanity_draws_segment_once_and_take_the_pass(monkeypatch):
    """The sanity check segments the frames once for all its calls (not per draw, not through a host
    callback), and its draws, vmapped over the weights, take the pass: their maps are the plain path's."""
    import importlib
    lime_module = importlib.import_module("jaxsal.perturbation.lime")
    model, params, obs = model_params()
    segmented, real_segment = [], lime_module.segment
    monkeypatch.setattr(lime_module, "segment", lambda *a, **k: segmented.append(1) or real_segment(*a, **k))
    calls, real = [], _superpixel.apply
    monkeypatch.setattr(_superpixel, "apply", lambda *a: calls.append(1) or real(*a))
    kw = dict(method="lime", layers=("q", "conv2", "conv1"), key=KEY, metrics=("spearman",), return_maps=True,
              n_samples=24, segmentation_options={"n_segments": 6}, batch_size=48)
    together = sanity_check(model, params, obs, draws=(0, 1), **kw)
    assert len(segmented) == 1 and calls
    plain = sanity_check(model, params, obs, draws=(0, 1), fast_superpixels=False, **kw)
    for d in (0, 1):  # (draws in one call equal draw by draw: tests/metrics/test_sanity.py)
        for label in ("original", "q", "conv2", "conv1"):
            m = np.asarray(together[d]["maps"][label])
            np.testing.assert_allclose(m, np.asarray(plain[d]["maps"][label]), rtol=1e-4, atol=1e-5)
        assert np.abs(np.asarray(together[d]["maps"]["conv1"]) - np.asarray(together[d]["maps"]["original"])).max() > 1e-3