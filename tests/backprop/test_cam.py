"""CAM family against hand-derived numpy references (known-answer models)."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.errors import SaliencyInputError
from tests._support.gradient_models import ConvHead, LinearConv, bilinear_ref, init, obs


def conv_out(model, params, x):
    c = nn.Conv(model.features, (model.kernel,) * 2, (model.stride,) * 2, padding="VALID")
    return np.asarray(c.apply({"params": params["params"]["conv"]}, jnp.asarray(x)), np.float64)


def test_gradcam_known_answer_linear_head():
    """y_a = sum W[ijk, a] A_ijk + b, so g = W[:, a] and w_k = mean_ij W[ijk, a]."""
    m = LinearConv()
    x = obs((3, 8, 8, 2))
    p = init(m, x.shape)
    A = conv_out(m, p, x)                                     # (3, 4, 4, 3)
    W = np.asarray(p["params"]["q"]["kernel"]).reshape(4, 4, 3, -1)
    q = np.asarray(m.apply(p, x))
    got = np.asarray(jaxsal.gradcam(m.apply, p, x, layer="conv"))
    assert got.shape == (3, 8, 8)
    for n in range(3):
        a = q[n].argmax()
        w = W[..., a].mean(axis=(0, 1))                        # mean over (h, w), not (w, K)
        cam = np.maximum((A[n] * w).sum(-1), 0)
        np.testing.assert_allclose(got[n], bilinear_ref(cam, 8, 8), rtol=1e-4, atol=1e-6)


def head_grads(p, A, a, rule):
    """dy_a/dA for each state's conv output A[n] (pre-activation) through the ReLU -> fc1 ->
    ReLU -> q head, by hand ("guided": also zero negative backward signals)."""
    W1 = np.asarray(p["params"]["fc1"]["kernel"], np.float64)
    b1 = np.asarray(p["params"]["fc1"]["bias"], np.float64)
    W2 = np.asarray(p["params"]["q"]["kernel"], np.float64)
    gs = []
    for n in range(len(A)):
        z1 = np.maximum(A[n].ravel(), 0) @ W1 + b1
        r = W2[:, a[n]]
        r = (z1 > 0) * ((r > 0) if rule == "guided" else 1) * r
        rh = W1 @ r
        rh = (A[n].ravel() > 0) * ((rh > 0) if rule == "guided" else 1) * rh
        gs.append(rh.reshape(A[n].shape))
    return np.stack(gs)


def manual_grads(m, p, x, a, rule):
    """dy_a/dA at the conv output (pre-activation) through ConvHead's ReLUs, by hand."""
    A = conv_out(m, p, x)
    return A, head_grads(p, A, a, rule)


def model_case(m, shape, x_seed, p_seed):
    """(model, params, observations, greedy actions) of a small test model."""
    x = obs(shape, seed=x_seed)
    p = init(m, x.shape, seed=p_seed)
    return m, p, x, np.asarray(m.apply(p, x)).argmax(-1)


@pytest.fixture(scope="module")
def head():
    return model_case(ConvHead(kernel=2, stride=2, hidden=6), (4, 8, 8, 2), x_seed=3, p_seed=2)


def test_gradcam_nonlinear_head(head):
    m, p, x, a = head
    A, g = manual_grads(m, p, x, a, "plain")
    got = np.asarray(jaxsal.gradcam(m.apply, p, x, layer="conv"))
    for n in range(len(x)):
        cam = np.maximum((A[n] * g[n].mean(axis=(0, 1))).sum(-1), 0)
        np.testing.assert_allclose(got[n], bilinear_ref(cam, 8, 8), rtol=1e-4, atol=1e-6)


def test_gradcam_pp_reference(head):
    m, p, x, a = head
    A, g = manual_grads(m, p, x, a, "plain")
    got = np.asarray(jaxsal.gradcam_pp(m.apply, p, x, layer="conv"))
    for n in range(len(x)):
        g2, g3 = g[n] ** 2, g[n] ** 3
        denom = 2 * g2 + A[n].sum(axis=(0, 1)) * g3
        alpha = np.where(g[n] != 0, g2 / np.where(denom != 0, denom, 1), 0)
        w = (alpha * np.maximum(g[n], 0)).sum(axis=(0, 1))
        cam = np.maximum((A[n] * w).sum(-1), 0)
        np.testing.assert_allclose(got[n], bilinear_ref(cam, 8, 8), rtol=1e-4, atol=1e-6)


def guided_input(m, p, x, a):
    """Guided backprop to the input: guided layer gradient, then the (linear) conv transposed."""
    _, gg = manual_grads(m, p, x, a, "guided")
    conv = nn.Conv(m.features, (m.kernel,) * 2, (m.stride,) * 2, padding="VALID")
    cp = {"params": p["params"]["conv"]}
    _, vjp = jax.vjp(lambda xx: conv.apply(cp, xx), jnp.asarray(x))
    return np.asarray(vjp(jnp.asarray(gg, jnp.float32))[0], np.float64)


def test_g1_g2_guided_gradcam_reference(head):
    m, p, x, a = head
    A, g = manual_grads(m, p, x, a, "plain")
    _, gg = manual_grads(m, p, x, a, "guided")
    gb = guided_input(m, p, x, a)
    got = jaxsal.explain(m.apply, p, x, method=["g1gradcam", "g2gradcam", "guided_gradcam",
                                                 "guided_backprop"], layer="conv")
    np.testing.assert_allclose(got["guided_backprop"], gb.sum(-1), rtol=1e-4, atol=1e-6)
    # a state's map may be (nearly) all 0: atol is 1e-4 of the batch's largest value
    atol = {k: 1e-4 * np.abs(np.asarray(got[k])).max() for k in ("guided_gradcam", "g2gradcam")}
    for n in range(len(x)):
        g1 = bilinear_ref(np.maximum((A[n] * gg[n].mean(axis=(0, 1))).sum(-1), 0), 8, 8)
        g1 = g1 / g1.max() if g1.max() > 0 else g1
        np.testing.assert_allclose(got["g1gradcam"][n], g1, rtol=1e-4, atol=1e-6)
        gc = bilinear_ref(np.maximum((A[n] * g[n].mean(axis=(0, 1))).sum(-1), 0), 8, 8)
        np.testing.assert_allclose(got["guided_gradcam"][n],
                                   (gc[..., None] * np.maximum(gb[n], 0)).sum(-1),
                                   rtol=1e-4, atol=atol["guided_gradcam"])
        np.testing.assert_allclose(got["g2gradcam"][n],
                                   (g1[..., None] * np.maximum(gb[n], 0)).sum(-1),
                                   rtol=1e-4, atol=atol["g2gradcam"])
    per = jaxsal.guided_gradcam(m.apply, p, x, layer="conv", per_frame=True)
    assert per.shape == (4, 8, 8, 2)
    want = np.asarray(got["guided_gradcam"])     # summed in the program: another program
    np.testing.assert_allclose(per.sum(-1), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_layer_activation_relu(head):
    m, p, x, a = head
    A, g = manual_grads(m, p, x, a, "plain")
    got = np.asarray(jaxsal.gradcam(m.apply, p, x, layer="conv", layer_activation="relu"))
    for n in range(len(x)):
        # A is post-ReLU; g is dY/dA' where A > 0 and 0 elsewhere (g already carries 1[A > 0]).
        cam = np.maximum((np.maximum(A[n], 0) * g[n].mean(axis=(0, 1))).sum(-1), 0)
        np.testing.assert_allclose(got[n], bilinear_ref(cam, 8, 8), rtol=1e-4, atol=1e-6)


def test_nature_dqn_default_and_early_layers():
    from jaxsal_agents.networks import NatureDQN
    m = NatureDQN(4)
    x = obs((2, 84, 84, 4), lo=0, hi=255)
    p = m.init(jax.random.PRNGKey(0), x)
    default = jaxsal.explain(m.apply, p, x, method="gradcam")
    np.testing.assert_allclose(default, jaxsal.gradcam(m.apply, p, x, layer="conv3"))
    for layer in ("conv1", "conv2"):
        cam = jaxsal.gradcam(m.apply, p, x, layer=layer)
        assert cam.shape == (2, 84, 84) and bool(jnp.isfinite(cam).all())
        assert float(cam.max()) > 0


def test_per_frame_rejected_for_layer_resolution_maps(head):
    m, p, x, _ = head
    with pytest.raises(SaliencyInputError, match="per_frame"):
        jaxsal.explain(m.apply, p, x, method="gradcam", per_frame=True)


def test_cam_rejects_dense_layer_and_unknown_activation(head):
    m, p, x, _ = head
    with pytest.raises(SaliencyInputError, match="spatial"):
        jaxsal.gradcam(m.apply, p, x, layer="fc1")
    with pytest.raises(SaliencyInputError, match="layer_activation"):
        jaxsal.gradcam(m.apply, p, x, layer="conv", layer_activation="swishy")


# ---- time-distributed trunks: one shared conv run on the T frames of each state (Paper A) ----

class TimeDistConv(nn.Module):
    """(N, H, W, T*c) frame-major stacks -> shared 'conv' on N*T frames of c channels (rows
    n*T + t, or time-major t*N + n) -> ReLU -> 'fc1' -> ReLU -> 'q'."""
    frames: int = 3
    features: int = 3
    hidden: int = 6
    time_major: bool = False
    kernel: int = 2
    stride: int = 2

    @nn.compact
    def __call__(self, x):
        n, H, W, C = x.shape
        t, c = self.frames, C // self.frames
        f = jnp.moveaxis(x[..., :t * c].reshape(n, H, W, t, c), 3, 1)        # (N, T, H, W, c)
        f = jnp.swapaxes(f, 0, 1) if self.time_major else f
        a = nn.Conv(self.features, (2, 2), (2, 2), padding="VALID", name="conv")(
            f.reshape((n * t, H, W, c)))
        a = a.reshape((t, n) + a.shape[1:]).swapaxes(0, 1) if self.time_major else a
        h = nn.relu(a).reshape((n, -1))
        h = nn.relu(nn.Dense(self.hidden, name="fc1")(h))
        return nn.Dense(3, name="q")(h)


def frame_grads(m, p, x, a, rule):
    """Per (state, frame) activations A (N, T, h, w, K) and dy_a/dA, by hand, one frame at a time."""
    t = m.frames
    c = x.shape[-1] // t
    A = np.stack([np.stack([conv_out(m, p, x[n:n + 1, ..., j * c:(j + 1) * c])[0] for j in range(t)])
                  for n in range(len(x))])
    return A, head_grads(p, A, a, rule)


def frame_guided_input(m, p, x, gg):
    """Guided backprop to the input: each frame's guided layer gradient through the conv."""
    t, c = m.frames, x.shape[-1] // m.frames
    conv = nn.Conv(m.features, (2, 2), (2, 2), padding="VALID")
    cp = {"params": p["params"]["conv"]}
    out = np.zeros(x.shape)
    for n in range(len(x)):
        for j in range(t):
            _, vjp = jax.vjp(lambda xx: conv.apply(cp, xx), jnp.asarray(x[n:n + 1, ..., j * c:(j + 1) * c]))
            out[n, ..., j * c:(j + 1) * c] = np.asarray(vjp(jnp.asarray(gg[n, j:j + 1], jnp.float32))[0][0])
    return out


@pytest.fixture(scope="module")
def td():
    return model_case(TimeDistConv(frames=3), (4, 8, 8, 6), x_seed=5, p_seed=4)   # 3 frames x 2 ch


def test_time_distributed_gradcam_and_pp_per_frame_reference(td):
    m, p, x, a = td
    A, g = frame_grads(m, p, x, a, "plain")
    got = jaxsal.explain(m.apply, p, x, method=["gradcam", "gradcam_pp"], layer="conv", per_frame=True)
    summed = jaxsal.explain(m.apply, p, x, method=["gradcam", "gradcam_pp"], layer="conv")
    assert got["gradcam"].shape == (4, 8, 8, 3) and summed["gradcam"].shape == (4, 8, 8)
    for n in range(len(x)):
        for j in range(3):
            w = g[n, j].mean(axis=(0, 1))                  # this frame's gradient, mean over (h, w)
            cam = bilinear_ref(np.maximum((A[n, j] * w).sum(-1), 0), 8, 8)
            np.testing.assert_allclose(got["gradcam"][n, ..., j], cam, rtol=1e-4, atol=1e-6)
            g2, g3 = g[n, j] ** 2, g[n, j] ** 3
            denom = 2 * g2 + A[n, j].sum(axis=(0, 1)) * g3
            alpha = np.where(g[n, j] != 0, g2 / np.where(denom != 0, denom, 1), 0)
            wpp = (alpha * np.maximum(g[n, j], 0)).sum(axis=(0, 1))
            cam = bilinear_ref(np.maximum((A[n, j] * wpp).sum(-1), 0), 8, 8)
            np.testing.assert_allclose(got["gradcam_pp"][n, ..., j], cam, rtol=1e-4, atol=1e-6)
    for k in ("gradcam", "gradcam_pp"):
        np.testing.assert_allclose(summed[k], np.asarray(got[k]).sum(-1), rtol=1e-5, atol=1e-7)
    # the frames differ: a frame-independent map (one CAM broadcast to all frames) would fail here
    assert not np.allclose(got["gradcam"][..., 0], got["gradcam"][..., 1])


def test_time_distributed_g1_g2_guided_reference(td):
    m, p, x, a = td
    A, g = frame_grads(m, p, x, a, "plain")
    _, gg = frame_grads(m, p, x, a, "guided")
    gb = frame_guided_input(m, p, x, gg)
    meths = ["g1gradcam", "g2gradcam", "guided_gradcam", "guided_backprop"]
    got = jaxsal.explain(m.apply, p, x, method=meths, layer="conv", per_frame=True)
    summed = jaxsal.explain(m.apply, p, x, method=meths, layer="conv")
    np.testing.assert_allclose(got["guided_backprop"], gb, rtol=1e-4, atol=1e-6)
    assert got["g1gradcam"].shape == (4, 8, 8, 3) and got["g2gradcam"].shape == (4, 8, 8, 6)
    atol = {k: 1e-4 * np.abs(np.asarray(got[k])).max() for k in ("guided_gradcam", "g2gradcam")}
    for n in range(len(x)):
        g1 = np.stack([bilinear_ref(np.maximum((A[n, j] * gg[n, j].mean(axis=(0, 1))).sum(-1), 0), 8, 8)
                       for j in range(3)], -1)
        gc = np.stack([bilinear_ref(np.maximum((A[n, j] * g[n, j].mean(axis=(0, 1))).sum(-1), 0), 8, 8)
                       for j in range(3)], -1)
        assert g1.max() > 0
        # one scale for all frames of a state: the max over (H, W, T) becomes 1
        np.testing.assert_allclose(got["g1gradcam"][n], g1 / g1.max(), rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(summed["g1gradcam"][n], g1.sum(-1) / g1.sum(-1).max(),
                                   rtol=1e-4, atol=1e-6)
        # channel ch of the frame-major stack belongs to frame ch // 2
        np.testing.assert_allclose(got["g2gradcam"][n], np.repeat(g1 / g1.max(), 2, -1)
                                   * np.maximum(gb[n], 0), rtol=1e-4, atol=atol["g2gradcam"])
        np.testing.assert_allclose(got["guided_gradcam"][n], np.repeat(gc, 2, -1) * np.maximum(gb[n], 0),
                                   rtol=1e-4, atol=atol["guided_gradcam"])
    for k in ("g2gradcam", "guided_gradcam"):
        want = np.asarray(got[k]).sum(-1)
        np.testing.assert_allclose(summed[k], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_time_distributed_batched_equals_per_example(td):
    m, p, x, _ = td
    x5 = np.concatenate([x, x[:1] * 0.5])
    meths = ["gradcam", "gradcam_pp", "g1gradcam", "g2gradcam", "guided_gradcam"]
    for per_frame in (True, False):
        batched = jaxsal.explain(m.apply, p, x5, method=meths, layer="conv", per_frame=per_frame,
                                 batch_size=6)           # 6 conv rows = 2 states per chunk, padded
        for n in range(len(x5)):
            one = jaxsal.explain(m.apply, p, x5[n:n + 1], method=meths, layer="conv",
                                 per_frame=per_frame)
            for k in meths:
                np.testing.assert_allclose(batched[k][n:n + 1], one[k], rtol=1e-5, atol=1e-7)
    # the single-method entry points agree with the shared pass and pick the layer by default
    want = np.asarray(jaxsal.explain(m.apply, p, x5, method=["gradcam", "g1gradcam"], layer="conv",
                                     per_frame=True)["gradcam"])
    np.testing.assert_allclose(jaxsal.gradcam(m.apply, p, x5, per_frame=True), want, rtol=1e-6,
                               atol=1e-6 * np.abs(want).max())


def test_time_distributed_errors(td):
    m, p, x, _ = td
    tm = TimeDistConv(frames=3, time_major=True)
    with pytest.raises(SaliencyInputError, match="not state-major"):
        jaxsal.gradcam(tm.apply, init(tm, x.shape, seed=4), x, layer="conv")

    class FirstState(nn.Module):                         # a conv on state 0 only: (1, h, w, K) always
        @nn.compact
        def __call__(self, x):
            a = nn.Conv(2, (2, 2), (2, 2), name="conv")(x[:1])
            return nn.Dense(3, name="q")(x.reshape((x.shape[0], -1))) + a.sum()

    fs = FirstState()
    with pytest.raises(SaliencyInputError, match=r"layer 'conv' outputs shape \(1, 4, 4, 2\) for N = 1 "
                                                 r"states and \(1, 4, 4, 2\) for N = 2"):
        jaxsal.gradcam(fs.apply, init(fs, x.shape), x, layer="conv")
    x7 = obs((2, 8, 8, 7), seed=5)                       # 3 frames x 2 channels + 1 unused channel
    with pytest.raises(SaliencyInputError, match="not a multiple of 3"):
        jaxsal.g2gradcam(m.apply, p, x7, layer="conv")
    assert jaxsal.gradcam(m.apply, p, x7, layer="conv", per_frame=True).shape == (2, 8, 8, 3)


@pytest.mark.slow  # ~35 CPU s (its LSTMs); per-frame CAM on time-distributed trunks is checked above
def test_split_attention_agent_per_frame_cam():
    """Paper A's split-attention agent: its shared trunk runs on N*T frames; one map per frame
    (the frame-summed default on this agent is checked by tests/agents/test_snapshots.py's slow test)."""
    from jaxsal_agents.networks import SplitAttentionDQN
    from jaxsal.backprop.layers import resolve_layer
    m = SplitAttentionDQN(3, frames=4, lstm_features=8)
    x = obs((2, 84, 84, 4), seed=7, lo=0, hi=255)
    # random params of init's shapes (eager flax init of the LSTMs takes ~15 s on a busy CPU)
    rng = np.random.default_rng(0)
    p = jax.tree.map(lambda s: (rng.standard_normal(s.shape) / np.sqrt(np.prod(s.shape[:-1]))
                                if len(s.shape) > 1 else 0.01 * rng.standard_normal(s.shape)
                                ).astype(np.float32), jax.eval_shape(m.init, jax.random.PRNGKey(0), x[:1]))
    assert resolve_layer(m.apply, p, x[:1], None) == "conv3"       # default: the last conv
    meths = ["gradcam", "g1gradcam", "g2gradcam"]
    # Paper A tapped conv2 of this agent; batch_size=4 rows = chunks of one state (4 frames)
    pf = jaxsal.explain(m.apply, p, x, method=meths, layer="conv2", per_frame=True, batch_size=4)
    for k in meths:
        assert pf[k].shape == (2, 84, 84, 4) and bool(jnp.isfinite(pf[k]).all())
        assert np.all(np.asarray(pf[k]).max(axis=(1, 2, 3)) > 0)
    for k in ("g1gradcam", "g2gradcam"):                 # guided: every frame gets a map
        assert np.all(np.asarray(pf[k]).max(axis=(1, 2)) > 0)
    np.testing.assert_allclose(np.asarray(pf["g1gradcam"]).max(axis=(1, 2, 3)), 1.0, rtol=1e-6)
    one = jaxsal.explain(m.apply, p, x[1:2], method=meths, layer="conv2", per_frame=True)
    for k in meths:                                      # batched == per-example
        np.testing.assert_allclose(pf[k][1:2], one[k], rtol=1e-5, atol=1e-7)
