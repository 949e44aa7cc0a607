"""jaxsal_agents.framestack: the correct stack and each bug, hand-derived on numbered frames; envs."""
import numpy as np
import pytest

from jaxsal_agents.errors import AgentInputError
from jaxsal_agents.framestack import BUGS, FrameStackEnv, FrameStacker, make_stacked_env


def frame(v, n=2, c=1):
    """(n, 2, 3, c) frames whose every pixel of channel j in env i is 100*i + 10*v + j."""
    out = np.zeros((n, 2, 3, c), np.float32)
    for i in range(n):
        for j in range(c):
            out[i, ..., j] = 100 * i + 10 * v + j
    return out


def slots(stack, k, env=0):
    """The frame number v held in each slot of env `env` (channel 0 of each slot)."""
    c = stack.shape[-1] // k
    return [int(round((stack[env, 0, 0, s * c] - 100 * env) / 10)) for s in range(k)]


def run(bug, k=3, n_steps=5, c=1):
    st = FrameStacker(k, bug)
    out = [st.reset(frame(0, c=c))]
    for v in range(1, n_steps + 1):
        out.append(st.step(frame(v, c=c)))
    return out


def test_correct_stack_is_last_k_frames_oldest_first():
    out = run(None)
    assert [slots(s, 3) for s in out] == [[0, 0, 0], [0, 0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4], [3, 4, 5]]
    assert out[-1].shape == (2, 2, 3, 3)


def test_bugs_off_by_default():
    assert FrameStacker(3).bug is None
    a, b = run(None), [FrameStacker(3)]
    b = [b[0].reset(frame(0))] + [b[0].step(frame(v)) for v in range(1, 6)]
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("bug, expected", [
    ("misaligned", [[0, 0, 0], [0, 0, 0], [0, 0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 4]]),
    ("reuse", [[0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 0, 3], [0, 0, 4], [0, 0, 5]]),
    ("no_update", [[0, 0, 0], [1, 1, 1], [2, 2, 2], [3, 3, 3], [4, 4, 4], [5, 5, 5]]),
    ("reversed", [[0, 0, 0], [1, 0, 0], [2, 1, 0], [3, 2, 1], [4, 3, 2], [5, 4, 3]]),
])
def test_each_bug_hand_derived(bug, expected):
    out = run(bug)
    assert [slots(s, 3) for s in out] == expected
    assert [slots(s, 3, env=1) for s in out] == expected     # every env the same way


def test_multichannel_frames_are_frame_major():
    st = FrameStacker(2)
    st.reset(frame(0, c=3))
    s = st.step(frame(1, c=3))
    # channels: frame0 (c0, c1, c2), frame1 (c0, c1, c2)
    np.testing.assert_array_equal(s[0, 0, 0], [0, 1, 2, 10, 11, 12])


@pytest.mark.parametrize("bug", (None,) + BUGS)
def test_new_episode_restarts_only_its_rows(bug):
    st = FrameStacker(3, bug)
    st.reset(frame(0))
    st.step(frame(1))
    st.step(frame(2))
    s = st.step(frame(3), new_episode=np.array([False, True]))
    assert slots(s, 3, env=1) == [3, 3, 3]                      # restarted from its new frame
    ref = run(bug, n_steps=3)[-1]
    np.testing.assert_array_equal(s[0], ref[0])                 # env 0 unaffected


def test_errors_are_clear():
    with pytest.raises(AgentInputError, match="unknown frame-stack bug 'shuffled'"):
        FrameStacker(4, "shuffled")
    with pytest.raises(AgentInputError, match="num_frames must be a positive int"):
        FrameStacker(0)
    st = FrameStacker(2)
    with pytest.raises(AgentInputError, match="call reset"):
        st.step(frame(0))
    with pytest.raises(AgentInputError, match=r"\(N, H, W, c\)"):
        st.reset(np.zeros((2, 3, 4)))
    st.reset(frame(0))
    with pytest.raises(AgentInputError, match="differs from the reset frames"):
        st.step(frame(0, n=3))


class CountEnv:
    """Fake single-frame env: frame value = steps since its episode began; done every 3rd step."""
    num_actions, obs_shape = 2, (2, 3, 2)

    def __init__(self, new_frame_on_done):
        self.t, self.new_frame_on_done = np.zeros(2, int), new_frame_on_done

    def _obs(self):
        return np.stack([np.full((2, 3, 2), 10 * t, np.float32) + [0, 1] for t in self.t])

    def reset(self):
        self.t[:] = 0
        return self._obs()

    def step(self, actions):
        self.t += 1
        done = self.t == 3
        if self.new_frame_on_done:          # gymnax: done step already shows the new episode
            self.t[done] = 0
            obs = self._obs()
        else:                               # envpool: terminal frame now, new episode next step
            obs = self._obs()
            self.t[self.t > 3] = 0
            self.t[self.t == 3] = -1        # next step() increments to 0
        return obs, np.zeros(2, np.float32), done.astype(np.float32), []


@pytest.mark.parametrize("after", [False, True])
def test_env_wrapper_restarts_stacks_at_episode_start(after):
    env = FrameStackEnv(CountEnv(new_frame_on_done=not after), num_frames=3, reset_after_done=after,
                        keep_channels=[0])
    assert env.obs_shape == (2, 3, 3) and env.num_actions == 2
    got = [slots(env.reset(), 3)]
    for _ in range(5):
        got.append(slots(env.step(np.zeros(2))[0], 3))
    if not after:
        assert got == [[0, 0, 0], [0, 0, 1], [0, 1, 2], [0, 0, 0], [0, 0, 1], [0, 1, 2]]
    else:
        assert got == [[0, 0, 0], [0, 0, 1], [0, 1, 2], [1, 2, 3], [0, 0, 0], [0, 0, 1]]


def test_minatar_stacked_env_matches_raw_frames():
    from jaxsal_agents.envs import MinAtarEnv
    env = make_stacked_env("minatar-breakout", 3, seed=5, num_frames=4, drop_trail=True)
    raw = MinAtarEnv("minatar-breakout", 3, seed=5)
    assert env.obs_shape == (10, 10, 12)
    s, r = env.reset(), raw.reset()
    rng = np.random.default_rng(0)
    prev = [r[..., [0, 1, 3]]] * 4
    for _ in range(20):
        a = rng.integers(0, 3, 3)
        s, (r, _, done, _) = env.step(a)[0], raw.step(a)
        prev = prev[1:] + [r[..., [0, 1, 3]]]
        for i in np.flatnonzero(done):
            for j in range(4):
                prev[j] = prev[j].copy()
                prev[j][i] = r[i, ..., [0, 1, 3]].transpose(1, 2, 0)
        np.testing.assert_array_equal(s, np.concatenate(prev, -1))


def test_atari_path_matches_envpool_stack():
    pytest.importorskip("envpool")
    from jaxsal_agents.envs import AtariEnv
    ours = make_stacked_env("breakout", 1, train=False, seed=3, num_frames=4)
    ref = AtariEnv("breakout", 1, train=False, seed=3, frame_stack=4)
    assert ours.obs_shape == (84, 84, 4)
    ours.reset(), ref.reset()
    rng = np.random.default_rng(0)
    for t in range(12):
        a = rng.integers(0, ours.num_actions, 1)
        s, r = ours.step(a)[0], ref.step(a)[0]
        if t >= 3:   # once 4 real frames are in, the stacks agree exactly
            np.testing.assert_array_equal(s, r)
    with pytest.raises(AgentInputError, match="MinAtar games only"):
        make_stacked_env("breakout", 1, drop_trail=True)
