"""The trainers' targets, advantages, schedules and losses against slow textbook loops: PQN's epsilon
schedule and Q(lambda) loss, PPO's GAE and clipped-surrogate loss, the DDDQN's Huber loss. Each update
runs one epoch of one minibatch with a zero learning rate, so its reported loss is the loss at the given
params, recomputed here in numpy one state at a time."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxsal_agents.train import PQNConfig, epsilon_at
from jaxsal_agents.zoo import build_model


def test_epsilon_decays_linearly_over_its_fraction_then_stays_at_its_end():
    """epsilon goes from eps_start to eps_end linearly over eps_decay_frac * steps, then stays at eps_end."""
    cfg = PQNConfig(steps=10_000, eps_start=1.0, eps_end=0.05, eps_decay_frac=0.2)      # decays over 2,000 steps
    for step, want in [(0, 1.0), (500, 1.0 - 0.25 * 0.95), (1000, 0.525), (2000, 0.05), (2500, 0.05), (10_000, 0.05)]:
        assert epsilon_at(cfg, step) == pytest.approx(want), step


def _gae_loop(r, v, d, last, gamma, lam):
    """Schulman et al. (2016), one env at a time: delta_t = r_t + gamma V_{t+1} (1 - d_t) - V_t,
    A_t = delta_t + gamma lam (1 - d_t) A_{t+1}, V_T = the value of the state after the rollout."""
    t, e = r.shape
    adv = np.zeros((t, e))
    for j in range(e):
        a_next = 0.0
        for i in reversed(range(t)):
            v_next = last[j] if i == t - 1 else v[i + 1, j]
            delta = r[i, j] + gamma * v_next * (1.0 - d[i, j]) - v[i, j]
            a_next = delta + gamma * lam * (1.0 - d[i, j]) * a_next
            adv[i, j] = a_next
    return adv


def test_gae_matches_the_textbook_recursion():
    """PPO's advantages and returns (A + V), an episode end cutting both the bootstrap and the trace."""
    from jaxsal_agents.train_ppo import gae

    rng = np.random.default_rng(0)
    r, v = rng.normal(size=(2, 7, 3)).astype(np.float32)
    d = np.zeros((7, 3), np.float32)
    d[[1, 4, 6], [0, 1, 2]] = 1.0
    last = rng.normal(size=3).astype(np.float32)
    adv, ret = gae(r, v, d, last, 0.9, 0.7)
    want = _gae_loop(r, v, d, last, 0.9, 0.7)
    np.testing.assert_allclose(adv, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ret, want + v, rtol=1e-5, atol=1e-5)


def _rollout(rng, t, e, channels=4):
    obs = rng.integers(0, 2, (t, e, 10, 10, channels)).astype(np.float32)
    last = rng.integers(0, 2, (e, 10, 10, channels)).astype(np.float32)
    dones = np.zeros((t, e), np.float32)
    dones[[1, t - 1], [0, e - 1]] = 1.0
    return obs, last, rng.normal(size=(t, e)).astype(np.float32), dones


def test_pqn_loss_is_half_the_squared_error_of_the_taken_actions_q_to_the_lambda_returns():
    """0.5 mean (Q(s_t, a_t) - G_t)^2 with G the Q(lambda) return on max_a Q(s_{t+1}, a) (no target network);
    the actions taken are not the greedy ones, so Q of the wrong action would show."""
    from jaxsal_agents.train import make_update

    rng = np.random.default_rng(1)
    t, e, gamma, lam = 5, 3, 0.9, 0.6
    model = build_model("minatar-breakout", "dqn", 3)
    cfg = PQNConfig(game="minatar-breakout", num_envs=e, rollout=t, minibatches=1, epochs=1, gamma=gamma, lam=lam)
    obs, last, rewards, dones = _rollout(rng, t, e)
    params = model.init(jax.random.PRNGKey(0), obs[0])
    q = np.stack([np.asarray(model.apply(params, obs[i])) for i in range(t)]).astype(np.float64)   # (T, E, A)
    greedy = q.argmax(-1)
    actions = (greedy + 1 + rng.integers(0, 2, (t, e))) % 3                                       # never greedy
    tx = optax.sgd(0.0)
    _, _, loss = make_update(model, tx, cfg)(params, None, tx.init(params), jax.random.PRNGKey(2), jnp.asarray(obs),
                                             jnp.asarray(actions), jnp.asarray(rewards), jnp.asarray(dones),
                                             jnp.asarray(q.max(-1), jnp.float32), jnp.asarray(greedy), jnp.asarray(last))
    q_next = np.concatenate([q.max(-1)[1:], np.asarray(model.apply(params, last)).max(-1)[None]])
    g = np.zeros((t, e))
    for j in range(e):
        for i in reversed(range(t)):
            boot = q_next[i, j] if i == t - 1 else lam * g[i + 1, j] + (1 - lam) * q_next[i, j]
            g[i, j] = rewards[i, j] + gamma * (1 - dones[i, j]) * boot
    q_taken = np.take_along_axis(q, actions[..., None], -1)[..., 0]
    assert float(loss) == pytest.approx(0.5 * np.mean((q_taken - g) ** 2), rel=1e-4)


def test_ppo_loss_is_the_clipped_surrogate_plus_value_minus_entropy():
    """-mean min(rho A, clip(rho, 1 -+ eps) A) on normalised GAE advantages + vf_coef * 0.5 mean (V - R)^2
    - ent_coef * entropy; the old log-probabilities are shifted so that many ratios lie outside the clip."""
    from jaxsal_agents.train_ppo import PPOConfig, make_update

    rng = np.random.default_rng(3)
    t, e = 6, 3
    cfg = PPOConfig(game="minatar-breakout", num_envs=e, rollout=t, minibatches=1, epochs=1, gamma=0.9,
                    gae_lambda=0.8, clip=0.1, ent_coef=0.05, vf_coef=0.5)
    model = build_model("minatar-breakout", "actor_critic", 3)
    obs, last, rewards, dones = _rollout(rng, t, e)
    params = model.init(jax.random.PRNGKey(0), obs[0])
    out = [model.apply(params, obs[i]) for i in range(t)]
    logits = np.stack([np.asarray(o["logits"]) for o in out]).astype(np.float64)                  # (T, E, A)
    value = np.stack([np.asarray(o["value"]) for o in out]).astype(np.float64)
    actions = rng.integers(0, 3, (t, e))
    logp_all = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    logp = np.take_along_axis(logp_all, actions[..., None], -1)[..., 0]
    old_logp = (logp + rng.uniform(-0.4, 0.4, (t, e))).astype(np.float32)
    values = rng.normal(size=(t, e)).astype(np.float32)          # the rollout's values (GAE), not the new ones
    tx = optax.sgd(0.0)
    _, _, loss = make_update(model, tx, cfg)(params, tx.init(params), jax.random.PRNGKey(4), jnp.asarray(obs),
                                             jnp.asarray(actions), jnp.asarray(old_logp), jnp.asarray(values),
                                             jnp.asarray(rewards), jnp.asarray(dones), jnp.asarray(last))
    adv = _gae_loop(rewards, values, dones, np.asarray(model.apply(params, last)["value"]), 0.9, 0.8)
    ret = adv + values
    a = (adv - adv.mean()) / (adv.std() + 1e-8)
    ratio = np.exp(logp - old_logp)
    assert ((ratio < 0.9) | (ratio > 1.1)).mean() > 0.3
    pg = -np.mean(np.minimum(ratio * a, np.clip(ratio, 0.9, 1.1) * a))
    vf = 0.5 * np.mean((value - ret) ** 2)
    ent = np.mean(-(np.exp(logp_all) * logp_all).sum(-1))
    assert float(loss) == pytest.approx(pg + 0.5 * vf - 0.05 * ent, rel=1e-4, abs=1e-5)


def test_ppo_acting_gives_the_log_probability_of_the_sampled_action():
    """The old log-probability the ratio divides by: log softmax(logits)[a] of the action sampled, with the value."""
    from jaxsal_agents.train_ppo import make_act

    model = build_model("minatar-breakout", "actor_critic", 3)
    obs = np.random.default_rng(7).integers(0, 2, (64, 10, 10, 4)).astype(np.float32)
    params = model.init(jax.random.PRNGKey(0), obs[:1])
    actions, logp, value = (np.asarray(x) for x in make_act(model)(params, obs, jax.random.PRNGKey(1)))
    out = model.apply(params, obs)
    logits = np.asarray(out["logits"], np.float64)
    want = np.take_along_axis(logits - np.log(np.exp(logits).sum(-1, keepdims=True)), actions[:, None], -1)[:, 0]
    np.testing.assert_allclose(logp, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(value, np.asarray(out["value"]), rtol=1e-6)
    assert len(set(actions.tolist())) == 3                 # sampled, not argmax


def test_dqn_loss_is_the_huber_loss_of_the_taken_actions_q_to_the_double_dqn_target():
    """mean Huber(Q(s, a) - y, delta) over the sampled batch, y = r + gamma (1 - d) Q_target(s', argmax Q(s'));
    rewards large enough that both branches of the Huber loss are used."""
    from jaxsal_agents import train_dqn as T
    from jaxsal_agents.networks import MinAtarDuelingDQN

    rng = np.random.default_rng(5)
    n, gamma, delta = 12, 0.9, 1.0
    model = MinAtarDuelingDQN(3, 4)
    cfg = T.DQNConfig(batch_size=16, grad_steps=1, gamma=gamma, huber_delta=delta)
    obs = rng.integers(0, 2, (n, 10, 10, 4)).astype(np.uint8)
    data = {"obs": obs, "action": rng.integers(0, 3, n).astype(np.int32), "reward": rng.normal(0, 2, n).astype(np.float32),
            "done": (rng.random(n) < 0.3).astype(np.float32), "next_obs": np.roll(obs, -1, 0)}
    buffer = T.buffer_add(T.buffer_init(n, data), data)
    params = model.init(jax.random.PRNGKey(0), obs[:1].astype(np.float32))
    target = model.init(jax.random.PRNGKey(1), obs[:1].astype(np.float32))
    tx = optax.sgd(0.0)
    key = jax.random.PRNGKey(6)
    _, _, loss = T.make_update(model, tx, cfg)(params, target, tx.init(params), buffer, key)
    idx = np.asarray(T.buffer_indices(buffer, jax.random.split(key)[1], 16))    # the rows the update drew
    errs = []
    for i in idx:
        q = lambda p, s: np.asarray(model.apply(p, s[None].astype(np.float32))["q"])[0]   # noqa: E731
        a_star = int(q(params, data["next_obs"][i]).argmax())
        y = data["reward"][i] + gamma * (1 - data["done"][i]) * q(target, data["next_obs"][i])[a_star]
        errs.append(q(params, data["obs"][i])[data["action"][i]] - y)
    x = np.abs(np.array(errs))
    assert (x > delta).any() and (x < delta).any()
    huber = np.where(x <= delta, 0.5 * x ** 2, delta * (x - 0.5 * delta))
    assert float(loss) == pytest.approx(huber.mean(), rel=1e-4)
