"""Training: a short MinAtar PQN run improves its return; checkpoints resume; PPO runs."""
import numpy as np
import pytest

from agents.train import PQNConfig, q_lambda_targets, train
from agents.train_ppo import PPOConfig, train as train_ppo


def test_q_lambda_targets_match_slow_reference():
    rng = np.random.default_rng(0)
    r, d, qn = rng.normal(size=(3, 6, 2)).astype(np.float32)
    d = (d > 0.8).astype(np.float32)
    gamma, lam = 0.9, 0.6
    got = np.asarray(q_lambda_targets(r, d, qn, gamma, lam))
    want = np.zeros_like(r)
    want[-1] = r[-1] + gamma * (1 - d[-1]) * qn[-1]
    for t in range(4, -1, -1):
        want[t] = r[t] + gamma * (1 - d[t]) * (lam * want[t + 1] + (1 - lam) * qn[t])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_minatar_pqn_return_improves_and_resumes(tmp_path):
    cfg = PQNConfig(game="minatar-breakout", steps=49152, num_envs=64, rollout=16, ckpt_every=8,
                    eps_decay_frac=0.2, run_dir=str(tmp_path / "run"), lr=1e-3)
    out = train(cfg, log=lambda m: None)
    rets = out["returns"]
    assert len(rets) > 100
    first, last = np.mean(rets[:50]), np.mean(rets[-50:])
    assert last > first + 0.5, (first, last)
    assert (tmp_path / "run" / "returns.csv").read_text().count("\n") == len(rets) + 1
    # rerun with a larger budget resumes from the checkpoint instead of starting over
    logs = []
    more = PQNConfig(**{**cfg.__dict__, "steps": cfg.steps + 2048})
    out2 = train(more, log=logs.append)
    assert logs[0].startswith("resumed minatar-breakout at update 48")
    assert out2["step"] == cfg.steps + 1024 * 2


def test_ppo_runs_and_resumes(tmp_path):
    cfg = PPOConfig(game="minatar-breakout", steps=4096, num_envs=16, rollout=32, ckpt_every=4,
                    epochs=1, minibatches=2, run_dir=str(tmp_path / "ppo"))
    out = train_ppo(cfg, log=lambda m: None)
    assert out["step"] == 4096
    logs = []
    train_ppo(PPOConfig(**{**cfg.__dict__, "steps": 4096 + 512}), log=logs.append)
    assert logs[0].startswith("resumed minatar-breakout at update 8")
