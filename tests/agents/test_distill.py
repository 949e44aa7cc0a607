"""jaxsal_agents.distill: policy distillation of a trained teacher into another network (DAgger data)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsal_agents.distill import (Buffer, DistillConfig, beta_at, distill, distill_loss, initial_state,
                                   make_optimizer)
from jaxsal_agents.framestack import FrameStackEnv
from jaxsal_agents.networks import MinAtarDQN
from jaxsal_agents.zoo import Agent

pytestmark = pytest.mark.slow  # trains a student


class GridEnv:
    """Fake MinAtar-like single-frame env (no gymnax compile): seeded random binary 10x10x3 frames."""
    num_actions, obs_shape = 3, (10, 10, 3)

    def __init__(self, num_envs, seed=0):
        self.n, self.rng, self.t = num_envs, np.random.default_rng(seed), 0

    def _obs(self):
        return (self.rng.random((self.n,) + self.obs_shape) < 0.2).astype(np.float32)

    def reset(self):
        return self._obs()

    def step(self, actions):
        self.t += 1
        done = np.full(self.n, self.t % 7 == 0, np.float32)
        return self._obs(), np.ones(self.n, np.float32), done, [7.0] * int(done.sum())


def env_fn(frames):
    def make(cfg, teacher, num_envs, seed):
        return FrameStackEnv(GridEnv(num_envs, seed), num_frames=frames)
    return make


@pytest.fixture(scope="module")
def teacher():
    model = MinAtarDQN(3, 12)
    params = model.init(jax.random.PRNGKey(1), jnp.zeros((1, 10, 10, 12)))
    card = {"game": "minatar-breakout", "arch": "dqn", "num_actions": 3, "obs_shape": [10, 10, 12]}
    return Agent(name="teacher", model=model, params=params, card=card)


def _cfg(tmp_path, **kw):
    base = dict(steps=4 * 4 * 60, num_envs=4, collect=4, updates=2, batch=16, buffer=400, warmup=32,
                lr=1e-3, seed=0, run_dir=str(tmp_path / "run"), ckpt_every=1000)
    return DistillConfig(**dict(base, **kw))


def test_loss_matches_its_definition_and_vanishes_at_the_teacher():
    rng = np.random.default_rng(0)
    qs, qt = rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(5, 4)).astype(np.float32)
    tau, w = 0.3, 2.0

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)
    p, r = softmax(qt / tau), softmax(qs / tau)
    want = np.mean((qs - qt) ** 2) + w * tau * np.mean(np.sum(p * (np.log(p) - np.log(r)), -1))
    loss, parts = distill_loss(jnp.asarray(qs), jnp.asarray(qt), tau, w)
    np.testing.assert_allclose(float(loss), want, rtol=1e-5)
    assert float(parts["agreement"]) == pytest.approx(np.mean(qs.argmax(-1) == qt.argmax(-1)))
    g = jax.grad(lambda q: distill_loss(q, jnp.asarray(qt), tau, w)[0])(jnp.asarray(qt))
    np.testing.assert_allclose(np.asarray(g), 0.0, atol=1e-6)


def test_beta_falls_from_teacher_to_student_and_buffer_keeps_the_newest():
    cfg = DistillConfig(steps=1000, teacher_frac=0.2)
    assert beta_at(cfg, 0) == 1.0 and beta_at(cfg, 100) == pytest.approx(0.5) and beta_at(cfg, 200) == 0.0
    buf = Buffer(5, (2,), np.uint8, 3)
    for i in range(3):
        buf.add(np.full((2, 2), i, np.uint8), np.full((2, 3), i, np.float32))
    assert buf.size == 5 and sorted(buf.obs[:, 0].tolist()) == [0, 1, 1, 2, 2]
    o, q = buf.sample(np.random.default_rng(0), 50)
    assert set(o[:, 0].tolist()) <= {0, 1, 2} and np.all(q[:, 0] == o[:, 0])


def _held_out(teacher, model, params):
    """Loss and agreement against the teacher on 48 states the training never saw."""
    env = FrameStackEnv(GridEnv(8, 99), num_frames=6)
    obs = np.concatenate([env.reset()] + [env.step(np.zeros(8, int))[0] for _ in range(5)])
    q_t = teacher.apply_fn(teacher.params, jnp.asarray(obs[..., -12:]))   # the newest 4 frames
    return distill_loss(model.apply(params, jnp.asarray(obs)), q_t, 0.02, 1.0)


@pytest.mark.slow  # a learning check; distill's training loop and resume are checked fast below
def test_student_with_more_frames_learns_the_teacher(tmp_path, teacher):
    """A 6-frame student learns a 4-frame teacher (which reads the newest 4 frames): held-out loss
    falls to under half and action agreement rises."""
    model, cfg = MinAtarDQN(3, 18), _cfg(tmp_path)
    start = _held_out(teacher, model, initial_state(cfg, model, make_optimizer(cfg), (10, 10, 18))["params"])
    out = distill(cfg, log=lambda m: None, env_fn=env_fn(6), model=model, teacher=teacher)
    after = _held_out(teacher, model, out["params"])
    assert float(after[0]) < 0.5 * float(start[0])
    assert float(after[1]["agreement"]) > float(start[1]["agreement"])
    assert out["step"] == cfg.steps and out["returns"]


def test_stops_on_time_limit_and_resumes_from_its_checkpoint(tmp_path, teacher):
    model = MinAtarDQN(3, 12)
    logs = []
    first = distill(_cfg(tmp_path, time_limit=1e-9), log=logs.append, env_fn=env_fn(4), model=model, teacher=teacher)
    assert first["update"] == 1 and any(m.startswith("stopped at update 1") for m in logs)
    second = distill(_cfg(tmp_path), log=logs.append, env_fn=env_fn(4), model=model, teacher=teacher)
    assert any(m.startswith("resumed at update 1") for m in logs) and second["step"] == 4 * 4 * 60
    rows = (tmp_path / "run" / "returns.csv").read_text().splitlines()
    assert rows[0] == "step,return,wall_s,student_share" and sum(r.startswith("step") for r in rows) == 1


def test_too_few_student_frames_is_a_clear_error(tmp_path, teacher):
    with pytest.raises(SystemExit, match="fewer than the teacher's 12"):
        distill(_cfg(tmp_path), log=lambda m: None, env_fn=env_fn(2), model=MinAtarDQN(3, 6), teacher=teacher)


def test_evaluation_stacks_as_many_frames_as_the_card_says():
    """A 10-frame Atari agent (Paper A's split-attention layout) plays under the protocol."""
    pytest.importorskip("envpool")
    import flax.linen as nn

    from jaxsal_agents.evaluate import play_games

    class TenFrames(nn.Module):
        @nn.compact
        def __call__(self, obs):
            assert obs.shape[1:] == (84, 84, 10), obs.shape
            return nn.Dense(4)(obs.mean((1, 2)))

    params = TenFrames().init(jax.random.PRNGKey(0), jnp.zeros((1, 84, 84, 10)))
    agent = Agent(name="ten", model=TenFrames(), params=params,
                  card={"game": "breakout", "arch": "split_attention", "num_actions": 4, "obs_shape": [84, 84, 10]})
    assert len(play_games(agent, episodes=2, max_steps=5)) == 2
