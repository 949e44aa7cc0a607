"""Vectorised environments with one host-side API: EnvPool Atari and gymnax MinAtar.

`make_env(game, num_envs, train=...)` returns an object with `reset() -> obs`,
`step(actions) -> (obs, reward, done, finished_returns)`, `num_actions`, `obs_shape`.
Atari observations are uint8 NHWC frame stacks `(num_envs, 84, 84, 4)`: 84x84 grey,
frame-skip 4 with max-pool, 4-frame stack, up to 30 no-op starts. Training envs add
episodic life and reward clipping; evaluation envs give true full-game returns (unclipped,
all lives). Both press FIRE after a life loss (EnvPool's episodic-life reset), so a greedy
agent trained with episodic life does not stall at the start of its next life.
`done` is the learning signal when training (life loss counts) and the end of a full game in
evaluation; `finished_returns` lists the undiscounted, unclipped returns of the full games
that ended on this step.
"""
from __future__ import annotations

import numpy as np

from .errors import AgentLoadError

ATARI_GAMES = {
    "pong": "Pong-v5",
    "breakout": "Breakout-v5",
    "mspacman": "MsPacman-v5",
    "spaceinvaders": "SpaceInvaders-v5",
    "frostbite": "Frostbite-v5",
    "seaquest": "Seaquest-v5",
}
MINATAR_GAMES = {
    "minatar-breakout": "Breakout-MinAtar",
    "minatar-spaceinvaders": "SpaceInvaders-MinAtar",
    "minatar-asterix": "Asterix-MinAtar",
    "minatar-freeway": "Freeway-MinAtar",
}


def check_game(game: str) -> str:
    """Normalise a game name, or raise a clear error listing the known games."""
    key = game.lower().replace("_", "").replace(" ", "")
    key = key.replace("minatar", "minatar-").replace("--", "-") if key.startswith("minatar") else key
    if key in ATARI_GAMES or key in MINATAR_GAMES:
        return key
    known = ", ".join(list(ATARI_GAMES) + list(MINATAR_GAMES))
    raise AgentLoadError(f"unknown game {game!r}; known games: {known}")


def needs_extra(module: str, what: str):
    """`module` imported, or an AgentLoadError naming the extra that installs it (the core install
    explains loaded agents on buffers and needs no emulator)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise AgentLoadError(f"{what} needs {module}, which the core install leaves out; fix: "
                             f"pip install 'jaxsal[agents]'") from None


def is_minatar(game: str) -> bool:
    return check_game(game) in MINATAR_GAMES


class AtariEnv:
    """EnvPool Atari with the standard DQN preprocessing, observations transposed to NHWC."""

    def __init__(self, game: str, num_envs: int = 8, train: bool = True, seed: int = 0,
                 frame_stack: int = 4, max_episode_steps: int = 27000, num_threads: int = 0):
        envpool = needs_extra("envpool", "playing Atari games")
        self.game = check_game(game)
        self.num_envs = num_envs
        self.train = train
        self._env = envpool.make(
            ATARI_GAMES[self.game], env_type="gymnasium", num_envs=num_envs, seed=seed,
            episodic_life=True, reward_clip=train, stack_num=frame_stack, noop_max=30,
            repeat_action_probability=0.0, img_height=84, img_width=84, gray_scale=True,
            frame_skip=4, max_episode_steps=max_episode_steps, num_threads=num_threads)
        self.num_actions = int(self._env.action_space.n)
        self.obs_shape = (84, 84, frame_stack)
        self._returns = np.zeros(num_envs, np.float64)

    def reset(self) -> np.ndarray:
        obs, _ = self._env.reset()
        self._returns[:] = 0.0
        return np.ascontiguousarray(obs.transpose(0, 2, 3, 1))

    def step(self, actions):
        obs, reward, terminated, truncated, info = self._env.step(np.asarray(actions, np.int32))
        self._returns += info["reward"]  # unclipped reward of the true game
        game_over = info["terminated"].astype(bool) | truncated  # real game over, not life loss
        finished = self._returns[game_over].tolist()
        self._returns[game_over] = 0.0
        done = ((terminated | truncated) if self.train else game_over).astype(np.float32)
        return np.ascontiguousarray(obs.transpose(0, 2, 3, 1)), reward.astype(np.float32), done, finished


class MinAtarEnv:
    """gymnax MinAtar, vmapped and jitted, auto-resetting; observations float32 (N, 10, 10, C)."""

    def __init__(self, game: str, num_envs: int = 64, train: bool = True, seed: int = 0):
        import jax

        gymnax = needs_extra("gymnax", "playing MinAtar games")
        self.game = check_game(game)
        self.num_envs = num_envs
        env, params = gymnax.make(MINATAR_GAMES[self.game])
        self.num_actions = int(env.num_actions)
        self.obs_shape = tuple(env.observation_space(params).shape)
        self._key = jax.random.PRNGKey(seed)
        self._reset = jax.jit(jax.vmap(lambda k: env.reset(k, params)))
        self._step = jax.jit(jax.vmap(lambda k, s, a: env.step(k, s, a, params)))
        self._returns = np.zeros(num_envs, np.float64)
        self._state = None

    def _keys(self):
        import jax

        self._key, sub = jax.random.split(self._key)
        return jax.random.split(sub, self.num_envs)

    def reset(self) -> np.ndarray:
        obs, self._state = self._reset(self._keys())
        self._returns[:] = 0.0
        return np.asarray(obs, np.float32)

    def get_state(self) -> dict:
        """Everything a later step depends on (RNG key, every env's game state, the unfinished
        games' returns) as numpy arrays, for an exact resume (set_state); call after reset()."""
        import jax

        leaves = jax.tree.leaves(self._state)
        return {"key": np.asarray(self._key), "returns": self._returns.copy(),
                "game": {f"{i:03d}": np.asarray(x) for i, x in enumerate(leaves)}}

    def set_state(self, state: dict) -> None:
        """Restore get_state()'s arrays (after reset(), which fixes the game state's structure)."""
        import jax
        import jax.numpy as jnp

        treedef = jax.tree.structure(self._state)
        leaves = [jnp.asarray(state["game"][f"{i:03d}"]) for i in range(treedef.num_leaves)]
        self._state = jax.tree.unflatten(treedef, leaves)
        self._key = jnp.asarray(state["key"])
        self._returns = np.array(state["returns"], np.float64)

    def step(self, actions):
        out = self._step(self._keys(), self._state, np.asarray(actions, np.int32))
        obs, self._state, reward = out[:3]
        # gymnax < 1.0 returns (obs, state, reward, done, info); 1.0 splits terminated/truncated
        done = np.asarray(out[3], bool) | (np.asarray(out[4], bool) if len(out) == 6 else False)
        reward = np.asarray(reward, np.float32)
        self._returns += reward
        finished = self._returns[done].tolist()
        self._returns[done] = 0.0
        return np.asarray(obs, np.float32), reward, done.astype(np.float32), finished


def make_env(game: str, num_envs: int = 8, train: bool = True, seed: int = 0, **kwargs):
    """Atari (EnvPool) or MinAtar (gymnax) by game name, e.g. "breakout", "minatar-asterix"."""
    game = check_game(game)
    if game in MINATAR_GAMES:
        return MinAtarEnv(game, num_envs=num_envs, train=train, seed=seed)
    return AtariEnv(game, num_envs=num_envs, train=train, seed=seed, **kwargs)
