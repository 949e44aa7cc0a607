"""experiments.frame_stack_bug.study: the pre-registered runner end to end on tiny fake-env studies
(outputs in tmp dirs), and its pieces."""
import dataclasses
import json

import numpy as np
import pytest

from jaxsal_agents.framestack import FrameStackEnv
from experiments.frame_stack_bug import run as frame_stack_bug
from experiments.frame_stack_bug import plan
from experiments.frame_stack_bug import study as fss


class GridEnv:
    """Fake single-frame env: seeded random binary frames; reward 1 when the action equals a
    bit of the current frame (so agents can learn something); episodes of 5 steps."""

    def __init__(self, num_envs, seed=0, shape=(10, 10, 3), num_actions=3, density=0.2):
        self.n, self.rng, self.t = num_envs, np.random.default_rng(seed), 0
        self.obs_shape, self.num_actions, self.density = shape, num_actions, density
        self.ret = np.zeros(num_envs)

    def _obs(self):
        self.frame = (self.rng.random((self.n,) + self.obs_shape) < self.density).astype(np.float32)
        return self.frame * (255.0 if self.obs_shape[-1] == 1 else 1.0)

    def reset(self):
        self.t = 0
        return self._obs()

    def step(self, actions):
        self.t += 1
        reward = (np.asarray(actions) == (self.frame[:, 0, 0, 0] > 0)).astype(np.float32)
        self.ret += reward
        done = np.full(self.n, self.t % 5 == 0, np.float32)
        finished = self.ret[done > 0].tolist()
        self.ret[done > 0] = 0
        return self._obs(), reward, done, finished


def fake_env(shape, num_actions):
    def make_env(study, bug):
        def env_fn(game, num_envs, train=True, seed=0):
            return FrameStackEnv(GridEnv(num_envs, seed, shape, num_actions), study.frames, bug)
        return env_fn
    return make_env


TINY_MINATAR = dataclasses.replace(plan.MINATAR, variants=("correct", "reuse", "reversed"), seeds=(100, 101),
                                   steps=96, num_envs=4, rollout=4, epochs=1, minibatches=1, snapshot_every=1,
                                   checkpoint_every=2)


def test_shards_cover_every_run_once_and_bad_shards_are_clear():
    runs = fss.all_runs(plan.ATARI)
    assert len(runs) == 15 and runs[:3] == [("correct", 100), ("reuse", 100), ("reversed", 100)]
    parts = [fss.shard_runs(runs, f"{i}/4") for i in range(4)]
    assert sorted(sum(parts, [])) == sorted(runs)
    assert len(fss.all_runs(plan.MINATAR)) == 40
    for bad in ("4/4", "x"):
        with pytest.raises(SystemExit):
            fss.shard_runs(runs, bad)


def test_checkpoint_values_fill_unfinished_games_and_refuse_missing_steps():
    rows = [{"step": 10, "return_mean": float("nan")}, {"step": 20, "return_mean": 3.0}]
    np.testing.assert_array_equal(fss.at_checkpoints(rows, [10, 20], "return_mean"), [plan.RETURN_IF_NO_GAME, 3.0])
    with pytest.raises(ValueError, match="no snapshot at checkpoint"):
        fss.at_checkpoints(rows, [30], "return_mean")
    m, sd, lo, hi = fss.t_interval([1.0, 2.0, 3.0])
    assert m == 2.0 and sd == pytest.approx(1.0) and lo == pytest.approx(2 - 4.303 / 3 ** 0.5, abs=1e-3)


@pytest.mark.slow
def test_minatar_study_end_to_end_resumes_and_writes_the_summary(tmp_path):
    make_env = fake_env((10, 10, 3), 3)
    # one run stopped after its first update (time limit), then resumed to the full budget
    rec = fss.train_run(TINY_MINATAR, "reuse", 100, tmp_path / "runs", make_env, time_limit=1e-9, log=lambda m: None)
    assert rec["done"] is False and rec["steps"] == 16
    s = fss.run_study(TINY_MINATAR, tmp_path / "out", tmp_path / "runs", make_env=make_env, n_boot=20,
                      log=lambda m: None)
    assert s["seeds"] == [100, 101]
    assert set(s["steps"]) == {f"{v}_s{x}" for v in TINY_MINATAR.variants for x in (100, 101)}
    assert set(s["steps"].values()) == {96}
    # each start and resumption records its host and commit: the resumed run lists two
    starts = json.loads((tmp_path / "runs" / "reuse_s100" / "provenance.json").read_text())
    assert len(starts) == 2 and all(len(p["git_commit"]) == 40 and p["hostname"] and p["cpu_flags"]
                                    for p in starts)
    assert s["complete"] and not s["truncated"] and s["checkpoints"] == [32, 64, 96]
    assert set(s["bugs"]) == {"reuse", "reversed"} and s["alpha_per_bug"] == pytest.approx(0.025)
    for b in s["bugs"].values():
        assert "saliency_detection_step" in b and "return_detection_step" in b
        # 2 vs 2 seeds can never reject at alpha 0.025: the rule says so instead of detecting
        assert b["saliency_detection_step"] is None and b["saliency"]["can_reject"] is False
        assert len(b["saliency"]["p_values"]) == 3 and b["saliency"]["interval"]["n_boot"] == 20
    assert set(s["final_returns"]) == set(TINY_MINATAR.variants)
    assert len(s["final_returns"]["correct"]["per_seed"]) == 2
    for f in ("minatar_summary.json", "minatar_stats.csv", "minatar_frame_stack_bug.png"):
        assert (tmp_path / "out" / f).exists()
    assert json.loads((tmp_path / "out" / "minatar_summary.json").read_text())["bugs"] == s["bugs"]
    # a second call trains nothing (every run is done) and gives the same analysis
    again = fss.run_study(TINY_MINATAR, tmp_path / "out2", tmp_path / "runs", make_env=lambda *a: 1 / 0,
                          n_boot=20, log=lambda m: None)
    assert again["bugs"] == s["bugs"]


@pytest.mark.slow
def test_analysis_waits_for_missing_runs_and_truncates_incomplete_ones(tmp_path):
    make_env = fake_env((10, 10, 3), 3)
    study = dataclasses.replace(TINY_MINATAR, variants=("correct", "reuse"))
    logs = []
    assert fss.run_study(study, tmp_path / "o", tmp_path / "r", shard="0/2", make_env=make_env,
                         log=logs.append) is None
    assert any("cannot analyse yet" in m for m in logs)
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == ["correct_s100", "correct_s101"]
    fss.train_run(study, "reuse", 100, tmp_path / "r", make_env, log=lambda m: None)
    fss.train_run(study, "reuse", 101, tmp_path / "r", make_env, time_limit=1e-9, log=lambda m: None)
    # train nothing: analyse what is on disk; reuse_s101 stopped at step 16 < first checkpoint 32
    with pytest.raises(SystemExit, match="no registered checkpoint"):
        fss.run_study(study, tmp_path / "o", tmp_path / "r", train=False, n_boot=5, log=lambda m: None)


def test_cli_study_flag_uses_the_plan(monkeypatch, tmp_path):
    seen = {}

    def fake_run_study(study, out, runs_dir, **kw):
        seen.update(study=study, out=out, **kw)
        return None
    monkeypatch.setattr(fss, "run_study", fake_run_study)
    res = frame_stack_bug.main(["--study", "atari", "--out", str(tmp_path), "--shard", "1/3", "--no-analysis"],
                               log=lambda m: None)
    assert res == {"analysed": False}
    assert seen["study"] is plan.ATARI and seen["shard"] == "1/3" and seen["analysis"] is False and seen["train"]


@pytest.mark.slow
def test_atari_study_end_to_end_with_the_dueling_double_dqn(tmp_path):
    study = dataclasses.replace(plan.ATARI, seeds=(100, 101), steps=2 * 4 * 3, num_envs=2, rollout=4,
                                epochs=1, minibatches=1, snapshot_every=1, checkpoint_every=1, target_every=2)
    s = fss.run_study(study, tmp_path / "out", make_env=fake_env((84, 84, 1), 4), n_boot=10,
                      export_to=tmp_path / "slim", log=lambda m: None)
    assert set(s["bugs"]) == {"reuse", "reversed"} and s["checkpoints"] == [8, 16, 24]
    assert set(s["steps"].values()) == {24} and set(s["final_returns"]) == {"correct", "reuse", "reversed"}
    cfg = json.loads((tmp_path / "out" / "runs_atari" / "reuse_s100" / "config.json").read_text())
    assert cfg["arch"] == "dueling" and cfg["target_every"] == 2 and cfg["game"] == "breakout"
    assert (tmp_path / "out" / "atari_frame_stack_bug.png").exists()
    assert "## atari study" in (tmp_path / "out" / "atari_summary.md").read_text()
    assert (tmp_path / "out" / "atari_detection.png").exists()
    # the exported (small) runs analyse exactly as the full ones, figure included
    again = fss.run_study(study, tmp_path / "out2", tmp_path / "slim", train=False, n_boot=10, log=lambda m: None)
    assert again["bugs"] == s["bugs"] and again["final_returns"] == s["final_returns"]
    assert (tmp_path / "out2" / "atari_frame_stack_bug.png").exists()


def _fake_run(run_dir, steps=(512, 2048), done=True, ckpt=True):
    """A run folder as train_run leaves it: snapshots with maps of 3 probes and frame shares."""
    rng = np.random.default_rng(len(str(run_dir)))
    (run_dir / "snapshots").mkdir(parents=True)
    if ckpt:
        (run_dir / "ckpt" / "000000001").mkdir(parents=True)
    for f in ("config.json", "snapshots/meta.json"):
        (run_dir / f).write_text("{}")
    (run_dir / "returns.csv").write_text("step,return\n")
    (run_dir / "snapshots" / "stats.csv").write_text("step\n" + "".join(f"{s}\n" for s in steps))
    np.save(run_dir / "snapshots" / "probe.npy", rng.random((3, 6, 6, 4)).astype(np.float32))
    for s in steps:
        np.savez_compressed(run_dir / "snapshots" / f"step_{s:09d}.npz", gradcam=rng.normal(size=(3, 6, 6)),
                            g1gradcam=rng.normal(size=(3, 6, 6)), gradient=rng.random((3, 6, 6)),
                            frame_shares=rng.random((3, 3, 4)))
    if done:
        (run_dir / "done.json").write_text(json.dumps({"rows": [{"step": s} for s in steps], "steps": steps[-1]}))


@pytest.mark.parametrize("in_place", [False, True])
def test_export_keeps_the_statistics_inputs_and_only_the_first_seeds_maps(tmp_path, in_place):
    from jaxsal_agents.snapshots import load_snapshots
    study = dataclasses.replace(TINY_MINATAR, variants=("correct", "reuse"))
    src = tmp_path / "runs"
    for v in study.variants:
        for s in study.seeds:
            _fake_run(src / fss.run_name(v, s), done=(v, s) != ("reuse", 101))
    full = {n.name: load_snapshots(n / "snapshots") for n in src.iterdir()}
    dest = src if in_place else tmp_path / "slim"
    names = fss.export_runs(study, src, dest, log=lambda m: None)
    assert names == ["correct_s100", "reuse_s100", "correct_s101"]     # the unfinished run stays out
    for name in names:
        slim = load_snapshots(dest / name / "snapshots")
        assert [s for s, _ in slim] == [s for s, _ in full[name]]
        for (_, a), (_, b) in zip(slim, full[name]):
            np.testing.assert_array_equal(a["frame_shares"], b["frame_shares"])
            # every run keeps its CAM maps' row profiles (all probes), which the secondary analyses read
            want = np.abs(np.stack([b["gradcam"], b["g1gradcam"]]).astype(np.float32)).sum(-1)
            np.testing.assert_allclose(a["cam_rows"], want, rtol=1e-6)
            if name.endswith("_s100"):   # the figure's seed: probe 0's maps, exactly
                assert set(a) == set(b) | {"cam_rows"} and a["gradcam"].shape == (1, 6, 6)
                np.testing.assert_array_equal(a["gradcam"][0], b["gradcam"][0])
            else:
                assert set(a) == {"frame_shares", "cam_rows"}
        assert (dest / name / "snapshots" / "probe.npy").exists() == name.endswith("_s100")
        assert (dest / name / "done.json").read_text() == (src / name / "done.json").read_text()
        assert not list((dest / name / "snapshots").glob("*.tmp.npz"))
        assert (dest / name / "ckpt").exists() == in_place       # checkpoints never travel
    assert not (dest / "reuse_s101").exists() or in_place
    # exporting the slim copies again changes nothing (their row profiles survive)
    before = {n: load_snapshots(dest / n / "snapshots") for n in names}
    fss.export_runs(study, dest, dest, log=lambda m: None)
    for n in names:
        for (_, a), (_, b) in zip(load_snapshots(dest / n / "snapshots"), before[n]):
            assert set(a) == set(b)
            np.testing.assert_array_equal(a["cam_rows"], b["cam_rows"])


def test_summary_its_markdown_and_figure_report_a_planted_bug_and_a_miss(tmp_path):
    from experiments.frame_stack_bug import report as frame_stack_report
    study = dataclasses.replace(TINY_MINATAR, variants=("correct", "reuse"), seeds=tuple(range(100, 106)))
    rng = np.random.default_rng(0)
    loaded = {}
    for v in study.variants:
        for s in study.seeds:
            rows = [{"step": t, "return_mean": float(rng.normal(2, 1)), "newest_share_gain": float(rng.normal()),
                     "stack_age_gain": float(rng.normal(0, 0.1) - (1.0 if v == "reuse" and t >= 32 else 0.0))}
                    for t in range(16, 97, 16)]
            loaded[(v, s)] = (rows, 96, s != 105 or v == "correct")
    s = fss.summarise(study, loaded, n_boot=50)
    b = s["bugs"]["reuse"]
    assert s["checkpoints"] == [32, 64, 96] and s["seeds"] == list(range(100, 106))
    assert b["saliency_detection_step"] == 32 and b["saliency"]["direction"] == "-"
    assert b["saliency"]["matches_prediction"] is True and b["return_detection_step"] is None
    assert s["incomplete_runs"] == ["reuse_s105"] and s["truncated"]
    md = frame_stack_report.render(json.loads(json.dumps(s)))
    row = next(line for line in md.splitlines() if line.startswith("| reuse |"))
    assert "**32** (down" in row and "missed (last p" in row and "down; matches" in row
    assert "Interim / truncated" in md and "reuse_s105" in md
    assert "| correct | " in md and "did not learn" in md
    assert "registered for the Atari study only" in md
    fss.detection_figure(study, {k: x[0] for k, x in loaded.items()}, s, tmp_path / "detection.png")
    assert (tmp_path / "detection.png").stat().st_size > 10_000


def _planted(study, effect_from=32, drop=(), short=None, effect=1.0, seed=0):
    """{(variant, seed): (rows, steps, finished)} with a map effect on every bug from `effect_from`;
    runs in `drop` are missing, `short` {(variant, seed): last step} stopped early."""
    rng = np.random.default_rng(seed)
    loaded = {}
    for v in study.variants:
        for s in study.seeds:
            if (v, s) in drop:
                continue
            last = (short or {}).get((v, s), study.steps)
            rows = [{"step": t, "return_mean": float(rng.normal(2, 1)), "newest_share_gain": float(rng.normal()),
                     "stack_age_gain": float(rng.normal(0, 0.1) - (effect if v != "correct" and t >= effect_from else 0))}
                    for t in range(16, last + 1, 16)]
            loaded[(v, s)] = (rows, last, last == study.steps)
    return loaded


FIVE = dataclasses.replace(TINY_MINATAR, seeds=tuple(range(100, 105)))


def test_incomplete_report_applies_the_rule_to_the_runs_that_exist_truncated_with_the_missing_listed():
    """The pre-registration's incomplete study (Atari's shape: all seed-104 runs missing, one run
    stopped short): the rule at the checkpoints every existing run reached, 4 vs 4 seeds, labelled
    truncated, the missing runs listed, and where the seeds cannot reach the per-bug level, said so."""
    from experiments.frame_stack_bug import report as frame_stack_report
    study = dataclasses.replace(FIVE, variants=("correct", "reuse", "reversed"))        # per-bug level 0.025
    drop = {(v, 104) for v in study.variants}
    s = fss.summarise(study, _planted(study, drop=drop, short={("reuse", 103): 70}), n_boot=20)
    assert s["report"] == "incomplete" and s["truncated"] and not s["complete"]
    assert s["missing_runs"] == ["correct_s104", "reuse_s104", "reversed_s104"]
    assert s["incomplete_runs"] == ["reuse_s103"]
    assert s["checkpoints"] == [32, 64]                   # reuse_s103 reached step 70: 96 is cut
    for bug, b in s["bugs"].items():
        assert b["seeds"] == [100, 101, 102, 103]
        for signal in ("saliency", "return", "saliency_old"):
            r = b[signal]
            assert (r["n_bug"], r["n_correct"]) == (4, 4) and r["min_attainable_p"] == pytest.approx(2 / 70)
            assert b["can_reject"][signal] is False and r["can_reject"] is False
        # the planted effect is as extreme as the data allow (p = 2/70), still above 0.025: missed
        assert b["saliency"]["p_values"] == [pytest.approx(2 / 70)] * 2 and b["saliency_detection_step"] is None
    assert len(s["cannot_reject"]) == 6 and "smallest attainable p 0.0286 > per-bug level 0.025" in s["cannot_reject"][0]
    assert s["final_returns"]["correct"]["seeds"] == [100, 101, 102, 103]
    md = frame_stack_report.render(json.loads(json.dumps(s)))
    assert "Incomplete study, truncated" in md and "correct_s104, reuse_s104, reversed_s104" in md
    assert "the rule cannot reject" in md and "cannot reject with these seeds" in md


def test_incomplete_report_detects_where_the_seeds_allow_and_pairs_bug_and_correct_by_seed():
    study = dataclasses.replace(FIVE, variants=("correct", "reuse"))                   # one bug: level 0.05
    s = fss.summarise(study, _planted(study, drop={("correct", 104)}), n_boot=20)
    b = s["bugs"]["reuse"]
    # reuse_s104 exists but its seed's correct run does not: the seed enters neither group
    assert s["missing_runs"] == ["correct_s104"] and b["seeds"] == [100, 101, 102, 103]
    assert s["final_returns"]["reuse"]["seeds"] == list(FIVE.seeds)
    assert b["saliency"]["min_attainable_p"] == pytest.approx(2 / 70) and b["can_reject"]["saliency"]
    assert b["saliency_detection_step"] == 32 and b["saliency"]["direction"] == "-"
    assert s["cannot_reject"] == [] and s["checkpoints"] == [32, 64, 96] and s["truncated"]


def test_analysis_on_disk_waits_for_missing_runs_unless_the_study_is_declared_incomplete(tmp_path):
    study = dataclasses.replace(FIVE, variants=("correct", "reuse"), seeds=(100, 101, 102))
    loaded = _planted(study, drop={("reuse", 102)})
    for (v, s), (rows, _, _) in loaded.items():
        run = tmp_path / "runs" / fss.run_name(v, s)
        _fake_run(run, steps=[r["step"] for r in rows])
        for r in rows:
            r["newest_share"] = 0.5
        (run / "done.json").write_text(json.dumps({"rows": rows, "steps": rows[-1]["step"]}))
        for f in (run / "snapshots").glob("step_*.npz"):       # the figure draws these maps too
            with np.load(f) as z:
                arrays = dict(z)
            np.savez_compressed(f, guided_backprop=arrays["gradient"], **arrays)
    logs = []
    assert fss.run_study(study, tmp_path / "out", tmp_path / "runs", train=False, log=logs.append) is None
    assert any("--incomplete" in m for m in logs) and not list((tmp_path / "out").iterdir())
    s = fss.run_study(study, tmp_path / "out", tmp_path / "runs", train=False, n_boot=10, incomplete=True,
                      log=logs.append)
    assert s["report"] == "incomplete" and s["missing_runs"] == ["reuse_s102"]
    out = json.loads((tmp_path / "out" / "minatar_incomplete_summary.json").read_text())
    assert out["bugs"]["reuse"]["seeds"] == [100, 101] and not (tmp_path / "out" / "minatar_summary.json").exists()
    for f in ("summary.md", "stats.csv", "frame_stack_bug.png", "detection.png"):
        assert (tmp_path / "out" / f"minatar_incomplete_{f}").exists()
    assert any("cannot reject" in m for m in logs)
