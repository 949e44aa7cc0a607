"""Conformance of every registered method, built from the registry: a method registered
without a case here fails `test_every_registered_method_has_a_case`.

For each method, through `chex.variants` (eager and under `jax.jit`): output shape, jit ==
eager, chunked (batch_size, lax.map when traced) == unchunked; eagerly batched == per-example
and NCHW == NHWC; then
determinism under a fixed key, `jax.vmap` over a leading axis of batches == a loop, and the
call inside `jax.lax.scan` == a loop. A tiny flax CNN (a strided conv so the matmul-gradient
rule applies, ReLUs so guided rules bite, named layers for the CAM methods) keeps compiles short.
"""
import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl.testing import parameterized

import jaxsal

N, H, W, C, A = 3, 16, 16, 2, 3


class Tiny(nn.Module):
    @nn.compact
    def __call__(self, obs):
        x = jnp.asarray(obs, jnp.float32) / 255.0
        x = nn.relu(nn.Conv(4, (3, 3), (2, 2), padding="VALID", name="conv1")(x))
        x = nn.relu(nn.Conv(4, (2, 2), (1, 1), padding="VALID", name="conv2")(x))
        return nn.Dense(A, name="q")(x.reshape(x.shape[0], -1))


MODEL = Tiny()
PARAMS = jax.jit(MODEL.init)(jax.random.PRNGKey(0), jnp.zeros((1, H, W, C)))
KEY = jax.random.PRNGKey(7)

# Every method the engine runs brings its conformance case (Spec.example: small sample counts;
# the method's own definition and defaults are tested against references elsewhere).
COMBINED = {"noise_tunnel_gradcam": jaxsal.noise_tunnel("gradcam"),
            "path_integral_guided_backprop": jaxsal.path_integral("guided_backprop")}
"""Methods made by the combinators, checked as every registered method is."""


def _spec_cases() -> dict:
    from jaxsal.registry import SPECS
    specs = {**{m: s for m, s in SPECS.items() if _jaxsal_defined(m)}, **COMBINED}
    return {m: {**s.example, **({"key": KEY} if s.stochastic else {})} for m, s in specs.items()}


def _jaxsal_defined(m):
    from jaxsal.registry import METHODS
    return METHODS[m].__module__.startswith("jaxsal.")


CASES = _spec_cases()
STOCHASTIC = {"smoothgrad", "rise", "lime", "noise_tunnel_gradcam"}
POSITION_KEYED = {"smoothgrad", "noise_tunnel_gradcam"}
"""Noise of state i comes from fold_in(key, i) (i = its row in the call): a one-state call
reproduces row 0 of the batch, not every row."""


def _obs(n=N, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 256, (n, H, W, C)), jnp.uint8)


def _explain(method, p, o, **kw):
    return jaxsal.explain(MODEL.apply, p, o, method=COMBINED.get(method, method), **{**CASES[method], **kw})


def _close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert np.abs(want).max() > 0 or what == "lime", f"{what}: all-zero maps test nothing"
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5 * max(1e-6, np.abs(want).max()),
                               err_msg=what)


def _shipped():
    """Methods jaxsal registers (other tests register stand-ins from their own modules)."""
    from jaxsal.registry import METHODS
    return {m for m in jaxsal.methods() if METHODS[m].__module__.startswith("jaxsal.")}


def test_every_registered_method_has_a_case():
    missing = sorted(_shipped() - set(CASES))
    assert not missing, f"methods registered without a conformance case: {missing}"
    assert not set(CASES) - _shipped() - set(COMBINED), "cases for methods that are not registered"


METHODS = [(m, m) for m in sorted(CASES)]
QUICK = {"gradient", "gradcam", "occlusion", "rise"}
"""One method per family (gradient, CAM, deterministic and stochastic perturbation) runs every
check in the fast loop; the others run the eager shape/batching/chunking/layout checks there, and
their jit, vmap and scan checks (a compile each, ~70 CPU s together) are `slow` tests."""


class Conformance(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*METHODS)
    def test_shapes_batching_chunking_layout(self, method):
        obs = _obs()
        eager = _explain(method, PARAMS, obs)
        chex.assert_shape(eager, (N, H, W))
        run = self.variant(lambda p, o: _explain(method, p, o))
        got = run(PARAMS, obs)
        chex.assert_shape(got, (N, H, W))
        _close(got, eager, f"{method}: jit (or eager) == eager")
        chunked = self.variant(lambda p, o: _explain(method, p, o, batch_size=2))(PARAMS, obs)
        _close(chunked, eager, f"{method}: batch_size=2 == unchunked")  # traced: lax.map chunks
        if self.id().endswith("__with_jit"):
            return  # the rest compares eager calls only
        rows = 1 if method in POSITION_KEYED else N
        one = jnp.concatenate([run(PARAMS, obs[i:i + 1]) for i in range(rows)])
        _close(one, eager[:rows], f"{method}: batched == per-example")
        # the maps of a prefix of the states are the prefix of the maps (experiments.paper_b's
        # sanity check reuses them as its original maps)
        _close(run(PARAMS, obs[:2]), eager[:2], f"{method}: prefix of the batch == batch of the prefix")
        nchw = jaxsal.explain(lambda q, x: MODEL.apply(q, jnp.transpose(x, (0, 2, 3, 1))), PARAMS,
                              jnp.transpose(obs, (0, 3, 1, 2)), method=COMBINED.get(method, method), layout="NCHW",
                              **CASES[method])
        _close(nchw, eager, f"{method}: NCHW == NHWC")

    @parameterized.named_parameters(*METHODS)
    def test_deterministic_vmap_and_scan(self, method):
        batches = jnp.stack([_obs(seed=1), _obs(seed=2)])
        loop = jnp.stack([_explain(method, PARAMS, b) for b in batches])
        _close(_explain(method, PARAMS, batches[0]), loop[0], f"{method}: same key, same maps")
        if method in STOCHASTIC:
            other = _explain(method, PARAMS, batches[0], key=jax.random.PRNGKey(8))
            assert not np.allclose(np.asarray(other), np.asarray(loop[0])), "key is ignored"

        def step(carry, o):
            return carry + 1, _explain(method, PARAMS, o)

        @jax.jit  # one compile for both
        def both(bs):
            return jax.vmap(lambda o: _explain(method, PARAMS, o))(bs), jax.lax.scan(step, 0, bs)[1]
        vm, scanned = both(batches)
        chex.assert_shape(vm, (2, N, H, W))
        _close(vm, loop, f"{method}: vmap == loop")
        _close(scanned, loop, f"{method}: inside lax.scan == loop")


def _mark_slow_variants():
    """The generated test methods are named test_<check>_<method>[__with_jit|__without_jit]."""
    for base in ("test_shapes_batching_chunking_layout", "test_deterministic_vmap_and_scan"):
        for method in set(CASES) - QUICK:
            name = f"{base}_{method}" + ("__with_jit" if base == "test_shapes_batching_chunking_layout" else "")
            setattr(Conformance, name, pytest.mark.slow(getattr(Conformance, name)))


_mark_slow_variants()
