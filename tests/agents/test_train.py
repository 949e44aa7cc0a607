"""Training: a short MinAtar PQN run improves its return; checkpoints resume; PPO runs."""
import numpy as np
import pytest

from jaxsal_agents.train import PQNConfig, q_lambda_targets, train
from jaxsal_agents.train_ppo import PPOConfig, train as train_ppo
from tests._support import ROOT

pytestmark = pytest.mark.slow  # training runs and resumes: learning checks


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


@pytest.mark.slow  # a learning check (49k env steps); resuming is checked fast by the target-network run
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


def test_double_dqn_bootstrap_matches_slow_reference():
    """With a target network the bootstrap is Q_target(s', argmax_a Q_online(s', a))."""
    import jax
    import jax.numpy as jnp

    from jaxsal_agents.train import bootstrap_values
    from jaxsal_agents.zoo import build_model

    model = build_model("minatar-breakout", "dqn", 3)
    rng = np.random.default_rng(1)
    t, e = 4, 3
    obs = jnp.asarray(rng.integers(0, 2, (t, e, 10, 10, 4)), jnp.float32)
    last = jnp.asarray(rng.integers(0, 2, (e, 10, 10, 4)), jnp.float32)
    online = model.init(jax.random.PRNGKey(0), obs[0])
    target = model.init(jax.random.PRNGKey(1), obs[0])
    q_on = np.asarray(jax.vmap(lambda o: model.apply(online, o))(obs))
    greedy, q_max = q_on.argmax(-1), q_on.max(-1)
    got = np.asarray(bootstrap_values(model, online, target, obs, q_max, greedy, last))
    nxt = np.concatenate([np.asarray(obs[1:]), np.asarray(last)[None]], 0)
    want = np.zeros((t, e), np.float32)
    for i in range(t):
        for j in range(e):
            s = nxt[i, j][None]
            a = int(np.asarray(model.apply(online, s))[0].argmax())
            want[i, j] = np.asarray(model.apply(target, s))[0, a]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    # without a target network: plain max_a Q(s', a) from the same rollout
    plain = np.asarray(bootstrap_values(model, online, None, obs, q_max, greedy, last))
    np.testing.assert_allclose(plain[:-1], q_max[1:], rtol=1e-6)
    np.testing.assert_allclose(plain[-1], np.asarray(model.apply(online, last)).max(-1), rtol=1e-5)


def test_target_network_run_checkpoints_and_resumes(tmp_path):
    cfg = PQNConfig(game="minatar-breakout", steps=4096, num_envs=16, rollout=16, ckpt_every=4,
                    minibatches=2, epochs=1, target_every=3, run_dir=str(tmp_path / "tn"))
    out = train(cfg, log=lambda m: None)
    assert out["step"] == 4096
    logs = []
    train(PQNConfig(**{**cfg.__dict__, "steps": 4096 + 512}), log=logs.append)
    assert logs[0].startswith("resumed minatar-breakout at update 16")


def test_stop_at_steps_stops_with_a_checkpoint_on_the_full_schedule(tmp_path):
    """--stop-at-steps ends training (with a checkpoint) once reached, epsilon still decaying over
    --steps; the same command again trains nothing more; without it the run goes on to --steps."""
    from jaxsal_agents.train import epsilon_at
    cfg = PQNConfig(game="minatar-breakout", steps=4096, num_envs=16, rollout=16, ckpt_every=8,
                    minibatches=2, epochs=1, stop_at_steps=1000, run_dir=str(tmp_path / "cut"))
    logs = []
    out = train(cfg, log=logs.append)
    assert out["step"] == 1024                      # the first update at or past 1,000 env steps
    assert "--stop-at-steps 1000 reached" in logs[-1]
    assert epsilon_at(cfg, 256) == pytest.approx(1.0 - 256 / 409.6 * 0.99)   # decays over 10% of 4,096
    logs = []
    again = train(cfg, log=logs.append)
    assert logs[0].startswith("resumed minatar-breakout at update 4") and again["step"] == 1024
    full = train(PQNConfig(**{**cfg.__dict__, "stop_at_steps": 0}), log=lambda m: None)
    assert full["step"] == 4096


def test_warm_start_from_exported_params(tmp_path):
    """With no checkpoint, --init-from starts from an exported agent's params and step count."""
    import json

    import jax

    from jaxsal_agents.checkpoint import export_params
    from jaxsal_agents.zoo import build_model, load

    model = build_model("minatar-breakout", "dqn", 3)
    params = model.init(jax.random.PRNGKey(7), np.zeros((1, 10, 10, 4), np.float32))
    export_params(tmp_path / "seed.msgpack", params)
    card = {"name": "seed", "game": "minatar-breakout", "arch": "dqn", "layer_norm": True,
            "num_actions": 3, "obs_shape": [10, 10, 4], "env_steps_trained": 2048}
    (tmp_path / "seed.json").write_text(json.dumps(card))
    logs = []
    cfg = PQNConfig(game="minatar-breakout", steps=2048 + 512, num_envs=16, rollout=16, minibatches=2,
                    epochs=1, init_from=str(tmp_path / "seed.json"), run_dir=str(tmp_path / "warm"))
    out = train(cfg, log=logs.append)
    assert logs[0].startswith(f"warm start from {tmp_path / 'seed.json'} (2048 env steps, update 8)")
    assert out["step"] == 2048 + 512
    seed = load(str(tmp_path / "seed.json")).params
    moved = jax.tree.map(lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max()), out["params"], seed)
    assert 0 < max(jax.tree.leaves(moved)) < 1.0  # trained on from the seed, not from a fresh init


@pytest.mark.slow  # a training subprocess
def test_sigterm_stops_after_the_update_with_a_checkpoint(tmp_path):
    """A killed session loses nothing: SIGTERM ends the run after its update, checkpointed."""
    import signal
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(f"""
        from jaxsal_agents.train import PQNConfig, train
        cfg = PQNConfig(game="minatar-breakout", steps=10**7, num_envs=8, rollout=4, minibatches=1,
                        epochs=1, ckpt_every=10**6, run_dir={str(tmp_path / 'run')!r})
        train(cfg, log=lambda m: print(m, flush=True),
              callback=lambda update, **kw: print(f"update {{update}}", flush=True))
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, cwd=str(ROOT))
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("update 3"):
            proc.send_signal(signal.SIGTERM)
            break
    out, _ = proc.communicate(timeout=120)
    lines += out.splitlines(keepends=True)
    assert proc.returncode == 0, "".join(lines)[-2000:]
    stopped = [l for l in lines if l.startswith("stopped at update")]
    assert stopped and "(signal)" in stopped[0], "".join(lines)[-2000:]
    n = int(stopped[0].split()[3])
    assert n >= 3 and (tmp_path / "run" / "ckpt" / f"{n:09d}").is_dir()


def test_fast_conv_update_equals_the_plain_update(arch="dueling"):
    """The default update (strided convs' input gradient as matmuls) is the plain update up to
    float rounding. With SGD at lr 1 and one minibatch, the change of params is the gradient."""
    import dataclasses

    import jax
    import jax.numpy as jnp
    import optax

    from jaxsal.backprop.rules import count_convs
    from jaxsal_agents.train import make_update
    from jaxsal_agents.zoo import build_model

    cfg = PQNConfig(game="breakout", arch=arch, num_envs=2, rollout=4, minibatches=1, epochs=1, target_every=8)
    model = build_model("breakout", arch, 4)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 84, 84, 4)))
    tx = optax.sgd(1.0)
    rng = np.random.default_rng(0)
    t, e = cfg.rollout, cfg.num_envs
    batch = (jnp.asarray(rng.integers(0, 256, (t, e, 84, 84, 4)), jnp.float32), jnp.asarray(rng.integers(0, 4, (t, e))),
             jnp.asarray(rng.normal(size=(t, e)), jnp.float32), jnp.asarray(rng.random((t, e)) < 0.2, jnp.float32),
             jnp.asarray(rng.normal(size=(t, e)), jnp.float32), jnp.asarray(rng.integers(0, 4, (t, e))),
             jnp.asarray(rng.integers(0, 256, (e, 84, 84, 4)), jnp.float32))
    grads, losses = {}, {}
    for fast in (True, False):
        update = make_update(model, tx, dataclasses.replace(cfg, fast_conv=fast))
        new, _, losses[fast] = update(params, params, tx.init(params), jax.random.PRNGKey(1), *batch)
        grads[fast] = jax.tree.map(lambda a, b: np.asarray(a - b), params, new)
    assert float(losses[True]) == pytest.approx(float(losses[False]), rel=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(grads[True]), jax.tree.leaves(grads[False])):
        assert np.abs(b).max() > 0, path
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-4 * np.abs(b).max(), err_msg=str(path))
    # and the rule really is in the gradient: both strided convs are served by it
    assert PQNConfig().fast_conv is True
    assert count_convs(model.apply, params, batch[0][0]) == 2      # conv1 (stride 4), conv2 (stride 2)
