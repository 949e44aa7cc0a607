"""Atari through ale-py with EnvPool's preprocessing, plus the RAM behind every stacked frame.

EnvPool does not expose the emulator's RAM, so ground-truth objects (jaxsal.game_objects) need
our own player. `AleAtariEnv` repeats EnvPool's Atari logic step for step (frame skip 4, the
last two raw frames max-pooled, ALE's grey palette, INTER_AREA resize to 84x84, 4-frame stack,
0..noop_max-1 no-ops then FIRE on reset, episodic-life resets, auto-reset on the step after
`done`), so for the same actions and no-op counts its observations equal EnvPool's bit for bit
(tests/game_objects/test_tables.py). It has `jaxsal_agents.envs.AtariEnv`'s API, and `rams()` gives, for the
current observations, the RAM of the raw frames pooled into each stacked frame: (E, F, 2, 128).

    env = AleAtariEnv("pong", num_envs=2)
    batch, boxes = collect_objects(agent, 500, env=env)    # Batch + jaxsal.game_objects.ObjectBoxes
"""
from __future__ import annotations

import numpy as np

from .area_resize import resize_area
from .envs import check_game, needs_extra

ROM_NAMES = {"pong": "pong", "breakout": "breakout", "mspacman": "ms_pacman",
             "spaceinvaders": "space_invaders", "frostbite": "frostbite", "seaquest": "seaquest"}


def ale_module():
    return needs_extra("ale_py", "emulator frames with ground-truth objects (ale-py ships the ROMs)")


def make_ale(game: str, seed: int = 0):
    """An ale_py.ALEInterface for `game` with EnvPool's settings: one raw frame per act(), no sticky actions."""
    ale_py = ale_module()
    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)
    ale.setInt("random_seed", int(seed) % (2 ** 31))
    ale.setFloat("repeat_action_probability", 0.0)
    ale.setInt("frame_skip", 1)
    ale.loadROM(ale_py.roms.get_rom_path(ROM_NAMES[game]))
    return ale


class _OneEnv:
    """One ALE emulator with EnvPool's reset/step logic (see the module doc)."""

    def __init__(self, game, seed, frame_stack, noop_max, max_episode_steps, episodic_life):
        ale_py = ale_module()
        self.ale = make_ale(game, seed)
        self.actions = list(self.ale.getMinimalActionSet())
        self.fire = ale_py.Action.FIRE in self.actions
        self.noop, self.fire_action = ale_py.Action.NOOP, ale_py.Action.FIRE
        self.rng = np.random.default_rng(seed)
        self.k, self.noop_max, self.max_steps, self.episodic_life = frame_stack, noop_max, max_episode_steps, episodic_life
        h, w = self.ale.getScreenDims()
        self.screens = [np.zeros((h, w), np.uint8), np.zeros((h, w), np.uint8)]
        self.rams = [np.zeros(128, np.uint8), np.zeros(128, np.uint8)]
        self.stack = np.zeros((frame_stack, 84, 84), np.uint8)
        self.ram_stack = np.zeros((frame_stack, 2, 128), np.uint8)
        self.elapsed, self.lives, self.done, self.game_over = 0, 0, True, True
        self.ale.reset_game()

    def _grab(self, slot):
        self.screens[slot] = self.ale.getScreenGrayscale().copy()
        self.rams[slot] = self.ale.getRAM().copy()

    def _push(self, push_all, maxpool):
        frame = np.maximum(self.screens[0], self.screens[1]) if maxpool else self.screens[0]
        rams = np.stack([self.rams[0], self.rams[1]]) if maxpool else np.stack([self.rams[0], self.rams[0]])
        small = resize_area(frame)
        if push_all:
            self.stack[:] = small
            self.ram_stack[:] = rams
        else:
            self.stack = np.roll(self.stack, -1, axis=0)
            self.stack[-1] = small
            self.ram_stack = np.roll(self.ram_stack, -1, axis=0)
            self.ram_stack[-1] = rams

    def reset(self, noops=None, full=False):
        """Reset as EnvPool: a real reset after a game over (or when not episodic, or `full`),
        then 0..noop_max-1 no-ops (the last one replaced by FIRE in games that have it)."""
        n = int(self.rng.integers(0, self.noop_max)) if noops is None else int(noops)
        n = n + 1 - int(self.fire)
        push_all = False
        if full or not self.episodic_life or self.ale.game_over() or self.elapsed >= self.max_steps:
            self.ale.reset_game()
            self.elapsed, push_all = 0, True
        for _ in range(n):
            self.ale.act(self.noop)
            if self.ale.game_over():
                self.ale.reset_game()
                push_all = True
        if self.fire:
            self.ale.act(self.fire_action)
        self._grab(0)
        self.screens[1] = np.zeros_like(self.screens[1])
        self._push(push_all, maxpool=False)
        self.lives, self.done, self.game_over = self.ale.lives(), False, False
        return 0.0

    def step(self, action):
        """One agent step (4 raw frames); after `done` the next call resets instead (EnvPool's auto-reset)."""
        if self.done:
            return self.reset()
        reward, skip = 0.0, 4
        while skip > 0 and not self.ale.game_over():
            reward += self.ale.act(self.actions[int(action)])
            if skip <= 2:
                self._grab(2 - skip)
            skip -= 1
        self._push(False, maxpool=skip == 0)
        self.elapsed += 1
        self.game_over = bool(self.ale.game_over()) or self.elapsed >= self.max_steps
        lost_life = self.episodic_life and 0 < self.ale.lives() < self.lives
        self.lives = self.ale.lives()
        self.done = self.game_over or lost_life
        return reward


class AleAtariEnv:
    """`jaxsal_agents.envs.AtariEnv`'s API on ale-py (EnvPool's preprocessing), with `rams()`."""

    def __init__(self, game: str, num_envs: int = 1, train: bool = False, seed: int = 0, frame_stack: int = 4,
                 noop_max: int = 30, max_episode_steps: int = 27000):
        self.game = check_game(game)
        if self.game not in ROM_NAMES:
            raise ValueError(f"AleAtariEnv plays Atari games {sorted(ROM_NAMES)}, not {game!r}")
        if noop_max < 1:
            raise ValueError(f"noop_max must be >= 1 (EnvPool draws 0..noop_max-1 no-ops), got {noop_max}")
        self.num_envs, self.train = num_envs, train
        self._envs = [_OneEnv(self.game, seed * 1000 + i, frame_stack, noop_max, max_episode_steps, True)
                      for i in range(num_envs)]
        self.num_actions = len(self._envs[0].actions)
        self.obs_shape = (84, 84, frame_stack)
        self._returns = np.zeros(num_envs, np.float64)

    def _obs(self):
        return np.ascontiguousarray(np.stack([e.stack for e in self._envs]).transpose(0, 2, 3, 1))

    def reset(self, noops=None) -> np.ndarray:
        """Reset every env (a full game reset); `noops` fixes the no-op count (tests)."""
        for e in self._envs:
            e.reset(noops, full=True)
        self._returns[:] = 0.0
        return self._obs()

    def step(self, actions):
        actions = np.asarray(actions).reshape(-1)
        reward = np.zeros(self.num_envs, np.float32)
        done = np.zeros(self.num_envs, np.float32)
        finished = []
        for i, (e, a) in enumerate(zip(self._envs, actions)):
            r = e.step(a)
            self._returns[i] += r
            if e.done and e.game_over:
                finished.append(float(self._returns[i]))
                self._returns[i] = 0.0
            reward[i] = np.sign(r) if self.train else r
            done[i] = float(e.done if self.train else (e.done and e.game_over))
        return self._obs(), reward, done, finished

    def rams(self) -> np.ndarray:
        """(E, F, 2, 128) uint8: for each env's current observation, per stacked frame, the RAM
        after each of the two raw frames max-pooled into it (the same RAM twice after a reset)."""
        return np.stack([e.ram_stack for e in self._envs])

    def emulators(self) -> list:
        """Each env's ale_py.ALEInterface (cloneState, restoreState, setRAM)."""
        return [e.ale for e in self._envs]

    def ale_actions(self) -> list:
        """The minimal action set: agent action i is ale_actions()[i] for ALEInterface.act."""
        return list(self._envs[0].actions)

    def resets_next(self) -> np.ndarray:
        """(E,) bool: the env's next step() resets (a game over or a lost life) instead of stepping."""
        return np.array([e.done for e in self._envs])

    def objects(self):
        """jaxsal.game_objects.ObjectBoxes of the current observations (E states)."""
        from jaxsal.game_objects import boxes_from_ram
        return boxes_from_ram(self.game, self.rams())


class Recording:
    """Wraps an AleAtariEnv so that every observation handed out has its RAM recorded."""

    def __init__(self, env):
        self.env, self.num_envs, self.num_actions = env, env.num_envs, env.num_actions
        self.rams = []

    def reset(self):
        obs = self.env.reset()
        self.rams.append(self.env.rams())
        return obs

    def step(self, actions):
        out = self.env.step(actions)
        self.rams.append(self.env.rams())
        return out


def collect_objects(agent, steps: int, game: str | None = None, epsilon: float = 0.0, num_envs: int = 1,
                    seed: int = 0, env: AleAtariEnv | None = None, until_done: bool = False):
    """`jaxsal_agents.collect` on ale-py: (Batch, ObjectBoxes) with one row of boxes per state, in the
    Batch's env-major order."""
    from .collect import collect
    from jaxsal.game_objects import boxes_from_ram

    env = env or AleAtariEnv(game or agent.game, num_envs, train=False, seed=seed)
    rec = Recording(env)
    batch = collect(agent, steps, epsilon=epsilon, seed=seed, env=rec, until_done=until_done)
    rams = np.stack(rec.rams[:len(batch) // env.num_envs])            # (T, E, F, 2, 128)
    rams = np.swapaxes(rams, 0, 1).reshape((-1,) + rams.shape[2:])   # env-major, as the Batch
    return batch, boxes_from_ram(env.game, rams)
