"""PQN (Gallici et al. 2024): parallel Q-learning with Q(lambda) targets and no replay.

Readable top to bottom: config -> network -> act -> Q(lambda) targets -> update -> loop.
Works for Atari (EnvPool) and MinAtar (gymnax), plain or dueling heads. By default there is
no target network (PQN); `--target-every K` adds one, synced every K updates, and bootstraps
with the Double-DQN value Q_target(s', argmax_a Q_online(s', a)) (Paper A's DDDQN target). Resumable: an
orbax checkpoint (params, optimiser state, RNG key, step) every `ckpt_every` updates, and
a CSV log of full-game returns. CPU note: conv gradients inside `lax.scan` are ~10x slower
on XLA:CPU (jax-ml/jax#12868), so the minibatch updates are unrolled inside one jit and the
outer loop is Python.

    python -m jaxsal_agents.train --game minatar-breakout --steps 500000 --run-dir runs/minatar-breakout
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import functools
import json
import sys
import signal
import threading
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsal.backprop.rules import rewrite

from .checkpoint import restore_train_state, save_train_state
from .envs import make_env
from .zoo import build_model


@dataclasses.dataclass
class PQNConfig:
    game: str = "minatar-breakout"
    arch: str = "dqn"            # "dqn" (Nature CNN / MinAtar CNN) or "dueling"
    steps: int = 500_000         # total env steps (all envs together; Atari: x4 frames)
    num_envs: int = 32
    rollout: int = 32            # steps per env between updates
    minibatches: int = 4
    epochs: int = 2
    lr: float = 2.5e-4
    gamma: float = 0.99
    lam: float = 0.65
    eps_start: float = 1.0
    eps_end: float = 0.01
    eps_decay_frac: float = 0.1  # fraction of training over which epsilon decays linearly
    max_grad_norm: float = 10.0
    layer_norm: bool = True
    seed: int = 0
    run_dir: str = "runs/pqn"
    ckpt_every: int = 20         # updates between checkpoints
    time_limit: float = 0.0      # seconds; > 0 stops (after a checkpoint) when exceeded
    stop_at_steps: int = 0       # env steps; > 0 stops (after a checkpoint) once reached, the schedules keep `steps`
    target_every: int = 0        # updates between target-network syncs; 0: no target net (PQN)
    init_from: str = ""          # shipped agent name or card .json to start from when no checkpoint
    env_threads: int = 0         # EnvPool worker threads (Atari); 0: EnvPool's default
    fast_conv: bool = True       # update's strided-conv input gradients as matmuls (jaxsal.backprop.strided_conv; same math)


def reached_stop(cfg: PQNConfig, step: int) -> bool:
    """True once `step` env steps reach `cfg.stop_at_steps` (> 0): training the same schedule for a
    shorter budget, e.g. another seed to the step count a shipped card was trained for."""
    return cfg.stop_at_steps > 0 and step >= cfg.stop_at_steps


def epsilon_at(cfg: PQNConfig, step: int) -> float:
    frac = min(1.0, step / max(1.0, cfg.eps_decay_frac * cfg.steps))
    return cfg.eps_start + frac * (cfg.eps_end - cfg.eps_start)


def q_values(out):
    """Q-vector from a network output (array, or dict with key "q")."""
    return out["q"] if isinstance(out, dict) else out


def num_updates(cfg: PQNConfig) -> int:
    return cfg.steps // (cfg.num_envs * cfg.rollout)


def make_optimizer(cfg: PQNConfig):
    """RAdam with a linearly decaying learning rate and global-norm clipping (PQN defaults)."""
    grad_steps = num_updates(cfg) * cfg.epochs * cfg.minibatches
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm),
                       optax.radam(optax.linear_schedule(cfg.lr, 1e-20, max(1, grad_steps))))


def make_act(model):
    @jax.jit
    def act(params, obs, key, eps):
        q = q_values(model.apply(params, obs))
        greedy = jnp.argmax(q, -1)
        k1, k2 = jax.random.split(key)
        random = jax.random.randint(k1, greedy.shape, 0, q.shape[-1])
        explore = jax.random.uniform(k2, greedy.shape) < eps
        return jnp.where(explore, random, greedy), q.max(-1), greedy
    return act


def q_lambda_targets(rewards, dones, q_next_max, gamma, lam):
    """G_t = r_t + gamma (1 - d_t) [lam G_{t+1} + (1 - lam) max_a Q(s_{t+1})], backwards in t.

    rewards, dones, q_next_max: (T, E); q_next_max[t] = max_a Q(s_{t+1}).
    """
    def backward(g_next, xs):
        r, d, qn = xs
        g = r + gamma * (1.0 - d) * (lam * g_next + (1.0 - lam) * qn)
        return g, g

    g_last = rewards[-1] + gamma * (1.0 - dones[-1]) * q_next_max[-1]
    _, g = jax.lax.scan(backward, g_last, (rewards[:-1], dones[:-1], q_next_max[:-1]), reverse=True)
    return jnp.concatenate([g, g_last[None]], 0)


def bootstrap_values(model, params, target, obs, q_max, greedy, last_obs):
    """Value of s_{t+1} for every step (T, E): max_a Q(s', a) (PQN), or with a target network
    the Double-DQN value Q_target(s', argmax_a Q_online(s', a)); the online argmax of s_{t+1}
    is the greedy action recorded when acting (same params all rollout)."""
    last_q = q_values(model.apply(params, last_obs))
    if target is None:
        return jnp.concatenate([q_max[1:], last_q.max(-1)[None]], 0)
    next_obs = jnp.concatenate([obs[1:], last_obs[None]], 0)
    t, e = next_obs.shape[:2]
    q_t = q_values(model.apply(target, next_obs.reshape((t * e,) + next_obs.shape[2:]))).reshape(t, e, -1)
    pick = jnp.concatenate([greedy[1:], last_q.argmax(-1)[None]], 0)
    return jnp.take_along_axis(q_t, pick[..., None], -1)[..., 0]


def make_update(model, tx, cfg: PQNConfig):
    # the gradient runs through jaxsal's conv rule: XLA:CPU's transposed conv for a strided
    # conv's input gradient (the Nature CNN's conv2) is slower than the same sums as matmuls
    apply = rewrite(model.apply, "plain", fast_conv=True) if cfg.fast_conv else model.apply

    def loss_fn(params, obs, actions, targets):
        q = q_values(apply(params, obs))
        q_a = jnp.take_along_axis(q, actions[:, None], -1)[:, 0]
        return 0.5 * jnp.mean((q_a - targets) ** 2)

    @jax.jit
    def update(params, target, opt_state, key, obs, actions, rewards, dones, q_max, greedy, last_obs):
        q_next_max = bootstrap_values(model, params, target, obs, q_max, greedy, last_obs)
        targets = q_lambda_targets(rewards, dones, q_next_max, cfg.gamma, cfg.lam)
        n = obs.shape[0] * obs.shape[1]
        flat = (obs.reshape((n,) + obs.shape[2:]), actions.reshape(n), targets.reshape(n))
        mb = n // cfg.minibatches
        losses = []
        for _ in range(cfg.epochs):                      # unrolled on purpose (CPU trap)
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


def initial_state(cfg: PQNConfig, model, tx, obs_shape) -> dict:
    """Fresh training state (the template a checkpoint restores into): params, optimiser,
    RNG key, counters, and the target network's params when `cfg.target_every` > 0."""
    key, init_key = jax.random.split(jax.random.PRNGKey(cfg.seed))
    params = model.init(init_key, jnp.zeros((1,) + tuple(obs_shape), jnp.float32))
    state = {"params": params, "opt_state": tx.init(params), "key": key, "step": 0, "update": 0}
    if cfg.target_every:
        state["target"] = params
    return state


def warm_start(cfg: PQNConfig, state: dict, log) -> dict:
    """Start from exported parameters (a shipped name or card) when the checkpoint is gone:
    params and counters come back from the card; the optimiser state starts afresh."""
    from .zoo import load

    agent = load(cfg.init_from)
    params = jax.tree.map(jnp.asarray, agent.params)
    step = int(agent.card.get("env_steps_trained", 0))
    upd = step // (cfg.num_envs * cfg.rollout)
    log(f"warm start from {cfg.init_from} ({step} env steps, update {upd}); optimiser state is new")
    state = dict(state, params=params, step=step, update=upd)
    if "target" in state:
        state["target"] = params
    return state


class StopRequest:
    """SIGTERM/SIGINT ask the loop to stop after the current update, with a checkpoint, so a
    killed session loses nothing (handlers only in the main thread; restored on exit)."""

    def __init__(self):
        self.requested, self._old = False, {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.requested:  # a second signal: stop now
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def train(cfg: PQNConfig, log=print, callback=None, env_fn=None, model=None) -> dict:
    """Train (or resume) a PQN agent. Optional hooks, all None by default: `callback(step=,
    update=, params=, apply_fn=, returns=)` after every update (e.g. saliency snapshots);
    `env_fn(game, num_envs, train=, seed=)` replaces make_env; `model` replaces build_model."""
    if env_fn is None:
        env_fn = functools.partial(make_env, **({"num_threads": cfg.env_threads} if cfg.env_threads else {}))
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1))
    env = env_fn(cfg.game, cfg.num_envs, train=True, seed=cfg.seed)
    model = model if model is not None else build_model(cfg.game, cfg.arch, env.num_actions,
                                                        layer_norm=cfg.layer_norm)
    n_updates = num_updates(cfg)
    tx = make_optimizer(cfg)
    state = restore_train_state(run_dir / "ckpt", initial_state(cfg, model, tx, env.obs_shape))
    if state["update"]:
        log(f"resumed {cfg.game} at update {state['update']} (step {state['step']})")
    elif cfg.init_from:
        state = warm_start(cfg, state, log)
    if state["update"]:  # fresh env seeds, so a resumed run does not replay the same games
        env = env_fn(cfg.game, cfg.num_envs, train=True, seed=cfg.seed + 1000 * state["update"])

    act, update = make_act(model), make_update(model, tx, cfg)
    params, opt_state, key = state["params"], state["opt_state"], state["key"]
    target = state.get("target")
    step, upd = int(state["step"]), int(state["update"])
    csv_path = run_dir / "returns.csv"
    new_csv = not csv_path.exists()
    csv_file = open(csv_path, "a", newline="")
    writer = csv.writer(csv_file)
    if new_csv:
        writer.writerow(["step", "return", "wall_s"])
    obs = env.reset()
    t0, recent = time.time(), []
    # wall seconds per phase, from the end of this process's first update (which compiles)
    clock, t_steady, steady_step, first_upd = {"act": 0.0, "env": 0.0, "update": 0.0}, t0, step, upd
    with StopRequest() as stop:
        while upd < n_updates and not reached_stop(cfg, step):
            buf = {k: [] for k in ("obs", "actions", "rewards", "dones", "q_max", "greedy")}
            for _ in range(cfg.rollout):
                key, sub = jax.random.split(key)
                tick = time.perf_counter()
                actions, q_max, greedy = act(params, obs, sub, epsilon_at(cfg, step))
                actions = np.asarray(actions)
                tock = time.perf_counter()
                next_obs, reward, done, finished = env.step(actions)
                clock["act"] += tock - tick
                clock["env"] += time.perf_counter() - tock
                for k, v in zip(buf, (obs, actions, reward, done, q_max, greedy)):
                    buf[k].append(v)
                for ret in finished:
                    writer.writerow([step, ret, round(time.time() - t0, 1)])
                    recent.append(ret)
                obs, step = next_obs, step + cfg.num_envs
            key, sub = jax.random.split(key)
            tick = time.perf_counter()
            params, opt_state, loss = update(params, target, opt_state, sub,
                                             *(jnp.asarray(np.stack(buf[k])) for k in buf), obs)
            loss.block_until_ready()
            clock["update"] += time.perf_counter() - tick
            upd += 1
            if upd == first_upd + 1:
                clock, t_steady, steady_step = dict.fromkeys(clock, 0.0), time.time(), step
            if target is not None and upd % cfg.target_every == 0:
                target = params
            if callback is not None:
                callback(step=step, update=upd, params=params, apply_fn=model.apply, returns=recent)
            out_of_time = cfg.time_limit > 0 and time.time() - t0 > cfg.time_limit
            at_stop = reached_stop(cfg, step)
            if upd % cfg.ckpt_every == 0 or upd == n_updates or at_stop or out_of_time or stop.requested:
                csv_file.flush()
                saved = {"params": params, "opt_state": opt_state, "key": key, "step": step, "update": upd}
                if target is not None:
                    saved["target"] = target
                save_train_state(run_dir / "ckpt", saved)
                mean_ret = float(np.mean(recent[-20:])) if recent else float("nan")
                wall = max(1e-9, time.time() - t_steady)
                log(f"{cfg.game} update {upd}/{n_updates} step {step} eps {epsilon_at(cfg, step):.3f} "
                    f"loss {float(loss):.4f} return(last20) {mean_ret:.2f} "
                    f"{(step - steady_step) / wall:.0f} steps/s (act {clock['act'] / wall:.0%}, "
                    f"env {clock['env'] / wall:.0%}, update {clock['update'] / wall:.0%})")
                if at_stop:
                    log(f"stopped at update {upd} (step {step}) with a checkpoint: --stop-at-steps "
                        f"{cfg.stop_at_steps} reached (the schedules run to --steps {cfg.steps})")
                    break
                if out_of_time or stop.requested:
                    log(f"stopped at update {upd} (step {step}) with a checkpoint "
                        f"({'time limit' if out_of_time else 'signal'}); rerun the same command to resume")
                    break
    csv_file.close()
    steady = max(1e-9, time.time() - t_steady)
    return {"params": params, "model": model, "step": step, "returns": recent,
            "steady": {"seconds": steady, "steps": step - steady_step,
                       "steps_per_s": (step - steady_step) / steady,
                       "share": {k: v / steady for k, v in clock.items()}}}


def parse_config(cls, argv, doc: str, snapshots: bool = True, extra=None):
    """A dataclass config (PQNConfig/PPOConfig/...) from command-line flags, plus the snapshot flags
    (--snapshot-every, --tensorboard) as a dict for `snapshot_callback` (`snapshots=False`: none;
    `extra(parser)` adds more flags, returned in the dict)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        if f.type == "bool" or isinstance(f.default, bool):
            parser.add_argument(flag, type=lambda s: s.lower() in ("1", "true", "yes"), default=f.default)
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default)
    if extra is not None:
        extra(parser)
    if not snapshots:
        args = vars(parser.parse_args(argv))
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in args.items() if k in names}), {k: v for k, v in args.items() if k not in names}
    parser.add_argument("--snapshot-every", type=int, default=0,
                        help="updates between saliency snapshots in RUN_DIR/snapshots (jaxsal_agents.snapshots); 0: off")
    parser.add_argument("--tensorboard", action="store_true",
                        help="also write the snapshots' maps and statistics and the return curve to TensorBoard "
                             "(RUN_DIR/snapshots/tensorboard; needs pip install 'jaxsal[tensorboard]')")
    args = vars(parser.parse_args(argv))
    snap = {"every": args.pop("snapshot_every"), "tensorboard": args.pop("tensorboard")}
    if snap["tensorboard"] and snap["every"] < 1:
        parser.error("--tensorboard logs the saliency snapshots: add --snapshot-every N (updates between them)")
    return cls(**args), snap


def snapshot_callback(cfg, snap: dict, target="q_chosen"):
    """The SaliencySnapshots callback the snapshot flags ask for (jaxsal_agents.snapshots.for_run), or None."""
    if not snap["every"]:
        return None
    from .snapshots import for_run
    return for_run(cfg.game, cfg.run_dir, snap["every"], seed=cfg.seed, target=target,
                   tensorboard=snap["tensorboard"] or None)


def main(argv=None):
    import jaxsal.cpu
    jaxsal.cpu.use_fast_kernels()  # XLA:CPU's YNNPACK kernels: ~2.5x faster updates here
    cfg, snap = parse_config(PQNConfig, argv, __doc__)
    callback = snapshot_callback(cfg, snap)
    train(cfg, log=lambda m: print(m, flush=True), callback=callback)
    if callback is not None:
        callback.close()


if __name__ == "__main__":
    sys.exit(main())
