"""A new number of states in an eager call compiles no XLA program once the method has run at
another size in the same bucket: padding, slicing, casting, action choice and the glue after the
main program (reshapes, resizes, weighted sums) run on the host or inside the bucket-padded
chunks, never as one small device program per new N (each ~0.05-0.2 s of compile on CPU)."""
import numpy as np
import jax
import jax.numpy as jnp
import pytest
from jax._src import monitoring

import jaxsal
from tests._support.conformance import COMBINED, MODEL, PARAMS, _obs, cases

CASES = cases(only_shipped=True)

_COMPILES = []
monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: _COMPILES.append(event) if event.endswith("backend_compile_duration") else None)


def _compiles(method, obs):
    _COMPILES.clear()
    np.asarray(jaxsal.explain(MODEL.apply, PARAMS, obs, method=COMBINED.get(method, method), **CASES[method]))
    return len(_COMPILES)


@pytest.mark.parametrize("kind", ["numpy", "jax"])
@pytest.mark.parametrize("method", sorted(CASES))
def test_a_new_number_of_states_compiles_nothing(method, kind):
    as_input = (lambda o: np.asarray(o)) if kind == "numpy" else (lambda o: o)
    warm, new = as_input(_obs(16, seed=1)), as_input(_obs(11, seed=2))  # both in the 16-state bucket
    jax.block_until_ready(new)
    _compiles(method, warm)
    assert _compiles(method, warm) == 0, "a repeat compiled: the listener or the cache is broken"
    assert _compiles(method, new) == 0, f"{method}: N=11 after N=16 compiled {len(_COMPILES)} program(s)"
