"""Paper A's frame-stacking bug, measured: do saliency maps flag a broken frame stack before
the return curve does?

The pre-registered study (experiments/frame_stack_bug/preregistration.md; every number from
experiments.frame_stack_bug.plan, runner and analysis in experiments.frame_stack_bug.study):

    python -m experiments.frame_stack_bug.run --study minatar      # MinAtar, seeds 100-107, 96k steps
    python -m experiments.frame_stack_bug.run --study atari        # Breakout, dueling PQN agent, seeds 100-104 (GPU)
    python -m experiments.frame_stack_bug.run --study atari --shard 1/4 --no-analysis   # parallel workers
    python -m experiments.frame_stack_bug.run --study atari --analyse-only
    python -m experiments.frame_stack_bug.run --study atari --analyse-only --incomplete   # registered incomplete report
    python -m experiments.frame_stack_bug.run --study replay_dddqn  # replay DDDQN, MinAtar, seeds 200-207
                                                                # (experiments/frame_stack_bug/replay_dddqn_preregistration.md)

With --study, only --out, --runs-dir, --shard, --no-analysis, --analyse-only, --incomplete, --export-runs,
--time-limit and --env-threads apply; the flags below belong to the EARLIER, exploratory experiment (seeds 0-5,
statistic chosen on seeds 0-2), kept to reproduce its results:

    python -m experiments.frame_stack_bug.run                  # small: MinAtar, 6 seeds, ~30 min on 2 CPUs
    python -m experiments.frame_stack_bug.run --steps 96000 --every 4   # the 4x budget (results/.../gpu_96k)
    python -m experiments.frame_stack_bug.run --large          # >= 6 seeds, 10x the steps (GPU or patience)

Trains PQN agents (jaxsal_agents.train) on frame-stacked MinAtar Breakout whose trail channel is
dropped (so the ball's direction is only in the stack): the correct stack and each bug of
jaxsal_agents.framestack, >= 3 seeds each (seed s of every variant starts from the same weights and
the same env seed). A SaliencySnapshots callback computes Grad-CAM, G1Grad-CAM, G2Grad-CAM,
Guided Backprop and gradient maps on a fixed probe set every K updates, and the per-stacked-
frame attribution shares of gradient x input maps (experiments.frame_stack_bug.stats).

Statistic (from the maps alone; why it works: experiments.frame_stack_bug.stats): `stack_age_gain`, the mean
age of the attended stacked frames (per-frame attribution shares of gradient x input, gradient
and Guided Backprop, averaged over methods and probe states), minus its value at the run's
first snapshot, as a causal trailing mean over the last `--window` snapshots. The earlier
statistic, `newest_share_gain` (gradient x input share on the newest frame minus its first
value), is reported next to it. Separation step: the earliest snapshot step from which
AUC(buggy vs correct seeds) stays >= 0.9 (or <= 0.1) to the end of the budget; the same
criterion on the return curve (mean of the last 20 finished games at each snapshot) gives the
reward step. Overall `saliency_separation_step`: the step by which every bug that the
statistic separates is separated (the latest of their steps; null if it separates none),
with the bugs it does not separate listed next to it (`saliency_bugs_not_separated`);
`saliency_separation_step_all_bugs` is null unless every bug is separated. Same for reward.

The statistic's design was chosen on seeds 0..`--dev-seeds`-1 (a development set); the
summary's `held_out` block scores both statistics and the returns on the other seeds only.

Outputs in experiments/results/frame_stack_bug/: summary.json, stats.csv (every snapshot of
every run), frame_stack_bug.png (return curves next to map snapshots and the statistic).
"""
from __future__ import annotations

import argparse
import csv
import json
import platform
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from experiments.common.paths import RESULTS
from experiments.frame_stack_bug import study as frame_stack_study
from experiments.frame_stack_bug.study import OLD_STAT_DOC, OLD_STATISTIC, STAT_DOC, STATISTIC, add_statistic

OUT = RESULTS / "frame_stack_bug"
DEFAULT_BUGS = ("reuse", "no_update", "reversed", "misaligned")


def make_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--game", default="minatar-breakout")
    p.add_argument("--bugs", default=",".join(DEFAULT_BUGS),
                   help="comma-separated bugs of jaxsal_agents.framestack.BUGS (misaligned, reuse, no_update, reversed)")
    p.add_argument("--seeds", type=int, default=6, help="seeds per variant (>= --dev-seeds + 3 to get a held-out set)")
    p.add_argument("--steps", type=int, default=24_000, help="env steps per run")
    p.add_argument("--num-envs", type=int, default=32)
    p.add_argument("--rollout", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--minibatches", type=int, default=4)
    p.add_argument("--frames", type=int, default=4)
    p.add_argument("--every", type=int, default=2, help="updates between saliency snapshots")
    p.add_argument("--probes", type=int, default=16)
    p.add_argument("--threshold", type=float, default=0.9)
    p.add_argument("--window", type=int, default=4, help="snapshots in the statistic's trailing mean")
    p.add_argument("--dev-seeds", type=int, default=3,
                   help="the statistic was designed on seeds 0..N-1; the rest are scored as held out")
    p.add_argument("--keep-trail", action="store_true", help="keep MinAtar's trail channel")
    p.add_argument("--large", action="store_true", help=">= 5 seeds and 10x the steps")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--runs-dir", default=None, help="where run folders go (default OUT/runs)")
    p.add_argument("--fresh", action="store_true", help="retrain runs that already finished")
    g = p.add_argument_group("the pre-registered study (experiments.frame_stack_bug.plan)")
    g.add_argument("--study", choices=("minatar", "atari", "replay_dddqn"), default=None,
                   help="run/analyse the pre-registered study; every other number comes from the plan")
    g.add_argument("--shard", default=None, help="i/n: train every n-th registered run from i (parallel workers)")
    g.add_argument("--no-analysis", action="store_true", help="train only (a shard); analyse later")
    g.add_argument("--analyse-only", action="store_true", help="analyse the runs on disk, train nothing")
    g.add_argument("--incomplete", action="store_true",
                   help="the study cannot be completed: write the pre-registration's incomplete report "
                        "(<study>_incomplete_summary.*: the rule on the runs that exist, at the checkpoints "
                        "all of them reached, truncated, missing runs listed) instead of waiting for them")
    g.add_argument("--export-runs", default=None, metavar="DEST",
                   help="afterwards, copy the finished runs to DEST as small committable folders (the "
                        "statistic's inputs; maps of the first seed only) that --runs-dir DEST analyses alike")
    g.add_argument("--time-limit", type=float, default=0.0,
                   help="seconds per run before it stops after a checkpoint (resumable); 0: none")
    g.add_argument("--env-threads", type=int, default=0, help="EnvPool threads per run (Atari); 0: default")
    return p


_MODELS: dict = {}


def run_one(args, bug, seed, runs_dir, log=print):
    """Train one variant/seed with snapshots; returns its snapshot rows (cached on disk)."""
    from jaxsal_agents.framestack import make_stacked_env
    from jaxsal_agents.networks import MinAtarDQN
    from jaxsal_agents.snapshots import SaliencySnapshots, probe_states
    from jaxsal_agents.train import PQNConfig, train

    name = f"{bug or 'correct'}_s{seed}"
    run_dir = Path(runs_dir) / name
    done_file = run_dir / "done.json"
    if done_file.exists() and not args.fresh:
        return json.loads(done_file.read_text())["rows"]
    if run_dir.exists():
        shutil.rmtree(run_dir)

    def env_fn(game, num_envs, train=True, seed=0):
        return make_stacked_env(game, num_envs, train=train, seed=seed, num_frames=args.frames,
                                bug=bug, drop_trail=not args.keep_trail)

    # probes: same env seed and random actions for every variant, so the same game states
    # (each variant sees them through its own, possibly buggy, stack)
    probe_env = env_fn(args.game, 8, seed=10_000)
    probe = probe_states(probe_env, args.probes, seed=0)
    shape = (probe_env.num_actions, probe_env.obs_shape[-1])
    model = _MODELS.setdefault(shape, MinAtarDQN(*shape))   # one instance: compiled maps are reused
    cfg = PQNConfig(game=args.game, steps=args.steps, num_envs=args.num_envs, rollout=args.rollout,
                    lr=args.lr, epochs=args.epochs, minibatches=args.minibatches, seed=seed, run_dir=str(run_dir), ckpt_every=10**9)
    snaps = SaliencySnapshots(probe, run_dir / "snapshots", every=args.every, num_frames=args.frames)
    t0 = time.time()
    train(cfg, log=log, callback=snaps, env_fn=env_fn, model=model)
    rows = snaps.rows
    done_file.write_text(json.dumps({"rows": rows, "wall_s": round(time.time() - t0, 1)}))
    log(f"{name}: {len(rows)} snapshots, {time.time() - t0:.0f} s")
    return rows


def run_shares(snap_dir):
    """(T, M, N, k) per-frame attribution shares of a run's saved snapshots, in step order."""
    from jaxsal_agents.snapshots import load_snapshots

    snaps = load_snapshots(snap_dir)
    return [s for s, _ in snaps], np.stack([a["frame_shares"] for _, a in snaps])


SIGNALS = {"saliency": STATISTIC, "saliency_old": OLD_STATISTIC, "reward": "return_mean"}


def analyse(results, bugs, seeds, threshold):
    """Per bug: separation steps, directions and AUC curves vs the correct runs of `seeds`, for
    the statistic ("saliency_*"), the earlier statistic ("saliency_old_*") and returns ("reward_*")."""
    from experiments.frame_stack_bug.stats import separation_step

    n = min(len(results[(b, s)]) for b in [None] + list(bugs) for s in seeds)
    steps = [r["step"] for r in results[(None, seeds[0])][:n]]

    def matrix(bug, key):
        m = np.array([[r[key] for r in results[(bug, s)][:n]] for s in seeds], float)
        return np.nan_to_num(m, nan=0.0)   # no finished game yet: return 0

    per_bug = {}
    for bug in bugs:
        v = {}
        for name, key in SIGNALS.items():
            st, d, curve = separation_step(steps, matrix(bug, key), matrix(None, key), threshold)
            v[f"{name}_separation_step"], v[f"{name}_direction"] = st, d
            v[f"{name}_auc"] = [round(float(a), 3) for a in curve]
        v["final_return_mean"] = float(matrix(bug, "return_mean")[:, -1].mean())
        v["final_newest_share"] = float(matrix(bug, "newest_share")[:, -1].mean())
        v[f"final_{STATISTIC}"] = float(matrix(bug, STATISTIC)[:, -1].mean())
        per_bug[bug] = v
    return steps, per_bug


def overall(per_bug, key):
    """(step by which every bug that is separated at all is separated -- the latest of their
    steps, None if none is --, the bugs not separated, the step if ALL are separated else None)."""
    hit = {b: v[key] for b, v in per_bug.items() if v[key] is not None}
    missed = [b for b, v in per_bug.items() if v[key] is None]
    step = max(hit.values()) if hit else None
    return step, missed, (step if not missed else None)


def overall_block(per_bug, prefix=""):
    """Summary keys for the overall separation steps of the three signals."""
    out = {}
    for name in SIGNALS:
        step, missed, all_step = overall(per_bug, f"{name}_separation_step")
        out[f"{prefix}{name}_separation_step"] = step
        out[f"{prefix}{name}_bugs_not_separated"] = missed
        out[f"{prefix}{name}_separation_step_all_bugs"] = all_step
    return out


def figure(results, bugs, seeds, steps, runs_dir, path, state=0, cols=5):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxsal_agents.snapshots import load_snapshots, probe_image

    variants = [None] + list(bugs)
    fig = plt.figure(figsize=(3.2 * 2 + 1.3 * cols, 1.6 * len(variants) + 0.6))
    gs = fig.add_gridspec(len(variants), cols + 4)
    ax_r = fig.add_subplot(gs[:, :2])
    ax_s = fig.add_subplot(gs[:, 2:4])
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, bug in enumerate(variants):
        label = bug or "correct"
        for s in seeds:
            rows = results[(bug, s)][:len(steps)]
            ax_r.plot(steps, [r["return_mean"] for r in rows], color=colors[i], alpha=0.6,
                      label=label if s == seeds[0] else None)
            ax_s.plot(steps, [r[STATISTIC] for r in rows], color=colors[i], alpha=0.6,
                      label=label if s == seeds[0] else None)
        snaps = load_snapshots(Path(runs_dir) / f"{label}_s{seeds[0]}" / "snapshots")
        pick = np.unique(np.linspace(0, len(snaps) - 1, cols).round().astype(int))
        for c, j in enumerate(pick):
            step, arr = snaps[j]
            a = fig.add_subplot(gs[i, 4 + c])
            a.imshow(arr["guided_backprop"][state], cmap="inferno")
            a.set_xticks([])
            a.set_yticks([])
            if c == 0:
                a.set_ylabel(label, fontsize=8, color=colors[i])
            if i == 0:
                a.set_title(f"step {step}", fontsize=7)
    ax_r.set_title("return (last 20 games)", fontsize=9)
    ax_r.set_xlabel("env step")
    ax_r.legend(fontsize=7)
    ax_s.set_title("stack age gain (maps only)", fontsize=9)
    ax_s.axhline(0, color="grey", lw=0.5)
    ax_s.set_xlabel("env step")
    fig.suptitle("frame-stacking bugs: returns vs Guided Backprop snapshots (seed %d, probe %d)"
                 % (seeds[0], state), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None, log=lambda m: print(m, flush=True)):
    args = make_parser().parse_args(argv)
    if args.study:
        out = Path(args.out)
        summary = frame_stack_study.run_study(
            frame_stack_study.STUDIES[args.study], out, args.runs_dir, shard=args.shard,
            train=not args.analyse_only, analysis=not args.no_analysis, time_limit=args.time_limit,
            env_threads=args.env_threads, export_to=args.export_runs, incomplete=args.incomplete, log=log)
        return summary if summary is not None else {"analysed": False}
    from jaxsal_agents.framestack import check_bug
    if args.large:
        args.seeds, args.steps = max(args.seeds, 5), args.steps * 10
    bugs = [check_bug(b.strip()) for b in args.bugs.split(",") if b.strip()]
    if not bugs or None in bugs:
        raise SystemExit("--bugs needs at least one bug name (the correct stack always runs)")
    if args.seeds < 1:
        raise SystemExit("--seeds must be >= 1")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = Path(args.runs_dir) if args.runs_dir else out / "runs"
    seeds = list(range(args.seeds))
    t0 = time.time()
    results = {}
    for s in seeds:                      # seed-major: a cut-short run still has every variant
        for bug in [None] + bugs:
            rows = run_one(args, bug, s, runs_dir, log=log)
            snap_steps, shares = run_shares(Path(runs_dir) / f"{bug or 'correct'}_s{s}" / "snapshots")
            if snap_steps != [r["step"] for r in rows]:
                raise SystemExit(f"{bug or 'correct'}_s{s}: snapshot files do not match its rows; rerun with --fresh")
            results[(bug, s)] = add_statistic(rows, shares, args.window)
    steps, per_bug = analyse(results, bugs, seeds, args.threshold)
    dev = seeds[:args.dev_seeds]
    held = seeds[args.dev_seeds:]
    held_out = None
    if dev and held:
        h_steps, h_bugs = analyse(results, bugs, held, args.threshold)
        held_out = {"seeds": held, **overall_block(h_bugs), "per_bug": h_bugs}
    with open(out / "stats.csv", "w", newline="") as f:
        keys = ["variant", "seed"] + list(results[(None, 0)][0])
        w = csv.DictWriter(f, keys, extrasaction="ignore")
        w.writeheader()
        for (bug, s), rows in results.items():
            for r in rows:
                w.writerow({"variant": bug or "correct", "seed": s, **r})
    figure(results, bugs, seeds, steps, runs_dir, out / "frame_stack_bug.png")
    summary = {
        **overall_block(per_bug),
        "seeds": seeds, "statistic": STATISTIC, "statistic_definition": STAT_DOC,
        "old_statistic": OLD_STATISTIC, "old_statistic_definition": OLD_STAT_DOC,
        "criterion": f"AUC(buggy vs correct seeds) >= {args.threshold} or <= {1 - args.threshold:.2f} "
                     "at this snapshot and every later one (same direction)",
        "overall_definition": "saliency_separation_step (reward_separation_step): the step by which "
                              "every bug that the statistic (the return curve) separates is separated, "
                              "i.e. the latest of their per-bug steps, null if it separates none; the bugs "
                              "it never separates are listed in *_bugs_not_separated; "
                              "*_separation_step_all_bugs is null unless every bug is separated. "
                              "saliency_old_*: the same for the earlier statistic",
        "development_seeds": dev,
        "held_out": held_out,
        "per_bug": per_bug, "snapshot_steps": steps,
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "runs_dir", "fresh")},
        "env": f"{args.game}, {args.frames}-frame stack built by jaxsal_agents.framestack"
               + ("" if args.keep_trail else ", trail channel dropped"),
        "wall_s": round(time.time() - t0, 1), "platform": platform.platform(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    log(json.dumps({k: summary[k] for k in ("saliency_separation_step", "saliency_bugs_not_separated",
                                             "reward_separation_step", "reward_bugs_not_separated")}))
    for bug, v in per_bug.items():
        log(f"{bug}: saliency {v['saliency_separation_step']} (old statistic "
            f"{v['saliency_old_separation_step']}) reward {v['reward_separation_step']} "
            f"final return {v['final_return_mean']:.2f} newest share {v['final_newest_share']:.3f}")
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
