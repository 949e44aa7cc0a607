"""Replay DDDQN (Paper A's agent, Rosynski et al. 2020): dueling network, target network,
Double-DQN target, uniform replay of stacked transitions, epsilon-greedy exploration.

Readable top to bottom: config -> network -> replay buffer -> stored transitions -> transition
bugs (replay-specific bugs in the sampled transitions, with a severity) -> Double-DQN target ->
update -> loop.

One update (the unit of agents.train's PQN update, so the snapshot and checkpoint schedules of
experiments.* carry over): `rollout` steps of all `num_envs` vectorised envs, their transitions
stored in the replay buffer; then, once `learning_starts` env steps are stored, `grad_steps`
gradient steps, each on `batch_size` transitions drawn uniformly (with replacement) from the
buffer; the target network is a copy of the online one, synced after every `target_every`-th
update. The loss is the Huber loss between Q(s, a) and the Double-DQN target
r + gamma (1 - done) Q_target(s', argmax_a' Q_online(s', a')).

Environments: any of agents.envs (MinAtar via gymnax, Atari via EnvPool) or, with `frames` > 0,
host-stacked frames through agents.framestack (with its frame-stack bug `stack_bug` and, for
MinAtar Breakout, `drop_trail`: the setting of the pre-registered MinAtar frame-stack study).

Resumable: an orbax checkpoint (params, target, optimiser state, RNG key, counters, the whole
replay buffer, and the envs' own state where they expose one: gymnax MinAtar, also stacked) every
`ckpt_every` updates; returns.csv is cut back to the checkpoint on resume. With a gymnax env a
resumed run continues exactly as the uninterrupted one would have (tests/agents/test_train_dqn.py);
envs without get_state (EnvPool) restart with fresh seeds, as agents.train does. CPU note as in
agents.train: the gradient steps are unrolled inside one jit (conv gradients inside lax.scan are
slow on XLA:CPU, jax-ml/jax#12868); the replay buffer lives in JAX arrays and is updated in place
(donated) by a jitted ring-buffer write.

    python -m jaxsal_agents.train_dqn --game minatar-breakout --frames 4 --drop-trail true \\
        --steps 100000 --run-dir runs/dddqn-minatar
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxsal.backprop.rules import rewrite

from .checkpoint import restore_train_state, save_train_state
from .envs import is_minatar, make_env
from .errors import AgentInputError
from .train import StopRequest, epsilon_at, make_act, parse_config, q_values

# bugs in the sampled transitions (corrupt_batch; frame-stack bugs of the env: agents.framestack)
TRANSITION_BUGS = ("misassembled", "cross_episode", "done_late", "reward_late", "neighbour_next")


@dataclasses.dataclass
class DQNConfig:
    game: str = "minatar-breakout"
    arch: str = "dueling"        # "dueling" (Q = V + A - mean A) or "dqn" (plain Q head)
    steps: int = 100_000         # total env steps (all envs together)
    num_envs: int = 16
    rollout: int = 8             # steps per env between updates
    buffer_size: int = 50_000    # replay capacity in transitions (ring buffer, oldest overwritten)
    batch_size: int = 64
    grad_steps: int = 2          # gradient steps per update
    learning_starts: int = 2_000  # env steps stored before the first gradient step
    lr: float = 1e-3             # Adam, constant
    gamma: float = 0.99
    target_every: int = 4        # updates between target-network syncs
    eps_start: float = 1.0
    eps_end: float = 0.01
    eps_decay_frac: float = 0.2  # fraction of training over which epsilon decays linearly
    huber_delta: float = 1.0
    max_grad_norm: float = 10.0
    layer_norm: bool = True
    frames: int = 0              # > 0: host-stack this many frames (agents.framestack); 0: the env's own frames
    drop_trail: bool = False     # with frames: drop MinAtar Breakout's trail channel
    stack_bug: str = ""          # with frames: a frame-stack bug of agents.framestack.BUGS
    transition_bug: str = ""     # "" or one of TRANSITION_BUGS (in the sampled transitions, corrupt_batch)
    transition_bug_p: float = 1.0  # the bug's severity: the fraction of sampled transitions it corrupts
    seed: int = 0
    run_dir: str = "runs/dddqn"
    ckpt_every: int = 32         # updates between checkpoints
    time_limit: float = 0.0      # seconds; > 0 stops (after a checkpoint) when exceeded
    fast_conv: bool = True       # strided-conv input gradients as matmuls (jaxsal.backprop.strided_conv; same math)


def check_transition_bug(bug) -> str | None:
    if bug in (None, "", "none", "correct"):
        return None
    if bug not in TRANSITION_BUGS:
        raise AgentInputError(f"unknown transition bug {bug!r}; choose None or one of {TRANSITION_BUGS}")
    return bug


def check_severity(p) -> float:
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise AgentInputError(f"transition_bug_p is a fraction of sampled transitions in [0, 1], got {p}")
    return p


def num_updates(cfg: DQNConfig) -> int:
    return cfg.steps // (cfg.num_envs * cfg.rollout)


def default_env_fn(cfg: DQNConfig):
    """make_env, or with `cfg.frames` > 0 agents.framestack's host-stacked env (with its bug)."""
    if cfg.frames:
        from .framestack import make_stacked_env
        return functools.partial(make_stacked_env, num_frames=cfg.frames, bug=cfg.stack_bug or None,
                                 drop_trail=cfg.drop_trail)
    if cfg.stack_bug or cfg.drop_trail:
        raise AgentInputError("stack_bug and drop_trail need a host frame stack: set frames (e.g. 4)")
    return make_env


# --- network ---------------------------------------------------------------------------------

def build_dqn_model(cfg: DQNConfig, num_actions: int, obs_shape):
    """MinAtar: the one-conv trunk with the dueling head (networks.MinAtarDuelingDQN) or a plain
    Q head (networks.MinAtarDQN), for the env's channel count; Atari: agents.zoo's Nature CNNs."""
    from . import networks
    from .zoo import build_model

    if is_minatar(cfg.game):
        cls = {"dueling": networks.MinAtarDuelingDQN, "dqn": networks.MinAtarDQN}.get(cfg.arch)
        if cls is None:
            raise AgentInputError(f"the DQN trainer's MinAtar archs are 'dueling' and 'dqn', got {cfg.arch!r}")
        return cls(num_actions, obs_shape[-1], layer_norm=cfg.layer_norm)
    return build_model(cfg.game, cfg.arch, num_actions, layer_norm=cfg.layer_norm)


def make_optimizer(cfg: DQNConfig):
    return optax.chain(optax.clip_by_global_norm(cfg.max_grad_norm), optax.adam(cfg.lr))


# --- replay buffer: a jitted ring buffer of transitions ---------------------------------------

def buffer_init(capacity: int, example: dict) -> dict:
    """An empty buffer for `capacity` items shaped like one row of `example` {name: (n, ...)}."""
    data = {k: jnp.zeros((capacity,) + np.shape(v)[1:], np.asarray(v).dtype) for k, v in example.items()}
    return {"data": data, "pos": jnp.zeros((), jnp.int32), "size": jnp.zeros((), jnp.int32)}


@functools.partial(jax.jit, donate_argnums=0)
def buffer_add(buffer: dict, batch: dict) -> dict:
    """Write the n rows of `batch` at the ring position (wrapping around, oldest overwritten).
    The buffer is donated: updated in place, the old one is invalid afterwards."""
    capacity = next(iter(buffer["data"].values())).shape[0]
    n = next(iter(batch.values())).shape[0]
    if n > capacity:
        raise AgentInputError(f"adding {n} transitions at once to a buffer of {capacity}")
    idx = (buffer["pos"] + jnp.arange(n)) % capacity
    data = {k: buffer["data"][k].at[idx].set(jnp.asarray(batch[k], buffer["data"][k].dtype)) for k in buffer["data"]}
    return {"data": data, "pos": (buffer["pos"] + n) % capacity, "size": jnp.minimum(buffer["size"] + n, capacity)}


def buffer_indices(buffer: dict, key, batch_size: int):
    """`batch_size` row indices drawn uniformly, with replacement, from the filled part of the buffer."""
    return jax.random.randint(key, (batch_size,), 0, jnp.maximum(buffer["size"], 1))


def buffer_sample(buffer: dict, key, batch_size: int) -> dict:
    """`batch_size` items drawn uniformly, with replacement, from the filled part of the buffer."""
    idx = buffer_indices(buffer, key, batch_size)
    return {k: v[idx] for k, v in buffer["data"].items()}


# --- stored transitions ------------------------------------------------------------------------

OBS_DTYPE = np.uint8   # stacks are stored as uint8 (MinAtar 0/1 grids, Atari 0-255 pixels): exact


def transitions(obs, actions, rewards, dones, next_obs) -> dict:
    """A rollout's (T, E, ...) arrays as T*E transitions to store, time-major (row t * E + e).

    (s_t, a_t, r_t, d_t, s_{t+1}) with s_{t+1} the stack the env returned after a_t (at a game's
    end the next game's first stack, which d_t masks out of the target). The buffer always holds
    correct transitions; a transition bug corrupts what is sampled from it (corrupt_batch)."""
    def flat(x, dtype):
        x = np.asarray(x)
        return x.reshape((-1,) + x.shape[2:]).astype(dtype, copy=False)

    return {"obs": flat(obs, OBS_DTYPE), "action": flat(actions, np.int32), "reward": flat(rewards, np.float32),
            "done": flat(dones, np.float32), "next_obs": flat(next_obs, OBS_DTYPE)}


def check_storable(obs) -> None:
    """The stacks must be exact in OBS_DTYPE (integers 0-255)."""
    obs = np.asarray(obs)
    if not np.array_equal(obs, obs.astype(OBS_DTYPE)):
        raise AgentInputError(f"observations must be integers in 0..255 to be stored as {OBS_DTYPE.__name__}")


# --- transition bugs: what a replay implementation gets wrong when it assembles a sampled batch -

def _restack(x, idx, num_envs: int, frames: int):
    """The stacks of rows `idx` rebuilt from the newest frame of the same env's previous rows
    (row - a * num_envs holds age a), ignoring episode ends: a frame-indexed replay buffer that
    assembles stacks across game boundaries."""
    cap, c = x.shape[0], x.shape[-1] // frames
    slots = [x[(idx - age * num_envs) % cap][..., -c:] for age in range(frames - 1, -1, -1)]   # oldest first
    return jnp.concatenate(slots, -1)


def corrupt_batch(data: dict, idx, batch: dict, key, bug: str, p: float, num_envs: int, frames: int = 0) -> dict:
    """The sampled `batch` (rows `idx` of the buffer's `data`) with transition `bug` applied to each
    transition independently with probability `p` (pure, jit-compatible; p = 0 returns `batch`).

    Rows are time-major (row t * num_envs + e, the ring wrapping at a multiple of num_envs), so the
    same env's previous step is row - num_envs and its neighbour env's row at the same step is
    row - e + (e + 1) % num_envs. The bugs (each touches only the named fields):
    - misassembled: next state = the state (assembled at step t instead of t+1): (s_t, a_t, r_t, d_t, s_t);
    - cross_episode: state and next-state stacks rebuilt from the previous rows' newest frames
      without stopping at a game's end, so a game's first frames-1 stacks hold the previous game's frames;
    - done_late: done = the previous step's done (one step late: the game's last transition is
      bootstrapped, the next game's first is cut);
    - reward_late: reward = the previous step's reward (shifted one step);
    - neighbour_next: next state = the neighbouring env's next state at the same step.
    The rows older than the buffer's oldest (the first steps of a run, or past the ring's write
    position) read whatever that row holds, as such a buffer would."""
    cap = data["obs"].shape[0]
    prev = (idx - num_envs) % cap
    if bug == "misassembled":
        new = {"next_obs": batch["obs"]}
    elif bug == "cross_episode":
        new = {"obs": _restack(data["obs"], idx, num_envs, frames),
               "next_obs": _restack(data["next_obs"], idx, num_envs, frames)}
    elif bug == "done_late":
        new = {"done": data["done"][prev]}
    elif bug == "reward_late":
        new = {"reward": data["reward"][prev]}
    elif bug == "neighbour_next":
        e = idx % num_envs
        new = {"next_obs": data["next_obs"][idx - e + (e + 1) % num_envs]}
    else:
        raise AgentInputError(f"unknown transition bug {bug!r}; choose one of {TRANSITION_BUGS}")
    hit = jax.random.uniform(key, idx.shape) < p

    def pick(k, v):
        if k not in new:
            return v
        return jnp.where(hit.reshape(hit.shape + (1,) * (v.ndim - 1)), new[k], v)
    return {k: pick(k, v) for k, v in batch.items()}


def check_bug_layout(cfg: DQNConfig, bug: str | None, obs_shape) -> None:
    """The bugs that read other rows need the ring to wrap at whole steps; cross_episode a host stack."""
    if bug in (None, "misassembled"):
        return
    if cfg.buffer_size % cfg.num_envs:
        raise AgentInputError(f"transition bug {bug!r} needs buffer_size a multiple of num_envs "
                              f"({cfg.buffer_size} % {cfg.num_envs} != 0)")
    if bug == "cross_episode" and (not cfg.frames or obs_shape[-1] % cfg.frames):
        raise AgentInputError("transition bug 'cross_episode' rebuilds host stacks: set frames (e.g. 4)")


# --- Double-DQN target and the update ---------------------------------------------------------

def double_dqn_targets(q_next_online, q_next_target, rewards, dones, gamma):
    """y = r + gamma (1 - d) Q_target(s', argmax_a Q_online(s', a)); q_* are (B, A)."""
    a_star = jnp.argmax(q_next_online, -1)
    v_next = jnp.take_along_axis(q_next_target, a_star[:, None], -1)[:, 0]
    return rewards + gamma * (1.0 - dones) * v_next


def dqn_targets(model, params, target, batch: dict, gamma: float):
    """The Double-DQN targets of a batch of stored transitions (online net picks, target net values)."""
    nxt = batch["next_obs"].astype(jnp.float32)
    return double_dqn_targets(q_values(model.apply(params, nxt)), q_values(model.apply(target, nxt)),
                              batch["reward"], batch["done"], gamma)


def make_update(model, tx, cfg: DQNConfig):
    apply = rewrite(model.apply, "plain", fast_conv=True) if cfg.fast_conv else model.apply

    def loss_fn(params, batch, y):
        q = q_values(apply(params, batch["obs"].astype(jnp.float32)))
        q_a = jnp.take_along_axis(q, batch["action"][:, None], -1)[:, 0]
        return jnp.mean(optax.huber_loss(q_a, y, delta=cfg.huber_delta))

    bug, p = check_transition_bug(cfg.transition_bug), check_severity(cfg.transition_bug_p)

    @jax.jit
    def update(params, target, opt_state, buffer, key):
        losses = []
        for _ in range(cfg.grad_steps):                  # unrolled on purpose (CPU trap)
            key, sub = jax.random.split(key)
            idx = buffer_indices(buffer, sub, cfg.batch_size)
            batch = {k: v[idx] for k, v in buffer["data"].items()}
            if bug is not None:                          # its own key: the correct run's stream is untouched
                batch = corrupt_batch(buffer["data"], idx, batch, jax.random.fold_in(sub, 1), bug, p,
                                      cfg.num_envs, cfg.frames)
            y = dqn_targets(model, params, target, batch, cfg.gamma)
            loss, grads = jax.value_and_grad(loss_fn)(params, batch, y)
            updates, opt_state = tx.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            losses.append(loss)
        return params, opt_state, jnp.stack(losses).mean()
    return update


# --- training state, checkpoints ---------------------------------------------------------------

def env_state(env):
    """The env's own state for an exact resume, or None if it has none (EnvPool, fakes)."""
    try:
        return env.get_state()
    except AttributeError:
        return None


def initial_state(cfg: DQNConfig, model, tx, env, obs) -> dict:
    """Fresh training state (the template a checkpoint restores into)."""
    key, init_key = jax.random.split(jax.random.PRNGKey(cfg.seed))
    params = model.init(init_key, jnp.zeros((1,) + tuple(env.obs_shape), jnp.float32))
    example = transitions(obs[None], np.zeros((1, cfg.num_envs), np.int32), np.zeros((1, cfg.num_envs)),
                          np.zeros((1, cfg.num_envs)), obs[None])
    state = {"params": params, "target": params, "opt_state": tx.init(params), "key": key, "step": 0,
             "update": 0, "buffer": buffer_init(cfg.buffer_size, example), "obs": np.asarray(obs)}
    es = env_state(env)
    if es is not None:
        state["env"] = es
    return state


def _resume_returns(csv_path: Path, step: int) -> list[float]:
    """Returns of the games finished before `step` (the checkpoint); the file is cut back to them."""
    if not csv_path.exists():
        return []
    with open(csv_path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if int(r["step"]) < step]
    with open(csv_path, "w", newline="") as f:
        w = csv.DictWriter(f, ["step", "return", "wall_s"])
        w.writeheader()
        w.writerows(rows)
    return [float(r["return"]) for r in rows]


def train(cfg: DQNConfig, log=print, callback=None, env_fn=None, model=None) -> dict:
    """Train (or resume) a replay DDDQN. Hooks as in agents.train.train: `callback(step=, update=,
    params=, apply_fn=, returns=)` after every update (e.g. SaliencySnapshots); `env_fn(game,
    num_envs, train=, seed=)` replaces the config's env; `model` replaces build_dqn_model."""
    bug = check_transition_bug(cfg.transition_bug)
    check_severity(cfg.transition_bug_p)
    if cfg.num_envs * cfg.rollout > cfg.buffer_size:
        raise AgentInputError(f"buffer_size {cfg.buffer_size} < one update's {cfg.num_envs * cfg.rollout} transitions")
    env_fn = env_fn or default_env_fn(cfg)
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=1))
    env = env_fn(cfg.game, cfg.num_envs, train=True, seed=cfg.seed)
    obs = env.reset()
    check_storable(obs)
    check_bug_layout(cfg, bug, env.obs_shape)
    model = model if model is not None else build_dqn_model(cfg, env.num_actions, env.obs_shape)
    tx = make_optimizer(cfg)
    state = restore_train_state(run_dir / "ckpt", initial_state(cfg, model, tx, env, obs))
    step, upd = int(state["step"]), int(state["update"])
    csv_path = run_dir / "returns.csv"
    recent = _resume_returns(csv_path, step) if upd else []
    if upd:
        log(f"resumed {cfg.game} at update {upd} (step {step})")
        if "env" in state:          # the envs continue exactly where the checkpoint left them
            env.set_state(jax.tree.map(np.asarray, state["env"]))
            obs = np.asarray(state["obs"])
        else:                       # no env state: fresh env seeds, as agents.train does
            env = env_fn(cfg.game, cfg.num_envs, train=True, seed=cfg.seed + 1000 * upd)
            obs = env.reset()

    act, update = make_act(model), make_update(model, tx, cfg)
    params, target, opt_state, key = state["params"], state["target"], state["opt_state"], state["key"]
    buffer = state["buffer"]
    n_updates = num_updates(cfg)
    new_csv = not csv_path.exists()
    csv_file = open(csv_path, "a", newline="")
    writer = csv.writer(csv_file)
    if new_csv:
        writer.writerow(["step", "return", "wall_s"])
    t0, loss = time.time(), float("nan")
    clock, t_steady, steady_step, first_upd = {"act": 0.0, "env": 0.0, "update": 0.0}, t0, step, upd
    with StopRequest() as stop:
        while upd < n_updates:
            roll = {k: [] for k in ("obs", "actions", "rewards", "dones", "next_obs")}
            for _ in range(cfg.rollout):
                key, sub = jax.random.split(key)
                tick = time.perf_counter()
                actions = np.asarray(act(params, obs, sub, epsilon_at(cfg, step))[0])
                tock = time.perf_counter()
                next_obs, reward, done, finished = env.step(actions)
                clock["act"] += tock - tick
                clock["env"] += time.perf_counter() - tock
                for k, v in zip(roll, (obs, actions, reward, done, next_obs)):
                    roll[k].append(v)
                for ret in finished:
                    writer.writerow([step, ret, round(time.time() - t0, 1)])
                    recent.append(ret)
                obs, step = next_obs, step + cfg.num_envs
            tick = time.perf_counter()
            buffer = buffer_add(buffer, transitions(*(np.stack(roll[k]) for k in roll)))
            if step >= cfg.learning_starts:
                key, sub = jax.random.split(key)
                params, opt_state, loss = update(params, target, opt_state, buffer, sub)
                loss = float(loss)
            clock["update"] += time.perf_counter() - tick
            upd += 1
            if upd == first_upd + 1:
                clock, t_steady, steady_step = dict.fromkeys(clock, 0.0), time.time(), step
            if upd % cfg.target_every == 0:
                target = params
            if callback is not None:
                callback(step=step, update=upd, params=params, apply_fn=model.apply, returns=recent)
            out_of_time = cfg.time_limit > 0 and time.time() - t0 > cfg.time_limit
            if upd % cfg.ckpt_every == 0 or upd == n_updates or out_of_time or stop.requested:
                csv_file.flush()
                saved = {"params": params, "target": target, "opt_state": opt_state, "key": key, "step": step,
                         "update": upd, "buffer": buffer, "obs": np.asarray(obs)}
                es = env_state(env)
                if es is not None:
                    saved["env"] = es
                save_train_state(run_dir / "ckpt", saved)
                mean_ret = float(np.mean(recent[-20:])) if recent else float("nan")
                wall = max(1e-9, time.time() - t_steady)
                log(f"{cfg.game} update {upd}/{n_updates} step {step} eps {epsilon_at(cfg, step):.3f} "
                    f"loss {loss:.4f} return(last20) {mean_ret:.2f} {(step - steady_step) / wall:.0f} steps/s "
                    f"(act {clock['act'] / wall:.0%}, env {clock['env'] / wall:.0%}, "
                    f"store+update {clock['update'] / wall:.0%})")
                if out_of_time or stop.requested:
                    log(f"stopped at update {upd} (step {step}) with a checkpoint "
                        f"({'time limit' if out_of_time else 'signal'}); rerun the same command to resume")
                    break
    csv_file.close()
    steady = max(1e-9, time.time() - t_steady)
    return {"params": params, "target": target, "model": model, "step": step, "returns": recent, "buffer": buffer,
            "steady": {"seconds": steady, "steps": step - steady_step, "steps_per_s": (step - steady_step) / steady,
                       "share": {k: v / steady for k, v in clock.items()}}}


def snapshot_callback(cfg: DQNConfig, snap: dict):
    """The SaliencySnapshots callback of the --snapshot-every flag (probes from an 8-env copy of the
    run's own env with env seed seed + 10,000; per-frame shares when frames are host-stacked), or None."""
    if not snap["every"]:
        return None
    from .snapshots import SaliencySnapshots, probe_states

    probe_env = default_env_fn(cfg)(cfg.game, 8, train=False, seed=cfg.seed + 10_000)
    frames = cfg.frames or (None if is_minatar(cfg.game) else probe_env.obs_shape[-1])
    return SaliencySnapshots(probe_states(probe_env, 16, seed=cfg.seed), Path(cfg.run_dir) / "snapshots",
                             every=snap["every"], num_frames=frames, tensorboard=snap["tensorboard"] or None)


def main(argv=None):
    import jaxsal.cpu
    jaxsal.cpu.use_fast_kernels()
    cfg, snap = parse_config(DQNConfig, argv, __doc__)
    callback = snapshot_callback(cfg, snap)
    train(cfg, log=lambda m: print(m, flush=True), callback=callback)
    if callback is not None:
        callback.close()


if __name__ == "__main__":
    sys.exit(main())
