"""The tables of docs/guides/from-captum.md: every jaxsal call in them runs and names registered methods
(fast, on a tiny model), and every row computes what its Captum or pytorch-grad-cam call computes on
the same weights (slow; skipped where the bench extra's torch, captum and grad-cam are missing)."""
import importlib.util
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from tests._support import ROOT

PAGE = ROOT / "docs" / "guides" / "from-captum.md"


def table_rows() -> dict[str, tuple[str, str | None]]:
    """{peer call: (section, jaxsal call or None)} from the page's Captum and pytorch-grad-cam tables."""
    rows, section = {}, None
    for line in PAGE.read_text().splitlines():
        if line.startswith("## "):
            section = line[3:].strip()
        if section not in ("Captum", "pytorch-grad-cam") or not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip("|").split(" | ")]
        peer = cells[0].strip("`")
        ours = cells[1].strip("`") if cells[1].startswith("`") else None
        rows[peer] = (section, ours)
    return rows


ROWS = table_rows()


class Tiny(nn.Module):
    """A Nature-CNN-shaped Q-network with few channels: conv1, conv2, conv3, q, as the page's model."""

    @nn.compact
    def __call__(self, x):
        x = x.astype(jnp.float32) / 255.0
        x = nn.relu(nn.Conv(4, (8, 8), (4, 4), padding="VALID", name="conv1")(x))
        x = nn.relu(nn.Conv(4, (4, 4), (2, 2), padding="VALID", name="conv2")(x))
        x = nn.relu(nn.Conv(4, (3, 3), (1, 1), padding="VALID", name="conv3")(x))
        return nn.Dense(3, name="q")(x.reshape(x.shape[0], -1))


def squares(n: int, size: int = 12, hw: int = 84) -> np.ndarray:
    """(n, hw, hw) labels of the size x size squares tiling the frame."""
    i = np.arange(hw) // size
    return np.broadcast_to(i[:, None] * (hw // size) + i[None, :], (n, hw, hw)).astype(np.int32)


def namespace(apply_fn, params, obs, actions) -> dict:
    return {"jaxsal": jaxsal, "jnp": jnp, "apply_fn": apply_fn, "params": params, "obs": obs,
            "a": actions, "key": jax.random.PRNGKey(0), "segments": squares(len(obs))}


def frames(n: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 84, 84, 4), dtype=np.uint8)


def test_the_tables_are_read():
    assert len(ROWS) >= 20
    assert ROWS["Saliency(model).attribute(x, target=a, abs=False).sum(1)"][1].startswith("jaxsal.explain(")
    assert ROWS["KernelShap"] == ("Captum", None) and ROWS["GradCAM"][0] == "pytorch-grad-cam"


@pytest.mark.parametrize("peer", [p for p, (_, ours) in ROWS.items() if ours])
def test_every_jaxsal_call_in_the_tables_runs_with_registered_methods(peer):
    ours = ROWS[peer][1]
    names = re.findall(r'method="(\w+)"', ours) + re.findall(r"jaxsal\.(\w+)\(", ours)
    names = [n for n in names if n not in ("explain", "gausslegendre")]
    assert names and all(n in jaxsal.METHODS for n in names), (peer, names)
    model = Tiny()
    obs = frames(2)
    params = model.init(jax.random.PRNGKey(1), obs)
    out = eval(ours, namespace(model.apply, params, obs, np.array([0, 2])))
    expect = ((84, 84, 4) if "obs[:1]" in ours else (2, 84, 84, 4) if "per_frame=True" in ours
              else (2, 7, 7) if "return_grid=True" in ours else (2, 84, 84))
    assert np.asarray(out).shape == expect, (peer, np.asarray(out).shape)
    assert np.isfinite(np.asarray(out)).all()


# ---- against the peers (slow) ----

def _pytorch_grad_cam():
    """pytorch_grad_cam, imported as the peer benchmark imports it (with its torchvision stand-in where
    torchvision does not load: its CAM classes use none of it)."""
    if importlib.util.find_spec("pytorch_grad_cam") is None:
        pytest.skip("pytorch-grad-cam is not installed: pip install 'jaxsal[bench]'")
    from experiments.benchmarks.peers import methods as P
    status = P.pytorch_grad_cam_status()
    if status.startswith("does not import"):
        pytest.skip(f"pytorch-grad-cam {status}")
    import pytorch_grad_cam
    from pytorch_grad_cam.utils import model_targets
    return pytorch_grad_cam, model_targets


def _minmax(m):
    m = np.asarray(m, np.float64)
    lo, hi = m.min(axis=(1, 2), keepdims=True), m.max(axis=(1, 2), keepdims=True)
    return (m - lo) / (hi - lo + 1e-7)


def _correlation(u, v) -> float:
    from experiments.benchmarks.against_peers import correlation
    return correlation(u, v)


def captum_peers(torch, model, x, a):
    """{row's peer call: that call's output as NumPy}, exactly as the table writes it."""
    from captum.attr import (Deconvolution, FeatureAblation, GuidedBackprop, GuidedGradCam, InputXGradient,
                             IntegratedGradients, LayerAttribution, LayerGradCam, Lime, NoiseTunnel, Occlusion,
                             Saliency)
    squares_t = torch.from_numpy(squares(1)[:, None].astype(np.int64))
    segments_t = squares_t
    torch.manual_seed(0)
    calls = {
        "Saliency(model).attribute(x, target=a, abs=False).sum(1)":
            lambda: Saliency(model).attribute(x, target=a, abs=False).sum(1),
        "Saliency(model).attribute(x, target=a)":
            lambda: Saliency(model).attribute(x, target=a).permute(0, 2, 3, 1),
        "InputXGradient(model).attribute(x, target=a).sum(1)":
            lambda: InputXGradient(model).attribute(x, target=a).sum(1),
        "GuidedBackprop(model).attribute(x, target=a).sum(1)":
            lambda: GuidedBackprop(model).attribute(x, target=a).sum(1),
        "Deconvolution(model).attribute(x, target=a).sum(1)":
            lambda: Deconvolution(model).attribute(x, target=a).sum(1),
        'IntegratedGradients(model).attribute(x, target=a, n_steps=32, method="riemann_right").sum(1)':
            lambda: IntegratedGradients(model).attribute(x, target=a, n_steps=32, method="riemann_right").sum(1),
        "IntegratedGradients(model).attribute(x, target=a).sum(1)":
            lambda: IntegratedGradients(model).attribute(x, target=a).sum(1),
        'NoiseTunnel(Saliency(model)).attribute(x, target=a, nt_type="smoothgrad", nt_samples=64, '
        'stdevs=0.15 * 255, abs=False).sum(1)':
            lambda: NoiseTunnel(Saliency(model)).attribute(x, target=a, nt_type="smoothgrad", nt_samples=64,
                                                           stdevs=0.15 * 255, abs=False).sum(1),
        'NoiseTunnel(Saliency(model)).attribute(x, target=a, nt_type="smoothgrad_sq", nt_samples=64, '
        'stdevs=0.15 * 255, abs=False).sum(1)':
            lambda: NoiseTunnel(Saliency(model)).attribute(x, target=a, nt_type="smoothgrad_sq", nt_samples=64,
                                                           stdevs=0.15 * 255, abs=False).sum(1),
        'LayerAttribution.interpolate(LayerGradCam(model, model.conv3).attribute(x, target=a, '
        'relu_attributions=True), (84, 84), "bilinear")[:, 0]':
            lambda: LayerAttribution.interpolate(LayerGradCam(model, model.conv3).attribute(
                x, target=a, relu_attributions=True), (84, 84), "bilinear")[:, 0],
        'GuidedGradCam(model, model.conv3).attribute(x, target=a, interpolate_mode="bilinear").clamp(min=0).sum(1)':
            lambda: GuidedGradCam(model, model.conv3).attribute(
                x, target=a, interpolate_mode="bilinear").clamp(min=0).sum(1),
        "Occlusion(model).attribute(x, sliding_window_shapes=(4, 12, 12), strides=(4, 12, 12), baselines=0, "
        "target=a)[:, 0, ::12, ::12]":
            lambda: Occlusion(model).attribute(x, sliding_window_shapes=(4, 12, 12), strides=(4, 12, 12),
                                               baselines=0, target=a)[:, 0, ::12, ::12],
        "FeatureAblation(model).attribute(x, target=a, feature_mask=squares)":
            lambda: FeatureAblation(model).attribute(x, target=a, feature_mask=squares_t)[:, 0],
        "Lime(model).attribute(x, target=a, feature_mask=segments)":
            lambda: Lime(model).attribute(x, target=a, feature_mask=segments_t)[:, 0],
    }
    return calls


def pgc_peers(torch, model, x, a):
    pgc, targets = _pytorch_grad_cam()

    def cam(cls, tgt=targets.ClassifierOutputTarget):
        xg = x.detach().requires_grad_(True)  # the model's weights are frozen: the graph starts at the input
        ts = None if tgt is None else [tgt(int(i)) for i in a]
        with getattr(pgc, cls)(model=model, target_layers=[model.conv3]) as c:
            return c(input_tensor=xg, targets=ts)

    return {
        "GradCAM": lambda: cam("GradCAM"),
        "GradCAMPlusPlus": lambda: cam("GradCAMPlusPlus"),
        "XGradCAM": lambda: cam("XGradCAM"),
        "ScoreCAM": lambda: cam("ScoreCAM"),
        "targets=None": lambda: cam("GradCAM", None),
        "targets=[ClassifierOutputSoftmaxTarget(int(i)) for i in a]":
            lambda: cam("GradCAM", targets.ClassifierOutputSoftmaxTarget),
        'GuidedBackpropReLUModel(model, device="cpu")(x[:1], target_category=int(a[0]))':
            lambda: pgc.GuidedBackpropReLUModel(model, device="cpu")(x[:1].clone(), target_category=int(a[0])),
    }


# rows compared by correlation (the two draw different noise), by what both maps are (LIME: the page says
# the fits differ), or else allclose; pytorch-grad-cam's CAM rows against ours min-max scaled as it scales
AGREE = {f'NoiseTunnel(Saliency(model)).attribute(x, target=a, nt_type="{t}", nt_samples=64, '
         'stdevs=0.15 * 255, abs=False).sum(1)': 0.8 for t in ("smoothgrad", "smoothgrad_sq")}
LIME = "Lime(model).attribute(x, target=a, feature_mask=segments)"


@pytest.fixture(scope="module")
def peers_setup():
    torch = pytest.importorskip("torch")
    pytest.importorskip("captum")
    from experiments.benchmarks import against_peers as AP
    from experiments.benchmarks.peers.torch_nature import to_nchw
    torch.set_num_threads(2)
    apply_fn, params, model = AP.build(num_actions=5, seed=1)
    obs = frames(2, seed=3)
    a = np.array([1, 4])
    return torch, apply_fn, params, model, obs, a, to_nchw(obs), torch.from_numpy(a)


@pytest.mark.slow
@pytest.mark.parametrize("peer", [p for p, (_, ours) in ROWS.items() if ours])
def test_every_row_computes_what_the_peer_computes(peers_setup, peer):
    torch, apply_fn, params, model, obs, a, x, a_t = peers_setup
    section, ours_call = ROWS[peer]
    calls = captum_peers(torch, model, x, a_t) if section == "Captum" else pgc_peers(torch, model, x, a_t)
    assert peer in calls, f"no peer call for the row {peer!r}"
    theirs = calls[peer]()
    theirs = np.asarray(theirs.detach().numpy() if hasattr(theirs, "detach") else theirs, np.float64)
    ours = np.asarray(eval(ours_call, namespace(apply_fn, params, obs, a)), np.float64)
    if section == "pytorch-grad-cam" and "GuidedBackprop" not in peer:
        ours = _minmax(ours)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    if peer == LIME:  # one value per segment on both sides, and not all zero
        labels = squares(len(ours))
        for m in (ours, theirs):
            assert np.abs(m).max() > 0
            for i in range(len(m)):
                assert all(np.ptp(m[i][labels[i] == s]) == 0 for s in np.unique(labels[i]))
    elif peer in AGREE:
        assert _correlation(ours, theirs) >= AGREE[peer]
    else:
        scale = np.abs(theirs).max()
        assert scale > 0
        np.testing.assert_allclose(ours, theirs, rtol=1e-3, atol=2e-3 * scale)
