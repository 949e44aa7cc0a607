"""The pre-registered frame-stack-bug study (experiments/frame_stack_bug/preregistration.md).

    python -m experiments.frame_stack_bug.run --study minatar          # 40 runs, MinAtar Breakout
    python -m experiments.frame_stack_bug.run --study atari            # 15 runs, Breakout, dueling PQN agent (GPU)
    python -m experiments.frame_stack_bug.run --study atari --shard 0/4 --no-analysis   # 4 in parallel
    python -m experiments.frame_stack_bug.run --study atari --analyse-only
    python -m experiments.frame_stack_bug.run --study replay_dddqn     # 128 runs, replay DDDQN on MinAtar
                                                                   # (experiments/frame_stack_bug/replay_dddqn_preregistration.md)

Every number (variants, seeds, budget, snapshot and checkpoint schedules, the statistic's and
the rule's parameters) comes from experiments.frame_stack_bug.plan (the PQN studies) or
experiments.frame_stack_bug.replay_dddqn_plan (the replay-DDDQN study, which reuses the PQN studies' statistic
and rule); nothing here can change them. `STUDIES` names them all.
Each run trains PQN (jaxsal_agents.train; the replay-DDDQN study: jaxsal_agents.train_dqn, with
its graded transition bugs in the trainer, jaxsal_agents.train_dqn.corrupt_batch) on its own
(possibly buggy) stack with SaliencySnapshots
(Grad-CAM, G1Grad-CAM, G2Grad-CAM, Guided Backprop, gradient + per-frame shares) and is
resumable: an interrupted run continues from its orbax checkpoint and its snapshot rows
(`--time-limit` stops a run cleanly after a checkpoint), a finished one is skipped
(RUNS/<variant>_s<seed>/done.json). The analysis (experiments.frame_stack_bug.detection_rule) applies the rule
to the map statistic and to the returns at the registered checkpoints and writes
<study>_summary.json (keys `bugs`, `seeds`, `steps`, `final_returns`, ...), its tables as
<study>_summary.md, <study>_stats.csv (every snapshot of every run), <study>_detection.png (seed
means with bands, detection steps marked) and <study>_frame_stack_bug.png (return curves, the
statistic, and G1Grad-CAM / Grad-CAM / Guided Backprop / gradient snapshots side by side).
`--export-runs DEST` keeps finished runs small enough to commit (`export_runs`).
"""
from __future__ import annotations

import csv
import json
import math
import platform
import time
from pathlib import Path

import numpy as np

from experiments.frame_stack_bug import detection_rule
from experiments.frame_stack_bug import plan
from experiments.frame_stack_bug import secondary_plan as secondary
from experiments.frame_stack_bug.stats import at_checkpoints, t_interval  # noqa: F401  (used by the studies' code as fss.*)
from experiments.frame_stack_bug import report as frame_stack_report
from experiments.frame_stack_bug import replay_dddqn_plan

FIGURE_METHODS = ("g1gradcam", "gradcam", "guided_backprop", "gradient")
CKPT_EVERY = 32     # updates between orbax checkpoints (resumption only; not part of the analysis)

# Every registered study by name: the frozen PQN studies (frame_stack_plan.STUDIES, unchanged)
# and the replay-DDDQN study (replay_dddqn_plan; its own pre-registration).
STUDIES = {**plan.STUDIES, **replay_dddqn_plan.STUDIES}


def is_replay(study) -> bool:
    """A replay-DDDQN study (jaxsal_agents.train_dqn) rather than a PQN one (jaxsal_agents.train)."""
    return getattr(study, "trainer", "pqn") == "dqn"


def predicted_directions(study) -> dict:
    """The study's registered map-statistic directions per bug."""
    return dict(getattr(study, "predicted_saliency_direction", plan.PREDICTED_SALIENCY_DIRECTION))


def split_bug(variant: str):
    """(frame-stack bug for the env wrapper, transition bug for the replay trainer, its severity p)
    of a variant: "reuse", "misassembled" (p = 1) or a graded "done_late_p0.3"."""
    from jaxsal_agents.framestack import BUGS

    if variant == "correct":
        return None, None, 1.0
    if variant in BUGS:
        return variant, None, 1.0
    from jaxsal_agents.train_dqn import TRANSITION_BUGS
    if variant in TRANSITION_BUGS:
        return None, variant, 1.0
    bug, _, p = variant.rpartition("_p")
    if bug in TRANSITION_BUGS:
        try:
            if 0.0 <= float(p) <= 1.0:
                return None, bug, float(p)
        except ValueError:
            pass
    raise SystemExit(f"unknown variant {variant!r}")


def run_name(variant: str, seed: int) -> str:
    return f"{variant}_s{seed}"


def all_runs(study: plan.Study) -> list[tuple[str, int]]:
    """Seed-major (a cut-short study still has every variant of its first seeds)."""
    return [(v, s) for s in study.seeds for v in study.variants]


def shard_runs(runs, shard: str | None):
    """`shard` "i/n": every n-th run starting at i (for n parallel processes)."""
    if not shard:
        return runs
    try:
        i, n = (int(x) for x in shard.split("/"))
    except ValueError:
        raise SystemExit(f"--shard must be i/n, got {shard!r}") from None
    if not 0 <= i < n:
        raise SystemExit(f"--shard {shard}: need 0 <= i < n")
    return runs[i::n]


def default_env_fn(study: plan.Study, bug):
    from jaxsal_agents.framestack import make_stacked_env

    def env_fn(game, num_envs, train=True, seed=0):
        return make_stacked_env(game, num_envs, train=train, seed=seed, num_frames=study.frames,
                                bug=bug, drop_trail=study.drop_trail)
    return env_fn


_MODELS: dict = {}


def build_model(study: plan.Study, env):
    """The study's network; one instance per (arch, shape), so compiled saliency maps are reused."""
    key = (study.arch, study.game, env.num_actions, env.obs_shape)
    if key not in _MODELS:
        if study.arch == "minatar":
            from jaxsal_agents.networks import MinAtarDQN
            _MODELS[key] = MinAtarDQN(env.num_actions, env.obs_shape[-1])
        elif study.arch == "minatar_dueling":
            from jaxsal_agents.networks import MinAtarDuelingDQN
            _MODELS[key] = MinAtarDuelingDQN(env.num_actions, env.obs_shape[-1])
        else:
            from jaxsal_agents.zoo import build_model as zoo_model
            _MODELS[key] = zoo_model(study.game, study.arch, env.num_actions, layer_norm=True)
    return _MODELS[key]


def record_provenance(run_dir):
    """Appends this start's (or resumption's) host, CPU flags, versions and git commit to
    RUN/provenance.json: a run resumed on another machine lists both."""
    from experiments.common.machine import provenance

    path = Path(run_dir) / "provenance.json"
    starts = json.loads(path.read_text()) if path.exists() else []
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(starts + [provenance()], indent=1))
    tmp.replace(path)


def train_run(study: plan.Study, variant: str, seed: int, runs_dir, make_env=default_env_fn,
              time_limit: float = 0.0, env_threads: int = 0, log=print) -> dict:
    """Train (or resume, or skip if done) one registered run; returns its done record
    {"rows", "steps", "wall_s"} or, if stopped by `time_limit`, {"rows", "steps", "done": False}."""
    from jaxsal_agents.snapshots import SaliencySnapshots, probe_states

    stack_bug, transition_bug, severity = split_bug(variant)
    run_dir = Path(runs_dir) / run_name(variant, seed)
    done_file = run_dir / "done.json"
    if done_file.exists():
        return json.loads(done_file.read_text())
    env_fn = make_env(study, stack_bug)      # a transition bug leaves the env (and so the probes) correct
    probe = probe_states(env_fn(study.game, 8, train=False, seed=plan.PROBE_ENV_SEED), plan.N_PROBES,
                         steps=plan.PROBE_STEPS, seed=plan.PROBE_POLICY_SEED)
    model = build_model(study, env_fn(study.game, 1, train=False, seed=0))
    if is_replay(study):
        from jaxsal_agents.train_dqn import DQNConfig, train
        cfg = DQNConfig(game=study.game, arch="dueling" if study.arch == "minatar_dueling" else study.arch,
                        steps=study.steps, num_envs=study.num_envs, rollout=study.rollout,
                        buffer_size=study.buffer_size, batch_size=study.batch_size, grad_steps=study.grad_steps,
                        learning_starts=study.learning_starts, lr=study.lr, target_every=study.target_every,
                        eps_decay_frac=study.eps_decay_frac, frames=study.frames, drop_trail=study.drop_trail,
                        stack_bug=stack_bug or "", transition_bug=transition_bug or "",
                        transition_bug_p=severity, seed=seed,
                        run_dir=str(run_dir), ckpt_every=study.ckpt_every, time_limit=time_limit)
    else:
        from jaxsal_agents.train import PQNConfig, train
        cfg = PQNConfig(game=study.game, arch="dqn" if study.arch == "minatar" else study.arch, steps=study.steps,
                        num_envs=study.num_envs, rollout=study.rollout, lr=study.lr, epochs=study.epochs,
                        minibatches=study.minibatches, target_every=study.target_every, seed=seed,
                        run_dir=str(run_dir), ckpt_every=CKPT_EVERY, time_limit=time_limit, env_threads=env_threads)
    snaps = SaliencySnapshots(probe, run_dir / "snapshots", every=study.snapshot_every,
                              methods=plan.SNAPSHOT_METHODS, num_frames=study.frames,
                              frame_methods=plan.FRAME_METHODS, target=plan.TARGET)
    record_provenance(run_dir)
    t0 = time.time()
    out = train(cfg, log=log, callback=snaps, env_fn=env_fn, model=model)
    rec = {"rows": snaps.rows, "steps": int(out["step"]), "wall_s": round(time.time() - t0, 1)}
    if study.updates * study.steps_per_update > out["step"]:
        log(f"{run_name(variant, seed)}: stopped at step {out['step']} of {study.steps} (resumable)")
        return {**rec, "done": False}
    done_file.write_text(json.dumps(rec))
    log(f"{run_name(variant, seed)}: {len(snaps.rows)} snapshots, {rec['wall_s']:.0f} s")
    return rec


STATISTIC = "stack_age_gain"
STAT_DOC = ("mean age of the attended stacked frames (0 = newest .. k-1 = oldest): age centroid of "
            "the per-frame attribution shares of |gradient x input|, |gradient| and |Guided Backprop|, "
            "averaged over the three methods and the probe states, minus its value at the run's first "
            "snapshot, as a causal trailing mean over the last `window` snapshots "
            "(experiments.frame_stack_bug.stats.stack_age_gain); up = attention moving to older slots, down = "
            "collapsing onto the newest slot")
OLD_STATISTIC = "newest_share_gain"
OLD_STAT_DOC = ("share of |gradient x input| attribution (probe-set mean) on the newest stacked frame, "
                "minus the same share in the run's first snapshot")


def add_statistic(rows, shares, window=4):
    """Adds both statistics (STAT_DOC, OLD_STAT_DOC) to each snapshot row of one run; `shares`
    (T, M, N, k) are its snapshots' per-frame shares, one per row."""
    from experiments.frame_stack_bug.stats import stack_age_gain

    if len(shares) != len(rows):
        raise ValueError(f"{len(shares)} snapshots of shares for {len(rows)} rows")
    base = rows[0]["newest_share"]
    for r, v in zip(rows, stack_age_gain(shares, window)):
        r[OLD_STATISTIC] = r["newest_share"] - base
        r[STATISTIC] = float(v)
    return rows


def add_return_windows(rows, returns_csv, windows):
    """Adds `return_mean_W` to each snapshot row for each window W: the mean of the last W games
    the run finished before the row's step (RUN/returns.csv; NaN before the first game, as
    `return_mean`, the PQN studies' W = 20)."""
    steps, rets = [], []
    with open(returns_csv, newline="") as f:
        for r in csv.DictReader(f):
            steps.append(int(r["step"]))
            rets.append(float(r["return"]))
    steps, rets = np.asarray(steps, np.int64), np.asarray(rets, np.float64)
    for r in rows:
        n = int(np.searchsorted(steps, int(r["step"]), side="left"))   # games logged at steps < the row's
        for w in windows:
            r[f"return_mean_{w}"] = float(rets[max(0, n - w):n].mean()) if n else float("nan")
    return rows


def load_run(study: plan.Study, variant: str, seed: int, runs_dir):
    """(rows with both statistics (and the study's return windows), steps reached, finished?) of a
    run on disk, or None."""
    from jaxsal_agents.snapshots import load_snapshots

    run_dir = Path(runs_dir) / run_name(variant, seed)
    done_file = run_dir / "done.json"
    if done_file.exists():
        rec = json.loads(done_file.read_text())
        rows, steps, done = rec["rows"], rec["steps"], True
    elif (run_dir / "snapshots" / "stats.csv").exists():
        with open(run_dir / "snapshots" / "stats.csv", newline="") as f:
            rows = [{k: (int(v) if k in ("step", "update") else float(v)) for k, v in r.items()}
                    for r in csv.DictReader(f)]
        steps, done = (rows[-1]["step"] if rows else 0), False
    else:
        return None
    if not rows:
        return None
    snaps = load_snapshots(run_dir / "snapshots")
    if [s for s, _ in snaps] != [r["step"] for r in rows]:
        raise SystemExit(f"{run_name(variant, seed)}: snapshot files do not match its rows")
    rows = add_statistic([dict(r) for r in rows], np.stack([a["frame_shares"] for _, a in snaps]), plan.WINDOW)
    if getattr(study, "return_windows", None):
        rows = add_return_windows(rows, run_dir / "returns.csv", study.return_windows)
    return rows, int(steps), done


def paired_seeds(study: plan.Study, runs: dict, bug: str) -> list[int]:
    """The seeds that have both `bug`'s run and the correct run in `runs`: the registered rule
    compares "the bug's runs vs the correct runs of the same seeds", so a seed with only one of
    them enters neither group (all seeds when the study is complete)."""
    return [s for s in study.seeds if (bug, s) in runs and ("correct", s) in runs]


def analyse(study: plan.Study, runs: dict, complete: bool, n_boot: int | None = None) -> dict:
    """The pre-registered analysis of `runs` {(variant, seed): rows}: every registered run, or,
    for the registered incomplete report, the runs that exist (a missing run is absent from
    `runs`; each bug is then judged on the seeds that have both of its runs, `paired_seeds`)."""
    steps_reached = min(max(int(r["step"]) for r in rows) for rows in runs.values())
    checkpoints = [c for c in study.checkpoints if c <= steps_reached]
    if not checkpoints:
        short = sorted(run_name(v, s) for (v, s), rows in runs.items()
                       if max(int(r["step"]) for r in rows) < study.checkpoints[0])
        raise SystemExit(f"no registered checkpoint reached by every run yet (first checkpoint "
                         f"{study.checkpoints[0]:,}; short of it: {', '.join(short)})")
    boot = dict(plan.BOOTSTRAP, **({"n_boot": n_boot} if n_boot else {}))

    def matrix(variant, key, seeds):
        return np.stack([at_checkpoints(runs[(variant, s)], checkpoints, key) for s in seeds])

    signals = {**getattr(study, "signals", plan.SIGNALS), **plan.SECONDARY, **getattr(study, "descriptive_signals", {})}
    return_key = signals["return"]
    bugs = {}
    for bug in study.bugs:
        seeds = paired_seeds(study, runs, bug)
        if not seeds:
            raise SystemExit(f"{bug}: no seed has both its run and the correct run; nothing to compare")
        entry = {}
        for name, key in signals.items():
            b, c = matrix(bug, key, seeds), matrix("correct", key, seeds)
            r = detection_rule.detect(checkpoints, b, c, study.alpha)
            r["interval"] = detection_rule.bootstrap_detection_interval(
                checkpoints, b, c, study.alpha, n_boot=boot["n_boot"], seed=boot["seed"], level=boot["level"])
            r["statistic"] = key
            entry[name] = r
        pred = predicted_directions(study).get(bug)
        sal = entry["saliency"]
        entry["saliency"]["predicted_direction"] = pred
        entry["saliency"]["matches_prediction"] = (None if sal["detection_step"] is None or pred is None
                                                    else sal["direction"] == pred)
        bugs[bug] = {"saliency_detection_step": sal["detection_step"],
                     "return_detection_step": entry["return"]["detection_step"],
                     "seeds": seeds,
                     # can the rule reject at all with these seeds (smallest attainable p <= per-bug level)?
                     "can_reject": {name: entry[name]["can_reject"] for name in signals}, **entry}
    final = {}
    for v in study.variants:
        seeds = [s for s in study.seeds if (v, s) in runs]
        x = matrix(v, return_key, seeds)[:, -1] if seeds else np.zeros(0)
        m, sd, lo, hi = t_interval(x) if seeds else (None, None, None, None)
        final[v] = {"mean": m, "std": sd, "ci95": [lo, hi], "per_seed": [float(a) for a in x],
                    "seeds": seeds, "at_step": checkpoints[-1], "statistic": return_key}
    learned = final["correct"]["mean"] is not None and final["correct"]["mean"] >= study.learned_threshold
    return {"bugs": bugs, "final_returns": final, "checkpoints": checkpoints,
            "truncated": (not complete) or checkpoints != study.checkpoints,
            "learning_check": {"correct_final_return": final["correct"]["mean"],
                               "threshold": study.learned_threshold, "learned": bool(learned),
                               "registered": bool(getattr(study, "learning_check_registered", study.name == "atari"))},
            "alpha_per_bug": study.alpha, "family_alpha": plan.FAMILY_ALPHA}


def write_stats_csv(runs: dict, path):
    keys = list(dict.fromkeys(k for rows in runs.values() for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, ["variant", "seed"] + keys, restval="nan", extrasaction="ignore")
        w.writeheader()
        for (v, s), rows in runs.items():
            for r in rows:
                w.writerow({"variant": v, "seed": s, **r})


def variant_colors(n: int) -> list:
    """n distinct colours: matplotlib's default cycle for up to 10 variants, tab20 beyond (the
    replay-DDDQN study has 16)."""
    import matplotlib.pyplot as plt
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return cycle[:n] if n <= len(cycle) else [plt.get_cmap("tab20")(i % 20) for i in range(n)]


def figure(study: plan.Study, runs: dict, runs_dir, path, state: int = 0, cols: int = 5):
    """Returns and the map statistic per variant (all seeds) next to the first seed's
    G1Grad-CAM, Grad-CAM, Guided Backprop and gradient snapshots of probe `state`."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from jaxsal_agents.snapshots import load_snapshots

    colors = variant_colors(len(study.variants))
    nrow = len(study.variants) * len(FIGURE_METHODS)
    fig = plt.figure(figsize=(7 + 1.2 * cols, 0.95 * nrow + 1))
    gs = fig.add_gridspec(nrow, cols + 6)
    ax_r, ax_s = fig.add_subplot(gs[:nrow // 2, :5]), fig.add_subplot(gs[nrow // 2:, :5])
    for i, v in enumerate(study.variants):
        seeds = [s for s in study.seeds if (v, s) in runs]     # an incomplete study lacks some
        for s in seeds:
            rows = runs[(v, s)]
            x = [r["step"] for r in rows]
            ax_r.plot(x, [r["return_mean"] for r in rows], color=colors[i], alpha=0.5,
                      label=v if s == seeds[0] else None)
            ax_s.plot(x, [r["stack_age_gain"] for r in rows], color=colors[i], alpha=0.5)
        if (v, study.seeds[0]) not in runs:
            continue
        snaps = load_snapshots(Path(runs_dir) / run_name(v, study.seeds[0]) / "snapshots")
        pick = np.unique(np.linspace(0, len(snaps) - 1, cols).round().astype(int))
        for j, m in enumerate(FIGURE_METHODS):
            for c, k in enumerate(pick):
                step, arr = snaps[k]
                a = fig.add_subplot(gs[i * len(FIGURE_METHODS) + j, 6 + c])
                a.imshow(arr[m][state], cmap="inferno")
                a.set_xticks([])
                a.set_yticks([])
                if c == 0:
                    a.set_ylabel(f"{v}\n{m}", fontsize=6, color=colors[i])
                if i == 0 and j == 0:
                    a.set_title(f"step {step}", fontsize=7)
    for c in study.checkpoints:
        ax_s.axvline(c, color="grey", lw=0.2)
    ax_r.set_title(f"return (last {plan.RETURN_GAMES} games)", fontsize=9)
    ax_r.legend(fontsize=7)
    ax_s.set_title("stack age gain (maps only); grey: registered checkpoints", fontsize=9)
    ax_s.axhline(0, color="grey", lw=0.5)
    ax_s.set_xlabel("env step")
    fig.suptitle(f"{study.game}: frame-stack bugs, seeds {study.seeds[0]}-{study.seeds[-1]} "
                 f"(maps: seed {study.seeds[0]}, probe {state})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


def detection_figure(study: plan.Study, runs: dict, summary: dict, path):
    """The rule's verdicts at a glance: per variant, the seed mean of the return and of the map
    statistic at the registered checkpoints with a 95% t-band over seeds, and each bug's
    detection step marked on the signal that detected it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from scipy import stats

    checkpoints = summary["checkpoints"]
    colors = variant_colors(len(study.variants))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    ret_key = getattr(study, "signals", plan.SIGNALS)["return"]
    ret_games = getattr(study, "return_window", plan.RETURN_GAMES)
    for ax, (signal, key, title) in zip(axes, [("return", ret_key, f"return (last {ret_games} games)"),
                                              ("saliency", "stack_age_gain", "stack age gain (maps only)")]):
        for i, v in enumerate(study.variants):
            x = np.stack([at_checkpoints(runs[(v, s)], checkpoints, key) for s in study.seeds if (v, s) in runs])
            m = x.mean(0)
            h = stats.t.ppf(0.975, len(x) - 1) * x.std(0, ddof=1) / np.sqrt(len(x)) if len(x) > 1 else 0 * m
            step = None if v == "correct" else summary["bugs"][v][f"{signal}_detection_step"]
            label = v if v == "correct" else f"{v}: {'missed' if step is None else f'detected at {step:,}'}"
            ax.plot(checkpoints, m, color=colors[i], label=label)
            ax.fill_between(checkpoints, m - h, m + h, color=colors[i], alpha=0.15)
            if step is not None:
                ax.axvline(step, color=colors[i], ls="--", lw=1)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("env step")
        ax.legend(fontsize=7)
    n = sorted({len(f["seeds"]) for f in summary["final_returns"].values()})
    fig.suptitle(f"{study.game}: seed means with 95% t-bands ({'/'.join(map(str, n))} seeds per variant); dashed: "
                 f"detection step under the pre-registered rule", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


KEPT_WHOLE = ("frame_shares", "cam_rows")   # per-snapshot arrays every exported run keeps whole


def cam_rows(snapshot) -> np.ndarray | None:
    """(methods, probes, H) row profiles of a snapshot's CAM maps: the sum of |map| over columns
    per probe, for the secondary analyses' CAM statistics (experiments.frame_stack_bug.secondary_plan);
    the stored `cam_rows` of an already slim snapshot, or None when neither is there."""
    if "cam_rows" in snapshot:
        return np.asarray(snapshot["cam_rows"])
    if not all(m in snapshot for m in secondary.CAM_METHODS):
        return None
    maps = [np.asarray(snapshot[m], np.float32) for m in secondary.CAM_METHODS]
    probes = snapshot["frame_shares"].shape[1] if "frame_shares" in snapshot else plan.N_PROBES
    if maps[0].shape[0] != probes:                 # a slim copy keeps one probe's maps: not enough
        return None
    return np.stack([np.abs(m).sum(-1) for m in maps]).astype(np.float32)


def export_runs(study: plan.Study, runs_dir, dest, state: int = 0, log=print) -> list[str]:
    """Copy the finished runs into `dest` as small, committable folders that the analysis reads
    exactly as the full ones: done.json, config.json, returns.csv, provenance.json, snapshots/meta.json and
    stats.csv, every snapshot's `frame_shares` (all the primary statistic needs) and `cam_rows`
    (the CAM row profiles the secondary analyses need). The figure's seed (the study's first)
    also keeps its probe frames and probe `state`'s maps. No orbax checkpoint travels: an
    exported run is finished. `dest` may be `runs_dir` (slims in place). Returns the exported
    run names."""
    import shutil

    src, dest = Path(runs_dir), Path(dest)
    done = []
    for v, s in all_runs(study):
        run_src, run_dest = src / run_name(v, s), dest / run_name(v, s)
        if not (run_src / "done.json").exists():
            continue
        keep_maps = s == study.seeds[0]
        (run_dest / "snapshots").mkdir(parents=True, exist_ok=True)
        for f in ("done.json", "config.json", "returns.csv", "snapshots/meta.json", "snapshots/stats.csv", "provenance.json") + (
                ("snapshots/probe.npy",) if keep_maps else ()):
            if (run_src / f).exists() and (run_src / f).resolve() != (run_dest / f).resolve():
                shutil.copyfile(run_src / f, run_dest / f)
        if not keep_maps and (run_dest / "snapshots" / "probe.npy").exists():
            (run_dest / "snapshots" / "probe.npy").unlink()
        for p in sorted((run_src / "snapshots").glob("step_*.npz")):
            with np.load(p, allow_pickle=False) as z:
                arrays = {k: (z[k] if k in KEPT_WHOLE else z[k][state:state + 1])
                          for k in z.files if keep_maps or k in KEPT_WHOLE}
                rows = cam_rows(z)
            if rows is not None:
                arrays["cam_rows"] = rows
            tmp = run_dest / "snapshots" / (p.stem + ".tmp.npz")
            np.savez_compressed(tmp, **arrays)
            tmp.replace(run_dest / "snapshots" / p.name)
        done.append(run_name(v, s))
    log(f"exported {len(done)} finished runs to {dest} (maps of seed {study.seeds[0]}, probe {state})")
    return done


def run_study(study: plan.Study, out, runs_dir=None, shard=None, train=True, analysis=True,
              make_env=default_env_fn, time_limit=0.0, env_threads=0, n_boot=None, export_to=None,
              incomplete=False, log=print):
    """Train the registered runs (or a shard of them) and/or analyse whatever is on disk; with
    `export_to`, then copy the finished runs there small (`export_runs`). `incomplete`: the study
    cannot be completed, so runs that are missing get the registered incomplete report
    (`analyse_runs`) instead of no analysis."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs_dir = Path(runs_dir) if runs_dir else out / f"runs_{study.name}"
    t0 = time.time()
    if train:
        for v, s in shard_runs(all_runs(study), shard):
            train_run(study, v, s, runs_dir, make_env, time_limit=time_limit, env_threads=env_threads, log=log)
    summary = analyse_runs(study, out, runs_dir, n_boot, t0, log, incomplete=incomplete) if analysis else None
    if export_to:
        export_runs(study, runs_dir, export_to, log=log)
    return summary


def analyse_runs(study: plan.Study, out: Path, runs_dir: Path, n_boot, t0: float, log, incomplete: bool = False):
    """The analysis of every registered run on disk and its files in `out` (<study>_summary.*).
    While runs are missing: None, unless `incomplete` (the study cannot be completed), which
    writes the registered incomplete report as <study>_incomplete_summary.* (the rule on the
    runs that exist, at the registered checkpoints all of them reached, labelled truncated,
    the missing runs listed: `summarise`)."""
    loaded = {(v, s): load_run(study, v, s, runs_dir) for v, s in all_runs(study)}
    missing = [run_name(v, s) for (v, s), x in loaded.items() if x is None]
    if missing and not incomplete:
        log(f"cannot analyse yet: no snapshots for {missing} (if the study cannot be completed: "
            f"--incomplete writes the registered incomplete report)")
        return None
    present = {k: x for k, x in loaded.items() if x is not None}
    if not present:
        raise SystemExit(f"no run of the {study.name} study in {runs_dir}: nothing to report")
    summary = summarise(study, present, n_boot=n_boot)
    summary["wall_s_this_call"] = round(time.time() - t0, 1)
    runs = {k: x[0] for k, x in present.items()}
    prefix = f"{study.name}_incomplete" if not summary["complete"] and incomplete else study.name
    (out / f"{prefix}_summary.json").write_text(json.dumps(summary, indent=1))
    (out / f"{prefix}_summary.md").write_text(frame_stack_report.render(summary))
    write_stats_csv(runs, out / f"{prefix}_stats.csv")
    figure(study, runs, runs_dir, out / f"{prefix}_frame_stack_bug.png")
    detection_figure(study, runs, summary, out / f"{prefix}_detection.png")
    for bug, b in summary["bugs"].items():
        log(f"{bug}: maps {b['saliency_detection_step']} ({b['saliency']['direction']}) "
            f"returns {b['return_detection_step']} ({b['return']['direction']})")
    for line in summary["cannot_reject"]:
        log(line)
    return summary


def summarise(study: plan.Study, loaded: dict, n_boot: int | None = None) -> dict:
    """The summary of the registered runs on disk {(variant, seed): (rows, steps, finished)}: the
    rule's verdicts (`bugs`), `seeds`, `steps` per run, `final_returns`, and what the analysis
    covered. A registered run absent from `loaded` is missing: the summary is then the
    pre-registration's incomplete report (`report` "incomplete"): the rule applied at the
    registered checkpoints every run that exists reached, `truncated`, the `missing_runs` listed.
    Registration wording: "the rule is applied at the registered checkpoints that every run
    reached"; a missing run reached none, so read literally over all registered runs no
    checkpoint would remain and "the missing runs are listed" would describe an empty report.
    The reading implemented: "every run" = every run that exists (those with snapshots), and each
    bug is compared with the correct runs "of the same seeds" (`paired_seeds`)."""
    runs = {k: x[0] for k, x in loaded.items()}
    missing = [run_name(v, s) for v, s in all_runs(study) if (v, s) not in loaded]
    complete = not missing and all(x[2] for x in loaded.values())
    res = analyse(study, runs, complete, n_boot=n_boot)
    if getattr(study, "lead_alpha", None):
        from experiments.frame_stack_bug.lead import lead_test

        res["lead"] = lead_test(study, runs, res["checkpoints"]) if not missing else None
    cannot = [f"{bug} / {signal}: {r['n_bug']} vs {r['n_correct']} seeds, smallest attainable p "
              f"{r['min_attainable_p']:.3g} > per-bug level {r['alpha']:.3g}: the rule cannot reject"
              for bug, b in res["bugs"].items() for signal, ok in b["can_reject"].items()
              if not ok for r in (b[signal],)]
    return {
        "study": study.name,
        "preregistration": getattr(study, "preregistration", "experiments/frame_stack_bug/preregistration.md"),
        "report": "complete" if complete else ("incomplete" if missing else "interim"),
        "bugs": res.pop("bugs"), "seeds": list(study.seeds),
        "steps": {run_name(v, s): x[1] for (v, s), x in loaded.items()},
        "final_returns": res.pop("final_returns"),
        "complete": complete, "missing_runs": missing,
        "incomplete_runs": [run_name(v, s) for (v, s), x in loaded.items() if not x[2]],
        "cannot_reject": cannot,
        **res, "variants": list(study.variants), "plan": {k: getattr(study, k) for k in study.__dataclass_fields__},
        "rule": "exact two-sided permutation test over seeds (difference of means) at each registered "
                "checkpoint; fixed-sequence from the last checkpoint backwards at alpha_per_bug "
                "(= family_alpha / number of bugs); detection step = first checkpoint from which every "
                "later one rejects; null = missed",
        "platform": platform.platform(),
    }
