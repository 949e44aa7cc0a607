"""The Atari frame-stack study's secondary analyses, exactly as registered in
experiments/frame_stack_bug/secondary_registration.md (numbers: experiments.frame_stack_bug.secondary_plan).
Everything here is labelled secondary; none of it changes the primary verdicts.

    python -m experiments.frame_stack_bug.secondary --runs-dir RUNS --rerun-dir RERUNS --out OUT

S1  paired per-seed lead of the maps over the returns (`s1_lead`), with the MinAtar study's runs
    beside it as post hoc (`--minatar-runs-dir`);
S2  the primary rule on `cam_row_gain`, the Grad-CAM / G1Grad-CAM share on the ball-and-paddle rows
    (`s2_cam_rule`);
S3  Paper A's claim 3 (CAM on the ball and the paddle before the return rises) over all runs,
    against each run's own first snapshot (`s3_claim3`), each run's rise step from its own return
    curve (the re-run's for a re-trained run). As registered (5 seeds, Holm over 4 tests) it cannot
    reject: the smallest attainable adjusted p is 4/32 = 0.125 (`s3_min_holm_p`), so its output says
    "S3 as registered has no power; reported descriptively" next to every result. Beside it, labelled
    "not registered": one pooled test that can reject with 5 seeds (`s3_pooled_not_registered`).
Until every registered run is there (with its CAM row profiles for S2 and S3), `analyse` writes
which ones are missing and computes nothing else: the registration allows no interim look. If the
study ended incomplete, `--incomplete` reports S1 to S3 on the runs that exist, truncated, as registered.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import numpy as np

from experiments.common.breakout import ball_paddle_rows
from experiments.frame_stack_bug import detection_rule
from experiments.frame_stack_bug import plan
from experiments.frame_stack_bug import secondary_plan as sp
from experiments.frame_stack_bug import study as fss
from experiments.frame_stack_bug.lead import null_threshold, per_seed_step, s1_lead, sign_flip_p  # noqa: F401
from experiments.frame_stack_bug.stats import trailing_mean


# ---------------------------------------------------------------- shared pieces
def holm(p: dict) -> dict:
    keys = list(p)
    adj = detection_rule.holm([p[k] for k in keys])
    return {k: float(a) for k, a in zip(keys, adj)}


def seed_summary(x, n_boot=sp.S3_BOOTSTRAP["n_boot"], seed=sp.S3_BOOTSTRAP["seed"], level=sp.S3_BOOTSTRAP["level"]):
    """Mean over seeds with a Student-t and a seed-bootstrap percentile interval."""
    x = np.asarray(x, np.float64)
    m, sd, lo, hi = fss.t_interval(x, level)
    rng = np.random.default_rng(seed)
    boots = x[rng.integers(0, x.size, (n_boot, x.size))].mean(1)
    blo, bhi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return {"mean": m, "t95": [lo, hi], "bootstrap95": [float(blo), float(bhi)], "per_seed": [float(v) for v in x]}


# ---------------------------------------------------------------- S2 and S3: CAM rows
def object_rows(probe) -> dict:
    """{"ball_paddle", "ball", "paddle"}: (N, H) row masks of the probes' newest game frame."""
    rows = ball_paddle_rows(probe)
    below = np.arange(rows.shape[1]) >= sp.PADDLE_FIRST_ROW
    return {"ball_paddle": rows, "ball": rows & ~below, "paddle": rows & below}


def row_share(cam_rows, mask) -> np.ndarray:
    """(methods, probes) share of |map| on the masked rows, from (methods, probes, H) row profiles."""
    r = np.asarray(cam_rows, np.float64)
    tot = r.sum(-1)
    return np.where(tot > 0, (r * mask).sum(-1) / np.where(tot > 0, tot, 1.0), np.nan)


def cam_row_gain(shares_over_snapshots) -> np.ndarray:
    """(T,) the S2 statistic from (T, methods, probes) shares: mean over methods and probes, minus
    the first snapshot's value, causal trailing mean over S2_WINDOW snapshots."""
    a = np.nanmean(np.asarray(shares_over_snapshots, np.float64), axis=(1, 2))
    return trailing_mean(a - a[0], sp.S2_WINDOW)


def s2_cam_rule(study: plan.Study, cam: dict, checkpoints, mask, n_boot=None) -> dict:
    """S2: the primary rule on `cam_row_gain`. `cam` {(variant, seed): (steps, (T, methods, probes, H))}."""
    def gain_at_checkpoints(v, s):
        steps, rows = cam[(v, s)]
        g = dict(zip(steps, cam_row_gain(np.stack([row_share(r, mask) for r in rows]))))
        return np.array([g[c] for c in checkpoints])

    boot = dict(plan.BOOTSTRAP, **({"n_boot": n_boot} if n_boot else {}))
    out = {}
    for bug in study.bugs:
        b = np.stack([gain_at_checkpoints(bug, s) for s in study.seeds])
        c = np.stack([gain_at_checkpoints("correct", s) for s in study.seeds])
        alpha = sp.S2_FAMILY_ALPHA / len(study.bugs)
        r = detection_rule.detect(checkpoints, b, c, alpha)
        r["interval"] = detection_rule.bootstrap_detection_interval(
            checkpoints, b, c, alpha, n_boot=boot["n_boot"], seed=boot["seed"], level=boot["level"])
        out[bug] = r
    return {"label": "secondary", "statistic": sp.S2_STATISTIC, "methods": list(sp.CAM_METHODS), "bugs": out}


def rise_step(rows, level=sp.S3_RISE_RETURN):
    """First snapshot step whose return statistic reaches `level`, or None."""
    for r in rows:
        v = r.get("return_mean")
        if v is not None and np.isfinite(v) and v >= level:
            return int(r["step"])
    return None


S3_NO_POWER = "S3 as registered has no power; reported descriptively"


def s3_min_holm_p(n_seeds: int, n_tests: int = len(sp.CAM_METHODS) * len(sp.S3_OBJECTS)) -> float:
    """The smallest Holm-adjusted p that S3's design can produce: each test's exact one-sided
    sign-flip p is at least 1 / 2^n_seeds (every seed agreeing), and Holm multiplies the smallest
    of the n_tests p-values by n_tests (the others by at least 1, never below it). 5 seeds, 4
    tests: 4/32 = 0.125 > 0.05, so S3 as registered cannot reject."""
    return min(1.0, n_tests / 2 ** n_seeds)


def s3_power(n_seeds: int) -> dict:
    """Whether S3's Holm family can reject at all with `n_seeds` seeds, from the design alone."""
    m = len(sp.CAM_METHODS) * len(sp.S3_OBJECTS)
    p = s3_min_holm_p(n_seeds, m)
    ok = p <= sp.S3_FAMILY_ALPHA
    return {"seeds": n_seeds, "tests": m, "min_raw_p": 1 / 2 ** n_seeds, "min_holm_p": p,
            "family_alpha": sp.S3_FAMILY_ALPHA, "can_reject": bool(ok),
            "note": "S3 can reject with these seeds" if ok else S3_NO_POWER}


def reproduction(study: plan.Study, runs_dir, rerun_dir) -> dict:
    """The registered check of each re-trained run (`sp.RETRAINED`) against its committed run: the
    same run when its frame shares agree to `sp.REPRODUCE_SHARES_ATOL` at every snapshot and its
    return statistic is identical at every registered checkpoint. Either way S2 and S3 take the
    re-run's CAM rows (and S3 its return curve); a re-run that does not reproduce is a deviation."""
    from jaxsal_agents.snapshots import load_snapshots

    out = {}
    for name in sp.RETRAINED:
        a, b = Path(runs_dir) / name, Path(rerun_dir) / name if rerun_dir else None
        if b is None or not (a / "done.json").exists() or not (b / "done.json").exists():
            out[name] = None
            continue
        sa, sb = load_snapshots(a / "snapshots"), load_snapshots(b / "snapshots")
        same_steps = [s for s, _ in sa] == [s for s, _ in sb]
        diffs = [float(np.abs(np.asarray(x["frame_shares"]) - np.asarray(y["frame_shares"])).max())
                 for (_, x), (_, y) in zip(sa, sb)] if same_steps else []
        variant, seed = name.rsplit("_s", 1)
        ra = {r["step"]: r["return_mean"] for r in fss.load_run(study, variant, int(seed), runs_dir)[0]}
        rb = {r["step"]: r["return_mean"] for r in fss.load_run(study, variant, int(seed), rerun_dir)[0]}
        differ = [c for c in study.checkpoints if ra.get(c) != rb.get(c)]
        out[name] = {"same_snapshot_steps": same_steps,
                     "max_share_diff": max(diffs) if diffs else None,
                     "first_share_diff": diffs[0] if diffs else None,
                     "checkpoints_return_differs": len(differ),
                     "reproduces": bool(same_steps and diffs and max(diffs) <= sp.REPRODUCE_SHARES_ATOL and not differ)}
    return out


def s3_return_rows(runs: dict, reruns: dict) -> dict:
    """The rows whose return curve gives each run's rise step R: R is per run (registration S3.1),
    so a run re-trained for its CAM rows (`sp.RETRAINED`) takes R from the re-run's own return
    curve, not the committed run's (a re-run is a fresh draw), whatever the reproduction check says."""
    return {k: reruns.get(k, rows) for k, rows in runs.items()}


def _s3_per_seed(study: plan.Study, rise: dict, cam: dict, mask, methods: list) -> dict:
    """Per seed (a), (b), (c) and (b) - (a) of S3.2 for the CAM share on `mask`, averaged over the
    probes and the `methods` (indices into CAM_METHODS); (b), (c) only over the seed's rising runs."""
    per_seed = {k: [] for k in ("a", "b", "c", "b_minus_a")}
    for s in study.seeds:
        vals = {k: [] for k in per_seed}
        for v in study.variants:
            steps, rows = cam[(v, s)]
            share = np.array([np.nanmean(row_share(r, mask)[methods]) for r in rows])
            steps = np.asarray(steps)
            vals["a"].append(share[0])
            rs = rise[fss.run_name(v, s)]
            if rs is None:
                continue
            before, after = (steps > steps[0]) & (steps < rs), steps >= rs
            if before.any():
                vals["b"].append(share[before].mean())
                vals["b_minus_a"].append(share[before].mean() - share[0])
            if after.any():
                vals["c"].append(share[after].mean())
        for k in per_seed:
            per_seed[k].append(float(np.mean(vals[k])) if vals[k] else np.nan)
    return per_seed


def _tested(per_seed: dict):
    """(the seeds' finite (b) - (a) values, their exact one-sided sign-flip p of mean > 0; 1 if none)."""
    units = np.array(per_seed["b_minus_a"])
    units = units[np.isfinite(units)]
    return units, (sign_flip_p(units, "greater") if units.size else 1.0)


def s3_pooled_not_registered(study: plan.Study, runs: dict, cam: dict, masks: dict, alpha: float = 0.05) -> dict:
    """NOT REGISTERED (written after S3's design was found to have no power, issue 41; not part of
    the secondary registration, reported only with this label): one test instead of S3's four: the share on the ball-and-paddle rows averaged over both CAM
    methods, per seed (b) - (a) as in S3, exact one-sided sign-flip at `alpha`. With 5 seeds its
    smallest p is 1/32 = 0.031, so it rejects only when every seed agrees."""
    rise = {fss.run_name(v, s): rise_step(runs[(v, s)]) for (v, s) in runs}
    per_seed = _s3_per_seed(study, rise, cam, masks["ball_paddle"], list(range(len(sp.CAM_METHODS))))
    units, p = _tested(per_seed)
    min_p = 1 / 2 ** units.size if units.size else 1.0
    return {"label": "not registered", "alpha": alpha, "seeds_tested": int(units.size), "p": p,
            "min_attainable_p": min_p, "can_reject": bool(min_p <= alpha), "holds": bool(p <= alpha),
            "b_minus_a": seed_summary(units) if units.size else None, "chance": float(masks["ball_paddle"].mean())}


def s3_claim3(study: plan.Study, runs: dict, cam: dict, masks: dict) -> dict:
    """S3: per method and object, CAM row shares at the first snapshot (a), before the rise (b) and
    after it (c), seed-level, with the one-sided sign-flip test of (b) - (a) > 0 (Holm over 4).
    `runs` {(variant, seed): rows} must be the runs the CAM rows come from (`s3_return_rows`).
    With 5 seeds the registered family cannot reject (`s3_power`): every result carries that note."""
    rise = {fss.run_name(v, s): rise_step(runs[(v, s)]) for (v, s) in runs}
    result, pvals = {}, {}
    for mi, method in enumerate(sp.CAM_METHODS):
        for obj in sp.S3_OBJECTS:
            mask = masks[obj]
            chance = float(mask.mean())
            per_seed = _s3_per_seed(study, rise, cam, mask, [mi])
            key = f"{method}/{obj}"
            units, pvals[key] = _tested(per_seed)
            result[key] = {k: (seed_summary(np.array(x)[np.isfinite(x)]) if np.isfinite(x).any() else None)
                           for k, x in per_seed.items()}
            result[key].update({"chance": chance, "seeds_tested": int(units.size), "p": pvals[key]})
            a = result[key]["a"]
            result[key]["a_over_chance"] = a["mean"] / chance if a and chance else None
    adj = holm(pvals)
    design = s3_power(len(study.seeds))
    for k in result:
        result[k]["p_holm"] = adj[k]
        result[k]["holds"] = bool(adj[k] <= sp.S3_FAMILY_ALPHA)    # the registered verdict
        tested = s3_power(result[k]["seeds_tested"]) if result[k]["seeds_tested"] else None
        result[k]["min_holm_p"] = tested["min_holm_p"] if tested else 1.0
        result[k]["can_reject"] = bool(tested and tested["can_reject"])
        result[k]["power"] = design["note"] if not result[k]["can_reject"] else tested["note"]
    return {"label": "secondary", "power": design, "rise_level": sp.S3_RISE_RETURN, "rise_steps": rise,
            "tests": result}


# ---------------------------------------------------------------- loading and the whole analysis
def load_cam(study: plan.Study, variant: str, seed: int, runs_dir, rerun_dir=None):
    """(steps, (T, methods, probes, H)) CAM row profiles of one run: from the re-run for the runs
    trained before the registration (`sp.RETRAINED`), else from the run itself; None if absent."""
    from jaxsal_agents.snapshots import load_snapshots

    name = fss.run_name(variant, seed)
    base = Path(rerun_dir) if (name in sp.RETRAINED and rerun_dir) else Path(runs_dir)
    if name in sp.RETRAINED and not rerun_dir:
        return None
    if not (base / name / "done.json").exists():
        return None
    snaps = load_snapshots(base / name / "snapshots")
    rows = [fss.cam_rows(a) for _, a in snaps]
    if any(r is None for r in rows):
        return None
    return [s for s, _ in snaps], np.stack(rows)


def probe_masks(study: plan.Study, runs_dir, rerun_dir=None) -> dict:
    """Row masks from the correct runs' probes (identical across seeds; checked where several exist)."""
    probes = []
    for d in filter(None, (runs_dir, rerun_dir)):
        for s in study.seeds:
            f = Path(d) / fss.run_name("correct", s) / "snapshots" / "probe.npy"
            if f.exists():
                probes.append(np.load(f, allow_pickle=False))
    if not probes:
        raise SystemExit("no correct run keeps its probe.npy: the CAM rows cannot be placed")
    if any(not np.array_equal(p, probes[0]) for p in probes[1:]):
        raise SystemExit("the correct runs' probe states differ: the registration assumes one probe set")
    return object_rows(probes[0])


def complete_seeds(study: plan.Study, have) -> list[int]:
    """The seeds for which every variant is in `have` (S1 pairs each seed's bugs with its correct run
    and averages over the bugs; S3's unit is the seed)."""
    return [s for s in study.seeds if all((v, s) in have for v in study.variants)]


def analyse(study: plan.Study, runs_dir, rerun_dir=None, minatar_runs_dir=None, n_boot=None,
            incomplete: bool = False) -> dict:
    """S1 to S3 once every registered run (with its CAM rows for S2 and S3) is there; until then
    only what is missing. `incomplete` (the study ended incomplete): the registration's incomplete
    report instead, S1 to S3 "on the runs that exist, labelled truncated, with the missing runs
    listed": at the registered checkpoints every existing run reached, on the seeds that have every
    variant (S1) or every variant's CAM rows (S2, S3) (the reading implemented: the seed is S1's
    and S3's unit, so a seed enters with all its runs or not at all)."""
    loaded = {(v, s): fss.load_run(study, v, s, runs_dir) for v, s in fss.all_runs(study)}
    missing = [fss.run_name(v, s) for (v, s), x in loaded.items() if x is None or not x[2]]
    cam = {(v, s): load_cam(study, v, s, runs_dir, rerun_dir) for v, s in fss.all_runs(study)}
    missing_cam = [fss.run_name(v, s) for (v, s), x in cam.items() if x is None]
    out = {"label": "secondary", "registration": "experiments/frame_stack_bug/secondary_registration.md",
           "missing_runs": missing, "missing_cam_rows": missing_cam}
    if missing and not incomplete:
        return out
    runs = {k: x[0] for k, x in loaded.items() if x is not None}
    view = study
    if incomplete and missing:
        seeds = complete_seeds(study, runs)
        if len(seeds) < 2:
            raise SystemExit(f"incomplete report: {len(seeds)} seed(s) with every variant; S1 needs two")
        reached = min(max(int(r["step"]) for r in rows) for rows in runs.values())
        checkpoints = [c for c in study.checkpoints if c <= reached]
        if len(checkpoints) < 2:
            raise SystemExit("incomplete report: fewer than two registered checkpoints reached by every run")
        view = dataclasses.replace(study, seeds=tuple(seeds))
        out.update(report="incomplete", truncated=True, checkpoints=checkpoints, s1_seeds=seeds)
    else:
        checkpoints = study.checkpoints
    out["s1"] = s1_lead(view, runs, checkpoints)
    if minatar_runs_dir:
        m = plan.MINATAR
        mr = {(v, s): fss.load_run(m, v, s, minatar_runs_dir) for v, s in fss.all_runs(m)}
        if all(x is not None and x[2] for x in mr.values()):
            out["s1_minatar_post_hoc"] = dict(s1_lead(m, {k: x[0] for k, x in mr.items()}, m.checkpoints),
                                              label="post hoc (data seen before the registration)")
    if missing_cam and not incomplete:
        return out
    cam = {k: x for k, x in cam.items() if x is not None and k in runs}
    if missing_cam:
        seeds = complete_seeds(study, cam)
        if not seeds:
            return out
        view = dataclasses.replace(study, seeds=tuple(seeds))
        out.update(report="incomplete", truncated=True, checkpoints=checkpoints, cam_seeds=seeds)
    out["reproduction"] = rep = reproduction(study, runs_dir, rerun_dir)
    if any(r is not None and not r["reproduces"] for r in rep.values()):
        out["deviation"] = ("re-trained runs do not reproduce their committed runs: S2 and S3 use the re-runs' CAM "
                            "rows (and S3 their return curves) for all four, as the registration prescribes")
    masks = probe_masks(study, runs_dir, rerun_dir)
    out["s2"] = s2_cam_rule(view, cam, checkpoints, masks["ball_paddle"], n_boot)
    reruns = {(v, s): fss.load_run(study, v, s, rerun_dir)[0] for v, s in fss.all_runs(view)
              if fss.run_name(v, s) in sp.RETRAINED}      # load_cam found every one of them
    mine = s3_return_rows({k: rows for k, rows in runs.items() if k[1] in view.seeds}, reruns)
    out["s3"] = s3_claim3(view, mine, cam, masks)
    out["s3_pooled_not_registered"] = s3_pooled_not_registered(view, mine, cam, masks)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs-dir", default="experiments/results/frame_stack_bug/runs_atari")
    ap.add_argument("--rerun-dir", default="experiments/results/frame_stack_bug/reruns_atari",
                    help="re-trained copies of the runs finished before the registration (CAM rows)")
    ap.add_argument("--minatar-runs-dir", default="experiments/results/frame_stack_bug/runs_minatar")
    ap.add_argument("--out", default="experiments/results/frame_stack_bug/atari_secondary.json")
    ap.add_argument("--incomplete", action="store_true",
                    help="the study ended incomplete: S1 to S3 on the runs that exist, truncated, missing runs listed")
    a = ap.parse_args(argv)
    res = analyse(plan.ATARI, a.runs_dir, a.rerun_dir if Path(a.rerun_dir).exists() else None,
                  a.minatar_runs_dir if Path(a.minatar_runs_dir).exists() else None, incomplete=a.incomplete)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    if "s3" in res:
        print(f"S3: {res['s3']['power']['note']} (smallest attainable Holm p {res['s3']['power']['min_holm_p']:.3g})")
    if res["missing_runs"] or res["missing_cam_rows"]:
        print(f"incomplete: {len(res['missing_runs'])} runs missing, {len(res['missing_cam_rows'])} without "
              f"CAM rows; computed: {[k for k in ('s1', 's2', 's3') if k in res] or 'nothing'}")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
