"""Paper A's frame-stacking bug, measured: do saliency maps flag a broken frame stack before
the return curve does?

    python -m experiments.frame_stack_bug                  # small: MinAtar, 3 seeds, minutes on 2 CPUs
    python -m experiments.frame_stack_bug --large          # 5 seeds, 10x the steps (GPU or patience)

Trains PQN agents (agents.train) on frame-stacked MinAtar Breakout whose trail channel is
dropped (so the ball's direction is only in the stack): the correct stack and each bug of
agents.framestack, >= 3 seeds each (seed s of every variant starts from the same weights and
the same env seed). A SaliencySnapshots callback computes Grad-CAM, G1Grad-CAM, G2Grad-CAM,
Guided Backprop and gradient maps on a fixed probe set every K updates, and the per-stacked-
frame attribution shares of gradient x input maps (jaxsal.frame_stats).

Statistic (from the maps alone): the share of |gradient x input| on the newest stacked frame, minus
its value in the run's first snapshot (removes the random-init profile, which is shared by
the seed's variants). Separation step: the earliest snapshot step from which AUC(buggy vs
correct seeds) stays >= 0.9 (or <= 0.1) to the end of the budget; the same criterion on the
return curve (mean of the last 20 finished games at each snapshot) gives the reward step.

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

OUT = Path(__file__).parent / "results" / "frame_stack_bug"
DEFAULT_BUGS = ("reuse", "no_update", "reversed", "misaligned")
STATISTIC = "newest_share_gain"
STAT_DOC = ("share of |gradient x input| attribution (probe-set mean) on the newest stacked frame, "
            "minus the same share in the run's first snapshot")


def make_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--game", default="minatar-breakout")
    p.add_argument("--bugs", default=",".join(DEFAULT_BUGS),
                   help="comma-separated bugs of agents.framestack.BUGS (misaligned, reuse, no_update, reversed)")
    p.add_argument("--seeds", type=int, default=3)
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
    p.add_argument("--keep-trail", action="store_true", help="keep MinAtar's trail channel")
    p.add_argument("--large", action="store_true", help="5 seeds and 10x the steps")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--runs-dir", default=None, help="where run folders go (default OUT/runs)")
    p.add_argument("--fresh", action="store_true", help="retrain runs that already finished")
    return p


_MODELS: dict = {}


def run_one(args, bug, seed, runs_dir, log=print):
    """Train one variant/seed with snapshots; returns its snapshot rows (cached on disk)."""
    from agents.framestack import make_stacked_env
    from agents.networks import MinAtarDQN
    from agents.snapshots import SaliencySnapshots, probe_states
    from agents.train import PQNConfig, train

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


def add_statistic(rows):
    """Adds the detector statistic to each snapshot row of one run (see STAT_DOC)."""
    base = rows[0]["newest_share"]
    for r in rows:
        r[STATISTIC] = r["newest_share"] - base
    return rows


def analyse(results, bugs, seeds, threshold):
    """Per bug: saliency and reward separation steps and AUC curves vs the correct runs."""
    from jaxsal.frame_stats import separation_step

    steps = [r["step"] for r in results[(None, seeds[0])]]
    n = min(len(results[k]) for k in results)
    steps = steps[:n]

    def matrix(bug, key):
        m = np.array([[r[key] for r in results[(bug, s)][:n]] for s in seeds], float)
        return np.nan_to_num(m, nan=0.0)   # no finished game yet: return 0

    per_bug = {}
    for bug in bugs:
        sal, sal_dir, sal_auc = separation_step(steps, matrix(bug, STATISTIC), matrix(None, STATISTIC),
                                                threshold)
        rew, rew_dir, rew_auc = separation_step(steps, matrix(bug, "return_mean"),
                                                matrix(None, "return_mean"), threshold)
        per_bug[bug] = {"saliency_separation_step": sal, "saliency_direction": sal_dir,
                        "reward_separation_step": rew, "reward_direction": rew_dir,
                        "saliency_auc": [round(float(a), 3) for a in sal_auc],
                        "reward_auc": [round(float(a), 3) for a in rew_auc],
                        "final_return_mean": float(matrix(bug, "return_mean")[:, -1].mean()),
                        "final_newest_share": float(matrix(bug, "newest_share")[:, -1].mean())}
    return steps, per_bug


def overall(per_bug, key):
    """Step by which every bug is separated (the latest of the per-bug steps); None if any never."""
    vals = [v[key] for v in per_bug.values()]
    return None if any(v is None for v in vals) else max(vals)


def figure(results, bugs, seeds, steps, runs_dir, path, state=0, cols=5):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from agents.snapshots import load_snapshots, probe_image

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
    ax_s.set_title("newest-frame share gain", fontsize=9)
    ax_s.set_xlabel("env step")
    fig.suptitle("frame-stacking bugs: returns vs Guided Backprop snapshots (seed %d, probe %d)"
                 % (seeds[0], state), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None, log=lambda m: print(m, flush=True)):
    args = make_parser().parse_args(argv)
    from agents.framestack import check_bug
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
            results[(bug, s)] = add_statistic(run_one(args, bug, s, runs_dir, log=log))
    steps, per_bug = analyse(results, bugs, seeds, args.threshold)
    with open(out / "stats.csv", "w", newline="") as f:
        keys = ["variant", "seed"] + list(results[(None, 0)][0])
        w = csv.DictWriter(f, keys, extrasaction="ignore")
        w.writeheader()
        for (bug, s), rows in results.items():
            for r in rows:
                w.writerow({"variant": bug or "correct", "seed": s, **r})
    figure(results, bugs, seeds, steps, runs_dir, out / "frame_stack_bug.png")
    summary = {
        "saliency_separation_step": overall(per_bug, "saliency_separation_step"),
        "reward_separation_step": overall(per_bug, "reward_separation_step"),
        "seeds": seeds, "statistic": STATISTIC, "statistic_definition": STAT_DOC,
        "criterion": f"AUC(buggy vs correct seeds) >= {args.threshold} or <= {1 - args.threshold:.2f} "
                     "at this snapshot and every later one (same direction)",
        "per_bug": per_bug, "snapshot_steps": steps,
        "config": {k: v for k, v in vars(args).items() if k not in ("out", "runs_dir", "fresh")},
        "env": f"{args.game}, {args.frames}-frame stack built by agents.framestack"
               + ("" if args.keep_trail else ", trail channel dropped"),
        "wall_s": round(time.time() - t0, 1), "platform": platform.platform(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    log(json.dumps({k: summary[k] for k in ("saliency_separation_step", "reward_separation_step")}))
    for bug, v in per_bug.items():
        log(f"{bug}: saliency {v['saliency_separation_step']} reward {v['reward_separation_step']} "
            f"final return {v['final_return_mean']:.2f} newest share {v['final_newest_share']:.3f}")
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
