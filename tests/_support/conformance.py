"""The generic checks of a saliency method, generated from the registry: every registered method
(shipped, or registered by a test or a user at run time) gets them from its declared example
(`Spec.example`, or `jaxsal.register(..., example=...)` for a function method).

`cases()` asks the registry which methods exist and which options their case uses; the
`check_*` functions are the checks. tests/test_conformance.py runs them on every shipped method,
tests/test_own_methods.py on methods a test registers. A tiny flax CNN (a strided conv so the
matmul-gradient rule applies, ReLUs so guided rules bite, layers "conv1"/"conv2" for the CAM
methods) keeps compiles short.
"""
import chex
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal import registry
from jaxsal.errors import SaliencyInputError

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
COMBINED = {"noise_tunnel_gradcam": jaxsal.noise_tunnel("gradcam"),
            "path_integral_guided_backprop": jaxsal.path_integral("guided_backprop")}
"""Methods made by the combinators (not registered), checked as every registered method is."""


def shipped(name: str) -> bool:
    """A method jaxsal itself registers (tests and users register others)."""
    return registry.SHIPPED.get(name) is registry.METHODS[name]


def _spec(name):
    return COMBINED.get(name) or registry.SPECS.get(name)


def stochastic(name: str) -> bool:
    spec = _spec(name)
    return spec.stochastic if spec is not None else name in registry.STOCHASTIC


def position_keyed(name: str) -> bool:
    """Noise of state i comes from fold_in(key, i) (i = its row in the call, Spec.indexed): a
    one-state call reproduces row 0 of the batch, not every row."""
    spec = _spec(name)
    return spec is not None and spec.stochastic and spec.indexed


def example(name: str) -> dict:
    """The options of a method's case: its declared example (+ a key for a stochastic one)."""
    spec = _spec(name)
    opts = dict(spec.example if spec is not None else registry.EXAMPLES.get(name, {}))
    return {**opts, **({"key": KEY} if stochastic(name) else {})}


def cases(only_shipped: bool = False) -> dict:
    """name -> options of every registered method's case (and of the COMBINED ones)."""
    names = [m for m in registry.METHODS if shipped(m) or not only_shipped] + list(COMBINED)
    return {m: example(m) for m in sorted(names)}


def _obs(n=N, seed=0):
    return jnp.asarray(np.random.default_rng(seed).integers(0, 256, (n, H, W, C)), jnp.uint8)


def explain(method, p, o, **kw):
    return jaxsal.explain(MODEL.apply, p, o, method=COMBINED.get(method, method), **{**example(method), **kw})


def _close(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert np.abs(want).max() > 0 or what.startswith("lime"), f"{what}: all-zero maps test nothing"
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-5 * max(1e-6, np.abs(want).max()),
                               err_msg=what)


def check_shapes_batching_chunking_layout(method, run_as=lambda f: f, eager=True):
    """Output shape, `run_as(f)` (jax.jit, or eager) == eager, chunked (batch_size; lax.map when
    traced) == unchunked; with `eager` also batched == per-example, a prefix of the batch == the
    batch of the prefix, and NCHW == NHWC."""
    obs = _obs()
    want = explain(method, PARAMS, obs)
    chex.assert_shape(want, (N, H, W))
    run = run_as(lambda p, o: explain(method, p, o))
    got = run(PARAMS, obs)
    chex.assert_shape(got, (N, H, W))
    _close(got, want, f"{method}: jit (or eager) == eager")
    chunked = run_as(lambda p, o: explain(method, p, o, batch_size=2))(PARAMS, obs)
    _close(chunked, want, f"{method}: batch_size=2 == unchunked")
    if not eager:
        return
    rows = 1 if position_keyed(method) else N
    one = jnp.concatenate([run(PARAMS, obs[i:i + 1]) for i in range(rows)])
    _close(one, want[:rows], f"{method}: batched == per-example")
    # the maps of a prefix of the states are the prefix of the maps (experiments.paper_b.run's sanity
    # check reuses them as its original maps)
    _close(run(PARAMS, obs[:2]), want[:2], f"{method}: prefix of the batch == batch of the prefix")
    nchw = jaxsal.explain(lambda q, x: MODEL.apply(q, jnp.transpose(x, (0, 2, 3, 1))), PARAMS,
                          jnp.transpose(obs, (0, 3, 1, 2)), method=COMBINED.get(method, method), layout="NCHW",
                          **example(method))
    _close(nchw, want, f"{method}: NCHW == NHWC")


def check_deterministic_vmap_and_scan(method):
    """The same key gives the same maps (another key other maps, for a stochastic method);
    `jax.vmap` over a leading axis of batches == a loop; inside `jax.lax.scan` == a loop."""
    batches = jnp.stack([_obs(seed=1), _obs(seed=2)])
    loop = jnp.stack([explain(method, PARAMS, b) for b in batches])
    _close(explain(method, PARAMS, batches[0]), loop[0], f"{method}: same key, same maps")
    if stochastic(method):
        other = explain(method, PARAMS, batches[0], key=jax.random.PRNGKey(8))
        assert not np.allclose(np.asarray(other), np.asarray(loop[0])), f"{method}: key is ignored"

    def step(carry, o):
        return carry + 1, explain(method, PARAMS, o)

    @jax.jit  # one compile for both
    def both(bs):
        return jax.vmap(lambda o: explain(method, PARAMS, o))(bs), jax.lax.scan(step, 0, bs)[1]
    vm, scanned = both(batches)
    chex.assert_shape(vm, (2, N, H, W))
    _close(vm, loop, f"{method}: vmap == loop")
    _close(scanned, loop, f"{method}: inside lax.scan == loop")


def check_bad_input(method):
    """Bad calls are SaliencyInputErrors naming what is wrong: an unknown option, unbatched
    frames, q_action without actions, actions of the wrong length, a stochastic method without key."""
    obs = _obs()
    calls = [("has no option", dict(no_such_option=1)), ("batch of frame stacks", dict(o=obs[0])),
             ("needs actions", dict(target="q_action")), ("actions must have shape", dict(actions=np.arange(2)))]
    for match, kw in calls:
        o = kw.pop("o", obs)
        with pytest.raises(SaliencyInputError, match=match):
            explain(method, PARAMS, o, **kw)
    if stochastic(method):
        opts = {k: v for k, v in example(method).items() if k != "key"}
        with pytest.raises(SaliencyInputError, match="pass key"):
            jaxsal.explain(MODEL.apply, PARAMS, obs, method=COMBINED.get(method, method), **opts)


def check_all(method):
    """Every generic check, eagerly and under jax.jit."""
    check_shapes_batching_chunking_layout(method)
    check_shapes_batching_chunking_layout(method, jax.jit, eager=False)
    check_deterministic_vmap_and_scan(method)
    check_bad_input(method)


def agent():
    """The conformance CNN as a CLI agent (`--agent tests/_support/conformance.py:agent`)."""
    return MODEL.apply, PARAMS
