"""SBX (sbx-rl) DQN and PPO `.zip` models: read without unpickling, equal to SBX's own networks.

Real SBX models are trained here for a few hundred steps (CartPole for MlpPolicy, a tiny image
env for CnnPolicy) and saved with `model.save`; the loader's outputs must equal
`model.policy`'s on the same observations, and saliency through the loaded agent must equal
saliency through SBX's own (jitted) apply functions.
"""
from __future__ import annotations

import base64
import json
import pickle
import zipfile

import numpy as np
import pytest

sbx = pytest.importorskip("sbx")
gym = pytest.importorskip("gymnasium")

import jaxsal  # noqa: E402
from jaxsal.loaders import LoaderError, load_file  # noqa: E402
from jaxsal.loaders.sbx import sbx_model  # noqa: E402

pytestmark = pytest.mark.slow  # trains four SBX agents (~1 min on 2 cores)


class TinyFrames(gym.Env):
    """36x36 uint8 frames (the smallest NatureCNN input), 3 actions, 16-step episodes."""
    observation_space = gym.spaces.Box(0, 255, (36, 36, 1), np.uint8)
    action_space = gym.spaces.Discrete(3)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        return self.np_random.integers(0, 256, (36, 36, 1), dtype=np.uint8)

    def step(self, action):
        self.t += 1
        return self._obs(), float(action == 1), self.t >= 16, False, {}


def _train(algo, policy, env, path):
    if algo == "dqn":
        model = sbx.DQN(policy, env, buffer_size=500, learning_starts=32, batch_size=16,
                        train_freq=4, seed=0)
        model.learn(200)
    else:
        model = sbx.PPO(policy, env, n_steps=64, batch_size=32, n_epochs=1, seed=0)
        model.learn(64)
    model.save(path)
    return model


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("sbx")
    out = {}
    for algo in ("dqn", "ppo"):
        out[algo, "mlp"] = (d / f"{algo}_mlp.zip", _train(algo, "MlpPolicy", "CartPole-v1",
                                                          d / f"{algo}_mlp.zip"))
        out[algo, "cnn"] = (d / f"{algo}_cnn.zip", _train(algo, "CnnPolicy", TinyFrames(),
                                                          d / f"{algo}_cnn.zip"))
    return out


def _obs(kind, n=5):
    rng = np.random.default_rng(1)
    if kind == "mlp":
        return rng.normal(size=(n, 4)).astype(np.float32)
    return rng.integers(0, 256, (n, 1, 36, 36), dtype=np.uint8)  # SB3's channel-first frames


def _sbx_outputs(algo, model, obs):
    p = model.policy
    if algo == "dqn":
        return {"q": np.asarray(p.qf.apply(p.qf_state.params, obs))}
    return {"logits": np.asarray(p.actor.apply(p.actor_state.params, obs).logits),
            "value": np.asarray(p.vf.apply(p.vf_state.params, obs))[:, 0]}


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
@pytest.mark.parametrize("kind", ["mlp", "cnn"])
def test_loaded_outputs_equal_the_sbx_policy(models, algo, kind):
    path, model = models[algo, kind]
    agent = load_file(path)  # the .zip route: detected as SBX from the JSON `data`
    obs = _obs(kind)
    got = agent.apply_fn(agent.params, obs)
    got = {"q": got} if algo == "dqn" else got
    want = _sbx_outputs(algo, model, obs)
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-5, atol=1e-6)
    assert agent.num_actions == (2 if kind == "mlp" else 3)
    assert (agent.layout, agent.pixels) == (("NCHW", "uint8") if kind == "cnn" else ("NHWC", None))


def test_the_file_is_never_unpickled(models, monkeypatch):
    """The loader reads the cloudpickled policy as data: pickle must not run at all."""
    def refuse(*a, **k):
        raise AssertionError("pickle was called")
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    sbx_model(models["dqn", "cnn"][0])


def _with_pickled_policy(src, bad, policy):
    """A copy of the SBX zip src at bad whose serialized policy is pickle.dumps(policy)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.namelist():
            data = zin.read(item)
            if item == "data":
                meta = json.loads(data)
                meta["policy"][":serialized:"] = base64.b64encode(pickle.dumps(policy)).decode()
                data = json.dumps(meta).encode()
            zout.writestr(item, data)
    return bad


def test_a_payload_that_would_run_code_is_refused_and_not_run(models, tmp_path):
    """A policy pickle that calls os.system when unpickled: the loader names the route."""
    class Evil:
        def __reduce__(self):
            import os
            return os.system, ("touch " + str(tmp_path / "pwned"),)

    bad = _with_pickled_policy(models["dqn", "mlp"][0], tmp_path / "evil.zip", Evil())
    with pytest.raises(LoaderError, match=r"--agent file\.py:load"):
        load_file(bad)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("algo", ["dqn", "ppo"])
def test_saliency_of_the_loaded_agent_equals_saliency_through_sbx_jitted_apply(models, algo):
    path, model = models[algo, "cnn"]
    agent = load_file(path)
    obs = _obs("cnn", 3)
    p = model.policy
    if algo == "dqn":
        sbx_fn, sbx_params, target = p.qf.apply, p.qf_state.params, "q_chosen"
        layer = "NatureCNN_0/Conv_2"
    else:  # SBX's actor returns a distribution: its logits are the explained output
        sbx_fn = lambda prm, x: p.actor.apply(prm, x).logits  # noqa: E731
        sbx_params, target, layer = p.actor_state.params, "policy_logit", "NatureCNN_0/Conv_2"
    for method in ("gradient", "guided_backprop", "gradcam", "g2gradcam"):
        kw = dict(method=method, target=target, layout="NCHW")
        if "cam" in method:
            kw["layer"] = layer if algo == "dqn" else "actor/" + layer
        ours = np.asarray(jaxsal.explain(agent.apply_fn, agent.params, obs, **kw))
        if "cam" in method:
            kw["layer"] = layer
        theirs = np.asarray(jaxsal.explain(sbx_fn, sbx_params, obs, **kw))
        assert np.abs(theirs).max() > 0, method
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-5 * np.abs(theirs).max(),
                                   err_msg=method)


def test_ppo_with_continuous_actions_is_refused_with_the_route(tmp_path):
    model = sbx.PPO("MlpPolicy", "Pendulum-v1", n_steps=32, batch_size=32, n_epochs=1, seed=0)
    model.save(tmp_path / "pendulum.zip")
    with pytest.raises(LoaderError, match=r"Discrete action space.*--agent file\.py:load"):
        load_file(tmp_path / "pendulum.zip")


def test_cli_lists_layers_and_explains_an_sbx_zip(models, tmp_path, capsys):
    from jaxsal.cli import main

    path = models["dqn", "cnn"][0]
    assert main(["agents", "--layers", str(path)]) == 0
    out = capsys.readouterr().out
    assert "NatureCNN_0/Conv_2" in out and "default layer" in out
    frames = _obs("cnn", 4)
    np.save(tmp_path / "buf.npy", frames)
    assert main(["explain", "--agent", str(path), "--methods", "gradcam,gradient",
                 "--input", str(tmp_path / "buf.npy"), "--out", str(tmp_path / "maps")]) == 0
    maps = jaxsal.load_maps(tmp_path / "maps", "gradcam")
    assert maps.shape == (4, 36, 36) and np.abs(maps).max() > 0


def test_cli_refuses_an_unsafe_sbx_zip_in_one_line(models, tmp_path, capsys):
    from jaxsal.cli import main

    bad = _with_pickled_policy(models["ppo", "mlp"][0], tmp_path / "custom.zip", {"not": "a policy"})
    assert main(["agents", "--layers", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("jaxsal: error:") and "--agent file.py:load" in err
