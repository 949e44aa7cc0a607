"""Compiled-function caches never leak one call's shapes or options into another (issue 29.1).

A model that takes any frame size (conv + global mean pool + dense) is explained on one shape,
then on others, in one process; every result must equal the same call made first in a fresh
process. Before the fix SmoothGrad's noise was drawn with the first call's frame shape
(broadcast over the later call's channels: silently wrong maps) and a later frame size raised
a raw JAX TypeError.
"""
from __future__ import annotations

import json
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal import caching
from tests._support import ROOT


# first call, then a new channel count, then a new frame size with the same params
SHAPES = [(2, 84, 84, 1), (2, 84, 84, 4), (2, 64, 64, 4)]

CASES = {
    "smoothgrad": ("smoothgrad", dict(n_samples=3, per_frame=True)),
    "smoothgrad_vargrad_guided": ("smoothgrad", dict(n_samples=3, variant="vargrad",
                                                     rule="guided", per_frame=True)),
    "smoothgrad_nchw": ("smoothgrad", dict(n_samples=3, per_frame=True, layout="NCHW")),
    "ig_uniform": ("integrated_gradients", dict(steps=3, baseline="uniform", per_frame=True)),
    "ig_blur_error": ("integrated_gradients", dict(steps=3, baseline="blur", return_error=True)),
    "rise": ("rise", dict(n_masks=8, grid=4)),
    "noise_sensitivity": ("noise_sensitivity", dict(stride=16)),
    "noise_sensitivity_black_hard": ("noise_sensitivity", dict(stride=16, perturbation="black",
                                                               mask_shape="hard")),
    "sarfa": ("sarfa", dict(stride=16)),
    "occlusion": ("occlusion", dict(patch=16, stride=16)),
    "lime": ("lime", dict(n_samples=8, segmentation_options={"n_segments": 16})),
    "gradient": ("gradient", dict(per_frame=True)),
    "cam_family": (["gradcam", "gradcam_pp", "g1gradcam", "g2gradcam", "guided_gradcam",
                    "guided_backprop", "deconvnet"], dict(layer="conv2")),
    "gradcam_conv1": ("gradcam", dict(layer="conv1")),
}


class AnySize(nn.Module):
    """Any (H, W, C) input: convs, a global mean pool and a dense head (params depend on C only)."""

    @nn.compact
    def __call__(self, x):
        x = x / 255.0
        x = nn.relu(nn.Conv(4, (3, 3), strides=(2, 2), padding="VALID", name="conv1")(x))
        x = nn.relu(nn.Conv(4, (3, 3), padding="VALID", name="conv2")(x))
        return nn.Dense(3, name="q")(x.mean((1, 2)))


NET = AnySize()


def apply_nhwc(params, x):
    return NET.apply(params, x)


def apply_nchw(params, x):
    return NET.apply(params, jnp.transpose(x, (0, 2, 3, 1)))


def _inputs(shape, layout="NHWC"):
    n, h, w, c = shape
    params = NET.init(jax.random.PRNGKey(1), jnp.zeros((1, 8, 8, c)))
    obs = np.random.default_rng(h * 10 + c).integers(0, 256, shape).astype(np.float32)
    if layout == "NCHW":
        obs = obs.transpose(0, 3, 1, 2)
    return params, obs


def _run(case, shape):
    method, kw = CASES[case]
    layout = kw.get("layout", "NHWC")
    params, obs = _inputs(shape, layout)
    fn = apply_nchw if layout == "NCHW" else apply_nhwc
    from jaxsal.registry import STOCHASTIC
    if (isinstance(method, str) and method in STOCHASTIC) or kw.get("baseline") == "uniform":
        kw = dict(kw, key=jax.random.PRNGKey(7))
    out = jaxsal.explain(fn, params, obs, method=method, **kw)
    leaves = out if isinstance(out, dict) else {"": out}
    flat = {}
    for name, v in leaves.items():
        for i, a in enumerate(v if isinstance(v, tuple) else (v,)):
            flat[f"{name}.{i}"] = np.asarray(a)
    return flat


def _dump(shape, path):
    """Every case on `shape`, each the first call of this process (run in a fresh subprocess)."""
    res = {f"{case}/{k}": v for case in CASES for k, v in _run(case, tuple(shape)).items()}
    np.savez(path, **res)


@pytest.fixture(scope="module")
def fresh(tmp_path_factory):
    """{shape: {case/leaf: array}} for SHAPES[1:], each shape computed in its own fresh process."""
    out = {}
    for shape in SHAPES[1:]:
        path = tmp_path_factory.mktemp("fresh") / "maps.npz"
        code = (f"from tests.engine.test_cache_keys import _dump; "
                f"_dump({json.dumps(list(shape))}, {str(path)!r})")
        proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
        with np.load(path) as z:
            out[shape] = {k: z[k] for k in z.files}
    return out


@pytest.fixture(scope="module")
def in_process():
    """{(case, shape): {leaf: array} or the exception}: every case on SHAPES in order, in this
    process, caches warm from the earlier shapes."""
    out = {}
    for case in CASES:
        for shape in SHAPES:
            try:
                out[case, shape] = {f"{case}/{k}": v for k, v in _run(case, shape).items()}
            except Exception as e:  # noqa: BLE001 (reported by the case's own test)
                out[case, shape] = e
    return out


@pytest.mark.slow  # ~7 min on 2 cores: every method compiled for 3 shapes, twice
@pytest.mark.parametrize("shape", SHAPES[1:], ids=lambda s: "x".join(map(str, s[1:])))
@pytest.mark.parametrize("case", list(CASES))
def test_later_shape_equals_a_fresh_process(case, shape, in_process, fresh):
    for earlier in SHAPES[:SHAPES.index(shape) + 1]:
        if isinstance(in_process[case, earlier], Exception):
            raise in_process[case, earlier]
    got = in_process[case, shape]
    want = {k: v for k, v in fresh[shape].items() if k.startswith(case + "/")}
    assert got.keys() == want.keys() and got
    for k in got:
        assert got[k].shape == want[k].shape, k
        assert np.abs(want[k]).max() > 0, f"{k}: all-zero maps test nothing"
        np.testing.assert_allclose(got[k], want[k], rtol=1e-5,
                                   atol=1e-6 * float(np.abs(want[k]).max()), err_msg=k)


def test_smoothgrad_noise_is_drawn_per_channel_after_a_one_channel_call():
    """The reported case: (8, 84, 84, 1) then (8, 84, 84, 4), same apply_fn and params. For
    f(x) = sum(x^2) the SmoothGrad map is 2 mean_j(x + eps_j): on frames with 4 equal channels
    its channels differ only by the noise, so they are equal iff the noise is broadcast."""
    def energy(params, x):
        e = (x.reshape(x.shape[0], -1) ** 2).sum(1) * params["w"]
        return jnp.stack([e, -e, 0.0 * e], -1)

    params = {"w": jnp.float32(1.0)}
    x1 = np.random.default_rng(0).uniform(0, 1, (8, 84, 84, 1)).astype(np.float32)
    x4 = np.repeat(x1, 4, axis=-1)
    kw = dict(method="smoothgrad", key=jax.random.PRNGKey(0), n_samples=4, per_frame=True)
    jaxsal.explain(energy, params, x1, **kw)
    m4 = np.asarray(jaxsal.explain(energy, params, x4, **kw))
    for c in range(1, 4):
        assert np.abs(m4[..., 0] - m4[..., c]).max() > 1e-2, "noise identical in every channel"
    caching.clear_caches()
    np.testing.assert_allclose(m4, np.asarray(jaxsal.explain(energy, params, x4, **kw)),
                               rtol=1e-5, atol=1e-6 * np.abs(m4).max())
    m64 = jaxsal.explain(energy, params, x4[:, :64, :64], **kw)  # raised a JAX TypeError
    assert m64.shape == (8, 64, 64, 4)


def test_static_key_covers_captured_values_and_refuses_arrays():
    import functools

    from jaxsal.engine.combinators import path_integral
    from jaxsal.perturbation._common import make_score
    from jaxsal.targets import get_target

    key = caching.static_key
    q, v = get_target("q_chosen"), get_target("value")
    # jaxsal's own closures (rebuilt per call) by code and captured values
    assert key(make_score("drop", q)) == key(make_score("drop", q))
    assert key(make_score("drop", q)) != key(make_score("drop", v))
    assert key(make_score("drop", q)) != key(make_score("one_minus", q))
    assert key(functools.partial(max, 1)) != key(functools.partial(max, 1.0))  # int vs float
    assert key(functools.partial(max, 1)) != key(functools.partial(max, True))
    with pytest.raises(TypeError, match="traced argument"):
        key(path_integral("gradient", baseline=jnp.ones(3)).prepare)  # a captured array is a bug, not a key

    def user():  # a function from outside jaxsal: by identity (it may read changing globals)
        return 0

    def user2():
        return 0
    assert key(user) == key(user) and key(user) != key(user2)
    assert key(get_target(user)) == key(get_target(user)) != key(get_target(user2))


def test_cached_jit_keys_on_build_arguments_and_is_bounded(monkeypatch):
    def build(scale):
        return lambda x: x * scale
    f2, f3 = caching.cached_jit(build, 2.0), caching.cached_jit(build, 3.0)
    assert f2 is not f3 and caching.cached_jit(build, 2.0) is f2
    assert float(f3(jnp.ones(()))) == 3.0
    monkeypatch.setattr(caching._JIT_CACHE, "maxsize", 4)
    for i in range(10):
        caching.cached_jit(build, float(i))
    assert len(caching._JIT_CACHE) == 4
