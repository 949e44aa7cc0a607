"""The gradient and CAM methods give the maps recorded before the one-engine port
(tests/_support/engine_reference.py): the same to float rounding, case by case."""
import pytest

from tests._support import engine_reference as ref
from tests._support import reference


@pytest.fixture(scope="module")
def recorded():
    return reference.load(ref.PATH)


QUICK = {"list", "trunk_per_frame", "smoothgrad_groups", "ig_groups", "ig_per_state", "list_q_action"}
"""Cases of the fast loop (one per engine path); the rest (~40 CPU s) are slow tests."""


@pytest.mark.parametrize("name", [n if n in QUICK else pytest.param(n, marks=pytest.mark.slow)
                                  for n in sorted(ref.cases())])
def test_maps_equal_the_recorded_ones(name, recorded):
    reference.check(name, ref.cases()[name](), recorded)
