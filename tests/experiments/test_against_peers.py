"""The torch peers of experiments.benchmarks.against_peers: same weights -> same outputs, and each peer map
agrees with jaxsal's where the methods are defined the same. Skips cleanly without torch."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
captum = pytest.importorskip("captum")  # the bench extra installs both; torch alone (the loaders extra) is not enough

pytestmark = pytest.mark.slow  # a minute of torch and JAX; `make test-slow` installs captum beside torch

import jax  # noqa: E402

import jaxsal  # noqa: E402
from experiments.benchmarks import against_peers as AP  # noqa: E402
from experiments.benchmarks.peers import methods as P  # noqa: E402
from experiments.benchmarks.peers.torch_nature import from_flax, to_nchw  # noqa: E402


@pytest.fixture(scope="module")
def models():
    torch.set_num_threads(1)
    apply_fn, params, tm = AP.build(num_actions=5, seed=1)
    obs = np.random.default_rng(0).integers(0, 256, (3, 84, 84, 4), dtype=np.uint8)
    return apply_fn, params, tm, obs


def test_torch_copy_computes_the_same_q(models):
    apply_fn, params, tm, obs = models
    q_flax = np.asarray(apply_fn(params, obs))
    with torch.no_grad():
        q_torch = tm(to_nchw(obs)).numpy()
    np.testing.assert_allclose(q_torch, q_flax, rtol=1e-4, atol=1e-5)
    assert np.abs(q_flax).max() > 0


def test_from_flax_rejects_layer_norm():
    from jaxsal_agents.networks import NatureDQN
    m = NatureDQN(3, layer_norm=True)
    params = m.init(jax.random.PRNGKey(0), np.zeros((1, 84, 84, 4), np.uint8))
    with pytest.raises(ValueError, match="LayerNorm"):
        from_flax(params)


def test_correlation_helper():
    a = np.random.default_rng(0).normal(size=(2, 5, 5))
    assert AP.correlation(a, 3 * a + 1) == pytest.approx(1.0)
    assert AP.correlation(a, -a) == pytest.approx(-1.0)


@pytest.mark.parametrize("name,peer", [
    ("gradient", P.gradient), ("guided_backprop", P.guided_backprop),
    ("gradcam", P.gradcam), ("gradcam_pp", P.gradcam_pp), ("gradcam", P.gradcam_captum)])
def test_gradient_peers_agree(models, name, peer):
    apply_fn, params, tm, obs = models
    a = np.asarray(jaxsal.explain(apply_fn, params, obs, method=name))
    b = peer(tm, to_nchw(obs)).detach().numpy()
    assert a.shape == b.shape
    assert AP.correlation(a, b) >= 0.999


def test_integrated_gradients_peer_agrees(models):
    apply_fn, params, tm, obs = models
    a = np.asarray(jaxsal.explain(apply_fn, params, obs[:2], method="integrated_gradients", steps=8))
    b = P.integrated_gradients(tm, to_nchw(obs[:2]), steps=8).numpy()
    np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-3 * np.abs(a).max())


def test_occlusion_peer_agrees_on_the_drop_grid(models):
    apply_fn, params, tm, obs = models
    a = np.asarray(jaxsal.explain(apply_fn, params, obs[:1], method="occlusion", patch=12,
                                  stride=12, score="drop", return_grid=True))
    b = P.occlusion(tm, to_nchw(obs[:1]), patch=12, stride=12, return_grid=True).numpy()
    np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4 * np.abs(a).max())


def test_rise_peer_agrees_with_the_same_masks(models):
    apply_fn, params, tm, obs = models
    from jaxsal.perturbation.rise import rise_masks
    key = jax.random.PRNGKey(4)
    a = np.asarray(jaxsal.explain(apply_fn, params, obs[:1], method="rise", n_masks=40, key=key))
    masks = torch.from_numpy(np.array(rise_masks(key, 40, (84, 84))))
    b = P.rise(tm, to_nchw(obs[:1]), masks=masks).numpy()
    np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-4 * np.abs(a).max())


def test_noise_sensitivity_peer_agrees_on_the_grid(models):
    apply_fn, params, tm, obs = models
    nm, bh, bw, grid = AP.noise_masks(radius=3.0, stride=21)
    a = np.asarray(jaxsal.explain(apply_fn, params, obs[:1], method="noise_sensitivity", radius=3.0,
                                  stride=21, return_grid=True))
    b = P.noise_sensitivity(tm, to_nchw(obs[:1]), torch.from_numpy(nm), torch.from_numpy(bh),
                            torch.from_numpy(bw), grid, return_grid=True).numpy()
    assert a.shape == b.shape == (1, *grid)
    np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-6)


def test_benchmark_runs_end_to_end(tmp_path):
    res = AP.main(["--batches", "1", "--repeats", "1", "--budget", "1", "--scaling",
                   "--methods", "gradient", "gradcam conv3", "--out", str(tmp_path),
                   "--torch-threads", "1", "--no-memory"])
    assert res["agreement"]["gradient"]["corr_vs_peer"] >= 0.999
    row = res["timing"]["gradient"][0]
    assert row["jaxsal_maps_per_s"] > 0 and row["peer_maps_per_s"] > 0
    assert row["jaxsal_warm_maps_per_s"] > 0 and row["ratio_warm_min"] <= row["ratio_warm"] <= row["ratio_warm_max"]
    assert "## Back-to-back calls" in (tmp_path / "against_peers.md").read_text()
    for ext in ("json", "md", "png"):
        assert (tmp_path / f"against_peers.{ext}").stat().st_size > 0
    assert "| gradient |" in (tmp_path / "against_peers.md").read_text()
    again = tmp_path / "again"
    AP.main(["--render", str(tmp_path / "against_peers.json"), "--out", str(again)])
    section = (again / "against_peers_README_section.md").read_text()
    assert "| gradient | captum Saliency |" in section


def test_peak_memory_child_reports_its_own_peak():
    from experiments.benchmarks.against_peers import run_child
    r = run_child(["--case", "gradient", "--side", "jaxsal", "--n", 2], timeout=120)
    assert "error" not in r, r
    assert r["n"] == 2 and r["peak_rss_mb"] >= r["base_rss_mb"] > 50 and r["extra_mb"] >= 0


def test_pytorch_grad_cam_is_the_library_where_it_is_installed():
    """The Grad-CAM peers are pytorch-grad-cam's own classes when it is installed (with the
    torchvision stand-in where torchvision is missing), and they agree with jaxsal."""
    pytest.importorskip("cv2")
    pytest.importorskip("ttach")
    status = P.pytorch_grad_cam_status()
    if status.startswith("does not import"):
        pytest.skip(f"pytorch-grad-cam {status}")
    assert status.startswith("1.")
    assert P.pytorch_grad_cam_available()


def test_the_quick_run_times_each_side_in_its_own_process(tmp_path):
    """--quick end to end: agreement, both worker processes, per-round ratios with their range, the
    torch build recorded, and the tables written."""
    res = AP.main(["--quick", "--methods", "gradient", "--batches", "2", "--no-memory", "--out", str(tmp_path)])
    row, = res["timing"]["gradient"]
    assert "error" not in row, row
    assert row["ratio_min"] <= row["ratio"] <= row["ratio_max"] and row["repeats"] == 2
    assert res["machine"]["torch_build"] == "CPU build" and res["machine"]["torch_cuda"] is None
    assert res["rounds"] == 2 and len(res["commit"]) == 40
    md = (tmp_path / "against_peers.md").read_text()
    assert "own process" in md and "| gradient | captum Saliency | 2 |" in md
