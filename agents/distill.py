"""Policy distillation (Rusu et al. 2016) on DAgger data: a student network learns a trained
teacher's Q-values on the states its own play reaches.

Why: Paper A's split-attention agent (10 frames through one CNN, four bidirectional LSTMs of 512,
18.5M parameters) costs about 25x the Nature CNN's multiply-adds per state, too slow to learn Breakout from reward on
2 CPU cores. The shipped `breakout` DQN already plays, so the student regresses its Q-values.
Readable top to bottom: config -> loss -> update -> behaviour policy -> loop -> export.

- Loss: mean squared error to the teacher's Q (keeps Q's scale, so Q, V and A stay meaningful for
  saliency) plus `kl_weight * tau * KL(softmax(q_T / tau) || softmax(q_S / tau))`, which weighs the
  ranking of the actions (what decides play); both are minimal exactly at q_S = q_T.
- Data (DAgger, Ross et al. 2011): every env follows the teacher with probability beta (1 at the
  start, falling linearly to 0 over `teacher_frac` of the run), else the student; both explore with
  `epsilon`. Every state is labelled with the teacher's Q and kept in a replay buffer of the
  newest `buffer` states. The student sees the teacher's frames as its last `teacher frames` slots.
- Environment: the evaluation env (full games, all lives, unclipped rewards), so the logged returns
  of the student's games are the protocol's returns (with `epsilon` exploration).
- Resumable: an orbax checkpoint (params, optimiser, key, counters) every `ckpt_every` updates and on
  SIGTERM; the buffer is not saved (2.8 GB) and refills from the current student on a restart.

    python -m jaxsal_agents.distill --teacher breakout --arch split-attention \
        --run-dir $HOME/jaxsal-runs/breakout-split-attention --time-limit 3600
    python -m jaxsal_agents.distill --run-dir $HOME/jaxsal-runs/breakout-split-attention \
        --export breakout-split-attention       # evaluate 30 games, write float16 params + card
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

from .checkpoint import export_params, restore_train_state, save_train_state
from .envs import MINATAR_GAMES, make_env
from .train import StopRequest, parse_config, q_values
from .zoo import build_model, load


@dataclasses.dataclass
class DistillConfig:
    teacher: str = "breakout"     # shipped agent (or card .json) whose Q-values are learned
    arch: str = "split_attention"  # student architecture (jaxsal_agents.zoo.build_model)
    frames: int = 10              # frames per student state (Atari); the teacher reads the newest ones
    steps: int = 200_000          # env steps collected (all envs together)
    num_envs: int = 16
    collect: int = 4              # env steps per env between updates
    updates: int = 4              # gradient steps per collection (each on `batch` states)
    batch: int = 32
    buffer: int = 40_000          # newest states kept (uint8; 70 KB each at 84x84x10)
    warmup: int = 2_000           # states in the buffer before the first update
    lr: float = 1e-4
    max_grad_norm: float = 10.0
    tau: float = 0.02             # temperature of the ranking term (Breakout teacher: median top-2 gap 0.06)
    kl_weight: float = 1.0
    teacher_frac: float = 0.2     # fraction of `steps` over which beta falls from 1 to 0
    epsilon: float = 0.05
    seed: int = 0
    run_dir: str = "runs/distill"
    ckpt_every: int = 100
    time_limit: float = 0.0
    init_from: str = ""           # shipped student (name or card) to start from when no checkpoint


def beta_at(cfg: DistillConfig, step: int) -> float:
    """Probability that an env follows the teacher at `step` (DAgger's mixing weight)."""
    return max(0.0, 1.0 - step / max(1.0, cfg.teacher_frac * cfg.steps))


def distill_loss(q_student, q_teacher, tau: float, kl_weight: float):
    """(loss, parts): MSE to the teacher's Q plus kl_weight * tau * KL of the tempered softmaxes."""
    mse = jnp.mean((q_student - q_teacher) ** 2)
    p_t = jax.nn.softmax(q_teacher / tau, -1)
    kl = jnp.mean(jnp.sum(p_t * (jax.nn.log_softmax(q_teacher / tau, -1) - jax.nn.log_softmax(q_student / tau, -1)), -1))
    agree = jnp.mean(jnp.argmax(q_student, -1) == jnp.argmax(q_teacher, -1))
    return mse + kl_weight * tau * kl, {"mse": mse, "kl": kl, "agreement": agree}


def make_update(model, tx, cfg: DistillConfig):
    @jax.jit
    def update(params, opt_state, obs, q_teacher):
        def loss_fn(p):
            return distill_loss(q_values(model.apply(p, obs)), q_teacher, cfg.tau, cfg.kl_weight)
        (loss, parts), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, dict(parts, loss=loss)
    return update


def make_behaviour(model, teacher_apply, teacher_frames: int):
    """act(params, teacher_params, obs, key, beta, eps) -> (actions, teacher Q): per env the
    teacher's or the student's greedy action, replaced by a random one with probability eps."""
    def teacher_q(tp, obs):
        return q_values(teacher_apply(tp, obs[..., -teacher_frames:]))

    @jax.jit
    def teacher_only(tp, obs, key, eps):
        q_t = teacher_q(tp, obs)
        return _explore(jnp.argmax(q_t, -1), q_t.shape[-1], key, eps), q_t

    @jax.jit
    def mixed(params, tp, obs, key, beta, eps):
        q_t = teacher_q(tp, obs)
        greedy_s = jnp.argmax(q_values(model.apply(params, obs)), -1)
        k1, k2 = jax.random.split(key)
        follow = jax.random.uniform(k1, greedy_s.shape) < beta
        return _explore(jnp.where(follow, jnp.argmax(q_t, -1), greedy_s), q_t.shape[-1], k2, eps), q_t

    def act(params, tp, obs, key, beta, eps):
        return teacher_only(tp, obs, key, eps) if beta >= 1.0 else mixed(params, tp, obs, key, beta, eps)
    return act


def _explore(greedy, num_actions, key, eps):
    k1, k2 = jax.random.split(key)
    random = jax.random.randint(k1, greedy.shape, 0, num_actions)
    return jnp.where(jax.random.uniform(k2, greedy.shape) < eps, random, greedy)


class Buffer:
    """Ring buffer of the newest `capacity` (state, teacher Q) pairs, on the host."""

    def __init__(self, capacity: int, obs_shape, obs_dtype, num_actions: int):
        self.obs = np.zeros((capacity,) + tuple(obs_shape), obs_dtype)
        self.q = np.zeros((capacity, num_actions), np.float32)
        self.capacity, self.size, self.next = capacity, 0, 0

    def add(self, obs, q):
        idx = (self.next + np.arange(len(obs))) % self.capacity
        self.obs[idx], self.q[idx] = obs, q
        self.next = int((self.next + len(obs)) % self.capacity)
        self.size = min(self.capacity, self.size + len(obs))

    def sample(self, rng: np.random.Generator, n: int):
        idx = rng.integers(0, self.size, n)
        return self.obs[idx], self.q[idx]


def student_env(cfg: DistillConfig, teacher, num_envs: int, seed: int):
    """The evaluation env of the teacher's game with `cfg.frames` frames per state (Atari)."""
    if teacher.game in MINATAR_GAMES:
        return make_env(teacher.game, num_envs, train=False, seed=seed)
    return make_env(teacher.game, num_envs, train=False, seed=seed, frame_stack=cfg.frames)


def initial_state(cfg: DistillConfig, model, tx, obs_shape) -> dict:
    key, init_key = jax.random.split(jax.random.PRNGKey(cfg.seed))
    params = model.init(init_key, jnp.zeros((1,) + tuple(obs_shape), jnp.float32))
    return {"params": params, "opt_state": tx.init(params), "key": key, "step": 0, "update": 0}


def make_optimizer(cfg: DistillConfig):
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.lr))


def distill(cfg: DistillConfig, log=print, env_fn=None, model=None, teacher=None) -> dict:
    """Distil (or resume distilling) `cfg.teacher` into a student. Hooks for tests: `env_fn(cfg,
    teacher, num_envs, seed)` replaces `student_env`, `model` the student, `teacher` the loaded agent."""
    teacher = teacher if teacher is not None else load(cfg.teacher)
    env_fn = env_fn or student_env
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1))
    env = env_fn(cfg, teacher, cfg.num_envs, cfg.seed)
    t_frames = teacher.card["obs_shape"][-1]
    if env.obs_shape[-1] < t_frames:
        raise SystemExit(f"the student sees {env.obs_shape[-1]} frames, fewer than the teacher's {t_frames}: "
                         f"use --frames {t_frames} or more")
    model = model if model is not None else build_model(teacher.game, cfg.arch, env.num_actions)
    tx = make_optimizer(cfg)
    state = restore_train_state(run_dir / "ckpt", initial_state(cfg, model, tx, env.obs_shape))
    if state["update"]:
        log(f"resumed at update {state['update']} (step {state['step']}); the buffer refills first")
        env = env_fn(cfg, teacher, cfg.num_envs, cfg.seed + 1000 * state["update"])
    elif cfg.init_from:
        warm = load(cfg.init_from)
        state = dict(state, params=jax.tree.map(jnp.asarray, warm.params),
                     step=int(warm.card.get("env_steps_trained", 0)))
        log(f"warm start from {cfg.init_from} (step {state['step']}); optimiser state is new")

    act = make_behaviour(model, teacher.apply_fn, t_frames)
    update = make_update(model, tx, cfg)
    params, opt_state, key = state["params"], state["opt_state"], state["key"]
    step, upd = int(state["step"]), int(state["update"])
    rng = np.random.default_rng([cfg.seed, upd])
    obs = env.reset()
    buf = Buffer(cfg.buffer, env.obs_shape, obs.dtype, env.num_actions)
    csv_path = run_dir / "returns.csv"
    new_csv = not csv_path.exists()
    csv_file = open(csv_path, "a", newline="")
    writer = csv.writer(csv_file)
    if new_csv:
        writer.writerow(["step", "return", "wall_s", "student_share"])
    t0, step0, recent, parts = time.time(), step, [], {}
    with StopRequest() as stop:
        while step < cfg.steps:
            for _ in range(cfg.collect):
                key, sub = jax.random.split(key)
                beta = beta_at(cfg, step)
                actions, q_t = act(params, teacher.params, jnp.asarray(obs), sub, beta, cfg.epsilon)
                buf.add(obs, np.asarray(q_t))
                obs, _, _, finished = env.step(np.asarray(actions))
                for ret in finished:
                    writer.writerow([step, ret, round(time.time() - t0, 1), round(1.0 - beta, 3)])
                    recent.append((ret, 1.0 - beta))
                step += cfg.num_envs
            if buf.size < min(cfg.warmup, cfg.buffer):
                continue
            for _ in range(cfg.updates):
                o, q = buf.sample(rng, cfg.batch)
                params, opt_state, parts = update(params, opt_state, jnp.asarray(o), jnp.asarray(q))
            upd += 1
            out_of_time = cfg.time_limit > 0 and time.time() - t0 > cfg.time_limit
            if upd % cfg.ckpt_every == 0 or step >= cfg.steps or out_of_time or stop.requested:
                csv_file.flush()
                save_train_state(run_dir / "ckpt", {"params": params, "opt_state": opt_state, "key": key,
                                                    "step": step, "update": upd})
                own = [r for r, share in recent[-40:] if share >= 1.0]
                log(f"update {upd} step {step} beta {beta_at(cfg, step):.2f} loss {float(parts['loss']):.4f} "
                    f"mse {float(parts['mse']):.4f} agreement {float(parts['agreement']):.2f} "
                    f"student-only games (last 40) {np.mean(own) if own else float('nan'):.1f} "
                    f"{(step - step0) / max(1e-9, time.time() - t0):.0f} steps/s since start")
                if out_of_time or stop.requested:
                    log(f"stopped at update {upd} (step {step}) with a checkpoint; rerun the same command to resume")
                    break
    csv_file.close()
    return {"params": params, "model": model, "step": step, "update": upd, "returns": recent}


def export(run_dir, name: str, out_dir, episodes: int = 30, curves_dir=None) -> dict:
    """Evaluate the run's student (float16-rounded, as users get it) and write params + card."""
    from .evaluate import evaluate_agent
    from .export import write_card

    run_dir = Path(run_dir)
    cfg = DistillConfig(**json.loads((run_dir / "config.json").read_text()))
    teacher = load(cfg.teacher)
    env = student_env(cfg, teacher, 1, 0)
    model = build_model(teacher.game, cfg.arch, env.num_actions)
    state = restore_train_state(run_dir / "ckpt", initial_state(cfg, model, make_optimizer(cfg), env.obs_shape))
    if not state["update"]:
        raise SystemExit(f"no checkpoint in {run_dir / 'ckpt'}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sha = export_params(out_dir / f"{name}.msgpack", state["params"])
    card = {"name": name, "game": teacher.game, "arch": cfg.arch, "layer_norm": True,
            "num_actions": env.num_actions, "obs_shape": list(env.obs_shape)}
    (out_dir / f"{name}.json").write_text(json.dumps(card))
    result = evaluate_agent(load(str(out_dir / f"{name}.json")), episodes=episodes)
    frames_per_step = 1 if teacher.game in MINATAR_GAMES else 4
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in dataclasses.asdict(cfg).items()
                     if k not in ("time_limit", "run_dir") and v != "")
    card.update({
        "algorithm": f"policy distillation (Rusu et al. 2016) of `{cfg.teacher}` on DAgger data "
                     f"(MSE to its Q + tempered KL, tau {cfg.tau}); not trained from reward",
        "teacher": cfg.teacher, "teacher_return": teacher.card.get("eval", {}).get("mean_return"),
        "env_steps_trained": int(state["step"]), "frames_trained": int(state["step"]) * frames_per_step,
        "gradient_steps": int(state["update"]) * cfg.updates, "eval": result,
        "trained_with": f"python -m jaxsal_agents.distill {flags}",
        "params_sha256": sha, "dtype": "float16",
    })
    return write_card(card, out_dir, run_dir,
                      f"{name}: distillation (DAgger play, eps {cfg.epsilon})", curves_dir)


def main(argv=None):
    import jaxsal.cpu
    jaxsal.cpu.use_fast_kernels()

    def extra(p):
        p.add_argument("--export", metavar="NAME", help="evaluate the run's student and ship it as NAME")
        p.add_argument("--episodes", type=int, default=30, help="games for --export's evaluation")
        p.add_argument("--out-dir", default=None, help="where --export writes the params and card (required)")
        p.add_argument("--curves-dir", default=None, help="where --export's training curve goes (default: beside the card)")
    cfg, more = parse_config(DistillConfig, argv, __doc__, snapshots=False, extra=extra)
    if more["export"]:
        if not more["out_dir"]:
            raise SystemExit("--export needs --out-dir (e.g. agents/shipped from a checkout)")
        card = export(cfg.run_dir, more["export"], more["out_dir"], episodes=more["episodes"],
                      curves_dir=more["curves_dir"])
        e = card["eval"]
        print(f"{card['name']}: {e['mean_return']:.1f} ± {e['std_return']:.1f} (95% CI {e['ci95'][0]:.1f} to "
              f"{e['ci95'][1]:.1f}) over {e['episodes']} games")
        return
    cfg = dataclasses.replace(cfg, arch=cfg.arch.replace("-", "_"))
    distill(cfg, log=lambda m: print(m, flush=True))

if __name__ == "__main__":
    sys.exit(main())
