"""Pilot of the replay-DDDQN study on DEVELOPMENT seeds only (0-3): one replay-DDDQN run
(jaxsal_agents.train_dqn) on the study's env (MinAtar Breakout, trail dropped, 4-frame host stack
with the variant's bug) with the study's snapshots (probes, methods, target as registered for the
PQN study; experiments.frame_stack_bug.plan), trainer settings from JSON; appends its returns, wall
and CPU time to /tmp/replay_pilot/results.jsonl. Refuses seeds >= 4 (the registered study uses
200-207). This is the script that produced experiments/frame_stack_bug/replay_dddqn_pilot.md.

    PYTHONPATH=. chrt --idle 0 python experiments/frame_stack_bug/replay_dddqn_pilot.py NAME '{"seed": 0, "lr": 1e-3, ...}'

JSON keys: jaxsal_agents.train_dqn.DQNConfig fields, plus "bug" (a variant name) and
"snapshot_every" (updates, default 16).
"""
import sys, time, json, resource
from pathlib import Path
import jaxsal  # noqa: F401  (XLA:CPU fast kernels)
import numpy as np
from jaxsal_agents.train_dqn import DQNConfig, train
from jaxsal_agents.framestack import make_stacked_env
from jaxsal_agents.networks import MinAtarDuelingDQN
from jaxsal_agents.snapshots import SaliencySnapshots, probe_states
from experiments.frame_stack_bug import plan

name, kw = sys.argv[1], json.loads(sys.argv[2])
snap_every = kw.pop("snapshot_every", 16)
assert kw.get("seed", 0) < 4, "pilot: development seeds 0-3 only"
bug = kw.pop("bug", None)
stack_bug = bug if bug in ("reuse", "no_update", "reversed", "misaligned") else None
cfg = DQNConfig(**{"frames": 4, "drop_trail": True, "run_dir": f"/tmp/replay_pilot/runs/{name}", "stack_bug": stack_bug or "",
                   "transition_bug": "misassembled" if bug == "misassembled" else "", **kw})
def env_fn(game, n, train=True, seed=0):
    return make_stacked_env(game, n, train=train, seed=seed, num_frames=4, bug=stack_bug, drop_trail=True)
probe = probe_states(env_fn(cfg.game, 8, train=False, seed=plan.PROBE_ENV_SEED), 16, steps=64, seed=0)
env1 = env_fn(cfg.game, 1)
model = MinAtarDuelingDQN(env1.num_actions, env1.obs_shape[-1])
snaps = SaliencySnapshots(probe, Path(cfg.run_dir) / "snapshots", every=snap_every, methods=plan.SNAPSHOT_METHODS,
                          num_frames=4, frame_methods=plan.FRAME_METHODS, target=plan.TARGET)
t_snap = [0.0]
def cb(**k):
    t = time.perf_counter(); snaps(**k); t_snap[0] += time.perf_counter() - t
t0 = time.time()
out = train(cfg, log=lambda m: print(m, flush=True), callback=cb, env_fn=env_fn, model=model)
ru = resource.getrusage(resource.RUSAGE_SELF)
r = out["returns"]
rows = snaps.rows
res = {"name": name, "cfg": {k: v for k, v in vars(cfg).items() if k not in ("run_dir",)}, "wall_s": round(time.time() - t0, 1),
       "cpu_s": round(ru.ru_utime + ru.ru_stime, 1), "snapshot_wall_s": round(t_snap[0], 1), "games": len(r),
       "final_return_mean20": rows[-1]["return_mean"], "last100_games": float(np.mean(r[-100:])),
       "curve": [(x["step"], round(x["return_mean"], 2)) for x in rows[::4]]}
print(json.dumps(res), flush=True)
with open("/tmp/replay_pilot/results.jsonl", "a") as f:
    f.write(json.dumps(res) + "\n")
