"""Uniformly random play on the replay-DDDQN study's env (MinAtar Breakout, trail dropped, 4-frame
host stack): mean full-game return over about 1,000 games on env seeds 0-3 (development seeds),
the unit of the study's learning check (experiments.frame_stack_bug.replay_dddqn_plan.RANDOM_MINATAR_BREAKOUT_RETURN).

    python experiments/frame_stack_bug/replay_dddqn_random_return.py
"""
import numpy as np, json
from jaxsal_agents.framestack import make_stacked_env
rets = []
for seed in range(4):
    env = make_stacked_env("minatar-breakout", 32, seed=seed, drop_trail=True)
    env.reset(); rng = np.random.default_rng(seed)
    while len(rets) < 250 * (seed + 1):
        rets += env.step(rng.integers(0, env.num_actions, 32))[3]
print(json.dumps({"random_games": len(rets), "mean": float(np.mean(rets)), "std": float(np.std(rets))}))
