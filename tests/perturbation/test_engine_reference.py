"""The perturbation methods and Score-CAM give the maps recorded before their port to the one
engine (tests/_support/perturbation_reference.py, `python -m tests._support.perturbation_reference` made
tests/data/perturbation_reference.npz): the same to float rounding, case by case, eagerly and
under the caller's jit."""
import jax
import pytest

import jaxsal
from tests._support import perturbation_reference as ref
from tests._support import reference


@pytest.fixture(scope="module")
def recorded():
    return reference.load(ref.PATH)


QUICK = {"occlusion", "occlusion_q_action", "noise_sensitivity", "sarfa_blurred", "rise_chunked",
         "lime_slic", "scorecam_conv1_chunked"}
"""Cases of the fast loop (one per method); the rest are slow tests."""


def check(name, got, recorded):
    # scores are differences of O(1) model outputs: 1e-7 absolute is their float32 rounding
    reference.check(name, got, recorded, atol=1e-7)


@pytest.mark.parametrize("name", [n if n in QUICK else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(ref.cases())])
def test_maps_equal_the_recorded_ones(name, recorded):
    check(name, ref.cases()[name](), recorded)


@pytest.mark.parametrize("name,method,opts", [
    ("occlusion_incremental", "occlusion", dict(incremental=True, batch_size=20)),
    ("sarfa_plain", "sarfa", dict(incremental=False, batch_size=16)),
    ("rise_chunked", "rise", dict(n_masks=40, grid=4, key=ref.KEY, batch_size=16, fill="grey", p_keep=0.3)),
    ("scorecam_conv1_chunked", "scorecam", dict(layer="conv1", batch_size=3)),
])
def test_maps_under_jit_equal_the_recorded_ones(name, method, opts, recorded):
    f, p = ref.MODEL.apply, ref.PARAMS
    got = jax.jit(lambda pp, xx: jaxsal.explain(f, pp, xx, method=method, **opts))(p, ref.obs())
    check(name, got, recorded)
