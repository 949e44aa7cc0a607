"""XGrad-CAM and Score-CAM (issue 30): each against a slow reference written from its definition
(numpy loops over states and channels, gradients by hand), against pytorch-grad-cam's own
XGradCAM / ScoreCAM classes on a torch copy of the Nature CNN (slow; skipped where
pytorch-grad-cam does not import), and in what every CAM shares: targets and fixed actions,
chunking, layouts, per_frame, bad layers, method lists. jit, vmap, lax.scan, batched ==
per-example, prefixes and NCHW == NHWC come from the conformance table (tests/test_conformance.py)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.errors import SaliencyInputError
from jaxsal.perturbation.scorecam import align_corners_matrix
from tests._support.gradient_models import ConvHead, bilinear_ref, cleanrl_agent, init, obs
from tests.backprop.test_cam import TimeDistConv, conv_out, frame_grads, manual_grads, model_case


# ---- slow references, from the definitions ----

def align_corners_ref(m, H, W):
    """Bilinear resize with aligned corners (torch's UpsamplingBilinear2d), pixel by pixel:
    output (i, j) samples the input at (i (h - 1) / (H - 1), j (w - 1) / (W - 1))."""
    h, w = m.shape
    out = np.zeros((H, W))
    for i in range(H):
        for j in range(W):
            y = i * (h - 1) / (H - 1) if H > 1 else 0.0
            x = j * (w - 1) / (W - 1) if W > 1 else 0.0
            y0, x0 = min(int(np.floor(y)), h - 1), min(int(np.floor(x)), w - 1)
            y1, x1 = min(y0 + 1, h - 1), min(x0 + 1, w - 1)
            dy, dx = y - y0, x - x0
            out[i, j] = ((1 - dy) * (1 - dx) * m[y0, x0] + (1 - dy) * dx * m[y0, x1]
                         + dy * (1 - dx) * m[y1, x0] + dy * dx * m[y1, x1])
    return out


def xgradcam_ref(A, g, H, W):
    """Fu et al.: w_k = sum_ij (A^k_ij / (sum_ab A^k_ab + 1e-7)) g^k_ij, one state and channel at
    a time; map = ReLU(sum_k w_k A^k), upsampled (half-pixel centres)."""
    maps = []
    for n in range(len(A)):
        K = A.shape[-1]
        w = np.zeros(K)
        for k in range(K):
            den = A[n, :, :, k].sum() + 1e-7
            w[k] = (A[n, :, :, k] / den * g[n, :, :, k]).sum() if den != 0 else 0.0
        cam = np.maximum(sum(w[k] * A[n, :, :, k] for k in range(K)), 0)
        maps.append(bilinear_ref(cam, H, W))
    return np.stack(maps)


def scorecam_ref(apply_fn, p, x, A, score):
    """Wang et al. as pytorch-grad-cam: per state n and channel k, M = A^k upsampled (aligned
    corners) and min-max normalised (eps 1e-8), s_k = score(n, model(x_n * M)); w = softmax(s);
    map = ReLU(sum_k w_k A^k), upsampled (half-pixel centres). One model call per (n, k)."""
    H, W = x.shape[1:3]
    maps = []
    for n in range(len(x)):
        K = A.shape[-1]
        s = np.zeros(K)
        for k in range(K):
            U = align_corners_ref(A[n, :, :, k], H, W)
            M = (U - U.min()) / (U.max() - U.min() + 1e-8)
            xk = np.asarray(x[n], np.float64) * M[:, :, None]            # every stacked frame
            s[k] = score(n, apply_fn(p, jnp.asarray(xk[None], jnp.float32)))
        w = np.exp(s - s.max()) / np.exp(s - s.max()).sum()
        cam = np.maximum(sum(w[k] * A[n, :, :, k] for k in range(K)), 0)
        maps.append(bilinear_ref(cam, H, W))
    return np.stack(maps)


def _close(got, want, rtol=1e-4):
    want = np.asarray(want)
    assert np.abs(want).max() > 0, "all-zero maps test nothing"
    np.testing.assert_allclose(np.asarray(got), want, rtol=rtol, atol=1e-5 * np.abs(want).max())


@pytest.fixture(scope="module")
def head():
    """ConvHead whose 'conv' gives (5, 4) maps of 4 channels on 11 x 9 frames: upsampling by
    non-integer, unequal factors."""
    return model_case(ConvHead(features=4, kernel=3, stride=2, hidden=6), (3, 11, 9, 2),
                      x_seed=3, p_seed=2)


# ---- XGrad-CAM ----

@pytest.mark.parametrize("activation", [None, "post_relu"])
def test_xgradcam_matches_the_definition(head, activation):
    m, p, x, a = head
    A, g = manual_grads(m, p, x, a, "plain")      # pre-activation A, dy_a/dA by hand
    if activation == "post_relu":
        A = np.maximum(A, 0)                      # g already carries 1[A > 0] (the net's ReLU)
    got = jaxsal.explain(m.apply, p, x, method="xgradcam", layer="conv", layer_activation=activation)
    assert got.shape == (3, 11, 9)
    _close(got, xgradcam_ref(A, g, 11, 9))
    # not Grad-CAM under another name
    assert not np.allclose(got, jaxsal.explain(m.apply, p, x, method="gradcam", layer="conv",
                                               layer_activation=activation))


def test_xgradcam_weights_follow_pytorch_grad_cam_at_a_zero_channel_sum():
    from jaxsal.backprop.xgradcam import xgradcam_weights
    A = np.zeros((1, 2, 2, 3), np.float32)
    A[0, :, :, 1] = [[1.0, 2.0], [3.0, 4.0]]
    A[0, :, :, 2] = [[-1e-7, 0.0], [0.0, 0.0]]    # sum + 1e-7 == 0: pytorch-grad-cam divides by 0
    g = np.ones_like(A)
    w = np.asarray(xgradcam_weights(jnp.asarray(A), jnp.asarray(g)))
    np.testing.assert_allclose(w[0], [0.0, 10.0 / (10.0 + 1e-7), 0.0], rtol=1e-6)
    assert np.isfinite(w).all()


def test_xgradcam_per_frame_on_a_time_distributed_trunk():
    m, p, x, a = model_case(TimeDistConv(frames=3), (4, 8, 8, 6), x_seed=5, p_seed=4)
    A, g = frame_grads(m, p, x, a, "plain")                  # (N, T, h, w, K)
    per = np.asarray(jaxsal.explain(m.apply, p, x, method="xgradcam", layer="conv", per_frame=True))
    assert per.shape == (4, 8, 8, 3)
    for j in range(3):
        _close(per[..., j], xgradcam_ref(A[:, j], g[:, j], 8, 8))
    assert not np.allclose(per[..., 0], per[..., 1])
    summed = jaxsal.explain(m.apply, p, x, method="xgradcam", layer="conv")
    np.testing.assert_allclose(summed, per.sum(-1), rtol=1e-5, atol=1e-7)


def test_xgradcam_shares_the_backward_of_the_cam_family():
    from tests.test_explain import _convolutions
    m = ConvHead(kernel=2, stride=2)
    x = obs((2, 8, 8, 2), seed=6)
    p = init(m, x.shape, seed=6)
    assert _convolutions(["gradcam", "gradcam_pp", "xgradcam"], m, p, x) == \
        _convolutions(["gradcam"], m, p, x)


# ---- Score-CAM ----

def _q_score(q, a):
    return lambda n, out: float(np.asarray(q(out))[0, a[n]])


@pytest.mark.parametrize("target, actions", [("q_chosen", None), ("q_action", [2, 0, 1]),
                                             ("softmax_chosen", None)])
def test_scorecam_matches_the_definition(head, target, actions):
    m, p, x, a_greedy = head
    a = a_greedy if actions is None else np.asarray(actions)
    A = conv_out(m, p, x)
    q = (lambda o: jax.nn.softmax(o, -1)) if target == "softmax_chosen" else (lambda o: o)
    got = jaxsal.explain(m.apply, p, x, method="scorecam", layer="conv", target=target,
                         actions=actions)
    assert got.shape == (3, 11, 9)
    _close(got, scorecam_ref(m.apply, p, x, A, _q_score(q, a)))


def test_scorecam_scores_the_action_of_the_clean_pass(head):
    """The action is fixed from the clean input; re-choosing it on each masked input differs."""
    m, p, x, a = head
    A = conv_out(m, p, x)
    got = jaxsal.explain(m.apply, p, x, method="scorecam", layer="conv")
    rechosen = scorecam_ref(m.apply, p, x, A, lambda n, out: float(np.asarray(out).max()))
    assert not np.allclose(got, rechosen, rtol=1e-3, atol=1e-6)


def test_scorecam_post_relu_masks_from_the_relu_output(head):
    m, p, x, a = head
    A = np.maximum(conv_out(m, p, x), 0)
    got = jaxsal.explain(m.apply, p, x, method="scorecam", layer="conv", layer_activation="post_relu")
    _close(got, scorecam_ref(m.apply, p, x, A, _q_score(lambda o: o, a)))


def test_align_corners_matrix_is_the_definition():
    for n, size in [(5, 11), (4, 9), (7, 84), (1, 6), (6, 6), (3, 1)]:
        m = np.random.default_rng(size).normal(size=(n, 4))
        got = align_corners_matrix(n, size) @ m @ align_corners_matrix(4, 9).T
        np.testing.assert_allclose(got, align_corners_ref(m, size, 9), rtol=1e-5, atol=1e-6)


def test_align_corners_matrix_is_torchs_upsampling_bilinear2d():
    torch = pytest.importorskip("torch")
    m = np.random.default_rng(0).normal(size=(2, 3, 7, 5)).astype(np.float32)
    want = torch.nn.UpsamplingBilinear2d(size=(84, 61))(torch.from_numpy(m)).numpy()
    got = np.einsum("Hh,nkhw,Ww->nkHW", align_corners_matrix(7, 84), m, align_corners_matrix(5, 61))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_scorecam_chunks_bound_the_model_rows_and_change_nothing(head):
    m, p, x, _ = head
    x5 = np.concatenate([x, x[:2] * 0.5])
    whole = jaxsal.explain(m.apply, p, x5, method="scorecam", layer="conv")
    rows = []

    def apply_fn(params, o):
        rows.append(o.shape[0])            # at trace time: the rows of every compiled call
        return m.apply(params, o)

    for bs in (3, 5, 1):
        rows.clear()
        got = jaxsal.explain(apply_fn, p, x5, method="scorecam", layer="conv", batch_size=bs)
        np.testing.assert_allclose(got, whole, rtol=1e-5, atol=1e-7, err_msg=f"batch_size={bs}")
        # 5 states x 4 channels = 20 masked inputs; the only larger trace is the layer lookup's
        # shape-only probe of 2 rows
        assert rows and max(rows) <= max(bs, 2), (bs, rows)


def test_scorecam_channel_first_model_and_other_targets():
    apply_fn, params = cleanrl_agent(shape=(1, 2, 16, 16))
    x = obs((3, 2, 16, 16), seed=4, lo=0, hi=255)                 # NCHW
    nhwc = lambda q, o: apply_fn(q, jnp.transpose(o, (0, 3, 1, 2)))  # noqa: E731
    maps = {}
    for target in ("value", "policy_logit"):
        got = jaxsal.explain(apply_fn, params, x, method="scorecam", layout="NCHW", target=target)
        assert got.shape == (3, 16, 16) and float(jnp.abs(got).max()) > 0
        same = jaxsal.explain(nhwc, params, np.transpose(x, (0, 2, 3, 1)), method="scorecam",
                              target=target, layer="Conv_2")        # Conv_2: the default layer
        np.testing.assert_allclose(got, same, rtol=1e-5, atol=1e-7 * float(jnp.abs(got).max()))
        maps[target] = np.asarray(got)
    assert not np.allclose(maps["value"], maps["policy_logit"])


def test_scorecam_is_deterministic(head):
    m, p, x, _ = head
    a = jaxsal.explain(m.apply, p, x, method="scorecam")
    b = jaxsal.explain(m.apply, p, x, method="scorecam", layer="conv")   # the default layer
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_scorecam_per_frame_is_refused_with_the_fix(head):
    m, p, x, _ = head
    with pytest.raises(SaliencyInputError, match="per_frame.*drop per_frame for scorecam"):
        jaxsal.explain(m.apply, p, x, method="scorecam", per_frame=True)
    td, tp, tx, _ = model_case(TimeDistConv(frames=3), (2, 8, 8, 6), x_seed=5, p_seed=4)
    with pytest.raises(SaliencyInputError, match="runs 3 times per state.*gradcam/xgradcam"):
        jaxsal.explain(td.apply, tp, tx, method="scorecam", layer="conv")


# ---- both ----

@pytest.mark.parametrize("method", ["xgradcam", "scorecam"])
@pytest.mark.parametrize("case, match", [
    (dict(layer="fc1"), "spatial"),                      # a Dense layer: no (h, w, K) maps
    (dict(layer="q"), "spatial"),
    (dict(layer="nope"), "unknown layer"),
    (dict(layer="conv", layer_activation="swishy"), "layer_activation"),
    (dict(target="q_action"), "needs actions"),
    (dict(batch_size=0), "batch_size"),
])
def test_bad_input_gives_one_clear_error(head, method, case, match):
    m, p, x, _ = head
    with pytest.raises(SaliencyInputError, match=match):
        jaxsal.explain(m.apply, p, x, method=method, **case)


def test_method_list_equals_single_calls(head):
    m, p, x, _ = head
    many = jaxsal.explain(m.apply, p, x, method=["gradcam", "xgradcam", "scorecam"], layer="conv")
    for name in many:
        one = np.asarray(jaxsal.explain(m.apply, p, x, method=name, layer="conv"))   # another program
        np.testing.assert_allclose(many[name], one, rtol=1e-5, atol=1e-5 * np.abs(one).max(), err_msg=name)


def test_listed_with_their_options():
    assert {"xgradcam", "scorecam"} <= set(jaxsal.methods())
    assert "xgradcam" in jaxsal.cam_methods() and "scorecam" not in jaxsal.cam_methods()
    assert jaxsal.method_options("xgradcam") == {"layer_activation": None, "fast_conv": True}
    assert jaxsal.method_options("scorecam") == {"layer_activation": None}
    table = jaxsal.options_table()
    assert "scorecam: layer_activation=None" in table and "xgradcam: layer_activation=None" in table


# ---- pytorch-grad-cam's own classes on the same weights (slow) ----
# `make test-slow` installs grad-cam without its dependencies: torchvision does not load beside the CPU
# torch, so the peer benchmark's stand-in takes its place at import (the CAM classes use none of it).

def _pytorch_grad_cam():
    torch = pytest.importorskip("torch")
    import importlib.util
    if importlib.util.find_spec("pytorch_grad_cam") is None:
        pytest.skip("pytorch-grad-cam is not installed: pip install 'jaxsal[bench]'")
    from experiments.benchmarks.peers import methods as P
    status = P.pytorch_grad_cam_status()  # with the benchmark's torchvision stand-in where torchvision does not load
    if status.startswith("does not import"):
        pytest.skip(f"pytorch_grad_cam {status}")
    import pytorch_grad_cam as pgc
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget
    return torch, pgc, ClassifierOutputTarget


@pytest.fixture(scope="module")
def nature():
    torch, pgc, target_cls = _pytorch_grad_cam()
    from experiments.benchmarks import against_peers as AP
    from experiments.benchmarks.peers.torch_nature import to_nchw
    torch.set_num_threads(1)
    apply_fn, params, tm = AP.build(num_actions=5, seed=1)
    x = np.random.default_rng(0).integers(0, 256, (3, 84, 84, 4), dtype=np.uint8)
    return torch, pgc, target_cls, apply_fn, params, tm, x, to_nchw(x)


def _minmax(m):
    """pytorch-grad-cam's scale_cam_image per map: (m - min) / (max - min + 1e-7)."""
    m = np.asarray(m, np.float64)
    lo = m.min(axis=(1, 2), keepdims=True)
    return (m - lo) / ((m - lo).max(axis=(1, 2), keepdims=True) + 1e-7)


@pytest.mark.slow
@pytest.mark.parametrize("method, cls", [("xgradcam", "XGradCAM"), ("scorecam", "ScoreCAM")])
def test_pytorch_grad_cam_agrees(nature, method, cls):
    """pytorch-grad-cam min-max scales its CAM and resizes it with cv2 (half-pixel centres, as
    jaxsal's upsample): ours scaled the same way must match, not just correlate."""
    torch, pgc, target_cls, apply_fn, params, tm, x, xt = nature
    ours = np.asarray(jaxsal.explain(apply_fn, params, x, method=method, layer="conv3"))
    with torch.no_grad():
        a = tm(xt).argmax(1)
    with getattr(pgc, cls)(model=tm, target_layers=[tm.conv3]) as cam:
        cam.batch_size = 64                            # ScoreCAM's masked forwards per call
        theirs = cam(input_tensor=xt.detach().requires_grad_(True),
                     targets=[target_cls(int(i)) for i in a])
    assert theirs.shape == ours.shape == (3, 84, 84)
    assert float(ours.max()) > 0
    np.testing.assert_allclose(theirs, _minmax(ours), atol=1e-4)
