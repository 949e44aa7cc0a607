"""Evaluate a shipped agent under the baselines protocol and write the result on its card.

    python -m jaxsal_agents.evaluate breakout --episodes 30

Protocol (Atari): greedy (epsilon 0) unless --epsilon; full games with all lives; unclipped
rewards; FIRE pressed after each lost life (EnvPool's episodic-life reset, as in training);
up to 30 no-op starts; at most 27,000 agent steps per game. Every game runs in its own
environment, all in parallel. The card gets mean, std, a 95% confidence interval of the mean
(Student t over games) and every game's return. MinAtar uses gymnax's own episodes.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from .envs import MINATAR_GAMES, make_env
from .zoo import SHIPPED_DIR, Agent, load

PROTOCOL = ("greedy, full games (all lives), unclipped rewards, FIRE pressed after each lost life, "
            "up to 30 no-op starts, at most 27000 agent steps per game")
MINATAR_PROTOCOL = "greedy, gymnax MinAtar episodes (default settings)"


def greedy_actions(out):
    """Greedy action from a network output: argmax of `q` (Q-networks) or `logits` (policies)."""
    if isinstance(out, dict):
        out = out["q"] if "q" in out else out["logits"]
    return jnp.argmax(out, -1)


def play_games(agent: Agent, episodes: int = 30, epsilon: float = 0.0, seed: int = 123,
               max_steps: int = 27000) -> list[float]:
    """Full-game returns of `episodes` games played in parallel (no clipping, all lives).

    A game cut at `max_steps` agent steps counts with the return reached so far. The network runs
    only on the games still going (padded to a power of two, so at most log2(episodes) shapes
    compile): the last long game of a large agent costs one state per step, not `episodes`.
    """
    game = agent.game
    kwargs = {} if game in MINATAR_GAMES else {"max_episode_steps": max_steps,
                                                "frame_stack": int(agent.card.get("obs_shape", [4])[-1])}
    env = make_env(game, episodes, train=False, seed=seed, **kwargs)
    policy = jax.jit(lambda p, o: greedy_actions(agent.apply_fn(p, o)))
    rng = np.random.default_rng(seed)
    obs, returns, done = env.reset(), [None] * episodes, np.zeros(episodes, bool)
    running = np.zeros(episodes)
    for _ in range(max_steps):
        actions = _active_actions(policy, agent.params, obs, ~done)
        explore = rng.random(episodes) < epsilon
        actions = np.where(explore, rng.integers(0, env.num_actions, episodes), actions)
        obs, reward, step_done, _ = env.step(actions)
        running += np.where(done, 0.0, reward)
        for i in np.flatnonzero(step_done.astype(bool) & ~done):
            returns[i] = float(running[i])
        done |= step_done.astype(bool)
        if done.all():
            break
    return [r if r is not None else float(running[i]) for i, r in enumerate(returns)]


def _active_actions(policy, params, obs, active):
    """Greedy actions of the active games (the rest get 0); the batch is padded to a power of two."""
    idx, n = np.flatnonzero(active), len(active)
    if len(idx) == n:
        return np.asarray(policy(params, jnp.asarray(obs)))
    actions = np.zeros(n, np.int32)
    if len(idx):
        size = min(n, 1 << (len(idx) - 1).bit_length())
        take = np.concatenate([idx, np.full(size - len(idx), idx[0])])
        actions[idx] = np.asarray(policy(params, jnp.asarray(obs[take])))[:len(idx)]
    return actions


def summarise(returns, confidence: float = 0.95) -> dict:
    """Mean, std and the Student-t confidence interval of the mean over games."""
    from scipy import stats

    x = np.asarray(returns, np.float64)
    mean, std = float(x.mean()), float(x.std(ddof=1)) if len(x) > 1 else 0.0
    half = float(stats.t.ppf(0.5 + confidence / 2, len(x) - 1) * std / np.sqrt(len(x))) if len(x) > 1 else 0.0
    return {"episodes": len(x), "mean_return": mean, "std_return": std,
            "ci95": [mean - half, mean + half], "returns": x.tolist()}


def evaluate_agent(agent: Agent, episodes: int = 30, epsilon: float = 0.0, seed: int = 123) -> dict:
    """The card's `eval` entry for `agent`: summary, protocol, seed and wall time."""
    t0 = time.time()
    rets = play_games(agent, episodes=episodes, epsilon=epsilon, seed=seed)
    out = summarise(rets)
    out.update({"epsilon": epsilon, "seed": seed,
                "protocol": MINATAR_PROTOCOL if agent.game in MINATAR_GAMES else PROTOCOL,
                "seconds": round(time.time() - t0, 1), "date": time.strftime("%Y-%m-%d")})
    return out


def update_card(name: str, result: dict) -> Path:
    """Write `result` as the `eval` entry of a shipped agent's card (or a card path)."""
    path = Path(name) if str(name).endswith(".json") else SHIPPED_DIR / f"{name}.json"
    card = json.loads(path.read_text())
    card["eval"] = result
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(card, indent=1) + "\n")
    tmp.replace(path)
    return path


def main(argv=None):
    import jaxsal.cpu
    jaxsal.cpu.use_fast_kernels()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="shipped agent name or card .json")
    p.add_argument("--episodes", type=int, default=30)
    p.add_argument("--epsilon", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=123)
    p.add_argument("--no-update", action="store_true", help="print only; leave the card as it is")
    a = p.parse_args(argv)
    agent = load(a.name)
    res = evaluate_agent(agent, a.episodes, a.epsilon, a.seed)
    lo, hi = res["ci95"]
    print(f"{agent.name}: {res['mean_return']:.1f} ± {res['std_return']:.1f} (95% CI {lo:.1f} to {hi:.1f}) "
          f"over {res['episodes']} games, {res['seconds']:.0f} s")
    if not a.no_update:
        print(f"card updated: {update_card(a.name, res)}")


if __name__ == "__main__":
    sys.exit(main())
