"""The replay DDDQN trainer (jaxsal_agents.train_dqn): its Double-DQN target against a slow
reference, the ring buffer (wraparound included), the graded transition bugs on a known buffer, exact
resumption, and (slow) learning on MinAtar Breakout."""
import csv
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsal_agents import train_dqn as T
from jaxsal_agents.errors import AgentInputError
from jaxsal_agents.framestack import make_stacked_env
from jaxsal_agents.networks import MinAtarDuelingDQN

pytestmark = pytest.mark.slow  # training runs and resumes: learning checks


def test_double_dqn_target_matches_slow_reference():
    """y = r + gamma (1 - d) Q_target(s', argmax_a Q_online(s', a)), one transition at a time."""
    model = MinAtarDuelingDQN(3, 12)
    rng = np.random.default_rng(0)
    b = 16
    batch = {"next_obs": rng.integers(0, 2, (b, 10, 10, 12)).astype(np.uint8),
             "reward": rng.normal(size=b).astype(np.float32),
             "done": (rng.random(b) < 0.3).astype(np.float32)}
    online = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 10, 10, 12)))
    target = model.init(jax.random.PRNGKey(1), jnp.zeros((1, 10, 10, 12)))
    gamma = 0.9
    got = np.asarray(T.dqn_targets(model, online, target, batch, gamma))
    want, picks_differ = np.zeros(b, np.float32), 0
    for i in range(b):
        s = batch["next_obs"][i][None].astype(np.float32)
        q_on = np.asarray(model.apply(online, s)["q"])[0]
        q_tg = np.asarray(model.apply(target, s)["q"])[0]
        a = int(q_on.argmax())
        picks_differ += a != int(q_tg.argmax())
        want[i] = batch["reward"][i] + gamma * (1 - batch["done"][i]) * q_tg[a]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert picks_differ > 0       # the batch tells Double DQN from max_a Q_target(s', a)
    assert batch["done"].any() and not batch["done"].all()


def test_dueling_head_is_value_plus_centred_advantage():
    model = MinAtarDuelingDQN(3, 12)
    x = jnp.asarray(np.random.default_rng(1).integers(0, 2, (5, 10, 10, 12)), jnp.float32)
    out = model.apply(model.init(jax.random.PRNGKey(0), x), x)
    a = np.asarray(out["advantage"])
    np.testing.assert_allclose(out["q"], np.asarray(out["value"])[:, None] + a - a.mean(-1, keepdims=True),
                               rtol=1e-6, atol=1e-6)


def test_replay_buffer_returns_exactly_what_was_added_with_wraparound():
    cap = 10

    def rows(ids):
        ids = np.asarray(ids)
        return {"id": ids.astype(np.int32), "obs": np.stack([np.full((2, 3), i, np.uint8) for i in ids])}

    buf = T.buffer_init(cap, rows([0]))
    assert int(buf["size"]) == 0 and buf["data"]["obs"].shape == (cap, 2, 3)
    buf = T.buffer_add(buf, rows([1, 2, 3, 4]))
    buf = T.buffer_add(buf, rows([5, 6, 7, 8]))
    assert (int(buf["pos"]), int(buf["size"])) == (8, 8)
    np.testing.assert_array_equal(buf["data"]["id"][:8], np.arange(1, 9))
    drawn = np.asarray(T.buffer_sample(buf, jax.random.PRNGKey(0), 4000)["id"])
    assert set(drawn.tolist()) == set(range(1, 9))          # only the filled rows, every one of them
    counts = np.bincount(drawn, minlength=9)[1:]
    assert counts.min() > 400 and counts.max() < 600         # uniform (500 each expected)
    buf = T.buffer_add(buf, rows([9, 10, 11, 12]))            # wraps: 11, 12 overwrite 1, 2
    assert (int(buf["pos"]), int(buf["size"])) == (2, 10)
    np.testing.assert_array_equal(buf["data"]["id"], [11, 12, 3, 4, 5, 6, 7, 8, 9, 10])
    batch = T.buffer_sample(buf, jax.random.PRNGKey(1), 3000)
    assert set(np.asarray(batch["id"]).tolist()) == set(range(3, 13))
    for i, o in zip(np.asarray(batch["id"]), np.asarray(batch["obs"])):   # rows travel whole
        assert (o == i).all()
    with pytest.raises(AgentInputError, match="adding 11"):
        T.buffer_add(buf, rows(range(11)))


def _rollout(t=3, e=2, seed=0):
    rng = np.random.default_rng(seed)
    obs = rng.integers(0, 2, (t, e, 10, 10, 12)).astype(np.float32)
    nxt = rng.integers(0, 2, (t, e, 10, 10, 12)).astype(np.float32)
    return (obs, rng.integers(0, 3, (t, e)), rng.normal(size=(t, e)), (rng.random((t, e)) < 0.3) * 1.0, nxt)


def test_transitions_are_stored_time_major_and_correct():
    obs, actions, rewards, dones, nxt = _rollout()
    good = T.transitions(obs, actions, rewards, dones, nxt)
    assert set(good) == {"obs", "action", "reward", "done", "next_obs"}
    flat = lambda x: np.asarray(x).reshape((6,) + np.shape(x)[2:])           # noqa: E731  time-major
    np.testing.assert_array_equal(good["next_obs"], flat(nxt))
    np.testing.assert_array_equal(good["obs"], flat(obs))
    np.testing.assert_allclose(good["reward"], flat(rewards), rtol=1e-6)
    np.testing.assert_array_equal(good["done"], flat(dones))


# A tiny synthetic buffer with known contents: E envs, T steps (full ring), k-frame stacks of 1x1x1
# frames; frame g(t, e) = 10 t + e + 1. Env 0's game ends at step 2 (its next game starts at step 3),
# env 1's at step 4. s_t = [g(t-2), g(t-1), g(t)] within a game, the game's first frame repeated
# before its start; next_obs(t) = s_{t+1}.
E, STEPS, K = 2, 6, 3
ENDS = {0: 2, 1: 4}


def g(t, e):
    return 10 * t + e + 1


def _start(t, e):
    return ENDS[e] + 1 if t > ENDS[e] else 0


def _stack(t, e):
    return [g(max(t - a, _start(t, e)), e) for a in range(K - 1, -1, -1)]


def _synthetic():
    rows = [(t, e) for t in range(STEPS) for e in range(E)]                  # time-major
    data = {"obs": np.array([_stack(t, e) for t, e in rows], np.uint8).reshape(-1, 1, 1, K),
            "next_obs": np.array([_stack(t + 1, e) for t, e in rows], np.uint8).reshape(-1, 1, 1, K),
            "action": np.array([t % 3 for t, e in rows], np.int32),
            "reward": np.array([t + 0.5 * e for t, e in rows], np.float32),
            "done": np.array([float(t == ENDS[e]) for t, e in rows], np.float32)}
    return rows, {k: jnp.asarray(v) for k, v in data.items()}


def _expected(bug, t, e):
    """What `bug` makes of transition (t, e), written out from the definitions (no buffer rows)."""
    want = {"obs": _stack(t, e), "next_obs": _stack(t + 1, e), "action": t % 3, "reward": t + 0.5 * e,
            "done": float(t == ENDS[e])}
    tp = (t - 1) % STEPS                                  # the ring's previous step (t = 0 wraps)
    if bug == "misassembled":
        want["next_obs"] = want["obs"]
    elif bug == "cross_episode":                          # newest frames of the previous rows, games ignored
        want["obs"] = [g((t - a) % STEPS, e) for a in range(K - 1, -1, -1)]
        want["next_obs"] = [g((t - a) % STEPS + 1, e) for a in range(K - 1, -1, -1)]
    elif bug == "done_late":
        want["done"] = float(tp == ENDS[e])
    elif bug == "reward_late":
        want["reward"] = tp + 0.5 * e
    elif bug == "neighbour_next":
        want["next_obs"] = _stack(t + 1, (e + 1) % E)
    return want


@pytest.mark.parametrize("bug", T.TRANSITION_BUGS)
def test_each_transition_bug_does_what_it_says_on_a_known_buffer(bug):
    rows, data = _synthetic()
    idx = jnp.arange(len(rows))
    batch = {k: v[idx] for k, v in data.items()}
    f = jax.jit(T.corrupt_batch, static_argnames=("bug", "num_envs", "frames"))
    out = f(data, idx, batch, jax.random.PRNGKey(0), bug=bug, p=1.0, num_envs=E, frames=K)
    for i, (t, e) in enumerate(rows):
        want = _expected(bug, t, e)
        for k, v in want.items():
            np.testing.assert_array_equal(np.asarray(out[k][i]).reshape(-1), np.reshape(v, -1), err_msg=f"{k} {t} {e}")
    if bug == "cross_episode":      # env 0's new game (step 3) sees the old game's frames; mid-game rows are right
        assert _expected(bug, 3, 0)["obs"] == [g(1, 0), g(2, 0), g(3, 0)] != _stack(3, 0)
        assert _expected(bug, 2, 0)["obs"] == _stack(2, 0)
    # severity 0: the batch itself, bit for bit; severity 0.5: each row is either, both occur
    zero = f(data, idx, batch, jax.random.PRNGKey(0), bug=bug, p=0.0, num_envs=E, frames=K)
    for k in batch:
        np.testing.assert_array_equal(np.asarray(zero[k]), np.asarray(batch[k]))
    many = jnp.tile(idx, 50)
    big = {k: v[many] for k, v in data.items()}
    half = f(data, many, big, jax.random.PRNGKey(1), bug=bug, p=0.5, num_envs=E, frames=K)
    full = f(data, many, big, jax.random.PRNGKey(1), bug=bug, p=1.0, num_envs=E, frames=K)
    changed = [k for k in batch if not np.array_equal(np.asarray(full[k]), np.asarray(big[k]))]
    assert changed and set(changed) <= {"obs", "next_obs", "done", "reward"}
    k = changed[0]
    flat = lambda x: np.asarray(x).reshape(len(many), -1)      # noqa: E731
    is_bug = (flat(half[k]) == flat(full[k])).all(1)
    is_ok = (flat(half[k]) == flat(big[k])).all(1)
    assert (is_bug | is_ok).all()
    differs = ~(flat(full[k]) == flat(big[k])).all(1)           # rows the bug changes at all
    share = (is_bug & ~is_ok)[differs].mean()
    assert 0.35 < share < 0.65, share


def _tiny(tmp_path, name, **kw):
    return T.DQNConfig(**{"steps": 4 * 4 * 12, "num_envs": 4, "rollout": 4, "buffer_size": 128, "batch_size": 8,
                          "grad_steps": 2, "learning_starts": 16, "target_every": 2, "frames": 4, "drop_trail": True,
                          "ckpt_every": 4, "seed": 3, "run_dir": str(tmp_path / name), **kw})


def test_severity_zero_trains_bit_for_bit_as_the_correct_trainer_and_severity_one_does_not(tmp_path):
    """Every transition bug at p = 0 is the correct trainer exactly (same RNG stream, same params,
    same games, same buffer); at p = 1 it changes training."""
    good = T.train(_tiny(tmp_path, "good"), log=lambda m: None)
    leaves = jax.tree.leaves((good["params"], good["target"]))
    for bug in T.TRANSITION_BUGS:
        zero = T.train(_tiny(tmp_path, f"{bug}0", transition_bug=bug, transition_bug_p=0.0), log=lambda m: None)
        for a, b in zip(jax.tree.leaves((zero["params"], zero["target"])), leaves):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert zero["returns"] == good["returns"]
        for k in good["buffer"]["data"]:
            np.testing.assert_array_equal(np.asarray(zero["buffer"]["data"][k]), np.asarray(good["buffer"]["data"][k]))
    one = T.train(_tiny(tmp_path, "mis1", transition_bug="misassembled"), log=lambda m: None)
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(one["params"]), jax.tree.leaves(good["params"])))


def test_correct_buffer_next_state_is_the_next_state_acted_on(tmp_path):
    """The next state of env e at step t is the state it acts on at step t+1 (rows time-major, 4
    envs; gymnax resets inside the done step, so this holds across games too): the row layout the
    transition bugs rely on."""
    good = T.train(_tiny(tmp_path, "good", learning_starts=10**6, steps=4 * 4 * 3), log=lambda m: None)["buffer"]
    n = int(good["size"])
    assert n == 48
    g_ = {k: np.asarray(v[:n]) for k, v in good["data"].items()}
    np.testing.assert_array_equal(g_["next_obs"][:-4], g_["obs"][4:])
    assert (g_["next_obs"] != g_["obs"]).any()


def _returns_rows(run_dir):
    with open(run_dir / "returns.csv", newline="") as f:
        return [(r["step"], r["return"]) for r in csv.DictReader(f)]


def test_resume_equals_the_uninterrupted_run(tmp_path):
    calls = {"full": [], "cut": []}

    def recorder(name):
        return lambda **k: calls[name].append((k["step"], k["update"], len(k["returns"])))

    full = T.train(_tiny(tmp_path, "full"), log=lambda m: None, callback=recorder("full"))
    part = T.train(_tiny(tmp_path, "cut", time_limit=1e-9), log=lambda m: None, callback=recorder("cut"))
    assert part["step"] == 16                       # stopped after update 1, with a checkpoint
    logs = []
    rest = T.train(_tiny(tmp_path, "cut"), log=logs.append, callback=recorder("cut"))
    assert logs[0] == "resumed minatar-breakout at update 1 (step 16)"
    assert rest["step"] == full["step"] == 192
    for a, b in zip(jax.tree.leaves((rest["params"], rest["target"])), jax.tree.leaves((full["params"], full["target"]))):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
    for k in full["buffer"]["data"]:
        np.testing.assert_array_equal(np.asarray(rest["buffer"]["data"][k]), np.asarray(full["buffer"]["data"][k]))
    assert rest["returns"] == full["returns"] and len(full["returns"]) > 0
    assert calls["cut"] == calls["full"]
    assert _returns_rows(tmp_path / "cut") == _returns_rows(tmp_path / "full")


def test_resume_without_env_state_reseeds_and_bad_configs_are_clear(tmp_path):
    class NoState:
        """A MinAtar stacked env that hides get_state (as EnvPool's would)."""

        def __init__(self, env):
            self.env, self.num_actions, self.obs_shape = env, env.num_actions, env.obs_shape

        def reset(self):
            return self.env.reset()

        def step(self, a):
            return self.env.step(a)

    seeds = []

    def env_fn(game, n, train=True, seed=0):
        seeds.append(seed)
        return NoState(make_stacked_env(game, n, train=train, seed=seed, drop_trail=True))

    cfg = _tiny(tmp_path, "nostate", steps=4 * 4 * 3, frames=0, drop_trail=False)
    T.train(dataclasses.replace(cfg, time_limit=1e-9), log=lambda m: None, env_fn=env_fn)
    out = T.train(cfg, log=lambda m: None, env_fn=env_fn)
    assert out["step"] == 48 and seeds == [3, 3, 3 + 1000]
    with pytest.raises(AgentInputError, match="buffer_size"):
        T.train(_tiny(tmp_path, "x", buffer_size=8), log=lambda m: None)
    with pytest.raises(AgentInputError, match="unknown transition bug"):
        T.train(_tiny(tmp_path, "y", transition_bug="swapped"), log=lambda m: None)
    with pytest.raises(AgentInputError, match="transition_bug_p"):
        T.train(_tiny(tmp_path, "z", transition_bug="done_late", transition_bug_p=1.5), log=lambda m: None)
    with pytest.raises(AgentInputError, match="multiple of num_envs"):
        T.train(_tiny(tmp_path, "w", transition_bug="done_late", buffer_size=126), log=lambda m: None)
    with pytest.raises(AgentInputError, match="set frames"):
        T.train(_tiny(tmp_path, "v", transition_bug="cross_episode", frames=0, drop_trail=False), log=lambda m: None)
    with pytest.raises(AgentInputError, match="host frame stack"):
        T.default_env_fn(T.DQNConfig(stack_bug="reuse"))


@pytest.mark.slow
def test_correct_dddqn_beats_random_play_on_minatar_breakout(tmp_path):
    """Random play scores 0.41 per game here (1,002 games, stacked env without the trail, seeds 0-3)."""
    cfg = T.DQNConfig(steps=40_960, num_envs=16, rollout=8, buffer_size=20_000, batch_size=64, grad_steps=4,
                      learning_starts=2048, lr=1e-3, target_every=8, eps_decay_frac=0.1, frames=4, drop_trail=True,
                      seed=1, run_dir=str(tmp_path / "learn"), ckpt_every=10**6)
    out = T.train(cfg, log=lambda m: None)
    assert np.mean(out["returns"][-50:]) > 3 * 0.41, np.mean(out["returns"][-50:])
