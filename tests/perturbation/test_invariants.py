"""Perturbation methods: batched == per-example, chunking, determinism, layouts, fill, errors, sharding."""
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal import SaliencyInputError
from jaxsal.perturbation import lime, noise_sensitivity, occlusion, rise, sarfa
from tests._support.perturbation_models import H, W, TinyFlax, tiny_apply, tiny_obs, tiny_params
from tests._support import ROOT

P = tiny_params()
KEY = jax.random.PRNGKey(7)
CASES = {
    "occlusion": dict(patch=3, stride=2),
    "noise_sensitivity": dict(radius=2.0, stride=3),
    "sarfa": dict(radius=2.0, stride=3),
    "rise": dict(key=KEY, n_masks=40, grid=4),
    "lime": dict(key=KEY, n_samples=40, segmentation="felzenszwalb"),
}


@pytest.mark.parametrize("method", [
    m if m not in ("lime", "noise_sensitivity") else pytest.param(m, marks=pytest.mark.slow) for m in sorted(CASES)])
def test_batched_equals_per_example_and_chunking(method):
    """LIME and noise sensitivity (3-6 s each) are slow tests here: the fast loop checks both batched
    == per-example and chunked == unchunked in tests/test_conformance.py's eager checks."""
    obs = tiny_obs(3)
    fn = jaxsal.registry.get_method(method)
    full = np.asarray(fn(tiny_apply, P, obs, **CASES[method]))
    assert full.shape == (3, H, W) and np.isfinite(full).all()
    chunked = np.asarray(fn(tiny_apply, P, obs, batch_size=7, **CASES[method]))
    np.testing.assert_allclose(chunked, full, rtol=1e-5, atol=1e-6)
    for i in range(3):
        one = np.asarray(fn(tiny_apply, P, obs[i:i + 1], **CASES[method]))
        np.testing.assert_allclose(one[0], full[i], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["rise", "lime"])
def test_determinism_under_key(method):
    obs = tiny_obs(2)
    fn = jaxsal.registry.get_method(method)
    a = np.asarray(fn(tiny_apply, P, obs, **CASES[method]))
    b = np.asarray(fn(tiny_apply, P, obs, **CASES[method]))
    np.testing.assert_array_equal(a, b)
    other = {**CASES[method], "key": jax.random.PRNGKey(8)}
    assert not np.allclose(a, np.asarray(fn(tiny_apply, P, obs, **other)))
    assert method in jaxsal.registry.STOCHASTIC
    with pytest.raises(SaliencyInputError, match="key"):
        fn(tiny_apply, P, obs, **{k: v for k, v in CASES[method].items() if k != "key"})


@pytest.mark.parametrize("method", sorted(CASES))
def test_nchw_layout_and_flax_dict_output(method):
    obs = tiny_obs(2)
    fn = jaxsal.registry.get_method(method)
    want = np.asarray(fn(tiny_apply, P, obs, **CASES[method]))
    nchw = lambda p, x: tiny_apply(p, jnp.transpose(x, (0, 2, 3, 1)))  # noqa: E731
    got = np.asarray(fn(nchw, P, obs.transpose(0, 3, 1, 2), layout="NCHW", **CASES[method]))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    model = TinyFlax()
    params = model.init(jax.random.PRNGKey(0), obs[:1])
    m = np.asarray(jaxsal.explain(model.apply, params, obs, method=method, **CASES[method]))
    assert m.shape == (2, H, W) and np.isfinite(m).all() and np.abs(m).max() > 0


def test_fill_is_a_fraction_of_the_value_range():
    obs = tiny_obs(2)
    grey_u8 = occlusion(tiny_apply, P, obs, fill=0.5, return_grid=True)
    grey_abs = occlusion(tiny_apply, P, obs.astype(np.float32), fill=0.5, return_grid=True)
    grey_abs = np.asarray(grey_abs)     # 127.5 both; uint8 frames are cast inside the program: a drop near 0
    np.testing.assert_allclose(np.asarray(grey_u8), grey_abs, rtol=1e-6, atol=1e-6 * np.abs(grey_abs).max())
    f01 = lambda p, x: tiny_apply(p, x * 255.0)  # noqa: E731  same model on [0, 1] frames
    unit = occlusion(f01, P, obs / 255.0, fill="grey", return_grid=True)
    np.testing.assert_allclose(np.asarray(unit), np.asarray(grey_u8), rtol=1e-4, atol=1e-5)
    explicit = occlusion(tiny_apply, P, obs, fill=0.5, obs_max=100.0, return_grid=True)
    assert not np.allclose(np.asarray(explicit), np.asarray(grey_u8))
    mean = occlusion(tiny_apply, P, obs, fill="mean", return_grid=True)
    assert np.isfinite(np.asarray(mean)).all()


def test_given_actions_and_targets():
    obs = tiny_obs(2)
    q = np.asarray(tiny_apply(P, obs))
    chosen = q.argmax(-1)
    a = occlusion(tiny_apply, P, obs, actions=chosen, return_grid=True)
    b = occlusion(tiny_apply, P, obs, return_grid=True)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = (chosen + 1) % 3
    c = occlusion(tiny_apply, P, obs, target="q_action", actions=other, return_grid=True)
    assert not np.allclose(np.asarray(c), np.asarray(b))
    d = occlusion(tiny_apply, P, obs, target="advantage", score="drop", return_grid=True)
    assert np.isfinite(np.asarray(d)).all()
    with pytest.raises(SaliencyInputError, match="out of range"):
        occlusion(tiny_apply, P, obs, actions=np.array([0, 5]))


@pytest.mark.parametrize("call,match", [
    (lambda o: occlusion(tiny_apply, P, o, patch=13), "patch=13 does not fit"),
    (lambda o: occlusion(tiny_apply, P, o, stride=0), "stride"),
    (lambda o: occlusion(tiny_apply, P, o, fill="pink"), "fill"),
    (lambda o: occlusion(tiny_apply, P, o, score="nope"), "score"),
    (lambda o: noise_sensitivity(tiny_apply, P, o, radius=7.0), "radius=7.0 does not fit"),
    (lambda o: noise_sensitivity(tiny_apply, P, o, radius=-1), "radius"),
    (lambda o: noise_sensitivity(tiny_apply, P, o, blur_sigma=-1), "blur_sigma"),
    (lambda o: noise_sensitivity(tiny_apply, P, o, perturbation="smudge"), "perturbation"),
    (lambda o: sarfa(tiny_apply, P, o, stride=20), "stride=20 does not fit"),
    (lambda o: sarfa(tiny_apply, P, o, mask_shape="square"), "mask_shape"),
    (lambda o: rise(tiny_apply, P, o, key=KEY, n_masks=0), "n_masks"),
    (lambda o: rise(tiny_apply, P, o, key=KEY, grid=13), "grid"),
    (lambda o: rise(tiny_apply, P, o, key=KEY, p_keep=1.5), "p_keep"),
    (lambda o: rise(tiny_apply, P, o, masks=np.ones((3, 5, 5))), "masks must have shape"),
    (lambda o: lime(tiny_apply, P, o, key=KEY, n_samples=0), "n_samples"),
    (lambda o: lime(tiny_apply, P, o, key=KEY, segmentation="watershed"), "unknown segmentation"),
    (lambda o: lime(tiny_apply, P, o, key=KEY, segmentation_options={"bogus": 1}), "no option"),
    (lambda o: lime(tiny_apply, P, o, key=KEY, segments=np.zeros((1, 3, 3), int)), "segments"),
    (lambda o: occlusion(tiny_apply, P, o[0]), "obs\\[None\\]"),
    (lambda o: occlusion(tiny_apply, P, o, batch_size=0), "batch_size"),
    (lambda o: occlusion(tiny_apply, P, o, obs_max=-1), "obs_max"),
    (lambda o: occlusion(tiny_apply, P, o[:, :, :, :1]), "apply_fn"),
    (lambda o: jaxsal.explain(tiny_apply, P, o, method="occlusion", n_masks=3), "no option"),
])
def test_bad_input_is_one_clear_error(call, match):
    with pytest.raises(SaliencyInputError, match=match):
        call(tiny_obs(2))


@pytest.mark.slow  # a 4-device subprocess; tests/test_sharding.py and tests/cli/test_scale.py keep one each fast
def test_sharded_equals_unsharded():
    script = textwrap.dedent("""
        import jax, numpy as np
        from jaxsal.perturbation import occlusion, rise
        from tests._support.perturbation_models import tiny_apply, tiny_obs, tiny_params
        assert jax.local_device_count() == 4
        P, obs = tiny_params(), tiny_obs(5)
        o = occlusion(tiny_apply, P, obs, patch=3, stride=3, batch_size=12)
        r = rise(tiny_apply, P, obs, key=jax.random.PRNGKey(7), n_masks=20, grid=4, batch_size=40)
        import sys; np.save(sys.stdout.buffer, np.concatenate([np.asarray(o), np.asarray(r)]), allow_pickle=False)
    """)
    env = {**os.environ, "XLA_FLAGS": "--xla_force_host_platform_device_count=4", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    import io
    got = np.load(io.BytesIO(out.stdout), allow_pickle=False)
    obs = tiny_obs(5)
    o = occlusion(tiny_apply, P, obs, patch=3, stride=3)
    r = rise(tiny_apply, P, obs, key=jax.random.PRNGKey(7), n_masks=20, grid=4)
    np.testing.assert_allclose(got, np.concatenate([np.asarray(o), np.asarray(r)]), rtol=1e-5, atol=1e-6)
