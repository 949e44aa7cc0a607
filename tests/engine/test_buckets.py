"""No recompilation across batch sizes: batches smaller than a chunk are padded to a few bucket
sizes, so after one call with N = 64 the calls with N = 63, 50 and 17 reuse its programs.
Counted on jaxsal's compiled functions (jit cache sizes), not timed."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal import caching
from tests._support.conformance import MODEL, PARAMS, H, W, C


def _compiled() -> int:
    return sum(f._cache_size() for f in caching._JIT_CACHE.values())


@pytest.mark.parametrize("method,kw", [
    ("gradient", {}),  # the CAM methods run the same family engine
    ("smoothgrad", {"n_samples": 4, "key": jax.random.PRNGKey(0)}),  # as IG: sample groups
    pytest.param("occlusion", {"patch": 4, "stride": 4}, marks=pytest.mark.slow),  # the perturbation engine (~9 CPU s)
])
def test_smaller_batches_reuse_the_compiled_programs(method, kw):
    obs = np.random.default_rng(0).integers(0, 256, (64, H, W, C), dtype=np.uint8)
    first = jaxsal.explain(MODEL.apply, PARAMS, obs, method=method, **kw)
    assert first.shape == (64, H, W)
    before = _compiled()
    for n in (63, 50, 17):
        out = jaxsal.explain(MODEL.apply, PARAMS, obs[:n], method=method, **kw)
        np.testing.assert_allclose(out, first[:n], rtol=1e-5, atol=1e-6 * float(jnp.abs(first).max()))
    assert _compiled() == before, f"{method} recompiled for a smaller batch"
