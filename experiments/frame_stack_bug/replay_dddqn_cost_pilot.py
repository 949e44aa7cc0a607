"""Cost pilot of the redesigned replay-DDDQN study (development seed 0 only): one run of the study's
trainer settings (experiments.frame_stack_bug.replay_dddqn_plan.REPLAY_DDDQN) with one graded transition bug and the
study's saliency snapshots, stopped after at most `--cpu` CPU-seconds of this process; prints the
CPU cost of compilation, of the env steps and updates, and of a snapshot, and the extrapolated CPU
cost of one full run and of the whole study. Run it niced; nothing it writes is a result.

    nice python -m experiments.frame_stack_bug.replay_dddqn_cost_pilot --variant cross_episode_p1 --cpu 55
"""
from __future__ import annotations

import argparse
import json
import resource
import time
from pathlib import Path


class _Enough(Exception):
    pass


def cpu_s() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def main(argv=None):
    import jaxsal.cpu
    from experiments.frame_stack_bug import plan
    from experiments.frame_stack_bug import study as fss
    from experiments.frame_stack_bug import replay_dddqn_plan as rplan
    from jaxsal_agents.snapshots import SaliencySnapshots, probe_states
    from jaxsal_agents.train_dqn import DQNConfig, train

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variant", default="cross_episode_p1")
    ap.add_argument("--cpu", type=float, default=55.0, help="stop after this many CPU-seconds (at most 60)")
    ap.add_argument("--out", default="/tmp/replay_cost_pilot")
    a = ap.parse_args(argv)
    if a.cpu > 60:
        raise SystemExit("--cpu: the pilot is capped at 60 CPU-seconds")
    jaxsal.cpu.use_fast_kernels()
    study, seed = rplan.REPLAY_DDDQN, 0                       # development seed: never a registered one
    stack_bug, bug, p = fss.split_bug(a.variant)
    env_fn = fss.default_env_fn(study, stack_bug)
    t0 = cpu_s()
    probe = probe_states(env_fn(study.game, 8, train=False, seed=plan.PROBE_ENV_SEED), plan.N_PROBES,
                         steps=plan.PROBE_STEPS, seed=plan.PROBE_POLICY_SEED)
    model = fss.build_model(study, env_fn(study.game, 1, train=False, seed=0))
    run_dir = Path(a.out) / f"{a.variant}_s{seed}"
    snaps = SaliencySnapshots(probe, run_dir / "snapshots", every=study.snapshot_every, methods=plan.SNAPSHOT_METHODS,
                              num_frames=study.frames, frame_methods=plan.FRAME_METHODS, target=plan.TARGET)
    marks, snap_cpu = [], []

    def callback(**k):
        before = cpu_s()
        snaps(**k)
        after = cpu_s()
        if len(snaps.rows) and snaps.rows[-1]["step"] == k["step"]:
            snap_cpu.append((k["step"], after - before))
        marks.append((k["step"], after - t0))
        if after - t0 > a.cpu:
            raise _Enough
    cfg = DQNConfig(game=study.game, arch="dueling", steps=study.steps, num_envs=study.num_envs, rollout=study.rollout,
                    buffer_size=study.buffer_size, batch_size=study.batch_size, grad_steps=study.grad_steps,
                    learning_starts=study.learning_starts, lr=study.lr, target_every=study.target_every,
                    eps_decay_frac=study.eps_decay_frac, frames=study.frames, drop_trail=study.drop_trail,
                    transition_bug=bug or "", transition_bug_p=p, seed=seed, run_dir=str(run_dir), ckpt_every=10**9)
    w0 = time.time()
    try:
        train(cfg, log=lambda m: None, callback=callback, env_fn=env_fn, model=model)
    except _Enough:
        pass
    learn = [(s, c) for s, c in marks if s > study.learning_starts + 2 * study.steps_per_update]
    (s1, c1), (s2, c2) = learn[0], learn[-1]
    inside = [c for s, c in snap_cpu if s1 < s <= s2]           # snapshots after the first (which compiles)
    steady = (c2 - c1 - sum(inside)) / (s2 - s1)               # CPU-s per env step, snapshots excluded
    n_snaps = study.updates // study.snapshot_every + 1
    later = [c for _, c in snap_cpu[1:]]
    per_snap = sum(later) / max(1, len(later))
    per_run = c1 + steady * (study.steps - s1) + per_snap * n_snaps
    runs = len(fss.all_runs(study))
    print(json.dumps({"variant": a.variant, "pilot_cpu_s": round(c2, 1), "pilot_wall_s": round(time.time() - w0, 1),
                      "steps_reached": s2, "startup_and_compile_cpu_s": round(c1, 1),
                      "cpu_s_per_1000_steps": round(1000 * steady, 2), "cpu_s_per_snapshot": round(per_snap, 2),
                      "snapshots_timed": len(snap_cpu), "cpu_s_per_run": round(per_run), "runs": runs,
                      "study_cpu_h": round(per_run * runs / 3600, 2),
                      "study_wall_h_on_2_free_cores": round(per_run * runs / 3600 / 2, 2)}))


if __name__ == "__main__":
    main()
