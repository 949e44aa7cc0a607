"""experiments.paper_b.run.fidelity: a state whose ratio score is undefined gets a NaN AUC and is left
out of the mean curve (averaging it in made Breakout's and Frostbite's Q-value mean curves NaN)."""
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from experiments.paper_b import run as paper_b


def _agent():
    def apply_fn(params, obs):
        m = obs.reshape(obs.shape[0], -1).mean(1)
        return jnp.stack([params["w"] * m + params["b"], 0.5 * params["w"] * m + params["b"]], -1)
    return SimpleNamespace(apply_fn=apply_fn, params={"w": jnp.float32(4.0), "b": jnp.float32(-1.0)})


@pytest.mark.slow  # ~7 s of compiling; the study's runner, not the library
def test_an_undefined_state_has_a_nan_auc_and_stays_out_of_the_mean_curve():
    obs = np.array(jax.random.uniform(jax.random.key(0), (3, 84, 84, 4)), np.float32)
    obs[0] = 0.0   # Q = b < 0 for every action: Q_a(x_t) / Q_a(x) is undefined
    maps = np.asarray(jax.random.uniform(jax.random.key(1), (3, 84, 84)), np.float32)
    out = paper_b.fidelity(_agent(), obs, {"m": maps}, jax.random.PRNGKey(2), batch_size=64)
    aucs, curve = out["insertion", "black", "q_value"]["m"]
    assert np.isnan(aucs[0]) and np.isfinite(aucs[1:]).all()
    alone = paper_b.fidelity(_agent(), obs[1:], {"m": maps[1:]}, jax.random.PRNGKey(2), batch_size=64)
    want = np.asarray(alone["insertion", "black", "q_value"]["m"][1])   # another batch: the curve crosses 0
    np.testing.assert_allclose(curve, want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    adv_aucs, adv_curve = out["insertion", "black", "advantage"]["m"]
    assert np.isfinite(adv_aucs).all() and np.isfinite(adv_curve).all()
