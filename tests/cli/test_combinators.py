"""Combined methods from the command line: SmoothGrad of Grad-CAM is a method registered by a
JAXSAL_METHODS file (`jaxsal.register(jaxsal.noise_tunnel("gradcam"), name=...)`), IG of Guided
Backprop is `integrated_gradients` with `rule=guided`; the job's maps equal the Python call's."""
import jax
import numpy as np
import pytest

import jaxsal
from jaxsal import plugins
from jaxsal.cli import main
from tests._support import ROOT
from tests._support.conformance import MODEL, PARAMS, _obs

PLUGIN = '''import jaxsal

jaxsal.register(jaxsal.noise_tunnel("gradcam", n=4, sigma=0.2), name="smooth_gradcam")
'''


@pytest.mark.slow  # end to end, 3-10 s: the slow stage (CI runs it)
def test_smoothgrad_of_gradcam_and_ig_of_guided_backprop_from_the_cli(tmp_path, monkeypatch):
    x = np.asarray(_obs(4))
    np.save(tmp_path / "x.npy", x)
    (tmp_path / "combined.py").write_text(PLUGIN)
    monkeypatch.setenv(plugins.METHODS_ENV_VAR, str(tmp_path / "combined.py"))
    plugins.load_methods.cache_clear()
    try:
        code = main(["explain", "--agent", f"{ROOT / 'tests' / '_support' / 'conformance.py'}:agent",
                     "--methods", "smooth_gradcam,ig_guided=integrated_gradients",
                     "--option", "smooth_gradcam.layer=conv2", "--option", "ig_guided.rule=guided",
                     "--option", "ig_guided.steps=4", "--input", str(tmp_path / "x.npy"), "--out",
                     str(tmp_path / "out"), "--seed", "3", "--quiet"])
        assert code == 0
        want = jaxsal.explain(MODEL.apply, PARAMS, x, method=jaxsal.noise_tunnel("gradcam", n=4, sigma=0.2),
                              layer="conv2", key=jax.random.PRNGKey(3))
        got = jaxsal.load_maps(tmp_path / "out", "smooth_gradcam")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))
        plain = jaxsal.explain(MODEL.apply, PARAMS, x, method="gradcam", layer="conv2")
        assert not np.allclose(got, plain, rtol=1e-3)  # the noise average, not Grad-CAM itself
        want = jaxsal.explain(MODEL.apply, PARAMS, x, method=jaxsal.path_integral("guided_backprop", steps=4))
        got = jaxsal.load_maps(tmp_path / "out", "ig_guided")
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))
        plain = jaxsal.explain(MODEL.apply, PARAMS, x, method="integrated_gradients", steps=4)
        assert not np.allclose(got, plain, rtol=1e-3)  # the guided rule reached the job
    finally:
        if "smooth_gradcam" in jaxsal.methods():
            jaxsal.unregister("smooth_gradcam")
        plugins.load_methods.cache_clear()


def test_method_expressions_in_methods(tmp_path, capsys):
    """--methods takes combinator calls (commas inside belong to the call): an aliased one takes
    --option ALIAS.NAME=VALUE, an unaliased one gets its canonical directory name; the stored maps
    equal the Python call with the job's key, PRNGKey(--seed)."""
    x = np.asarray(_obs(3))
    np.save(tmp_path / "x.npy", x)
    agent = f"{ROOT / 'tests' / '_support' / 'conformance.py'}:agent"
    out = tmp_path / "out"
    code = main(["explain", "--agent", agent, "--input", str(tmp_path / "x.npy"), "--out", str(out), "--seed", "5",
                 "--methods", "gradcam,sg=noise_tunnel(gradcam, n=2),path_integral(guided_backprop, steps=3)",
                 "--option", "sg.layer=conv2", "--quiet"])
    assert code == 0
    key = jax.random.PRNGKey(5)
    want = jaxsal.explain(MODEL.apply, PARAMS, x, method=jaxsal.noise_tunnel("gradcam", n=2), layer="conv2", key=key)
    got = jaxsal.load_maps(out, "sg")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))
    assert not np.allclose(got, jaxsal.load_maps(out, "gradcam"), rtol=1e-3)   # not Grad-CAM itself
    assert not np.allclose(got, jaxsal.explain(MODEL.apply, PARAMS, x, method=jaxsal.noise_tunnel("gradcam", n=2),
                                               layer="conv2", key=jax.random.PRNGKey(0)), rtol=1e-3)  # the seed's key
    np.testing.assert_allclose(jaxsal.load_maps(out, "gradcam"),
                               jaxsal.explain(MODEL.apply, PARAMS, x, method="gradcam"), rtol=1e-5, atol=1e-7)
    want = jaxsal.explain(MODEL.apply, PARAMS, x, method=jaxsal.path_integral("guided_backprop", steps=3))
    got = jaxsal.load_maps(out, "path_integral-guided_backprop-steps_3")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))
    methods = jaxsal.io.read_manifest(out)["config"]["methods"]
    assert methods["sg"] == {"method": "noise_tunnel(gradcam, n=2)", "options": {"layer": "conv2"}}
    assert methods["path_integral-guided_backprop-steps_3"]["method"] == "path_integral(guided_backprop, steps=3)"
    capsys.readouterr()
    for bad, option, words in (("gradcam,sg=noise_tunnel(gradcm, n=2)", "sg.layer=conv2", "unknown method 'gradcm'"),
                               ("sg=noise_tunnel(gradcam, n=0)", "sg.layer=conv2", "n must be an integer >= 1"),
                               ("sg=noise_tunnel(gradcam, n=2)", "sg.n_masks=2", "has no option 'n_masks'")):
        code = main(["explain", "--agent", agent, "--input", str(tmp_path / "x.npy"), "--out", str(tmp_path / "no"),
                     "--methods", bad, "--option", option, "--quiet"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and words in err[0], (bad, err)
        assert not (tmp_path / "no").exists()
