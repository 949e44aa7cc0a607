"""The gradient and CAM methods give the maps recorded before the one-engine port
(tests/_support/engine_reference.py): the same to float rounding, case by case."""
import numpy as np
import pytest

from tests._support import engine_reference as ref


@pytest.fixture(scope="module")
def recorded():
    with np.load(ref.PATH) as f:
        return dict(f)


QUICK = {"list", "trunk_per_frame", "smoothgrad_groups", "ig_groups", "ig_per_state", "list_q_action"}
"""Cases of the fast loop (one per engine path); the rest (~40 CPU s) are slow tests."""


@pytest.mark.parametrize("name", [n if n in QUICK else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(ref.cases())])
def test_maps_equal_the_recorded_ones(name, recorded):
    got = ref.flat(name, ref.cases()[name]())
    want = {k: v for k, v in recorded.items() if k == name or k.startswith(name + "/")}
    assert sorted(got) == sorted(want), name
    for k, w in want.items():
        assert np.abs(w).max() > 0, f"{k}: all-zero maps test nothing"
        np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-6 * float(np.abs(w).max()), err_msg=k)
