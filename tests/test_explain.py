"""Front door for gradient/CAM methods: layouts, CleanRL models, targets, caching, bad input."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.backprop.single_backward import backward
from jaxsal.errors import SaliencyInputError
from jaxsal.registry import METHODS, SPECS
from tests._support.gradient_models import ConvHead, cleanrl_agent, init, obs

ALL = sorted(m for m, s in SPECS.items() if s.shared is backward and METHODS[m].__module__.startswith("jaxsal."))
"""The shipped single-backward methods (a new CAM variant joins by registering)."""


@pytest.fixture(scope="module")
def head():
    m = ConvHead(kernel=2, stride=2)
    x = obs((3, 8, 8, 2), seed=1, lo=0, hi=255)
    return m, init(m, x.shape, seed=3), x


def test_list_shares_work_and_equals_single_calls(head):
    m, p, x = head
    many = jaxsal.explain(m.apply, p, x, method=ALL + ["smoothgrad"], layer="conv",
                          key=jax.random.PRNGKey(0), n_samples=3)
    assert set(many) == set(ALL + ["smoothgrad"])
    for name in ALL:
        kw = {"layer": "conv"} if "cam" in name else {}
        one = np.asarray(jaxsal.explain(m.apply, p, x, method=name, **kw))
        # the list is another program: a pixel near 0 is compared to 1e-5 of the map's largest value
        np.testing.assert_allclose(many[name], one, rtol=1e-5, atol=1e-5 * np.abs(one).max(), err_msg=name)


def test_second_call_does_not_retrace(head):
    m, p, x = head
    traces = []

    def apply_fn(params, obs_):
        traces.append(1)
        return m.apply(params, obs_)

    for method in ("gradcam", "guided_backprop", "integrated_gradients"):
        jaxsal.explain(apply_fn, p, x, method=method, steps=4) if method == \
            "integrated_gradients" else jaxsal.explain(apply_fn, p, x, method=method)
        before = len(traces)
        jaxsal.explain(apply_fn, p, x + 1.0, method=method, steps=4) if method == \
            "integrated_gradients" else jaxsal.explain(apply_fn, p, x + 1.0, method=method)
        assert len(traces) == before, f"{method} re-traced on a second call with the same shapes"


def test_cached_shape_check_still_catches_bad_calls(head):
    """The output-shape check is memoised per function and shapes; bad calls must still fail."""
    m, p, x = head
    jaxsal.explain(m.apply, p, x, method="gradient")
    with pytest.raises(SaliencyInputError, match="target"):
        jaxsal.explain(m.apply, p, x, method="gradient", target=lambda out: out)  # not (N,)
    with pytest.raises(SaliencyInputError, match="failed on obs of shape"):
        jaxsal.explain(m.apply, p, x[:, :, :, :1], method="gradient")  # 1 channel, model wants 2
    bad = jax.tree.map(lambda a: a[..., :1] if a.ndim == 4 else a, p)  # same tree, other shapes
    with pytest.raises(SaliencyInputError, match="params belong to this apply_fn"):
        jaxsal.explain(m.apply, bad, x, method="gradient")


def test_chunking_equals_unchunked(head):
    m, p, x = head
    x5 = np.concatenate([x, x[:2] * 0.5])
    for method in ("gradcam", "gradient", "g2gradcam"):
        a = jaxsal.explain(m.apply, p, x5, method=method)
        b = np.asarray(jaxsal.explain(m.apply, p, x5, method=method, batch_size=2))
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5 * np.abs(b).max())


def test_cleanrl_channel_first_model():
    apply_fn, params = cleanrl_agent(shape=(1, 2, 16, 16))
    x = obs((3, 2, 16, 16), seed=4, lo=0, hi=255)            # NCHW
    cam = jaxsal.explain(apply_fn, params, x, method="gradcam", layout="NCHW",
                         target="policy_logit")
    assert cam.shape == (3, 16, 16)
    np.testing.assert_allclose(cam, jaxsal.gradcam(apply_fn, params, x, layout="NCHW",
                                                   layer="Conv_2", target="policy_logit"))
    g = jaxsal.guided_backprop(apply_fn, params, x, layout="NCHW", per_frame=True,
                               target="value")
    assert g.shape == (3, 16, 16, 2)                           # per-frame output is NHWC
    # the same model fed NHWC (transposed outside) gives the transposed gradient
    nhwc = lambda p, o: apply_fn(p, jnp.transpose(o, (0, 3, 1, 2)))  # noqa: E731
    g2 = jaxsal.guided_backprop(nhwc, params, np.transpose(x, (0, 2, 3, 1)), per_frame=True,
                                target="value")
    np.testing.assert_allclose(g, g2, rtol=1e-5, atol=1e-9)
    lp = jaxsal.explain(apply_fn, params, x, method="gradient", layout="NCHW", target="log_prob")
    assert lp.shape == (3, 16, 16)


def test_dueling_targets_and_callable():
    import flax.linen as nn

    class TinyDueling(nn.Module):
        @nn.compact
        def __call__(self, x):
            h = nn.relu(nn.Conv(3, (3, 3), (2, 2), name="conv1")(x)).reshape((x.shape[0], -1))
            a = nn.Dense(3, name="advantage")(h)
            v = nn.Dense(1, name="value")(h)[:, 0]
            return {"q": v[:, None] + a - a.mean(-1, keepdims=True), "value": v, "advantage": a}

    m = TinyDueling()
    x = obs((2, 8, 8, 2), lo=0, hi=255)
    p = m.init(jax.random.PRNGKey(0), x)
    out = {t: jaxsal.explain(m.apply, p, x, method="gradient", target=t)
           for t in ("q_chosen", "advantage", "value", "softmax_chosen")}
    assert not np.allclose(out["value"], out["q_chosen"])
    call = jaxsal.explain(m.apply, p, x, method="gradient", target=lambda o: o["value"])
    want = np.asarray(out["value"])     # a named and a callable target: two programs
    np.testing.assert_allclose(call, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


@pytest.mark.parametrize("case, match", [
    (dict(obs=np.zeros((8, 8, 2))), "shape"),
    (dict(obs=np.full((1, 8, 8, 2), np.nan, np.float32)), "NaN"),
    (dict(method="gradcamm"), "unknown method"),
    (dict(method="gradcam", layer="nope"), "unknown layer"),
    (dict(target="qq"), "unknown target"),
    (dict(target="q_action", actions=[0, 5, 1]), "out of range"),
    (dict(target="q_action"), "needs actions"),
    (dict(method="smoothgrad"), "stochastic"),
    (dict(obs=np.zeros((3, 2, 8, 8))), "layout"),               # channel-first into NHWC model
    (dict(layout="NWHC"), "layout"),
    (dict(batch_size=0), "batch_size"),
    (dict(method="integrated_gradients", steps=0), "steps"),
    (dict(method="smoothgrad", key=jax.random.PRNGKey(0), variant="sg3"), "variant"),
    (dict(method="gradient", n_samples=3), "no option"),
    (dict(method="gradient", layer="conv"), "does not take"),
    (dict(target=lambda o: o), r"\(N,\)"),
])
def test_bad_input_gives_one_clear_error(head, case, match):
    m, p, x = head
    kw = dict(obs=x, method="gradient")
    kw.update(case)
    obs_ = kw.pop("obs")
    with pytest.raises(SaliencyInputError, match=match):
        jaxsal.explain(m.apply, p, obs_, **kw)


def _convolutions(methods, m, p, x):
    """Convolutions in the compiled program of one call (under jit: the engine's one chunk program)."""
    def call(p, x):
        return jaxsal.explain(m.apply, p, x, method=methods, layer="conv" if any("cam" in k for k in methods)
                              else None, fast_conv=False)  # XLA's transposed convs, so the count shows the sharing
    return jax.jit(call).lower(p, jnp.asarray(x, jnp.float32)).compile().as_text().count(" convolution(")


def test_cam_family_and_guided_share_one_forward_and_backward():
    m = ConvHead(kernel=2, stride=2)
    x = obs((2, 8, 8, 2), seed=6)
    p = init(m, x.shape, seed=6)
    alone = _convolutions(["guided_backprop"], m, p, x)        # 1 forward + 1 backward conv
    family = _convolutions(["gradcam", "gradcam_pp", "g1gradcam", "g2gradcam", "guided_gradcam",
                            "guided_backprop"], m, p, x)
    assert alone == 2 and family == alone
