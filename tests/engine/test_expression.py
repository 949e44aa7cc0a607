"""Method expressions (jaxsal.engine.expression): the text of a method for --methods and sweep
configs is read with `ast`, never evaluated; a combinator call gives the combinator's own spec (the
same maps as the Python call), one canonical text and a directory name; anything else is refused
in one message naming the forms that are accepted."""
import re

import jax
import numpy as np
import pytest

import jaxsal
from jaxsal.engine import expression as E
from jaxsal.engine.spec import Spec
from jaxsal.errors import SaliencyInputError
from tests._support.conformance import MODEL, PARAMS, _obs


@pytest.mark.parametrize("text,canonical,alias", [
    ("gradcam", "gradcam", "gradcam"),
    ("  occlusion ", "occlusion", "occlusion"),
    ("noise_tunnel(gradcam, n=16)", "noise_tunnel(gradcam, n=16)", "noise_tunnel-gradcam-n_16"),
    ("noise_tunnel( 'gradcam',variant=\"vargrad\",n=16 )", "noise_tunnel(gradcam, n=16, variant=vargrad)",
     "noise_tunnel-gradcam-n_16-variant_vargrad"),
    ("noise_tunnel(gradient, sigma=0.25)", "noise_tunnel(gradient, sigma=0.25)", "noise_tunnel-gradient-sigma_0p25"),
    ("path_integral(guided_backprop, baseline=blur, steps=32)", "path_integral(guided_backprop, steps=32, baseline=blur)",
     "path_integral-guided_backprop-steps_32-baseline_blur"),
    # a keyword at its default is the expression without it: one text, one directory, one manifest entry
    ("noise_tunnel(gradcam, n=50, sigma=0.15, variant='mean')", "noise_tunnel(gradcam)", "noise_tunnel-gradcam"),
    ("path_integral(gradient, steps=32, baseline='black')", "path_integral(gradient, steps=32)",
     "path_integral-gradient-steps_32"),
    ("noise_tunnel(gradcam, n=50.0)", "noise_tunnel(gradcam, n=50.0)", "noise_tunnel-gradcam-n_50p0"),  # not the int
])
def test_canonical_text_and_alias(text, canonical, alias):
    assert E.canonical(text) == canonical
    assert E.canonical(canonical) == canonical            # reading the canonical text gives it again
    assert E.alias(text) == alias
    assert re.fullmatch(r"[A-Za-z0-9_-]+", alias)          # a directory name check_specs accepts


def test_a_name_is_itself_and_a_call_is_the_combinators_spec():
    assert E.parse("gradcam") == "gradcam"
    spec = E.parse("noise_tunnel(gradcam, variant=vargrad, n=2)")
    assert isinstance(spec, Spec) and spec.name == "noise_tunnel(gradcam, n=2, variant=vargrad)"
    assert spec.options["n_samples"] == 2 and spec.options["variant"] == "vargrad"
    assert E.parse("path_integral(guided_backprop, steps=3)").options["steps"] == 3


def test_the_spec_gives_the_python_calls_maps():
    x, key = _obs(2), jax.random.PRNGKey(1)
    got = jaxsal.explain(MODEL.apply, PARAMS, x, method=E.parse("noise_tunnel(gradcam, n=2, variant=vargrad)"),
                         key=key)
    want = jaxsal.explain(MODEL.apply, PARAMS, x, method=jaxsal.noise_tunnel("gradcam", n=2, variant="vargrad"),
                          key=key)
    np.testing.assert_array_equal(got, want)
    mean = jaxsal.explain(MODEL.apply, PARAMS, x, method=jaxsal.noise_tunnel("gradcam", n=2), key=key)
    assert not np.allclose(got, mean)                      # the variant reached the spec
    got = jaxsal.explain(MODEL.apply, PARAMS, x, method=E.parse("path_integral(guided_backprop, steps=3)"))
    want = jaxsal.explain(MODEL.apply, PARAMS, x, method=jaxsal.path_integral("guided_backprop", steps=3))
    np.testing.assert_array_equal(got, want)


def test_function_takes_names_expressions_and_specs():
    assert E.function("gradcam") is jaxsal.METHODS["gradcam"]
    fn = E.function("noise_tunnel(gradcam, n=3)")
    assert fn.jaxsal_spec.options["n_samples"] == 3 and "key" in fn.__signature__.parameters
    spec = jaxsal.path_integral("gradient", steps=2)
    assert E.function(spec).jaxsal_spec is spec


@pytest.mark.parametrize("text,words", [
    ("gradcm", ["unknown method 'gradcm'", "did you mean 'gradcam'", "noise_tunnel(gradcam, n=16)"]),
    ("noise_tunnel(gradcm)", ["unknown method 'gradcm'", "available: "]),
    ("noise_tunel(gradcam)", ["'noise_tunel' is not a combinator", "noise_tunnel, path_integral"]),
    ("noise_tunnel(gradcam, 16)", ["takes one method, then keywords", "noise_tunnel(METHOD, n=, sigma=, variant=)"]),
    ("noise_tunnel()", ["takes one method"]),
    ("noise_tunnel(gradcam, n_samples=4)", ["has no argument 'n_samples'", "it takes n, sigma, variant", "--option"]),
    ("noise_tunnel(gradcam, name='x')", ["has no argument 'name'"]),
    ("noise_tunnel(gradcam, n=[4])", ["'[4]' is no number, string or True/False"]),
    ("noise_tunnel(gradcam, n=2 + 2)", ["'2 + 2' is no number"]),
    ("os.system('true')", ["neither a method name nor a combinator call", "write a method name"]),
    ("__import__('os')", ["'__import__' is not a combinator"]),
    ("noise_tunnel(gradcam, n=4", ["not an expression"]),
    ("gradcam + gradient", ["neither a method name nor a combinator call"]),
    ("", ["non-empty string"]),
    # the combinators' own checks, with the expression named
    ("noise_tunnel(gradcam, n=0)", ["method 'noise_tunnel(gradcam, n=0)'", "n must be an integer >= 1"]),
    ("noise_tunnel(gradcam, variant=loud)", ["variant must be one of"]),
    ("path_integral(gradient, baseline=blck)", ["baseline must be one of"]),
    ("noise_tunnel(occlusion, n=2)", ["noise_tunnel takes a gradient or CAM method", "'occlusion'"]),
    ("noise_tunnel(path_integral(gradient, steps=8), n=4)",
     ["noise_tunnel takes a gradient or CAM method, not the combined method 'path_integral(gradient, steps=8)'"]),
])
def test_refusals_name_the_fix(text, words):
    with pytest.raises(SaliencyInputError) as e:
        E.parse(text)
    for w in words:
        assert w in str(e.value), (w, str(e.value))


def test_nothing_is_evaluated(tmp_path):
    marker = tmp_path / "ran"
    with pytest.raises(SaliencyInputError):
        E.parse(f"noise_tunnel(gradcam, n=__import__('pathlib').Path({str(marker)!r}).touch())")
    assert not marker.exists()


def test_split_keeps_a_calls_commas():
    assert E.split("gradcam,sg=noise_tunnel(gradcam, n=2, variant=vargrad), occlusion") == [
        "gradcam", "sg=noise_tunnel(gradcam, n=2, variant=vargrad)", " occlusion"]
    assert E.split("noise_tunnel(path_integral(gradient, steps=2), n=2),x") == [
        "noise_tunnel(path_integral(gradient, steps=2), n=2)", "x"]


def test_split_keeps_a_quoted_strings_commas():
    assert E.split("a=noise_tunnel(gradcam, variant='x,y'), b") == ["a=noise_tunnel(gradcam, variant='x,y')", " b"]
    assert E.split('noise_tunnel(gradcam, variant="x,(y"),occlusion') == ['noise_tunnel(gradcam, variant="x,(y")',
                                                                          "occlusion"]
    assert E.split(r"noise_tunnel(gradcam, variant='x\',y'), z") == [r"noise_tunnel(gradcam, variant='x\',y')", " z"]
