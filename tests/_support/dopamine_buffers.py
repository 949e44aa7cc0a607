"""Replay buffers written by Dopamine's own OutOfGraphReplayBuffer (PyPI dopamine-rl), and what
Dopamine itself serves from them: the indices `is_valid_transition` accepts, in chronological
order (oldest first), with `get_observation_stack(index)` and the action at each index.

    python -m tests._support.dopamine_buffers        # rewrites tests/data/dopamine_replay (needs dopamine-rl)

The committed tests/data/dopamine_replay was written this way, so the fast tests read
files Dopamine wrote without needing tensorflow; tests/io/test_dopamine_real.py (slow) checks it
is still what Dopamine writes and serves, and runs many more layouts through live Dopamine.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tests._support import DATA

FIXTURE = DATA / "dopamine_replay"
STACK = 4


def replay_module():
    """Dopamine's circular_replay_buffer (dopamine-rl 4 keeps it under dopamine.tf; 2 and 3 did not)."""
    try:
        from dopamine.tf.replay_memory import circular_replay_buffer
    except ImportError:
        from dopamine.replay_memory import circular_replay_buffer
    return circular_replay_buffer


def make_buffer(capacity: int, horizon: int = 1, obs_shape=(10, 10)):
    return replay_module().OutOfGraphReplayBuffer(
        observation_shape=tuple(obs_shape), stack_size=STACK, replay_capacity=capacity, batch_size=1,
        update_horizon=horizon, gamma=0.99)


def add_episodes(buf, episodes, rng, num_actions: int = 3, step0: int = 0) -> int:
    """Add episodes to `buf`: each (length, end) with end "terminal" (the last step is terminal),
    "timeout" (add(..., episode_end=True) without terminal) or None (still running). Frame s is
    random dots plus the step number in its first bytes, so every stored frame is distinct.
    Returns the number of steps added (the next step number is step0 + that)."""
    s = step0
    shape = buf._observation_shape
    for length, end in episodes:
        for t in range(length):
            obs = (rng.random(shape) < 0.2).astype(np.uint8) * 200
            obs.flat[0], obs.flat[1] = 1 + s % 251, 1 + s // 251 % 251
            last = t == length - 1
            buf.add(obs, int(rng.integers(num_actions)), float(rng.normal()), last and end == "terminal",
                    episode_end=last and end == "timeout")
            s += 1
    return s - step0


def served(buf) -> dict:
    """What Dopamine serves: its valid indices oldest first, their stacks and actions."""
    cap = buf._replay_capacity
    start = int(buf.cursor()) if buf.is_full() else 0
    order = [(start + i) % cap for i in range(cap)]
    idx = np.array([i for i in order if buf.is_valid_transition(i)], np.int64)
    states = (np.stack([buf.get_observation_stack(int(i)) for i in idx]) if len(idx)
              else np.zeros((0,) + buf._observation_shape + (STACK,), np.uint8))
    return {"index": idx, "states": states, "actions": buf._store["action"][idx].astype(np.int64)}


# The committed fixture, two buffers. "dqn" (update horizon 1) is saved twice: before it fills
# (checkpoint 1) and after it wrapped twice (checkpoint 2); "rainbow" (update horizon 3) once, wrapped.
# Terminals, a one-step episode, time-outs and an episode still running at the save.
FIXTURE_BUFFERS = {
    "dqn": (60, 1, {1: [(9, "terminal"), (1, "terminal"), (12, "timeout"), (7, "terminal"), (5, None)],
                    2: [(4, None), (20, "terminal"), (2, "terminal"), (17, "timeout"), (30, "terminal"),
                        (11, "timeout"), (9, None)]}),
    "rainbow": (50, 3, {7: [(13, "terminal"), (2, "timeout"), (25, "terminal"), (1, "terminal"),
                            (16, "timeout"), (8, None)]}),
}


def write_fixture(root: Path = FIXTURE) -> dict:
    """Write each fixture buffer with Dopamine's own save() into root/NAME, and root/expected.npz
    with what Dopamine serves from each checkpoint (keys NAME_K_index, _states, _actions, _add_count)."""
    root = Path(root)
    expected = {}
    for name, (capacity, horizon, parts) in FIXTURE_BUFFERS.items():
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        for p in d.iterdir():
            p.unlink()
        rng = np.random.default_rng(29)
        buf = make_buffer(capacity, horizon)
        step = 0
        for k, episodes in parts.items():
            step += add_episodes(buf, episodes, rng, step0=step)
            buf.save(str(d), k)
            for key, v in served(buf).items():
                expected[f"{name}_{k}_{key}"] = v
            expected[f"{name}_{k}_add_count"] = np.array(buf.add_count)  # a copy: add() counts in place
    np.savez_compressed(root / "expected.npz", **expected)
    return expected


def fixture_expected() -> dict:
    with np.load(FIXTURE / "expected.npz", allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


if __name__ == "__main__":
    e = write_fixture()
    for name, (capacity, horizon, parts) in FIXTURE_BUFFERS.items():
        for k in parts:
            print(f"{name} checkpoint {k}: capacity {capacity}, update horizon {horizon}, add_count "
                  f"{int(e[f'{name}_{k}_add_count'])}, {len(e[f'{name}_{k}_index'])} valid states")
