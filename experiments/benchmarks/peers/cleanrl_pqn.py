"""A CleanRL-style PQN trainer in PyTorch (the structure of CleanRL's pqn_atari_envpool.py),
used only as the speed reference for jaxsal_agents.train: same EnvPool Atari setup, same Nature CNN
with LayerNorm, RAdam, Q(lambda) targets, epsilon-greedy acting, and the same rollout,
minibatch and epoch settings. Needs the `bench` extra (torch).

    python -m experiments.benchmarks.peers.cleanrl_pqn --game breakout --updates 30
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class QNetwork(nn.Module):
    """Nature CNN with LayerNorm after every layer (CleanRL's PQN network), NCHW input."""

    def __init__(self, num_actions: int):
        super().__init__()
        self.network = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.LayerNorm([32, 20, 20]), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.LayerNorm([64, 9, 9]), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.LayerNorm([64, 7, 7]), nn.ReLU(),
            nn.Flatten(), nn.Linear(3136, 512), nn.LayerNorm(512), nn.ReLU(),
            nn.Linear(512, num_actions))

    def forward(self, x):
        return self.network(x / 255.0)


def run(game: str = "breakout", num_envs: int = 32, num_steps: int = 32, minibatches: int = 8,
        epochs: int = 2, updates: int = 30, warmup: int = 3, lr: float = 2.5e-4, gamma: float = 0.99,
        q_lambda: float = 0.65, threads: int = 2, seed: int = 0) -> dict:
    """Train for `updates` iterations; returns env steps/s over the iterations after `warmup`."""
    import envpool

    from jaxsal_agents.envs import ATARI_GAMES

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    envs = envpool.make(ATARI_GAMES[game], env_type="gymnasium", num_envs=num_envs, seed=seed,
                        episodic_life=True, reward_clip=True, stack_num=4, noop_max=30,
                        repeat_action_probability=0.0, img_height=84, img_width=84, gray_scale=True,
                        frame_skip=4)
    n_actions = int(envs.action_space.n)
    q_network = QNetwork(n_actions)
    optimizer = torch.optim.RAdam(q_network.parameters(), lr=lr)
    obs = torch.zeros((num_steps, num_envs, 4, 84, 84))
    actions = torch.zeros((num_steps, num_envs), dtype=torch.long)
    rewards = torch.zeros((num_steps, num_envs))
    dones = torch.zeros((num_steps, num_envs))
    values = torch.zeros((num_steps, num_envs))
    next_obs = torch.tensor(envs.reset()[0], dtype=torch.float32)
    next_done = torch.zeros(num_envs)
    batch = num_envs * num_steps
    mb = batch // minibatches
    clock = {"act": 0.0, "env": 0.0, "update": 0.0}
    t_start = None
    for it in range(updates):
        if it == warmup:
            t_start, clock = time.perf_counter(), {k: 0.0 for k in clock}
        epsilon = max(0.01, 1.0 - it / max(1, updates))
        for step in range(num_steps):
            obs[step], dones[step] = next_obs, next_done
            t0 = time.perf_counter()
            with torch.no_grad():
                q = q_network(next_obs)
                greedy = q.argmax(1)
                values[step] = q.max(1).values
            explore = torch.rand(num_envs) < epsilon
            action = torch.where(explore, torch.randint(0, n_actions, (num_envs,)), greedy)
            actions[step] = action
            t1 = time.perf_counter()
            o, r, term, trunc, _ = envs.step(action.numpy().astype(np.int32))
            clock["act"] += t1 - t0
            clock["env"] += time.perf_counter() - t1
            rewards[step] = torch.as_tensor(r, dtype=torch.float32)
            next_obs = torch.as_tensor(o, dtype=torch.float32)
            next_done = torch.as_tensor(term | trunc, dtype=torch.float32)
        t0 = time.perf_counter()
        with torch.no_grad():  # Q(lambda) targets, backwards in time
            returns = torch.zeros_like(rewards)
            for t in reversed(range(num_steps)):
                if t == num_steps - 1:
                    returns[t] = rewards[t] + gamma * q_network(next_obs).max(1).values * (1.0 - next_done)
                else:
                    nonterminal = 1.0 - dones[t + 1]
                    returns[t] = rewards[t] + gamma * (q_lambda * returns[t + 1]
                                                       + (1 - q_lambda) * values[t + 1] * nonterminal)
        b_obs, b_act, b_ret = obs.reshape(-1, 4, 84, 84), actions.reshape(-1), returns.reshape(-1)
        for _ in range(epochs):
            perm = torch.randperm(batch)
            for start in range(0, batch, mb):
                idx = perm[start:start + mb]
                q_a = q_network(b_obs[idx]).gather(1, b_act[idx, None]).squeeze(1)
                loss = F.mse_loss(b_ret[idx], q_a)
                optimizer.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(q_network.parameters(), 10.0)
                optimizer.step()
        clock["update"] += time.perf_counter() - t0
    wall = time.perf_counter() - t_start
    steps = (updates - warmup) * batch
    return {"steps_per_s": steps / wall, "seconds": wall, "steps": steps, "torch": torch.__version__,
            "threads": threads, "share": {k: v / wall for k, v in clock.items()}}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--game", default="breakout")
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--num-envs", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args(argv)
    print(json.dumps(run(a.game, num_envs=a.num_envs, updates=a.updates, threads=a.threads)))


if __name__ == "__main__":
    main()
