"""PPO (Schulman et al. 2017), CleanRL-style: read it top to bottom.

Actor-critic on Atari (EnvPool) or MinAtar (gymnax); GAE, clipped surrogate, value loss,
entropy bonus. Resumable like jaxsal_agents.train (orbax checkpoint + CSV of full-game returns).
Minibatch updates are unrolled inside one jit and the outer loop is Python (the XLA:CPU
conv-gradient-in-scan trap, jax-ml/jax#12868).

    python -m jaxsal_agents.train_ppo --game minatar-breakout --steps 500000 --run-dir runs/ppo-minatar-breakout
"""
from __future__ import annotations

import csv
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from .checkpoint import restore_train_state, save_train_state
from .envs import make_env
from .train import parse_config, snapshot_callback
from .zoo import build_model


@dataclasses.dataclass
class PPOConfig:
    game: str = "minatar-breakout"
    steps: int = 500_000
    num_envs: int = 32
    rollout: int = 64
    minibatches: int = 4
    epochs: int = 4
    lr: float = 2.5e-4
    gamma: float = 0.99
    gae_lambda: float = 0.95
    clip: float = 0.1
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    seed: int = 0
    run_dir: str = "runs/ppo"
    ckpt_every: int = 20
    time_limit: float = 0.0


def gae(rewards, values, dones, last_value, gamma, lam):
    """Generalised advantage estimates (T, E) and returns, backwards in time."""
    next_values = jnp.concatenate([values[1:], last_value[None]], 0)

    def backward(adv_next, xs):
        r, v, nv, d = xs
        delta = r + gamma * nv * (1.0 - d) - v
        adv = delta + gamma * lam * (1.0 - d) * adv_next
        return adv, adv

    _, adv = jax.lax.scan(backward, jnp.zeros_like(last_value), (rewards, values, next_values, dones),
                          reverse=True)
    return adv, adv + values


def make_update(model, tx, cfg: PPOConfig):
    def loss_fn(params, obs, actions, old_logp, adv, ret):
        out = model.apply(params, obs)
        logp_all = jax.nn.log_softmax(out["logits"])
        logp = jnp.take_along_axis(logp_all, actions[:, None], -1)[:, 0]
        ratio = jnp.exp(logp - old_logp)
        adv = (adv - adv.mean()) / (adv.std() + 1e-8)
        pg = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - cfg.clip, 1 + cfg.clip) * adv).mean()
        vf = 0.5 * ((out["value"] - ret) ** 2).mean()
        ent = -(jnp.exp(logp_all) * logp_all).sum(-1).mean()
        return pg + cfg.vf_coef * vf - cfg.ent_coef * ent

    @jax.jit
    def update(params, opt_state, key, obs, actions, logp, values, rewards, dones, last_obs):
        last_value = model.apply(params, last_obs)["value"]
        adv, ret = gae(rewards, values, dones, last_value, cfg.gamma, cfg.gae_lambda)
        n = obs.shape[0] * obs.shape[1]
        flat = [x.reshape((n,) + x.shape[2:]) for x in (obs, actions, logp, adv, ret)]
        mb = n // cfg.minibatches
        losses = []
        for _ in range(cfg.epochs):                          # unrolled on purpose (CPU trap)
            key, sub = jax.random.split(key)
            perm = jax.random.permutation(sub, n)
            for i in range(cfg.minibatches):
                idx = perm[i * mb:(i + 1) * mb]
                loss, grads = jax.value_and_grad(loss_fn)(params, *(x[idx] for x in flat))
                updates, opt_state = tx.update(grads, opt_state, params)
                params = optax.apply_updates(params, updates)
                losses.append(loss)
        return params, opt_state, jnp.stack(losses).mean()
    return update


def make_act(model):
    @jax.jit
    def act(params, obs, key):
        out = model.apply(params, obs)
        actions = jax.random.categorical(key, out["logits"])
        logp = jnp.take_along_axis(jax.nn.log_softmax(out["logits"]), actions[:, None], -1)[:, 0]
        return actions, logp, out["value"]
    return act


def train(cfg: PPOConfig, log=print, callback=None) -> dict:
    """Train (or resume) a PPO agent; `callback(step=, update=, params=, apply_fn=, returns=)`,
    if given, runs after every update (e.g. saliency snapshots)."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1))
    env = make_env(cfg.game, cfg.num_envs, train=True, seed=cfg.seed)
    model = build_model(cfg.game, "actor_critic", env.num_actions)
    n_updates = cfg.steps // (cfg.num_envs * cfg.rollout)
    grad_steps = max(1, n_updates * cfg.epochs * cfg.minibatches)
    tx = optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                     optax.adam(optax.linear_schedule(cfg.lr, 0.0, grad_steps), eps=1e-5))
    key, init_key = jax.random.split(jax.random.PRNGKey(cfg.seed))
    params = model.init(init_key, jnp.zeros((1,) + env.obs_shape, jnp.float32))
    state = restore_train_state(run_dir / "ckpt", {"params": params, "opt_state": tx.init(params),
                                                   "key": key, "step": 0, "update": 0})
    if state["update"]:
        log(f"resumed {cfg.game} at update {state['update']} (step {state['step']})")
        env = make_env(cfg.game, cfg.num_envs, train=True, seed=cfg.seed + 1000 * state["update"])
    params, opt_state, key = state["params"], state["opt_state"], state["key"]
    step, upd = int(state["step"]), int(state["update"])
    act, update = make_act(model), make_update(model, tx, cfg)

    csv_path = run_dir / "returns.csv"
    new_csv = not csv_path.exists()
    csv_file = open(csv_path, "a", newline="")
    writer = csv.writer(csv_file)
    if new_csv:
        writer.writerow(["step", "return", "wall_s"])
    obs, t0, start_step, recent = env.reset(), time.time(), step, []
    while upd < n_updates:
        buf = {k: [] for k in ("obs", "actions", "logp", "values", "rewards", "dones")}
        for _ in range(cfg.rollout):
            key, sub = jax.random.split(key)
            actions, logp, value = act(params, obs, sub)
            next_obs, reward, done, finished = env.step(np.asarray(actions))
            for k, v in zip(buf, (obs, actions, logp, value, reward, done)):
                buf[k].append(v)
            for ret in finished:
                writer.writerow([step, ret, round(time.time() - t0, 1)])
                recent.append(ret)
            obs, step = next_obs, step + cfg.num_envs
        key, sub = jax.random.split(key)
        params, opt_state, loss = update(params, opt_state, sub,
                                         *(jnp.asarray(np.stack(buf[k])) for k in buf), obs)
        upd += 1
        if callback is not None:
            callback(step=step, update=upd, params=params, apply_fn=model.apply, returns=recent)
        out_of_time = cfg.time_limit > 0 and time.time() - t0 > cfg.time_limit
        if upd % cfg.ckpt_every == 0 or upd == n_updates or out_of_time:
            csv_file.flush()
            save_train_state(run_dir / "ckpt", {"params": params, "opt_state": opt_state, "key": key,
                                                "step": step, "update": upd})
            mean_ret = float(np.mean(recent[-20:])) if recent else float("nan")
            log(f"{cfg.game} ppo update {upd}/{n_updates} step {step} loss {float(loss):.4f} "
                f"return(last20) {mean_ret:.2f} {(step - start_step) / max(1e-9, time.time() - t0):.0f} steps/s")
            if out_of_time:
                break
    csv_file.close()
    return {"params": params, "model": model, "step": step, "returns": recent}


def main(argv=None):
    cfg, snap = parse_config(PPOConfig, argv, __doc__)
    callback = snapshot_callback(cfg, snap, target="policy_logit")
    train(cfg, log=lambda m: print(m, flush=True), callback=callback)
    if callback is not None:
        callback.close()


if __name__ == "__main__":
    sys.exit(main())
