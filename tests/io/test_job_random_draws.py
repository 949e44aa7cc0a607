"""Per-state random draws (a noise tunnel's noise, a uniform path baseline) belong to a state's
position in the whole input, not in its chunk: a batch job's maps do not depend on --chunk and
equal one `jaxsal.explain` call on every frame with the job's key."""
import jax
import numpy as np
import pytest

import jaxsal
from jaxsal.io import MethodSpec, open_source, run_job
from tests._support.conformance import MODEL, PARAMS, _obs

N, SEED = 7, 3
METHODS = {
    "smoothgrad": ("smoothgrad", {"n_samples": 3}),
    "sg_gradcam": ("noise_tunnel(gradcam, n=2)", {}),
    "ig_uniform": ("integrated_gradients", {"steps": 3, "baseline": "uniform"}),
}


def _job(tmp_path, chunk, aliases):
    path = tmp_path / "in.npz"
    if not path.exists():
        np.savez(path, obs=np.asarray(_obs(N)))
    out = tmp_path / f"out{chunk}"
    run_job(MODEL.apply, PARAMS, open_source(path), out,
            [MethodSpec(a, *METHODS[a]) for a in aliases], quiet=True, chunk=chunk, seed=SEED)
    return {a: np.asarray(jaxsal.load_maps(out, a)) for a in aliases}


@pytest.mark.parametrize("alias", list(METHODS))
def test_job_maps_are_one_call_s_whatever_the_chunk(tmp_path, alias):
    method, options = METHODS[alias]
    method = jaxsal.noise_tunnel("gradcam", n=2) if alias == "sg_gradcam" else method  # the job's expression
    whole = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, _obs(N), method=method,
                                      key=jax.random.PRNGKey(SEED), **options))
    for chunk in (2, 3):
        np.testing.assert_allclose(_job(tmp_path, chunk, [alias])[alias], whole, rtol=2e-5, atol=1e-6)


def test_a_slice_with_its_first_index_is_the_slice_of_one_call():
    key, obs = jax.random.PRNGKey(0), _obs(N)
    whole = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, obs, method="smoothgrad", key=key, n_samples=3))
    part = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, obs[4:], method="smoothgrad", key=key, n_samples=3,
                                     first_index=4))
    np.testing.assert_allclose(part, whole[4:], rtol=2e-5, atol=1e-6)
    # without it the slice draws the noise of positions 0.. (what a chunked job used to do)
    plain = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, obs[4:], method="smoothgrad", key=key, n_samples=3))
    assert np.abs(plain - whole[4:]).max() > 0.05 * np.abs(whole).max()


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_first_index_must_be_a_non_negative_int(bad):
    with pytest.raises(jaxsal.SaliencyInputError, match="first_index must be an integer >= 0"):
        jaxsal.explain(MODEL.apply, PARAMS, _obs(2), method="smoothgrad", key=jax.random.PRNGKey(0),
                       n_samples=2, first_index=bad)
