"""Conformance of every shipped method and the combinators, generated from the registry
(tests/_support/conformance.py): a method brings its case with it (`Spec.example`, or
`jaxsal.register(..., example=...)`), so a new method needs no edit here. Methods registered at
run time get the same checks (tests/test_own_methods.py).

For each method, through `chex.variants` (eager and under `jax.jit`): output shape, jit ==
eager, chunked (batch_size, lax.map when traced) == unchunked; eagerly batched == per-example
and NCHW == NHWC; then determinism under a fixed key, `jax.vmap` over a leading axis of batches
== a loop, the call inside `jax.lax.scan` == a loop; and clear errors on bad calls.
"""
import chex
import jax
import pytest
from absl.testing import parameterized

import jaxsal
from tests._support import conformance as K
from tests._support.conformance import COMBINED

CASES = K.cases(only_shipped=True)
METHODS = [(m, m) for m in CASES]
QUICK = {"gradient", "gradcam", "occlusion", "rise"}
"""One method per family (gradient, CAM, deterministic and stochastic perturbation) runs every
check in the fast loop; the others run the eager shape/batching/chunking/layout checks there, and
their jit, vmap and scan checks (a compile each, ~70 CPU s together) are `slow` tests. A fixed
choice of cost, not a list a new method joins."""


def test_cases_come_from_the_registry():
    """Every shipped method has a case, with the options it declares; a method registered now
    has one too (its example), and loses it when unregistered."""
    assert set(CASES) == {m for m in jaxsal.methods() if K.shipped(m)} | set(COMBINED)
    assert K.example("occlusion") == {"patch": 4, "stride": 4} and K.example("rise")["key"] is K.KEY
    jaxsal.register(lambda apply_fn, params, obs, *, scale=1.0: obs, name="conformance_probe",
                    example={"scale": 2.0})
    try:
        assert K.cases()["conformance_probe"] == {"scale": 2.0}
    finally:
        jaxsal.unregister("conformance_probe")
    assert "conformance_probe" not in K.cases()


class Conformance(chex.TestCase):

    @chex.variants(with_jit=True, without_jit=True)
    @parameterized.named_parameters(*METHODS)
    def test_shapes_batching_chunking_layout(self, method):
        K.check_shapes_batching_chunking_layout(method, self.variant, eager=not self.id().endswith("__with_jit"))

    @parameterized.named_parameters(*METHODS)
    def test_deterministic_vmap_and_scan(self, method):
        K.check_deterministic_vmap_and_scan(method)

    @parameterized.named_parameters(*METHODS)
    def test_bad_input(self, method):
        K.check_bad_input(method)


def _mark_slow_variants():
    """The generated test methods are named test_<check>_<method>[__with_jit|__without_jit]."""
    for base in ("test_shapes_batching_chunking_layout", "test_deterministic_vmap_and_scan"):
        for method in set(CASES) - QUICK:
            name = f"{base}_{method}" + ("__with_jit" if base == "test_shapes_batching_chunking_layout" else "")
            setattr(Conformance, name, pytest.mark.slow(getattr(Conformance, name)))


_mark_slow_variants()
