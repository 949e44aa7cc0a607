"""A new method is one file plus one registration: tests/_support/own_methods.py adds a gradient method, a
perturbation method (both `jaxsal.engine.Spec`s), SmoothGrad of the first and a CAM variant with
`jaxsal.register`, with no edit to any jaxsal file. Each gets the generated conformance checks (tests/_support/conformance.py), runs
through `jaxsal.explain` (alone and in a method list), is listed with its options, reaches the CLI
through JAXSAL_METHODS, and `jaxsal.unregister` takes it out again with its compiled programs."""
import importlib
import os
import subprocess
import sys
from importlib.metadata import EntryPoint

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal import caching, plugins, registry
from jaxsal.backprop import cam
from jaxsal.backprop.cam import CamSpec
from jaxsal.backprop.layers import tap
from jaxsal.cli import main
from jaxsal.errors import SaliencyInputError
from tests._support import conformance as K
from tests._support import ROOT

MODULE = "tests._support.own_methods"


@pytest.fixture(scope="module")
def own():
    module = importlib.import_module(MODULE)
    yield module
    for name in module.NAMES:
        jaxsal.unregister(name)
    sys.modules.pop(MODULE, None)


@pytest.mark.parametrize("name", [  # the fast loop: the stochastic one and the perturbation one (2-6 s each)
    pytest.param("abs_gradient", marks=pytest.mark.slow), "smooth_abs_gradient", "patch_drop",
    pytest.param("max_gradcam", marks=pytest.mark.slow)])
def test_each_passes_the_generated_checks(own, name):
    assert name in K.cases()  # the registry gives its case: the example it declared
    assert K.stochastic(name) == (name == "smooth_abs_gradient")
    K.check_all(name)


def test_they_run_through_explain_as_the_shipped_methods_do(own):
    obs = K._obs()
    f = lambda **kw: jaxsal.explain(K.MODEL.apply, K.PARAMS, obs, **kw)  # noqa: E731
    grad = f(method="gradient", per_frame=True)
    K._close(f(method="abs_gradient"), jnp.abs(grad).sum(-1), "abs_gradient")  # shipped: matmul conv rule
    K._close(f(method="abs_gradient", per_frame=True), jnp.abs(grad), "abs_gradient per frame")
    # patch_drop is occlusion's "drop" score on a tiling grid, each patch's value on its pixels
    occ = f(method="occlusion", patch=4, stride=4, score="drop", upsample="nearest")
    np.testing.assert_allclose(f(method="patch_drop"), occ, rtol=1e-5, atol=1e-6)
    # max_gradcam by hand: the layer's A, dQ_a/dA at the greedy action, w_k = max_ij g, ReLU, resize
    x = jnp.asarray(obs, jnp.float32)
    tapped = tap(K.MODEL.apply, "conv2")
    y, A = tapped(K.PARAMS, x, 0.0)
    a = jnp.argmax(y, -1)
    g = jax.grad(lambda e: jnp.take_along_axis(tapped(K.PARAMS, x, e)[0], a[:, None], 1).sum())(jnp.zeros_like(A))
    ref = jax.image.resize(jax.nn.relu(jnp.einsum("nhwk,nk->nhw", A, g.max((1, 2)))), (K.N, K.H, K.W),
                           "bilinear", antialias=False)
    assert float(jnp.abs(ref).max()) > 0
    np.testing.assert_allclose(f(method="max_gradcam", layer="conv2"), ref, rtol=1e-4, atol=1e-6)
    # in a method list, with the shipped ones (the CAM variant shares gradcam's backward)
    many = f(method=["abs_gradient", "patch_drop", "max_gradcam", "gradcam"], layer="conv2")
    np.testing.assert_allclose(many["max_gradcam"], ref, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(many["patch_drop"], occ, rtol=1e-5, atol=1e-6)
    # and a combinator of the new gradient method
    sg = f(method=jaxsal.noise_tunnel("abs_gradient", n=2), key=jax.random.PRNGKey(0))
    assert sg.shape == (K.N, K.H, K.W) and bool(jnp.all(sg >= 0))


def test_they_are_listed_with_their_options(own, capsys):
    assert set(own.NAMES) <= set(jaxsal.methods()) and "max_gradcam" in jaxsal.cam_methods()
    with pytest.raises(SystemExit):
        main(["explain", "--help"])
    listed = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("methods: "))
    assert set(own.NAMES) <= set(listed.removeprefix("methods: ").split(", "))
    assert jaxsal.method_options("patch_drop") == {"patch": 4}
    assert "patch_drop: patch=4" in jaxsal.options_table()
    with pytest.raises(SaliencyInputError, match="patch must be a positive int dividing"):
        jaxsal.explain(K.MODEL.apply, K.PARAMS, K._obs(), method="patch_drop", patch=5)


def _cached(objects) -> int:
    """How many cache entries refer to `objects` (counted by dropping them from a copy)."""
    saved = [dict(c) for c in caching.caches()]
    try:
        return caching.forget(objects)
    finally:
        for c, entries in zip(caching.caches(), saved):
            c.clear()
            c.update(entries)


def test_unregister_removes_a_method_and_its_compiled_programs(own):
    def finalize(*args):  # a piece of its own (a spec's programs are keyed by its pieces, not its name)
        return 2.0 * own._patch_finalize(*args)
    spec = own.patch_drop.jaxsal_spec._replace(name="patch_drop_tmp", finalize=finalize)
    jaxsal.register(spec)
    jaxsal.register(CamSpec(own.max_weights, rule="guided"), name="max_gradcam_tmp")
    obs = K._obs()
    jaxsal.explain(K.MODEL.apply, K.PARAMS, obs, method="patch_drop")
    jaxsal.explain(K.MODEL.apply, K.PARAMS, obs, method="patch_drop_tmp", patch=8)
    jaxsal.explain(K.MODEL.apply, K.PARAMS, obs, method="max_gradcam_tmp", layer="conv2")
    row = cam.CAMS["max_gradcam_tmp"]
    assert _cached([finalize]) > 0 and _cached([row]) > 0  # their programs are cached
    jaxsal.unregister("patch_drop_tmp")
    jaxsal.unregister("max_gradcam_tmp")
    for name in ("patch_drop_tmp", "max_gradcam_tmp"):
        assert name not in registry.METHODS and name not in registry.SPECS and name not in cam.CAMS
        with pytest.raises(SaliencyInputError, match=f"unknown method '{name}'"):
            jaxsal.explain(K.MODEL.apply, K.PARAMS, obs, method=name)
    assert _cached([finalize]) == 0 and _cached([row]) == 0
    # what the methods still registered use stays: patch_drop's chunk, max_gradcam's weights and row
    assert _cached([own.patch_drop.jaxsal_spec.chunk]) > 0
    jaxsal.explain(K.MODEL.apply, K.PARAMS, obs, method="max_gradcam", layer="conv2")
    assert _cached([cam.CAMS["max_gradcam"]]) > 0


def test_a_taken_name_needs_replace_and_unregister_brings_the_shipped_one_back(own):
    obs = K._obs()
    shipped = jaxsal.explain(K.MODEL.apply, K.PARAMS, obs, method="xgradcam", layer="conv2")
    with pytest.raises(SaliencyInputError, match="'xgradcam' is already registered.*replace=True"):
        jaxsal.register(CamSpec(own.max_weights), name="xgradcam")
    with pytest.raises(SaliencyInputError, match="'gradient' is already registered"):
        jaxsal.register(own.abs_gradient.jaxsal_spec._replace(name="gradient"))
    jaxsal.register(CamSpec(own.max_weights), name="xgradcam", replace=True)
    mine = jaxsal.explain(K.MODEL.apply, K.PARAMS, obs, method="xgradcam", layer="conv2")
    np.testing.assert_allclose(mine, jaxsal.explain(K.MODEL.apply, K.PARAMS, obs, method="max_gradcam",
                                                    layer="conv2"), rtol=1e-6)
    jaxsal.unregister("xgradcam")
    assert cam.CAMS["xgradcam"].weights.__module__ == "jaxsal.backprop.xgradcam" and not registry.REPLACED
    np.testing.assert_allclose(jaxsal.explain(K.MODEL.apply, K.PARAMS, obs, method="xgradcam", layer="conv2"),
                               shipped, rtol=1e-6)
    with pytest.raises(SaliencyInputError, match="'xgradcam' ships with jaxsal"):
        jaxsal.unregister("xgradcam")
    with pytest.raises(SaliencyInputError, match="no method 'nosuch' is registered"):
        jaxsal.unregister("nosuch")
    with pytest.raises(SaliencyInputError, match="a CAM variant needs a name"):
        jaxsal.register(CamSpec(own.max_weights))
    with pytest.raises(SaliencyInputError, match="takes a jaxsal.engine.Spec"):
        jaxsal.register(42, name="not_a_method")


@pytest.mark.slow  # end to end, 3-10 s: the slow stage (CI runs it)
def test_the_cli_reaches_them_through_jaxsal_methods(tmp_path):
    np.save(tmp_path / "x.npy", np.asarray(K._obs(4)))
    env = {**os.environ, "JAXSAL_METHODS": str(ROOT / "tests" / "_support" / "own_methods.py"),
           "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "jaxsal.cli", "explain", "--agent", str(ROOT / "tests" / "_support" / "conformance.py") + ":agent",
           "--methods", "abs_gradient,patch_drop,max_gradcam", "--option", "max_gradcam.layer=conv2",
           "--option", "patch_drop.patch=8", "--input", str(tmp_path / "x.npy"), "--out", str(tmp_path / "out"),
           "--quiet"]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    want = jaxsal.explain(K.MODEL.apply, K.PARAMS, K._obs(4), method="occlusion", patch=8, stride=8, score="drop",
                          upsample="nearest")
    np.testing.assert_allclose(jaxsal.load_maps(tmp_path / "out", "patch_drop"), want, rtol=1e-5, atol=1e-6)
    for name in ("abs_gradient", "max_gradcam"):
        assert jaxsal.load_maps(tmp_path / "out", name).shape == (4, K.H, K.W)


def test_load_methods_takes_modules_files_and_entry_points(monkeypatch, tmp_path):
    monkeypatch.setattr(plugins, "entry_points", lambda group: [
        EntryPoint("probe", "tests._plugin_probe_missing", group)] if group == plugins.METHODS_GROUP else [])
    plugins.load_methods.cache_clear()
    with pytest.raises(plugins.MethodPluginError, match="entry point 'probe'.*cannot import 'tests._plugin_probe_missing'"):
        plugins.load_methods()
    monkeypatch.setattr(plugins, "entry_points", lambda group: [])
    bad = tmp_path / "broken.py"
    bad.write_text("raise RuntimeError('boom')\n")
    for value, match in [("no_such_plugin_module", "cannot import 'no_such_plugin_module'"),
                         (str(tmp_path / "missing.py"), "missing.py: no such file"),
                         (str(bad), "failed while imported: RuntimeError: boom")]:
        monkeypatch.setenv(plugins.METHODS_ENV_VAR, value)
        with pytest.raises(plugins.MethodPluginError, match=match):
            plugins.load_methods()
    good = tmp_path / "one_method.py"
    good.write_text("import jaxsal\n\n@jaxsal.register(example={})\ndef plugin_probe(apply_fn, params, obs):\n"
                    "    return jaxsal.explain(apply_fn, params, obs, method='gradient')\n")
    monkeypatch.setenv(plugins.METHODS_ENV_VAR, f" {good} ,json")
    try:
        assert plugins.load_methods() == (str(good), "json") and "plugin_probe" in jaxsal.methods()
        plugins.load_methods.cache_clear()
        assert plugins.load_methods() == (str(good), "json")  # imported once: no "already registered"
        assert jaxsal.explain(K.MODEL.apply, K.PARAMS, K._obs(), method="plugin_probe").shape == (K.N, K.H, K.W)
    finally:
        jaxsal.unregister("plugin_probe")
        plugins.load_methods.cache_clear()


def test_a_broken_plugin_is_one_line_from_the_cli(monkeypatch, capsys):
    monkeypatch.setenv(plugins.METHODS_ENV_VAR, "no_such_plugin_module")
    plugins.load_methods.cache_clear()
    try:
        assert main(["agents"]) == 2
    finally:
        plugins.load_methods.cache_clear()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "JAXSAL_METHODS item 'no_such_plugin_module'" in err, err
