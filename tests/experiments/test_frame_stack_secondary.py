"""experiments.frame_stack_bug.secondary: the registered secondary analyses on synthetic runs with
planted answers (a bug the maps see before the returns, a CAM shift on the bug's runs, a CAM rise
before the return rises), and the refusal to compute anything while runs are missing."""
import dataclasses
import itertools
import json

import numpy as np
import pytest

from experiments.frame_stack_bug import plan
from experiments.frame_stack_bug import secondary as sec
from experiments.frame_stack_bug import secondary_plan as sp
from experiments.frame_stack_bug import study as fss
from tests._support import ROOT

STUDY = dataclasses.replace(plan.ATARI, seeds=tuple(range(100, 105)))
CKPTS = STUDY.checkpoints
NEVER = CKPTS[-1] + 16_384


@pytest.mark.parametrize("alternative", ["greater", "less", "two-sided"])
def test_sign_flip_p_counts_every_pattern_ties_included(alternative):
    """Against all 2^6 sign patterns by a loop; integers, so the patterns that flip both 1 and -1 tie
    the observed mean exactly and count as at least as extreme."""
    x = np.array([1.0, -2.0, 4.0, 2.0, -1.0, 3.0])
    obs = x.mean()
    means = np.array([np.dot(s, x) / 6 for s in itertools.product((1, -1), repeat=6)])
    want = {"greater": means >= obs, "less": means <= obs, "two-sided": np.abs(means) >= abs(obs)}[alternative]
    assert sec.sign_flip_p(x, alternative) == want.mean()


def test_sign_flip_p_is_exact():
    assert sec.sign_flip_p([1, 2, 3, 4, 5]) == pytest.approx(1 / 32)
    assert sec.sign_flip_p([-1, -2, -3, -4, -5]) == pytest.approx(1.0)
    # sum 5 is reached by flipping any subset of {1..5} summing to <= 5: 10 of the 32
    assert sec.sign_flip_p([1, 2, 3, 4, -5]) == pytest.approx(10 / 32)
    assert sec.sign_flip_p([1, -1, 2, -2, 0.5], "two-sided") > 0.5
    with pytest.raises(ValueError):
        sec.sign_flip_p([1, 2], "sideways")


def test_per_seed_step_needs_the_whole_tail_beyond_tau():
    steps = [10, 20, 30, 40, 50]
    assert sec.per_seed_step(steps, [0, 2, 0, 2, 2], 1.0, 99) == 40      # a dip breaks the run
    assert sec.per_seed_step(steps, [0, -2, -2, -2, -2], 1.0, 99) == 20  # either sign
    assert sec.per_seed_step(steps, [2, 2, 2, 2, 0.5], 1.0, 99) == 99    # the last is within tau: never
    assert sec.null_threshold([[0, 0], [1, 1], [3, 3]]) == pytest.approx(np.quantile([1, 1, 3, 3, 2, 2], 0.95))


def _runs(rng, map_from=None, return_from=None, effect=1.0, study=STUDY):
    """{(variant, seed): rows} with noise 0.05 and a bug effect planted from the given steps."""
    runs = {}
    for v in study.variants:
        for s in study.seeds:
            rows = []
            for t in [512] + CKPTS:
                bug = v != "correct"
                m = rng.normal(0, 0.05) - (effect if bug and map_from and t >= map_from else 0)
                r = 5 + rng.normal(0, 0.05) - (effect if bug and return_from and t >= return_from else 0)
                rows.append({"step": t, "stack_age_gain": m, "return_mean": r})
            runs[(v, s)] = rows
    return runs


def test_s1_finds_the_planted_lead_and_its_test_rejects_only_with_all_seeds_agreeing():
    runs = _runs(np.random.default_rng(0), map_from=CKPTS[3], return_from=CKPTS[10])
    r = sec.s1_lead(STUDY, runs, CKPTS)
    for bug in STUDY.bugs:
        assert r["bugs"][bug]["map_steps"] == [CKPTS[3]] * 5
        assert r["bugs"][bug]["return_steps"] == [CKPTS[10]] * 5
        assert r["bugs"][bug]["share_maps_first"] == 1.0
    assert r["p"] == pytest.approx(1 / 32) and r["maps_first"] and r["min_attainable_p"] == 1 / 32
    assert r["can_reject"]
    four = dataclasses.replace(STUDY, seeds=tuple(range(100, 104)))   # 1/16 > 0.05: S1 with 4 seeds cannot
    r4 = sec.s1_lead(four, _runs(np.random.default_rng(0), map_from=CKPTS[3], return_from=CKPTS[10], study=four), CKPTS)
    assert r4["min_attainable_p"] == 1 / 16 and not r4["can_reject"] and not r4["maps_first"]
    # returns first: the one-sided test does not reject
    r = sec.s1_lead(STUDY, _runs(np.random.default_rng(1), map_from=CKPTS[12], return_from=CKPTS[2]), CKPTS)
    assert r["p"] == pytest.approx(1.0) and not r["maps_first"]
    # no bug at all: every step is "never", the lead is 0, no rejection
    r = sec.s1_lead(STUDY, _runs(np.random.default_rng(2)), CKPTS)
    assert not r["maps_first"]
    assert all(x == NEVER or x in CKPTS for b in r["bugs"].values() for x in b["map_steps"])


def _cam(rng, shift_from=None, rise_gain=0.0, rise_at=None, probes=4, h=84, study=STUDY):
    """CAM row profiles: uniform mass per row plus extra on rows 60-62 for bugs after `shift_from`,
    and, after the first snapshot, extra on rows 76-77 (the paddle) for every run."""
    cam = {}
    steps = [512] + [t for t in range(8192, CKPTS[-1] + 1, 8192)]
    for v in study.variants:
        for s in study.seeds:
            prof = []
            for t in steps:
                r = np.ones((len(sp.CAM_METHODS), probes, h)) + rng.random((len(sp.CAM_METHODS), probes, h)) * 0.01
                if v != "correct" and shift_from and t >= shift_from:
                    r[..., 60:63] += 5
                if rise_at and 512 < t:
                    r[..., 76:78] += rise_gain
                prof.append(r)
            cam[(v, s)] = (steps, np.stack(prof))
    return cam


def _masks(probes=4):
    probe = np.zeros((probes, 84, 84, 4), np.uint8)
    probe[:, 61, 30:32, -1] = 200      # the ball
    probe[:, 75:78, 40:56, -1] = 200   # the paddle
    return sec.object_rows(probe)


def test_object_rows_split_the_ball_from_the_paddle():
    m = _masks()
    assert set(np.where(m["ball"][0])[0]) == {60, 61, 62}
    assert set(np.where(m["paddle"][0])[0]) == {74, 75, 76, 77, 78}
    assert (m["ball_paddle"] == (m["ball"] | m["paddle"])).all()


def test_s2_detects_a_planted_cam_shift_with_the_primary_rule():
    rng = np.random.default_rng(0)
    cam = _cam(rng, shift_from=CKPTS[5])
    r = sec.s2_cam_rule(STUDY, cam, CKPTS, _masks()["ball_paddle"], n_boot=20)
    for bug in STUDY.bugs:
        assert r["bugs"][bug]["detection_step"] is not None and r["bugs"][bug]["detection_step"] <= CKPTS[8]
        assert r["bugs"][bug]["direction"] == "+"
    none = sec.s2_cam_rule(STUDY, _cam(rng), CKPTS, _masks()["ball_paddle"], n_boot=20)
    assert all(b["detection_step"] is None for b in none["bugs"].values())


def _rising(runs, at):
    for rows in runs.values():   # every run's return reaches 3.4 at `at`
        for r in rows:
            r["return_mean"] = 5.0 if r["step"] >= at else 1.0
    return runs


def test_s3_design_cannot_reject_and_says_so_next_to_its_result():
    """S3 as registered: 5 seeds, exact one-sided sign-flip (p >= 1/32), Holm over 4 tests, so
    the adjusted p is >= 4/32 = 0.125 > 0.05 even when every seed agrees: no power."""
    assert sec.s3_min_holm_p(5) == 4 / 32 == 0.125
    assert sec.s3_min_holm_p(7) == 4 / 128 and sec.s3_min_holm_p(1) == 1.0
    assert sec.s3_power(5)["can_reject"] is False and sec.s3_power(7)["can_reject"] is True
    rng = np.random.default_rng(0)
    r = sec.s3_claim3(STUDY, _rising(_runs(rng), CKPTS[6]), _cam(rng, rise_gain=3.0, rise_at=CKPTS[6]), _masks())
    assert r["power"] == {"seeds": 5, "tests": 4, "min_raw_p": 1 / 32, "min_holm_p": 0.125, "family_alpha": 0.05,
                          "can_reject": False, "note": "S3 as registered has no power; reported descriptively"}
    for m in sp.CAM_METHODS:      # the planted rise is as strong as 5 seeds allow: p_holm at its floor
        t = r["tests"][f"{m}/paddle"]
        assert t["p"] == 1 / 32 and t["p_holm"] == 0.125 and not t["holds"] and not t["can_reject"]
        assert t["power"] == sec.S3_NO_POWER and t["min_holm_p"] == 0.125
    # the one-test analysis added afterwards can reject with 5 seeds, and says it is not registered
    runs = _rising(_runs(rng), CKPTS[6])
    pooled = sec.s3_pooled_not_registered(STUDY, runs, _cam(rng, rise_gain=3.0, rise_at=CKPTS[6]), _masks())
    assert pooled["label"] == "not registered" and pooled["can_reject"] and pooled["min_attainable_p"] == 1 / 32
    assert pooled["p"] == 1 / 32 and pooled["holds"] and pooled["b_minus_a"]["mean"] > 0
    flat = sec.s3_pooled_not_registered(STUDY, runs, _cam(rng), _masks())
    assert not flat["holds"]


def test_s3_detects_a_planted_rise_where_the_design_can_eight_seeds():
    study = dataclasses.replace(STUDY, seeds=tuple(range(100, 108)))
    rng = np.random.default_rng(0)
    r = sec.s3_claim3(study, _rising(_runs(rng, study=study), CKPTS[6]),
                      _cam(rng, rise_gain=3.0, rise_at=CKPTS[6], study=study), _masks())
    assert r["power"]["can_reject"] and r["power"]["min_holm_p"] == 4 / 256
    for m in sp.CAM_METHODS:
        t = r["tests"][f"{m}/paddle"]
        assert t["p"] == 1 / 256 and t["p_holm"] == 4 / 256 and t["holds"] and t["can_reject"]
        assert not r["tests"][f"{m}/ball"]["holds"]       # the ball lost mass: no rise there
    # no planted rise: nothing holds
    r = sec.s3_claim3(study, _rising(_runs(rng, study=study), CKPTS[6]), _cam(rng, study=study), _masks())
    assert not any(t["holds"] for t in r["tests"].values())


def test_s3_takes_a_retrained_runs_rise_from_the_reruns_own_return_curve():
    rng = np.random.default_rng(0)
    runs = _rising(_runs(rng), CKPTS[6])
    reruns = _rising({k: [dict(r) for r in rows] for k, rows in runs.items()
                      if fss.run_name(*k) in sp.RETRAINED}, CKPTS[9])     # a fresh draw rises later
    mixed = sec.s3_return_rows(runs, reruns)
    r = sec.s3_claim3(STUDY, mixed, _cam(rng, rise_gain=3.0, rise_at=CKPTS[6]), _masks())
    for name, step in r["rise_steps"].items():
        assert step == (CKPTS[9] if name in sp.RETRAINED else CKPTS[6])
    assert len(sp.RETRAINED) == 4 and mixed[("correct", 102)] is runs[("correct", 102)]


def test_s3_claim3_sees_a_paddle_rise_before_the_return_rises():
    rng = np.random.default_rng(0)
    runs = _rising(_runs(rng), CKPTS[6])
    r = sec.s3_claim3(STUDY, runs, _cam(rng, rise_gain=3.0, rise_at=CKPTS[6]), _masks())
    t = r["tests"]
    assert set(t) == {f"{m}/{o}" for m in sp.CAM_METHODS for o in sp.S3_OBJECTS}
    assert all(v == CKPTS[6] for v in r["rise_steps"].values())
    for m in sp.CAM_METHODS:
        assert t[f"{m}/paddle"]["p"] == pytest.approx(1 / 32) and t[f"{m}/paddle"]["b_minus_a"]["mean"] > 0.05
        assert t[f"{m}/ball"]["b_minus_a"]["mean"] < 0       # mass moved to the paddle, off the ball
        assert not t[f"{m}/ball"]["holds"]
        assert t[f"{m}/paddle"]["seeds_tested"] == 5
        assert t[f"{m}/paddle"]["chance"] == pytest.approx(5 / 84)
    assert all(t[f"{m}/paddle"]["p_holm"] == 4 / 32 for m in sp.CAM_METHODS)


def test_analyse_computes_nothing_while_runs_are_missing(tmp_path):
    res = sec.analyse(STUDY, tmp_path)
    assert len(res["missing_runs"]) == 15 and not {"s1", "s2", "s3"} & set(res)
    # the committed Atari runs: all 15 exist, so S1 (returns and frame shares only) is computed, while S2
    # and S3 wait for the re-trained runs' CAM rows
    res = sec.analyse(plan.ATARI, "experiments/results/frame_stack_bug/runs_atari")
    assert not res["missing_runs"] and "s1" in res and not {"s2", "s3"} & set(res)
    assert set(sp.RETRAINED) <= set(res["missing_cam_rows"])
    json.dumps(res)


def test_registration_numbers_match_the_primary_plan():
    assert sp.S2_WINDOW == plan.WINDOW
    assert sp.S3_RISE_RETURN == plan.ATARI.learned_threshold
    assert set(sp.CAM_METHODS) <= set(plan.SNAPSHOT_METHODS)
    assert set(sp.RETRAINED) <= {fss.run_name(*r) for r in fss.all_runs(plan.ATARI)}


def _disk_run(run_dir, steps, rng, probe):
    """A finished exported-like run: rows with the primary statistics' inputs, frame shares and
    Grad-CAM / G1Grad-CAM maps of 3 probes (84x84) per snapshot, the probe stack."""
    (run_dir / "snapshots").mkdir(parents=True)
    rows = [{"step": t, "return_mean": float(rng.normal(2, 0.1)), "newest_share": 0.5} for t in steps]
    (run_dir / "done.json").write_text(json.dumps({"rows": rows, "steps": steps[-1]}))
    (run_dir / "snapshots" / "stats.csv").write_text("step\n" + "".join(f"{t}\n" for t in steps))
    (run_dir / "snapshots" / "meta.json").write_text("{}")
    np.save(run_dir / "snapshots" / "probe.npy", probe)
    for t in steps:
        np.savez_compressed(run_dir / "snapshots" / f"step_{t:09d}.npz", frame_shares=rng.random((3, 3, 4)),
                            gradcam=rng.random((3, 84, 84)), g1gradcam=rng.random((3, 84, 84)))


def test_incomplete_report_runs_s1_to_s3_on_the_seeds_that_exist_truncated(tmp_path):
    study = dataclasses.replace(plan.ATARI, seeds=(100, 101, 102), steps=4 * 512, checkpoint_every=1, snapshot_every=1)
    steps = [512, 1024, 1536, 2048]
    probe = np.zeros((3, 84, 84, 4), np.float32)
    probe[:, 60, 30:32, -1] = 1.0
    probe[:, 75:78, 40:56, -1] = 1.0
    rng = np.random.default_rng(0)
    for v in study.variants:
        for s in (100, 101):                                 # every seed-102 run is missing
            for d in ("runs", "reruns") if fss.run_name(v, s) in sp.RETRAINED else ("runs",):
                _disk_run(tmp_path / d / fss.run_name(v, s), steps, rng, probe)
    res = sec.analyse(study, tmp_path / "runs", tmp_path / "reruns", n_boot=10)
    assert set(res["missing_runs"]) == {f"{v}_s102" for v in study.variants} and "s1" not in res
    res = sec.analyse(study, tmp_path / "runs", tmp_path / "reruns", n_boot=10, incomplete=True)
    assert res["report"] == "incomplete" and res["truncated"] and res["checkpoints"] == steps
    assert res["s1_seeds"] == [100, 101] and res["cam_seeds"] == [100, 101]
    assert res["s1"]["seeds"] == [100, 101] and res["s1"]["min_attainable_p"] == 0.25 and not res["s1"]["can_reject"]
    assert set(res["s2"]["bugs"]) == {"reuse", "reversed"}
    assert res["s2"]["bugs"]["reuse"]["n_bug"] == 2 and not res["s2"]["bugs"]["reuse"]["can_reject"]
    assert res["s3"]["power"]["min_holm_p"] == 1.0 and res["s3"]["power"]["note"] == sec.S3_NO_POWER
    assert set(res["s3"]["rise_steps"]) == {fss.run_name(v, s) for v in study.variants for s in (100, 101)}
    assert res["s3_pooled_not_registered"]["label"] == "not registered"
    json.dumps(res)


def test_the_reproduction_check_accepts_a_copy_and_rejects_a_share_off_by_more_than_the_tolerance(tmp_path):
    """The registered acceptance of a re-trained run: frame shares within 1e-5 at every snapshot and the
    same return statistic at every checkpoint (here on a committed run and copies of it)."""
    import shutil

    runs = ROOT / "experiments/results/frame_stack_bug/runs_atari"
    name = "correct_s101"
    reruns = tmp_path / "reruns"
    shutil.copytree(runs / name, reruns / name)
    got = sec.reproduction(plan.ATARI, runs, reruns)
    assert got[name]["reproduces"] and got[name]["max_share_diff"] == 0.0
    assert got["reuse_s100"] is None                       # not re-trained here: reported as absent
    snap = sorted((reruns / name / "snapshots").glob("step_*.npz"))[3]
    z = dict(np.load(snap))
    z["frame_shares"] = z["frame_shares"] + np.float32(2 * sp.REPRODUCE_SHARES_ATOL)
    np.savez(snap, **z)
    got = sec.reproduction(plan.ATARI, runs, reruns)[name]
    assert not got["reproduces"] and got["max_share_diff"] > sp.REPRODUCE_SHARES_ATOL
    assert got["checkpoints_return_differs"] == 0


def test_the_committed_secondary_results_are_what_the_code_computes_from_the_committed_runs():
    """atari_secondary.json is the analysis of the 15 committed runs and the 4 committed re-runs, as committed."""

    res_dir = ROOT / "experiments/results/frame_stack_bug"
    res = sec.analyse(plan.ATARI, res_dir / "runs_atari", res_dir / "reruns_atari", res_dir / "runs_minatar")
    assert {"s1", "s2", "s3"} <= set(res) and not res["missing_cam_rows"]
    assert json.loads(json.dumps(res)) == json.loads((res_dir / "atari_secondary.json").read_text())
