"""Host-side frame stacking with switches that reproduce real frame-stacking bugs.

`FrameStacker(num_frames, bug)` turns a stream of single frames `(N, H, W, c)` into stacks
`(N, H, W, c * num_frames)`, frame-major along channels, oldest frame first (slot k-1 is the
newest frame). `FrameStackEnv` wraps any of our vectorised envs (MinAtar without its own
stacking, or EnvPool Atari with `frame_stack=1`) with it. The bugs, off by default:

- "misaligned" (a): the next-state stack is built before the new frame is pushed, so every
  stack lags one step behind the game (frames t-k .. t-1 instead of t-k+1 .. t).
- "reuse" (a): the next-state stack reuses the state stack and only overwrites its newest
  slot (no shift), so the older slots keep the episode's first frame forever.
- "no_update" (b): the stack is never advanced: every slot holds the current frame.
- "reversed" (c): frames in reversed order (newest first).

With an on-policy learner like PQN the next-state stack of step t is the state stack of step
t+1, so a bug in building the next state changes every state the agent sees.
"""
from __future__ import annotations

import numpy as np

from .errors import AgentInputError

BUGS = ("misaligned", "reuse", "no_update", "reversed")


def check_bug(bug) -> str | None:
    """None/"none"/"" -> None; a known bug name -> itself; anything else -> clear error."""
    if bug is None or bug in ("", "none", "correct"):
        return None
    if bug not in BUGS:
        raise AgentInputError(f"unknown frame-stack bug {bug!r}; choose None or one of {BUGS}")
    return bug


class FrameStacker:
    """Stacks the last `num_frames` frames per env; `bug` switches on one of BUGS."""

    def __init__(self, num_frames: int = 4, bug: str | None = None):
        if not isinstance(num_frames, (int, np.integer)) or num_frames < 1:
            raise AgentInputError(f"num_frames must be a positive int, got {num_frames!r}")
        self.num_frames = int(num_frames)
        self.bug = check_bug(bug)
        self._hist = None   # (N, k+1, H, W, c): true history, oldest first, newest last
        self._reuse = None  # (N, k, H, W, c): the stack the "reuse" bug keeps rewriting

    def _check(self, frames, n=None):
        frames = np.asarray(frames)
        if frames.ndim != 4:
            raise AgentInputError(f"frames must be (N, H, W, c) single frames, got shape {frames.shape}")
        if n is not None and frames.shape != self._hist.shape[:1] + self._hist.shape[2:]:
            raise AgentInputError(f"frames shape {frames.shape} differs from the reset frames "
                                  f"{self._hist.shape[:1] + self._hist.shape[2:]}")
        return frames

    def reset(self, frames) -> np.ndarray:
        """Start every env's stack from its first frame (repeated in all slots)."""
        frames = self._check(frames)
        self._hist = np.repeat(frames[:, None], self.num_frames + 1, axis=1)
        self._reuse = self._hist[:, 1:].copy()
        return self._emit()

    def step(self, frames, new_episode=None) -> np.ndarray:
        """Push each env's newest frame; rows with `new_episode` true restart from that frame."""
        if self._hist is None:
            raise AgentInputError("call reset(frames) before step(frames)")
        frames = self._check(frames, n=True)
        self._hist = np.concatenate([self._hist[:, 1:], frames[:, None]], axis=1)
        self._reuse[:, -1] = frames
        if new_episode is not None:
            rows = np.asarray(new_episode, bool)
            if rows.any():
                self._hist[rows] = frames[rows][:, None]
                self._reuse[rows] = frames[rows][:, None]
        return self._emit()

    def _emit(self) -> np.ndarray:
        k = self.num_frames
        if self.bug is None:
            slots = self._hist[:, 1:]
        elif self.bug == "misaligned":
            slots = self._hist[:, :k]
        elif self.bug == "reuse":
            slots = self._reuse
        elif self.bug == "no_update":
            slots = np.repeat(self._hist[:, -1:], k, axis=1)
        else:  # reversed
            slots = self._hist[:, 1:][:, ::-1]
        n, _, h, w, c = slots.shape
        return np.ascontiguousarray(slots.transpose(0, 2, 3, 1, 4).reshape(n, h, w, k * c))


class FrameStackEnv:
    """Wraps a single-frame vectorised env (reset/step/num_actions/obs_shape) with FrameStacker.

    `reset_after_done`: EnvPool returns the terminal frame on the done step and the new
    episode's first frame on the next one, so its stacks restart one step after `done`;
    gymnax MinAtar auto-resets inside the done step, so its stacks restart on `done`.
    `keep_channels` picks the per-frame channels to keep (e.g. drop MinAtar Breakout's trail
    channel, which otherwise gives away the ball's direction and makes stacking unnecessary).
    """

    def __init__(self, env, num_frames: int = 4, bug: str | None = None,
                 reset_after_done: bool = False, keep_channels=None):
        self.env = env
        self.num_actions = env.num_actions
        self.keep = None if keep_channels is None else np.asarray(keep_channels, int)
        h, w, c = env.obs_shape
        c = c if self.keep is None else len(self.keep)
        self.frame_shape = (h, w, c)
        self.obs_shape = (h, w, c * num_frames)
        self.stacker = FrameStacker(num_frames, bug)
        self.reset_after_done = reset_after_done
        self._pending = None

    def _frames(self, obs):
        return obs if self.keep is None else obs[..., self.keep]

    def reset(self) -> np.ndarray:
        self._pending = None
        return self.stacker.reset(self._frames(self.env.reset()))

    def get_state(self) -> dict:
        """The wrapped env's state (its get_state) and the stacker's history, for an exact
        resume (set_state); only for envs that have get_state (gymnax MinAtar)."""
        n = self.stacker._hist.shape[0]
        pending = np.zeros(n, bool) if self._pending is None else np.asarray(self._pending, bool)
        return {"env": self.env.get_state(), "hist": self.stacker._hist.copy(),
                "reuse": self.stacker._reuse.copy(), "pending": pending}

    def set_state(self, state: dict) -> None:
        self.env.set_state(state["env"])
        self.stacker._hist = np.array(state["hist"])
        self.stacker._reuse = np.array(state["reuse"])
        self._pending = np.array(state["pending"], bool)

    def step(self, actions):
        obs, reward, done, finished = self.env.step(actions)
        restart = self._pending if self.reset_after_done else done
        self._pending = np.asarray(done, bool)
        return self.stacker.step(self._frames(obs), restart), reward, done, finished


MINATAR_NO_TRAIL = {"minatar-breakout": (0, 1, 3)}  # paddle, ball, brick (trail dropped)


def make_stacked_env(game: str, num_envs: int = 8, train: bool = True, seed: int = 0,
                     num_frames: int = 4, bug: str | None = None, drop_trail: bool = False):
    """A frame-stacked env whose stacking we control: MinAtar (gymnax) or Atari (EnvPool, 1 frame)."""
    from .envs import AtariEnv, MinAtarEnv, check_game, is_minatar

    game = check_game(game)
    if is_minatar(game):
        keep = MINATAR_NO_TRAIL.get(game) if drop_trail else None
        if drop_trail and keep is None:
            raise AgentInputError(f"drop_trail is defined for {list(MINATAR_NO_TRAIL)}, not {game!r}")
        return FrameStackEnv(MinAtarEnv(game, num_envs=num_envs, train=train, seed=seed),
                             num_frames, bug, reset_after_done=False, keep_channels=keep)
    if drop_trail:
        raise AgentInputError("drop_trail applies to MinAtar games only")
    return FrameStackEnv(AtariEnv(game, num_envs=num_envs, train=train, seed=seed, frame_stack=1),
                         num_frames, bug, reset_after_done=True)
