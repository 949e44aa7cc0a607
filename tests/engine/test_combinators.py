"""noise_tunnel and path_integral of any gradient or CAM method, against slow references written
from their definitions: a Python loop over the noise draws / path points, each one call of the
inner method on one state with the clean input's action fixed."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.errors import SaliencyInputError
from tests._support.conformance import MODEL, PARAMS, H, W, C, _obs

KEY = jax.random.PRNGKey(5)
F = MODEL.apply


def _close(got, want):
    want = np.asarray(want)
    assert np.abs(want).max() > 0
    np.testing.assert_allclose(np.asarray(got), want, rtol=2e-4, atol=2e-5 * np.abs(want).max())


def _greedy(x):
    return np.asarray(jnp.argmax(F(PARAMS, jnp.asarray(x, jnp.float32)), -1))


def _noisy(x, i, j, sigma):
    """Noise draw j of state i (SmoothGrad's level: sigma times the state's value range)."""
    xi = jnp.asarray(x[i], jnp.float32)
    e = jax.random.normal(jax.random.fold_in(jax.random.fold_in(KEY, i), j), xi.shape)
    return xi + sigma * (xi.max() - xi.min()) * e


def _tunnel_reference(method, x, n, sigma, acts=None, **kw):
    acts = _greedy(x) if acts is None else acts
    out = []
    for i in range(len(x)):
        m = np.stack([np.asarray(getattr(jaxsal, method)(F, PARAMS, _noisy(x, i, j, sigma)[None],
                                                          actions=acts[i:i + 1], **kw))[0] for j in range(n)])
        out.append(m)
    return np.stack(out)  # (N, n, ...)


def test_smoothgrad_of_gradcam_equals_the_loop_over_noise_draws():
    x = _obs()
    draws = _tunnel_reference("gradcam", x, 5, 0.2, layer="conv2")
    for variant, want in (("mean", draws.mean(1)), ("squared", (draws ** 2).mean(1)),
                          ("vargrad", draws.var(1))):
        spec = jaxsal.noise_tunnel("gradcam", n=5, sigma=0.2, variant=variant)
        got = jaxsal.explain(F, PARAMS, x, method=spec, layer="conv2", key=KEY)
        _close(got, want)
    # chunked with two groups of samples (batch_size below n): the same maps
    got = jaxsal.explain(F, PARAMS, x, method=jaxsal.noise_tunnel("gradcam", n=5, sigma=0.2), layer="conv2",
                         key=KEY, batch_size=3)
    _close(got, draws.mean(1))


def test_each_state_explains_its_own_given_action_in_every_group():
    """Given actions that differ between states (target q_action), every noisy copy of state i explains
    action i, in each group of samples (batch_size 2: the clean forward, then a program per group)."""
    x = _obs()
    acts = np.array([2, 0, 1])
    assert (acts != _greedy(x)).any()
    draws = _tunnel_reference("gradcam", x, 3, 0.2, acts=acts, layer="conv2", target="q_action")
    for batch_size in (None, 2):
        got = jaxsal.explain(F, PARAMS, x, method=jaxsal.noise_tunnel("gradcam", n=3, sigma=0.2), layer="conv2",
                             key=KEY, target="q_action", actions=acts, batch_size=batch_size)
        _close(got, draws.mean(1))


def test_noise_tunnel_of_guided_backprop_squares_each_input_element():
    """Input-resolution attributions: averaged (and squared) per channel, summed over channels after."""
    x = _obs()
    per_channel = _tunnel_reference("guided_backprop", x, 3, 0.1, per_frame=True)   # (N, n, H, W, C)
    got = jaxsal.explain(F, PARAMS, x, method=jaxsal.noise_tunnel("guided_backprop", n=3, sigma=0.1,
                                                                    variant="squared"), key=KEY)
    _close(got, (per_channel ** 2).mean(1).sum(-1))
    same = jaxsal.smoothgrad(F, PARAMS, x, n_samples=3, sigma=0.1, variant="sg2", rule="guided", key=KEY)
    _close(got, same)


def _path(x, x0, alphas):
    return [x0 + a * (x - x0) for a in alphas]


def test_integrated_gradients_of_guided_backprop_equals_the_loop_over_path_points():
    x = np.asarray(_obs(), np.float32)
    acts, steps = _greedy(x), 6
    alphas = (np.arange(steps) + 1) / steps
    x0 = np.full_like(x, 40.0)
    grads = np.mean([np.asarray(jaxsal.guided_backprop(F, PARAMS, xk, actions=acts, per_frame=True))
                     for xk in _path(x, x0, alphas)], axis=0)
    want = ((x - x0) * grads).sum(-1)
    got = jaxsal.explain(F, PARAMS, x, method=jaxsal.path_integral("guided_backprop", steps=steps,
                                                                     baseline=x0[0]))
    _close(got, want)
    _close(jaxsal.integrated_gradients(F, PARAMS, x, steps=steps, baseline=x0[0], rule="guided"), want)
    # two groups of path points and per-state baselines: the same
    _close(jaxsal.explain(F, PARAMS, x, method=jaxsal.path_integral("guided_backprop", steps=steps, baseline=x0),
                          batch_size=4), want)


def test_path_integral_of_gradcam_is_the_path_average_of_its_maps():
    x = np.asarray(_obs(), np.float32)
    acts, steps = _greedy(x), 4
    a, w = jaxsal.engine.combinators.quadrature(steps, "gausslegendre")
    want = sum(wk * np.asarray(jaxsal.gradcam(F, PARAMS, xk, actions=acts, layer="conv2"))
               for wk, xk in zip(w, _path(x, np.zeros_like(x), a)))
    got = jaxsal.explain(F, PARAMS, x, method=jaxsal.path_integral("gradcam", steps=steps), layer="conv2",
                         quadrature="gausslegendre")
    _close(got, want)


def test_combined_methods_under_jit_and_vmap():
    spec = jaxsal.noise_tunnel("gradcam", n=3)
    x = _obs()
    eager = jaxsal.explain(F, PARAMS, x, method=spec, key=KEY, layer="conv2")
    _close(jax.jit(lambda o: jaxsal.explain(F, PARAMS, o, method=spec, key=KEY, layer="conv2"))(x), eager)
    both = jnp.stack([x, x])
    vm = jax.vmap(lambda o: jaxsal.explain(F, PARAMS, o, method=spec, key=KEY, layer="conv2", batch_size=2))(both)
    _close(vm[1], eager)
    # in a method list, next to the methods it names
    out = jaxsal.explain(F, PARAMS, x, method=[spec, "gradcam"], key=KEY, layer="conv2")
    _close(out["noise_tunnel(gradcam)"], eager)


def test_bad_combinations_are_clear_errors():
    with pytest.raises(SaliencyInputError, match="not the combined method"):
        jaxsal.noise_tunnel(jaxsal.noise_tunnel("gradcam"))
    with pytest.raises(SaliencyInputError, match="not the perturbation method 'occlusion'"):
        jaxsal.path_integral("occlusion")
    with pytest.raises(SaliencyInputError, match="not a method the engine runs"):
        jaxsal.path_integral("no_such_method")
    with pytest.raises(SaliencyInputError, match="variant must be one of"):
        jaxsal.noise_tunnel("gradient", variant="median")
    with pytest.raises(SaliencyInputError, match="stochastic: pass key"):
        jaxsal.explain(F, PARAMS, _obs(), method=jaxsal.noise_tunnel("gradcam", n=2))
    with pytest.raises(SaliencyInputError, match="return_error needs an input-gradient method"):
        jaxsal.explain(F, PARAMS, _obs(), method=jaxsal.path_integral("gradcam", steps=2), return_error=True)
    assert (H, W, C) == _obs().shape[1:]
