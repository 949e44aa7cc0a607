"""The incremental forward pass (recompute only the touched part of each conv) equals the plain path."""
import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsal_agents.networks import NatureDQN
from jaxsal.perturbation import noise_sensitivity, occlusion, sarfa
from jaxsal.perturbation._incremental import incremental_apply
from tests._support.perturbation_models import tiny_apply, tiny_obs, tiny_params


class TwoConv(nn.Module):
    """Two VALID convs (strided, with a per-pixel LayerNorm between) and a dict output."""
    nonlocal_input: bool = False

    @nn.compact
    def __call__(self, obs):
        x = jnp.asarray(obs, jnp.float32) / 255.0
        if self.nonlocal_input:  # depends on the whole frame: a patch changes every pixel
            x = x - x.mean(axis=(1, 2), keepdims=True)
        x = nn.relu(nn.Conv(6, (3, 3), (2, 2), padding="VALID", name="conv1")(x))
        x = nn.LayerNorm(name="norm")(x)
        x = nn.relu(nn.Conv(5, (2, 2), (1, 1), padding="VALID", name="conv2")(x))
        q = nn.Dense(3, name="q")(x.reshape(x.shape[0], -1)) * 4.0
        return {"q": q, "value": q.mean(-1)}


OBS = tiny_obs(3, seed=9)
MODEL = TwoConv()


@functools.cache
def params():
    """The model's parameters: once per process, when a test first asks (not at collection)."""
    return jax.jit(MODEL.init)(jax.random.PRNGKey(1), OBS[:1])


@pytest.mark.parametrize("method,opts", [
    (occlusion, dict(patch=2, stride=2)),
    (occlusion, dict(patch=3, stride=2, fill=0.5, score="drop")),   # border-clipped last patch
    pytest.param(sarfa, dict(radius=1.0, stride=1, mask_shape="hard"), marks=pytest.mark.slow),
    (sarfa, dict(radius=0.5, stride=2, perturbation="blur", blur_sigma=1.0)),
    pytest.param(noise_sensitivity, dict(radius=0.5, stride=3, score="output_l2"),
                 marks=pytest.mark.slow),
])
def test_incremental_equals_plain(method, opts):
    plain = np.asarray(method(MODEL.apply, params(), OBS, incremental=False, return_grid=True, **opts))
    fast = np.asarray(method(MODEL.apply, params(), OBS, incremental=True, return_grid=True,
                             batch_size=40, **opts))
    np.testing.assert_allclose(fast, plain, rtol=1e-4, atol=1e-5)
    assert np.abs(plain).max() > 1e-3


def test_incremental_apply_windows_every_conv_without_leak():
    x = jnp.asarray(OBS[:2], jnp.float32)
    k = 5
    r0 = jnp.tile(jnp.array([0, 3, 5, 9, 11]), 2)
    c0 = jnp.tile(jnp.array([10, 0, 4, 7, 11]), 2)
    xp = jnp.repeat(x, k, axis=0)
    xp = jax.vmap(lambda xi, a, b: jax.lax.dynamic_update_slice(xi, jnp.zeros((1, 1, 2)), (a, b, 0)))(
        xp, r0, c0)
    out, leaked = jax.jit(lambda p: incremental_apply(MODEL.apply, p, x, xp, r0, c0, (1, 1), (12, 12)))(
        params())
    assert leaked is None  # x / 255, ReLU and a per-pixel LayerNorm: proven local, nothing checked
    want = MODEL.apply(params(), xp)
    np.testing.assert_allclose(np.asarray(out["q"]), np.asarray(want["q"]), rtol=1e-5, atol=1e-5)


def test_run_time_check_reports_a_change_outside_the_box(monkeypatch):
    from jaxsal.perturbation import _incremental
    monkeypatch.setattr(_incremental, "proven_local", lambda *a, **k: [False, False])
    x = jnp.asarray(OBS[:2], jnp.float32)
    r0, c0 = jnp.array([0, 3, 5, 9]), jnp.array([10, 0, 4, 7])
    xp = jax.vmap(lambda xi, a, b: jax.lax.dynamic_update_slice(xi, jnp.zeros((1, 1, 2)), (a, b, 0)))(
        jnp.repeat(x, 2, axis=0), r0, c0)
    run = jax.jit(lambda p, r: incremental_apply(MODEL.apply, p, x, xp, r, c0, (1, 1), (12, 12)))
    out, leaked = run(params(), r0)
    assert not bool(leaked)
    np.testing.assert_allclose(np.asarray(out["q"]), np.asarray(MODEL.apply(params(), xp)["q"]), rtol=1e-5, atol=1e-5)
    assert bool(run(params(), (r0 + 2) % 12)[1])  # a box that does not cover the change


def test_run_time_check_sees_a_change_one_pixel_past_the_box(monkeypatch):
    """The box is [r0, r0 + bh) x [c0, c0 + bw): a change on its last row and column is no leak, one a
    pixel past any of its four sides is."""
    from jaxsal.perturbation import _incremental
    monkeypatch.setattr(_incremental, "proven_local", lambda *a, **k: [False, False])
    x = jnp.asarray(OBS[:1], jnp.float32)
    r0, c0 = jnp.array([4]), jnp.array([5])
    run = jax.jit(lambda p, xp: incremental_apply(MODEL.apply, p, x, xp, r0, c0, (2, 2), (12, 12))[1])
    for (i, j), leak in [((5, 6), False), ((4, 5), False), ((6, 6), True), ((5, 7), True), ((3, 5), True),
                         ((4, 4), True)]:
        assert bool(run(params(), x.at[0, i, j, 0].add(80.0))) == leak, (i, j)


@pytest.mark.parametrize("radius", [0.5, 1.0, 2.0, 3.0])
def test_gaussian_disk_is_zero_outside_its_incremental_box(radius):
    """Noise sensitivity's incremental box spans gaussian_half(radius) pixels each side of the centre: the
    mask's definition (scipy's blur of Greydanus' 5-pixel disk) must be exactly 0 beyond it, or the
    windowed convs would miss part of the perturbation."""
    from scipy.ndimage import gaussian_filter

    from jaxsal.perturbation._disk import gaussian_half

    n, c = 41, 20
    disk = np.zeros((n, n))
    for di, dj in ((0, 0), (-1, 0), (1, 0), (0, -1), (0, 1)):
        disk[c + di, c + dj] = 1.0
    mask = gaussian_filter(disk, radius, mode="reflect")
    half = gaussian_half(radius)
    inside = np.zeros((n, n), bool)
    inside[c - half:c + half + 1, c - half:c + half + 1] = True
    assert np.all(mask[~inside] == 0) and mask[inside].min() >= 0 and mask[c, c] > 0


class Skip(nn.Module):
    """Local everywhere except an input mean added after the first conv (proven at conv 1 only
    when `skip` is off)."""
    skip: bool = True

    @nn.compact
    def __call__(self, obs):
        x = jnp.asarray(obs, jnp.float32) / 255.0
        h = nn.relu(nn.Conv(4, (3, 3), (2, 2), padding="VALID", name="conv1")(x))
        if self.skip:
            h = h + x.mean(axis=(1, 2, 3))[:, None, None, None]
        h = nn.relu(nn.Conv(3, (2, 2), padding="VALID", name="conv2")(h))
        return nn.Dense(2, name="q")(h.reshape(h.shape[0], -1))


@pytest.mark.parametrize("model,want", [(TwoConv(), [True, True]), (TwoConv(nonlocal_input=True), [False, True]),
                                        (Skip(), [True, False]), (Skip(skip=False), [True, True])])
def test_proof_of_locality_per_conv(model, want):
    from jaxsal.perturbation._incremental import proven_local
    params = model.init(jax.random.PRNGKey(0), OBS[:1])
    record = []

    def rec(f, args, kwargs, ctx):
        out = f(*args, **kwargs)
        if ctx.method_name == "__call__" and isinstance(ctx.module, nn.Conv):
            record.append((args[0], out))
        return out

    with nn.intercept_methods(rec):
        model.apply(params, jnp.asarray(OBS[:1], jnp.float32))
    assert proven_local(model.apply, params, jnp.zeros((4,) + OBS.shape[1:]), record) == want


@pytest.mark.parametrize("skip", [True, False])
def test_model_not_local_between_convs_equals_plain(skip):
    model = Skip(skip=skip)
    params = model.init(jax.random.PRNGKey(3), OBS[:1])
    plain = np.asarray(occlusion(model.apply, params, OBS, incremental=False, return_grid=True))
    fast = np.asarray(occlusion(model.apply, params, OBS, incremental=True, return_grid=True, batch_size=40))
    np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-6)


def test_non_local_model_falls_back_to_the_plain_path():
    model = TwoConv(nonlocal_input=True)
    params = model.init(jax.random.PRNGKey(2), OBS[:1])
    plain = np.asarray(occlusion(model.apply, params, OBS, incremental=False, return_grid=True))
    fast = np.asarray(occlusion(model.apply, params, OBS, incremental=True, return_grid=True))
    np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-6)
    # under the caller's jit too: each chunk checks its leak and reruns its plain pass on device
    jitted = jax.jit(lambda p, o: occlusion(model.apply, p, o, incremental=True, return_grid=True,
                                            batch_size=40))(params, OBS)
    np.testing.assert_allclose(np.asarray(jitted), plain, rtol=1e-5, atol=1e-6)


def test_plain_function_models_are_unaffected():
    p = tiny_params()
    a = occlusion(tiny_apply, p, OBS[:1], incremental=True, return_grid=True)
    b = occlusion(tiny_apply, p, OBS[:1], incremental=False, return_grid=True)
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_nature_dqn_occlusion_incremental_equals_plain():
    model = NatureDQN(4)
    obs = np.random.default_rng(0).integers(0, 256, (1, 84, 84, 4), dtype=np.uint8)
    params = model.init(jax.random.PRNGKey(0), obs)
    plain = np.asarray(occlusion(model.apply, params, obs, stride=6, incremental=False, return_grid=True))
    fast = np.asarray(occlusion(model.apply, params, obs, stride=6, incremental=None,
                                return_grid=True))  # auto: on for 2x2 patches
    np.testing.assert_allclose(fast, plain, rtol=1e-5, atol=1e-5)


def test_window_is_the_tightest_static_range_covering_every_touched_output():
    from jaxsal.perturbation._incremental import _window
    for k, s, n_in, size in [(8, 4, 84, 2), (4, 2, 20, 3), (3, 1, 9, 3), (8, 4, 84, 27), (5, 3, 17, 4)]:
        n_out = (n_in - k) // s + 1
        counts = []
        for a in range(-size, n_in):
            touched = [o for o in range(n_out) if o * s < a + size and o * s + k > a]
            lo, n_o = _window(np.int32(a), size, k, s, n_in)
            lo = int(lo)
            assert 0 <= lo and lo + n_o <= n_out
            assert all(lo <= o < lo + n_o for o in touched), (k, s, n_in, size, a)
            counts.append(len(touched))
        assert n_o == max(counts)  # no wasted output row: the static size is what some patch needs


@pytest.mark.parametrize("fast", [False, True])
def test_nature_dqn_default_runs_incremental_and_equals_plain(fast, monkeypatch):
    from jaxsal import caching
    from jaxsal.perturbation import _incremental
    from jaxsal.backprop.strided_conv import fast_apply
    model = NatureDQN(4)
    obs = np.random.default_rng(3).integers(0, 256, (1, 84, 84, 4), dtype=np.uint8)
    params = model.init(jax.random.PRNGKey(0), obs[:1])
    fn = fast_apply(model.apply) if fast else model.apply
    plain = np.asarray(occlusion(fn, params, obs, stride=27, incremental=False, return_grid=True))
    caching.clear_caches()
    traced = []
    real = _incremental.incremental_apply
    monkeypatch.setattr(_incremental, "incremental_apply", lambda *a: traced.append(1) or real(*a))
    auto = np.asarray(occlusion(fn, params, obs, stride=27, return_grid=True))  # default: auto
    np.testing.assert_allclose(auto, plain, rtol=1e-5, atol=1e-5)
    assert np.abs(plain).max() > 1e-3
    assert traced  # the default really took the incremental path
