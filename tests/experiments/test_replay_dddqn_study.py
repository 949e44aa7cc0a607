"""The replay-DDDQN frame-stack study (experiments.frame_stack_bug.replay_dddqn_plan) through the shared runner
(experiments.frame_stack_bug.study): the registry leaves the frozen PQN plans alone, the plan's
numbers, and the runner end to end on a tiny fake-env study (development seeds only)."""
import dataclasses
import json

import numpy as np
import pytest

from experiments.frame_stack_bug import plan, replay_dddqn_plan as rplan, report as frame_stack_report
from experiments.frame_stack_bug import run as frame_stack_bug, study as fss
from experiments.frame_stack_bug.lead import lead_test
from tests.experiments.test_frame_stack_study import fake_env


def test_registry_adds_the_replay_study_and_keeps_the_frozen_pqn_plans():
    assert set(fss.STUDIES) == {"minatar", "atari", "replay_dddqn"}
    assert fss.STUDIES["minatar"] is plan.MINATAR and fss.STUDIES["atari"] is plan.ATARI
    assert plan.STUDIES == {"minatar": plan.MINATAR, "atari": plan.ATARI}
    # the PQN MinAtar study's registered numbers, as frozen
    m = plan.MINATAR
    assert (m.seeds, m.steps, m.num_envs, m.rollout, m.lr, m.epochs, m.minibatches, m.snapshot_every,
            m.checkpoint_every, m.alpha) == (tuple(range(100, 108)), 96_000, 32, 16, 3e-3, 4, 4, 4, 8, 0.0125)
    assert not fss.is_replay(plan.MINATAR) and fss.is_replay(rplan.REPLAY_DDDQN)
    assert fss.predicted_directions(plan.MINATAR) == plan.PREDICTED_SALIENCY_DIRECTION


def test_replay_plan_numbers():
    from jaxsal_agents.train_dqn import TRANSITION_BUGS
    s = rplan.REPLAY_DDDQN
    assert s.seeds == tuple(range(200, 208)) and s.variants[0] == "correct"
    assert set(rplan.BUGS) == set(TRANSITION_BUGS) and rplan.SEVERITIES == (0.1, 0.3, 1.0)
    assert len(s.bugs) == 15 and s.bugs[:3] == ("misassembled_p0.1", "misassembled_p0.3", "misassembled_p1")
    assert s.alpha == pytest.approx(0.05 / 15) and len(fss.all_runs(s)) == 128
    assert 2 / 12_870 <= s.alpha                               # 8 vs 8 seeds can reach the per-cell level
    assert s.steps_per_update == 128 and s.updates == 768
    assert s.checkpoints[0] == 4096 and s.checkpoints[-1] == 98_304 and len(s.checkpoints) == 24
    assert s.checkpoint_every % s.snapshot_every == 0 and s.buffer_size % s.num_envs == 0
    assert s.learned_threshold == pytest.approx(2 * 0.41)
    assert s.signals == {"saliency": "stack_age_gain", "return": "return_mean_100"}
    assert set(s.descriptive_signals.values()) == {"return_mean_20", "return_mean_50", "return_mean_200", "return_mean_400"}
    assert s.lead_alpha == 0.05 and 1 / 2 ** len(s.seeds) <= s.lead_alpha
    assert set(s.predicted_saliency_direction) == set(s.bugs)
    assert fss.split_bug("done_late_p0.3") == (None, "done_late", 0.3)
    assert fss.split_bug("misassembled_p1") == fss.split_bug("misassembled") == (None, "misassembled", 1.0)
    assert fss.split_bug("reuse") == ("reuse", None, 1.0) and fss.split_bug("correct") == (None, None, 1.0)
    for bad in ("done_late_p2", "done_late_px", "swapped_p0.1"):
        with pytest.raises(SystemExit, match="unknown variant"):
            fss.split_bug(bad)


def test_return_windows_average_the_last_games_before_each_step(tmp_path):
    (tmp_path / "returns.csv").write_text("step,return,wall_s\n" + "".join(
        f"{s},{r},0\n" for s, r in [(0, 1.0), (16, 2.0), (16, 3.0), (48, 10.0)]))
    rows = [{"step": 16}, {"step": 32}, {"step": 64}, {"step": 0}]
    fss.add_return_windows(rows, tmp_path / "returns.csv", (1, 2, 100))
    assert [r["return_mean_1"] for r in rows[:3]] == [1.0, 3.0, 10.0]
    assert [r["return_mean_2"] for r in rows[:3]] == [1.0, 2.5, 6.5]
    assert rows[2]["return_mean_100"] == pytest.approx(4.0) and np.isnan(rows[3]["return_mean_100"])


def _lead_runs(study, map_from, return_from, rng):
    runs = {}
    for v in study.variants:
        for s in study.seeds:
            rows = []
            for t in [512] + study.checkpoints:
                bug = v != "correct"
                rows.append({"step": t, "stack_age_gain": rng.normal(0, 0.05) - (1.0 if bug and t >= map_from else 0),
                             "return_mean_100": 5 + rng.normal(0, 0.05) - (1.0 if bug and t >= return_from else 0)})
            runs[(v, s)] = rows
    return runs


def test_lead_test_finds_maps_first_with_eight_seeds_and_not_the_reverse():
    study = dataclasses.replace(rplan.REPLAY_DDDQN, variants=("correct", "done_late_p0.1", "done_late_p1"))
    ck = study.checkpoints
    r = lead_test(study, _lead_runs(study, ck[3], ck[12], np.random.default_rng(0)), ck)
    assert r["p"] == 1 / 256 and r["maps_first"] and r["can_reject"] and r["label"] == "registered lead test"
    assert r["bugs"]["done_late_p1"]["map_steps"] == [ck[3]] * 8 and r["bugs"]["done_late_p1"]["return_steps"] == [ck[12]] * 8
    r = lead_test(study, _lead_runs(study, ck[12], ck[3], np.random.default_rng(1)), ck)
    assert r["p"] == 1.0 and not r["maps_first"]


TINY = dataclasses.replace(rplan.REPLAY_DDDQN, variants=("correct", "reuse", "done_late_p0.3"), seeds=(0, 1),
                           steps=96, num_envs=4, rollout=4, snapshot_every=1, checkpoint_every=2, buffer_size=64,
                           batch_size=8, grad_steps=1, learning_starts=16, ckpt_every=2)


@pytest.mark.slow
def test_replay_study_end_to_end_resumes_exports_and_writes_the_summary(tmp_path):
    make_env = fake_env((10, 10, 3), 3)
    rec = fss.train_run(TINY, "done_late_p0.3", 0, tmp_path / "runs", make_env, time_limit=1e-9, log=lambda m: None)
    assert rec["done"] is False and rec["steps"] == 16
    s = fss.run_study(TINY, tmp_path / "out", tmp_path / "runs", make_env=make_env, n_boot=20,
                      export_to=tmp_path / "slim", log=lambda m: None)
    assert s["study"] == "replay_dddqn" and s["preregistration"] == "experiments/frame_stack_bug/replay_dddqn_preregistration.md"
    assert s["seeds"] == [0, 1] and set(s["steps"].values()) == {96}
    assert s["complete"] and s["checkpoints"] == [32, 64, 96] and s["alpha_per_bug"] == pytest.approx(0.025)
    assert set(s["bugs"]) == {"reuse", "done_late_p0.3"}
    for b in s["bugs"].values():
        assert {"saliency_detection_step", "return_detection_step", "saliency", "return"} <= set(b)
        assert len(b["saliency"]["p_values"]) == 3 and len(b["return"]["p_values"]) == 3
    assert s["bugs"]["done_late_p0.3"]["saliency"]["predicted_direction"] is None
    assert s["bugs"]["reuse"]["return"]["statistic"] == "return_mean_100" and "return_20" in s["bugs"]["reuse"]
    assert s["final_returns"]["correct"]["statistic"] == "return_mean_100"
    assert s["lead"]["label"] == "registered lead test" and not s["lead"]["can_reject"]   # 2 seeds: p >= 1/4
    assert set(s["final_returns"]) == set(TINY.variants) and s["learning_check"]["registered"] is True
    runs = tmp_path / "runs"
    cfg = json.loads((runs / "done_late_p0.3_s0" / "config.json").read_text())
    assert cfg["transition_bug"] == "done_late" and cfg["transition_bug_p"] == 0.3 and cfg["stack_bug"] == ""
    assert cfg["buffer_size"] == 64
    assert cfg["arch"] == "dueling" and cfg["grad_steps"] == 1
    assert json.loads((runs / "reuse_s1" / "config.json").read_text())["stack_bug"] == "reuse"
    for f in ("replay_dddqn_summary.json", "replay_dddqn_summary.md", "replay_dddqn_stats.csv",
              "replay_dddqn_detection.png", "replay_dddqn_frame_stack_bug.png"):
        assert (tmp_path / "out" / f).exists()
    md = (tmp_path / "out" / "replay_dddqn_summary.md").read_text()
    assert "## replay_dddqn study" in md and "registered for the Atari study only" not in md
    assert md == frame_stack_report.render(json.loads((tmp_path / "out" / "replay_dddqn_summary.json").read_text()))
    # the exported (small) runs analyse exactly as the full ones; a second call trains nothing
    again = fss.run_study(TINY, tmp_path / "out2", tmp_path / "slim", make_env=lambda *a: 1 / 0, n_boot=20,
                          log=lambda m: None)
    assert again["bugs"] == s["bugs"] and again["final_returns"] == s["final_returns"]


def test_cli_study_flag_runs_the_replay_plan(monkeypatch, tmp_path):
    seen = {}

    def fake_run_study(study, out, runs_dir, **kw):
        seen.update(study=study, **kw)
    monkeypatch.setattr(fss, "run_study", fake_run_study)
    frame_stack_bug.main(["--study", "replay_dddqn", "--out", str(tmp_path), "--shard", "0/2", "--no-analysis"],
                         log=lambda m: None)
    assert seen["study"] is rplan.REPLAY_DDDQN and seen["shard"] == "0/2" and seen["analysis"] is False
