"""Host (numpy) params go to the device once per call, not once per program of the call."""
import jax
import numpy as np

import jaxsal
from jaxsal.batching import on_device
from tests._support.conformance import KEY, MODEL, PARAMS, _obs


def test_numpy_leaves_become_device_arrays_and_device_trees_pass_through():
    host = jax.tree.map(np.asarray, PARAMS)
    moved = on_device(host)
    assert all(isinstance(v, jax.Array) for v in jax.tree.leaves(moved))
    assert jax.tree.structure(moved) == jax.tree.structure(host)
    assert all(np.array_equal(a, b) for a, b in zip(jax.tree.leaves(moved), jax.tree.leaves(host)))
    assert on_device(PARAMS) is PARAMS


def test_no_program_of_a_call_is_given_numpy_params(monkeypatch):
    """A jitted program given a numpy array copies it to the device on every call: the engine's
    programs (clean forward, per-chunk arrays, every group's step, finalize) get device params."""
    from jaxsal.engine import execute
    host = jax.tree.map(np.asarray, PARAMS)
    real, given = execute.caching.cached_jit, []

    def spy(*a, **k):
        fn = real(*a, **k)
        return lambda params, *rest: given.append({type(v) for v in jax.tree.leaves(params)}) or fn(params, *rest)

    monkeypatch.setattr(execute.caching, "cached_jit", spy)
    obs = _obs(3, seed=4)
    maps = jaxsal.explain(MODEL.apply, host, obs, method="rise", n_masks=40, grid=4, key=KEY, batch_size=8)
    assert len(given) > 3 and all(np.ndarray not in types for types in given)
    monkeypatch.setattr(execute.caching, "cached_jit", real)
    want = jaxsal.explain(MODEL.apply, PARAMS, obs, method="rise", n_masks=40, grid=4, key=KEY, batch_size=8)
    np.testing.assert_array_equal(np.asarray(maps), np.asarray(want))
