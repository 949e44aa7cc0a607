"""Models are probed through one helper, jaxsal.checks.output_shape: it works on a copied jitted
apply (jax.eval_shape of a copied PjitFunction raises AttributeError), is memoised and cleared
with the caches, and no module outside checks.py runs jax.eval_shape on a model itself."""
import ast
import copy
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxsal
from jaxsal import checks
from jaxsal.metrics.displacement import displacement_effects
from jaxsal.metrics.fidelity import insertion
from tests._support.conformance import MODEL, PARAMS, _obs

ROOT = Path(jaxsal.__file__).parent
ALLOWED = {
    "checks.py": "the one probe",
    "backprop/prefix.py": "traces the model with abstract params at batch 1 and 2 to split its affine prefix",
    "perturbation/_superpixel.py": "traces the model with abstract params under flax's interceptor to find its first conv",
}
COPIED = copy.copy(jax.jit(MODEL.apply))  # as a loader that copies a jitted apply (SBX) hands it over


def model_probes(text: str) -> list[int]:
    """Lines calling jax.eval_shape on an expression that reads the model (apply_fn or .apply)."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "eval_shape" \
                and node.args and any(getattr(n, "id", getattr(n, "attr", None)) in ("apply_fn", "apply")
                                      for n in ast.walk(node.args[0])):
            lines.append(node.lineno)
    return lines


def test_no_module_probes_the_model_outside_checks():
    found = [f"{p.relative_to(ROOT).as_posix()}:{line}" for p in sorted(ROOT.rglob("*.py"))
             if not any(p.relative_to(ROOT).as_posix().startswith(a) for a in ALLOWED)
             for line in model_probes(p.read_text())]
    assert not found, "probe the model with jaxsal.checks.output_shape:\n" + "\n".join(found)


@pytest.mark.parametrize("stray", ["jax.eval_shape(apply_fn, params, x[:1])",
                                   "jax.eval_shape(lambda p, o: T.q_of(apply_fn(p, o)), params, x[:1])"])
def test_the_scan_finds_a_stray_probe(stray):
    assert model_probes(f"def f(apply_fn, params, x):\n    return {stray}\n") != []
    assert model_probes("def f(fn, x):\n    return jax.eval_shape(fn, x)\n") == []


def test_output_shape_of_a_copied_jitted_apply():
    with pytest.raises(AttributeError):  # why the probe goes through a plain function
        jax.eval_shape(COPIED, PARAMS, jax.ShapeDtypeStruct((1,) + _obs(1).shape[1:], np.float32))
    got = checks.output_shape(COPIED, PARAMS, _obs(3).shape)
    assert got.shape == (1, np.asarray(MODEL.apply(PARAMS, _obs(1))).shape[-1])


def test_metrics_run_on_a_copied_jitted_apply():
    obs = np.asarray(_obs(2), np.float32)
    maps = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, obs, method="gradient"))
    want = insertion(MODEL.apply, PARAMS, obs, maps, pixels_per_step=64)
    got = insertion(COPIED, PARAMS, obs, maps, pixels_per_step=64)
    want_auc = np.asarray(want["auc"])
    np.testing.assert_allclose(np.asarray(got["auc"]), want_auc, rtol=1e-5, atol=1e-5 * np.abs(want_auc).max())
    d = displacement_effects(COPIED, PARAMS, obs, obs[:, ::-1], actions=np.array([0, 1]))
    np.testing.assert_array_equal(np.asarray(d.actions), [0, 1])


def test_output_shape_is_memoised_and_cleared(monkeypatch):
    jaxsal.clear_caches()
    calls = []
    real = checks._probe
    monkeypatch.setattr(checks, "_probe", lambda *a: calls.append(1) or real(*a))
    for _ in range(2):
        checks.output_shape(MODEL.apply, PARAMS, _obs(3).shape)
        checks.check_model(MODEL.apply, PARAMS, _obs(5).shape, layout="NHWC")  # the same probe
    assert len(calls) == 1
    jaxsal.clear_caches()
    checks.output_shape(MODEL.apply, PARAMS, _obs(3).shape)
    assert len(calls) == 2


def test_a_failing_model_is_one_clear_error():
    with pytest.raises(checks.ModelFails, match="failed on obs of shape"):
        checks.output_shape(lambda p, x: x.reshape(7, -1) @ np.ones((3, 3)), PARAMS, _obs(2).shape)
