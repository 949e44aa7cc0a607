"""Fast by default: the strided-conv gradient rule on any traced function (exact against the
plain path, values and maps) and XLA:CPU's YNNPACK kernels turned on by `import jaxsal`."""
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

import jaxsal
from jaxsal.backprop.rules import count_convs, rewrite
from tests._support import ROOT


def _nature():
    from jaxsal_agents.networks import NatureDQN
    m = NatureDQN(6)
    p = m.init(jax.random.PRNGKey(0), np.zeros((1, 84, 84, 4), np.uint8))
    x = np.random.default_rng(0).integers(0, 256, (3, 84, 84, 4), dtype=np.uint8)
    return m.apply, p, x


def _torch_style(params, x):
    """A functional NCHW / OIHW model (as ported torch code): no flax modules at all."""
    h = lax.conv_general_dilated(x / 255.0, params["k1"], (4, 4), "VALID",
                                 dimension_numbers=("NCHW", "OIHW", "NCHW"))
    h = jax.nn.relu(h)
    h = lax.conv_general_dilated(h, params["k2"], (2, 2), ((1, 0), (0, 1)),
                                 dimension_numbers=("NCHW", "OIHW", "NCHW"))
    h = jax.nn.relu(h).reshape((x.shape[0], -1))
    return h @ params["w"]


def _torch_params():
    rng = np.random.default_rng(1)
    return {"k1": jnp.asarray(rng.normal(0, 0.1, (8, 4, 8, 8)), jnp.float32),
            "k2": jnp.asarray(rng.normal(0, 0.1, (6, 8, 4, 4)), jnp.float32),
            "w": jnp.asarray(rng.normal(0, 0.1, (6 * 3 * 3, 5)), jnp.float32)}


def _compiled_convs(f, *args):
    return len(re.findall(r"convolution\(", jax.jit(f).lower(*args).compile().as_text()))


def test_rule_equals_plain_gradient_for_flax_and_functional_nchw_models():
    from tests._support.conformance import MODEL, PARAMS, _obs
    small = np.random.default_rng(3).integers(0, 256, (2, 4, 36, 36)).astype(np.float32)
    cases = [(MODEL.apply, PARAMS, jnp.asarray(_obs(), jnp.float32), 1, False),
             (_torch_style, _torch_params(), jnp.asarray(small), 2, True)]
    for fn, p, xf, strided, full in cases:
        def f(v, pp):
            return fn(pp, v)[:, 1].sum()
        assert count_convs(f, xf, p) == strided  # the strided convs, wherever they sit
        want, got = jax.jit(jax.grad(f))(xf, p), jax.jit(jax.grad(rewrite(f)))(xf, p)
        assert float(jnp.abs(want).max()) > 0
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(jnp.abs(want).max()))
        if not full:
            continue
        np.testing.assert_array_equal(rewrite(f)(xf, p), f(xf, p))  # the same forward program
        # the kernels' gradients are XLA's own
        wk, gk = jax.grad(f, 1)(xf, p), jax.grad(rewrite(f), 1)(xf, p)
        for a, b in zip(jax.tree.leaves(wk), jax.tree.leaves(gk)):
            np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)
        # and XLA really runs fewer convolutions (the strided ones' transposes became matmuls)
        assert _compiled_convs(jax.grad(rewrite(f)), xf, p) < _compiled_convs(jax.grad(f), xf, p)


def test_rule_leaves_alone_what_it_cannot_do_exactly():
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(2, 12, 12, 3)), jnp.float32)
    k = jnp.asarray(rng.normal(size=(3, 3, 3, 4)), jnp.float32)
    dn = ("NHWC", "HWIO", "NHWC")
    stride1 = lambda v: lax.conv_general_dilated(v, k, (1, 1), "VALID", dimension_numbers=dn).sum()  # noqa: E731
    dilated = lambda v: lax.conv_general_dilated(v, k, (2, 2), "VALID", rhs_dilation=(2, 2),  # noqa: E731
                                                 dimension_numbers=dn).sum()
    grouped = lambda v: lax.conv_general_dilated(  # noqa: E731
        v, jnp.tile(k[:, :, :1, :1], (1, 1, 1, 3)), (2, 2), "VALID", feature_group_count=3,
        dimension_numbers=dn).sum()
    bf16 = lambda v: lax.conv_general_dilated(v.astype(jnp.bfloat16), k.astype(jnp.bfloat16),  # noqa: E731
                                              (2, 2), "VALID", dimension_numbers=dn).sum()
    inside_jit = jax.jit(lambda v: lax.conv_general_dilated(v, k, (2, 2), "SAME",
                                                            dimension_numbers=dn))
    for f, n in [(stride1, 0), (dilated, 0), (grouped, 0), (bf16, 0),
                 (lambda v: inside_jit(v).sum(), 1)]:
        assert count_convs(f, x) == n
        np.testing.assert_allclose(jax.grad(rewrite(f))(x), jax.grad(f)(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("method,kw", [  # one per rule and engine in the fast loop; the rest slow
    ("gradient", {}), ("guided_backprop", {}), pytest.param("grad_x_input", {}, marks=pytest.mark.slow),
    ("gradcam", {"layer": "conv1"}), pytest.param("g2gradcam", {}, marks=pytest.mark.slow),
    pytest.param("guided_gradcam", {}, marks=pytest.mark.slow),
    ("smoothgrad", {"n_samples": 3, "key": jax.random.PRNGKey(0)}),
    pytest.param("smoothgrad", {"n_samples": 3, "key": jax.random.PRNGKey(0), "rule": "guided"},
                 marks=pytest.mark.slow),
    pytest.param("integrated_gradients", {"steps": 3, "rule": "guided"}, marks=pytest.mark.slow),
])
def test_default_maps_equal_the_plain_path(method, kw):
    from tests._support.conformance import MODEL, PARAMS, _obs
    obs = _obs()
    plain = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, obs, method=method, fast_conv=False,
                                      **kw))
    fast = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, obs, method=method, **kw))
    assert np.abs(plain).max() > 0
    np.testing.assert_allclose(fast, plain, rtol=1e-4, atol=1e-5 * np.abs(plain).max())


def test_default_maps_equal_the_plain_path_on_the_nature_cnn():
    apply_fn, params, x = _nature()
    methods = ["gradient", "guided_backprop", "gradcam"]
    plain = jaxsal.explain(apply_fn, params, x, method=methods, layer="conv1", fast_conv=False)
    fast = jaxsal.explain(apply_fn, params, x, method=methods, layer="conv1")
    for m in methods:
        want = np.asarray(plain[m])
        assert np.abs(want).max() > 0
        np.testing.assert_allclose(fast[m], want, rtol=1e-4, atol=1e-5 * np.abs(want).max(),
                                   err_msg=m)


def test_default_maps_equal_the_plain_path_for_a_functional_nchw_model():
    p = _torch_params()
    x = np.random.default_rng(0).integers(0, 256, (2, 4, 36, 36), dtype=np.uint8)
    plain = jaxsal.explain(_torch_style, p, x, method=["gradient", "guided_backprop"],
                           layout="NCHW", fast_conv=False)
    fast = jaxsal.explain(_torch_style, p, x, method=["gradient", "guided_backprop"],
                          layout="NCHW")
    for m, want in plain.items():
        want = np.asarray(want)
        assert np.abs(want).max() > 0
        np.testing.assert_allclose(fast[m], want, rtol=1e-4, atol=1e-5 * np.abs(want).max())


def test_guided_smoothgrad_and_ig_differ_from_plain_and_match_guided_backprop():
    """rule="guided" is really guided: with sigma 0 SmoothGrad is guided backprop itself."""
    from tests._support.conformance import MODEL, PARAMS, _obs
    x = _obs()
    gb = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, x, method="guided_backprop"))
    sg = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, x, method="smoothgrad", n_samples=2,
                                   sigma=0.0, rule="guided", key=jax.random.PRNGKey(0)))
    np.testing.assert_allclose(sg, gb, rtol=1e-5, atol=1e-6 * np.abs(gb).max())
    ig_plain = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, x, method="integrated_gradients",
                                         steps=2))
    ig_guided = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, x, method="integrated_gradients",
                                          steps=2, rule="guided"))
    assert not np.allclose(ig_plain, ig_guided)
    with pytest.raises(jaxsal.SaliencyInputError, match="rule must be one of"):
        jaxsal.explain(MODEL.apply, PARAMS, x, method="smoothgrad", rule="gided",
                       key=jax.random.PRNGKey(0))


def _fresh(code, **env):
    e = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXSAL_FAST_CPU")}
    e.update(JAX_PLATFORMS="cpu", **env)
    r = subprocess.run([sys.executable, "-W", "always", "-c", code], env=e, cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


@pytest.mark.slow  # two fresh processes (~7.5 s): the slow stage, which CI runs
def test_import_turns_on_the_fast_kernels_unless_opted_out_or_too_late(monkeypatch):
    from jaxsal import cpu
    if not cpu.flag_supported():
        pytest.skip("this jaxlib does not accept the YNNPACK flag")
    show = "import os, jaxsal, jax.numpy as jnp; float(jnp.ones(2).sum()); print(os.environ.get('XLA_FLAGS', ''))"
    assert "ynn_fusion_type" in _fresh(show).stdout
    late = _fresh("import jax.numpy as jnp; float(jnp.ones(2).sum()); import os, jaxsal; "
                  "import jaxsal.cpu; jaxsal.cpu.auto(); print(os.environ.get('XLA_FLAGS', ''))")
    assert "ynn_fusion_type" not in late.stdout
    assert late.stderr.count("JAX started before `import jaxsal`") == 1  # one warning, not two
    # opted out: nothing set, nothing looked up, no warning (as `import jaxsal` runs it)
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    monkeypatch.setenv("JAXSAL_FAST_CPU", "0")
    monkeypatch.setattr(cpu, "backend_started", lambda: False)
    monkeypatch.setattr(cpu, "flag_supported", lambda *a, **k: pytest.fail("looked up although opted out"))
    assert cpu.auto() is False
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=1"
