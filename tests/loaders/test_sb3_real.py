"""Stable-Baselines3 models trained and saved by SB3 itself (DQN and PPO with its CnnPolicy on
84x84x4 uint8 frames, a few hundred steps): jaxsal's loader gives SB3's own Q-values, logits and
values, and `jaxsal explain --agent model.zip` runs on them. Slow: it trains with torch."""
import numpy as np
import pytest

sb3 = pytest.importorskip("stable_baselines3")
pytest.importorskip("gymnasium")
torch = pytest.importorskip("torch")

import jaxsal  # noqa: E402
from jaxsal.cli import main  # noqa: E402
from jaxsal.loaders import load_file  # noqa: E402
from tests._support.client_models import Frames, frames as _frames, sb3_dqn  # noqa: E402

pytestmark = pytest.mark.slow


def _policy_input(model, frames_nchw):
    t, _ = model.policy.obs_to_tensor(frames_nchw)
    return t


def test_sb3_dqn_zip_gives_sb3s_q_values_and_maps(tmp_path):
    model = sb3_dqn(300)
    model.save(tmp_path / "dqn.zip")
    x = _frames().transpose(0, 3, 1, 2)                      # SB3 transposes images to channel-first
    with torch.no_grad():
        ref = model.q_net(_policy_input(model, x)).numpy()
    agent = load_file(tmp_path / "dqn.zip")
    assert agent.layout == "NCHW"
    out = np.asarray(agent.apply_fn(agent.params, x))
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(ref).max()))
    np.save(tmp_path / "buf.npy", x)
    assert main(["explain", "--agent", str(tmp_path / "dqn.zip"), "--methods", "gradcam,gradient",
                 "--input", str(tmp_path / "buf.npy"), "--out", str(tmp_path / "out"), "--quiet"]) == 0
    o = jaxsal.load_outputs(tmp_path / "out")
    np.testing.assert_array_equal(o["action"], ref.argmax(-1))
    np.testing.assert_allclose(o["q"], ref, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(ref).max()))
    assert np.abs(np.asarray(jaxsal.load_maps(tmp_path / "out", "gradcam"))).max() > 0


def test_sb3_ppo_zip_gives_sb3s_logits_and_values(tmp_path):
    model = sb3.PPO("CnnPolicy", Frames(), n_steps=64, batch_size=32, n_epochs=1, seed=0, device="cpu")
    model.learn(128)
    model.save(tmp_path / "ppo.zip")
    x = _frames(seed=1).transpose(0, 3, 1, 2)
    with torch.no_grad():
        t = _policy_input(model, x)
        features = model.policy.extract_features(t)
        pi, vf = model.policy.mlp_extractor(features)
        logits, value = model.policy.action_net(pi).numpy(), model.policy.value_net(vf).numpy()[:, 0]
    agent = load_file(tmp_path / "ppo.zip")
    out = agent.apply_fn(agent.params, x)
    np.testing.assert_allclose(np.asarray(out["logits"]), logits, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out["value"]), value, rtol=1e-4, atol=1e-5)
