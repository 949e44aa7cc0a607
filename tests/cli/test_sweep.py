"""`jaxsal sweep CONFIG.toml --out DIR`: one resumable explain job per agent x checkpoint x input x
method, one tidy table (jaxsal.load_sweep) that a rerun after a kill reproduces, every bad config
refused in one line before anything is written, a failing cell recorded without stopping the others."""
import json
import os
import shutil
import signal
import sys

import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from jaxsal.io import sweep as sw
from tests._support.cli_support import ROOT, files_at_least, frames, make_agent_files, start_job

N = 4
CONFIG = """
agents = ["runs/*.msgpack"]
inputs = ["buf.npy"]
metrics = ["insertion"]
chunk = 2
[methods]
gradient = {}
gradcam = { layer = "conv1" }
occlusion = { patch = 2, stride = 5 }
"""


def _setup(d, config=CONFIG):
    """Two random-init checkpoints of one tiny MinAtar agent, a buffer of N frames, the config."""
    make_agent_files(d / "runs", seed=0)
    make_agent_files(d / "runs", seed=1)
    np.save(d / "buf.npy", frames(N, seed=1))
    (d / "sweep.toml").write_text(config)
    return d / "sweep.toml"


def _sweep(cfg, out, *extra):
    return main(["sweep", str(cfg), "--out", str(out), "--quiet", *map(str, extra)])


def _without_seconds(out):
    t = jaxsal.load_sweep(out)
    return {k: v for k, v in t.items() if k != "seconds"}


def _same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    d = tmp_path_factory.mktemp("sweep")
    cfg = _setup(d)
    assert _sweep(cfg, d / "out") == 0
    return d, cfg, d / "out"


@pytest.mark.slow  # 3-8 s (a subprocess, a game or a whole job): the slow stage, which CI runs
def test_one_row_per_cell_with_its_metrics(swept):
    d, cfg, out = swept
    t = jaxsal.load_sweep(out)
    assert list(t["checkpoint"]) == ["tiny0"] * 3 + ["tiny1"] * 3       # glob matches, sorted
    assert list(t["method"]) == ["gradient", "gradcam", "occlusion"] * 2  # the config's order
    assert set(t["agent"]) == {"runs"} and set(t["input"]) == {"buf"} and set(t["status"]) == {"ok"}
    assert list(t["options"][:3]) == ["{}", '{"layer":"conv1"}', '{"patch":2,"stride":5}']
    assert (t["frames"] == N).all() and t["frames"].dtype == np.int64
    for col in ("seconds", "insertion_auc", "map_mass", "map_positive_share", "map_entropy"):
        assert np.isfinite(t[col]).all(), col
    assert np.isnan(t["newest_share"]).all()                             # summed maps: no per-frame shares
    assert "deletion_auc" not in t and (t["map_entropy"] <= 1).all()
    # each cell is an ordinary explain job; its insertion AUC is jaxsal.metrics.insertion of its maps
    import jaxsal_agents

    agent = jaxsal_agents.load(str(d / "runs" / "tiny1.json"))
    job = out / "cells" / "runs" / "tiny1" / "buf" / "occlusion" / "job"
    maps = np.asarray(jaxsal.load_maps(job, "occlusion"))
    assert maps.shape == (N, 10, 10)
    x = np.load(d / "buf.npy")
    want = np.asarray(jaxsal.metrics.insertion(agent.apply_fn, agent.params, x, maps)["auc"]).mean()
    np.testing.assert_allclose(t["insertion_auc"][5], want, rtol=1e-5)
    stats = sw.map_statistics(maps)
    np.testing.assert_allclose(t["map_mass"][5], stats["map_mass"].mean(), rtol=1e-6)
    assert (out / "sweep.toml").read_text() == cfg.read_text()


def test_rerun_after_lost_cells_gives_the_same_table(swept, tmp_path):
    d, cfg, ref = swept
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    cells = out / "cells" / "runs"
    shutil.rmtree(cells / "tiny0" / "buf" / "gradcam")                 # a cell never run
    (cells / "tiny1" / "buf" / "gradient" / "cell.json").unlink()       # killed mid-job: one chunk lost
    (cells / "tiny1" / "buf" / "gradient" / "job" / "gradient" / "chunk_0000001.npy").unlink()
    kept = {p: p.stat().st_mtime_ns for p in cells.rglob("cell.json")}
    assert _sweep(cfg, out) == 0
    _same(_without_seconds(out), _without_seconds(ref))
    assert all(p.stat().st_mtime_ns == t for p, t in kept.items())     # finished cells are not rerun
    assert (cells / "tiny1" / "buf" / "gradient" / "job" / "gradient" / "chunk_0000001.npy").exists()
    before = (out / "results.csv").read_bytes()
    assert _sweep(cfg, out) == 0                                        # nothing missing: the same bytes
    assert (out / "results.csv").read_bytes() == before


@pytest.mark.parametrize("edit,key", [(("chunk = 2", "chunk = 3"), "chunk"),
                                      (("patch = 2, stride = 5", "patch = 3, stride = 5"), "methods")])
def test_another_config_into_the_same_dir_is_refused(swept, tmp_path, capsys, edit, key):
    """Another chunk, or only another option of one method (whose cells would otherwise keep the old option's
    results under the new config), is another sweep: refused in one line naming what differs."""
    d, cfg, ref = swept
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    before = sorted(str(p) for p in out.rglob("*"))
    other = d / "other.toml"
    other.write_text(CONFIG.replace(*edit))
    capsys.readouterr()
    assert _sweep(other, out) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "another config" in err[0] and f"{key} differs" in err[0] and "--out" in err[0]
    assert sorted(str(p) for p in out.rglob("*")) == before


def test_a_rerun_retries_the_failed_cells_only(swept, tmp_path):
    """Cells recorded as failed (here: a worker that died) run again on a rerun of the same command and end as an
    uninterrupted sweep's; the cells that finished are not run again."""
    d, cfg, ref = swept
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    cells = out / "cells" / "runs"
    failed = [cells / "tiny0" / "buf" / "gradcam" / "cell.json", cells / "tiny1" / "buf" / "occlusion" / "cell.json"]
    for record in failed:
        sw.write_record(record, {"cell": str(record.parent.relative_to(out)), "status": "error", "frames": None,
                                 "metrics": {}, "seconds": None, "error": "worker exited with code -9"})
    kept = {p: p.stat().st_mtime_ns for p in cells.rglob("cell.json") if p not in failed}
    assert _sweep(cfg, out) == 0
    _same(_without_seconds(out), _without_seconds(ref))
    assert all(p.stat().st_mtime_ns == t for p, t in kept.items())


def test_each_row_of_the_table_is_its_own_cells_record(swept):
    """load_sweep's row i holds cell i's own record (status, frames, seconds, every metric), in every column."""
    d, cfg, out = swept
    t = jaxsal.load_sweep(out)
    assert len(t["agent"]) == 6
    for i in range(6):
        cell = out / sw.CELLS / t["agent"][i] / t["checkpoint"][i] / t["input"][i] / t["method"][i]
        rec = json.loads((cell / sw.CELL_RECORD).read_text())
        assert t["status"][i] == rec["status"] and t["frames"][i] == rec["frames"], i
        np.testing.assert_allclose(t["seconds"][i], rec["seconds"], rtol=1e-9)
        assert set(rec["metrics"]) >= {"insertion_auc", "map_mass"}
        for k, v in rec["metrics"].items():
            np.testing.assert_allclose(t[k][i], v, rtol=1e-9, err_msg=f"row {i} {k}")


def _bad_cases():
    """(name, config text, words the one-line error must contain)."""
    base = dict(agents='["runs/*.msgpack"]', inputs='["buf.npy"]', metrics='["insertion"]',
                methods='gradient = {}')

    def cfg(**kw):
        c = dict(base, **kw)
        extra = c.pop("extra", "")
        return (f"agents = {c['agents']}\ninputs = {c['inputs']}\nmetrics = {c['metrics']}\n{extra}\n"
                f"[methods]\n{c['methods']}\n")
    return [
        ("top-level key", cfg(extra="metric = 1"), ["'metric'", "did you mean 'metrics'", "agents, inputs"]),
        ("unknown agent", cfg(agents='["nosuchagent"]'), ["agents[0]", "'nosuchagent'", "shipped name"]),
        ("empty glob", cfg(agents='["runs/*.cleanrl_model"]'), ["agents[0]", "no file matches", "pattern"]),
        ("no card", cfg(agents='["lone/*.msgpack"]'), ["agents[0]", "x.json", "card ="]),
        ("unknown method", cfg(methods='gradcamm = {}'), ["[methods] gradcamm", "'gradcamm'",
                                                          "did you mean 'gradcam'"]),
        ("bad option", cfg(methods='occlusion = { patchh = 6 }'), ["[methods] occlusion", "'patchh'",
                                                                   "did you mean 'patch'", "stride"]),
        ("bad expression", cfg(methods='sg = { method = "noise_tunnel(gradcm, n=2)" }'),
         ["[methods] sg", "unknown method 'gradcm'", "did you mean 'gradcam'"]),
        ("bad combinator argument", cfg(methods='"noise_tunnel(gradcam, n=0)" = {}'),
         ["[methods] noise_tunnel(gradcam, n=0)", "n must be an integer >= 1"]),
        ("expression option", cfg(methods='sg = { method = "noise_tunnel(gradcam)", n_sample = 2 }'),
         ["[methods] sg", "'n_sample'", "did you mean 'n_samples'"]),
        ("unknown metric", cfg(metrics='["insertion", "fidelity"]'), ["metrics", "'fidelity'", "deletion"]),
        ("objects, no table", cfg(metrics='["objects"]'), ["'objects'", "object table", "minatar-breakout",
                                                           "drop 'objects'"]),
        ("missing input", cfg(inputs='["nobuf.npy"]'), ["inputs[0]", "nobuf.npy", "check the path"]),
        ("input key", cfg(inputs='[{ play = 5, sed = 1 }]'), ["inputs[0]", "'sed'", "did you mean 'seed'"]),
        ("not toml", "agents = [", ["sweep.toml", "not valid TOML"]),
        # before: an AttributeError (internal error) with objects; else each cell failed, after the sweep began
        ("card's game a number, objects", cfg(agents='["odd.json"]', metrics='["objects"]'),
         ["agents[0]", "odd.json", "game is 5", "game name"]),
        ("card's game a number", cfg(agents='["odd.json"]'), ["agents[0]", "odd.json", "game is 5"]),
        ("played game a list", cfg(inputs='[{ play = 5, game = ["x"] }]'), ["inputs[0]", "game is ['x']",
                                                                           "game name"]),
        # before: exit 1, "internal error TypeError: Object of type date is not JSON serializable", --out made
        ("option a TOML date", cfg(methods='occlusion = { patch = [1979-05-27] }'),
         ["[methods] occlusion", "patch is the TOML date 1979-05-27", "quote it"]),
        # before: every cell's job ran, then the sanity metric listed 2**63-1 draws: memory exhausted (OOM-killed)
        ("sanity draws beyond memory", cfg(metrics='["sanity"]', extra="sanity_draws = 9223372036854775807"),
         ["sanity_draws", "from 1 to 100", "9223372036854775807"]),
    ]


@pytest.mark.parametrize("name,text,words", _bad_cases(), ids=[c[0] for c in _bad_cases()])
def test_bad_config_one_line_exit_2_nothing_written(tmp_path, capsys, name, text, words):
    cfg = _setup(tmp_path, text)
    (tmp_path / "lone").mkdir()
    (tmp_path / "lone" / "x.msgpack").write_bytes(b"")
    (tmp_path / "odd.json").write_text(json.dumps({"game": 5, "arch": "dqn", "num_actions": 3,
                                                   "obs_shape": [10, 10, 4]}))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    capsys.readouterr()
    assert _sweep(cfg, tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    for w in words:
        assert w in err[0], (w, err[0])
    assert "Traceback" not in err[0]
    assert not (tmp_path / "out").exists()
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def test_a_failing_cell_is_recorded_and_the_others_complete(tmp_path, capsys):
    cfg = _setup(tmp_path, CONFIG.replace('agents = ["runs/*.msgpack"]', 'agents = ["runs/tiny0.msgpack"]')
                 .replace('gradcam = { layer = "conv1" }', 'broken = { method = "gradcam", layer = "nosuch" }'))
    capsys.readouterr()
    assert _sweep(cfg, tmp_path / "out") == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cells/tiny0/default/buf/broken" in err[0] and "nosuch" in err[0]
    t = jaxsal.load_sweep(tmp_path / "out")
    assert list(t["method"]) == ["gradient", "broken", "occlusion"]
    assert list(t["status"]) == ["ok", "error", "ok"]
    assert "nosuch" in t["error"][1] and t["error"][0] == "" and t["error"][2] == ""
    assert np.isfinite(t["insertion_auc"][[0, 2]]).all() and np.isnan(t["insertion_auc"][1])
    assert t["frames"][0] == N and t["frames"][2] == N


def test_load_sweep_as_a_dataframe(swept):
    pd = pytest.importorskip("pandas")
    df = jaxsal.load_sweep(swept[2], as_frame=True)
    assert isinstance(df, pd.DataFrame) and len(df) == 6
    assert list(df.columns[:4]) == ["agent", "checkpoint", "input", "method"]


def test_map_statistics_of_known_maps():
    m = np.zeros((3, 4, 4, 2), np.float32)
    m[0, 0, 0, 1] = 2.0                      # one pixel, newest frame: entropy 0, newest share 1
    m[1] = 1.0                               # uniform over pixels and frames: entropy 1, share 1/2
    m[2, :, :, 0] = -1.0                     # all negative, oldest frame
    s = sw.map_statistics(m)
    np.testing.assert_allclose(s["map_mass"], [2, 32, 16])
    np.testing.assert_allclose(s["map_positive_share"], [1, 1, 0])
    np.testing.assert_allclose(s["map_entropy"], [0, 1, 1], atol=1e-12)
    np.testing.assert_allclose(s["newest_share"], [1, 0.5, 0])
    np.testing.assert_allclose(s["age_centroid"], [0, 0.5, 1])
    z = sw.map_statistics(np.zeros((1, 4, 4), np.float32))
    assert np.isnan(z["map_entropy"]).all() and np.isnan(z["newest_share"]).all()


@pytest.mark.slow
def test_workers_run_cells_in_processes(swept, tmp_path):
    d, cfg, ref = swept
    assert _sweep(cfg, tmp_path / "out", "--workers", 2) == 0
    a, b = _without_seconds(tmp_path / "out"), _without_seconds(ref)
    assert a.keys() == b.keys()
    for k in a:
        if a[k].dtype.kind == "f":
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, err_msg=k)
        else:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def _mid_job(out):
    """A cell whose job has written a chunk but which has no record yet (killed there, it is half done)."""
    return [p.parent.parent.parent for p in out.glob("cells/*/*/*/*/job/*/chunk_*.npy")
            if not (p.parent.parent.parent / "cell.json").exists()]


@pytest.mark.slow
def test_sigkill_mid_sweep_then_rerun(swept, tmp_path):
    d, cfg, ref = swept
    out = tmp_path / "out"
    proc = start_job(["sweep", cfg, "--quiet"], out, lambda o: files_at_least(2, "cell.json")(o) and _mid_job(o),
                     slow_write=0.5)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    half = _mid_job(out)
    assert half and 2 <= len(list(out.rglob("cell.json"))) < 6
    t = jaxsal.load_sweep(out)                    # the table so far: finished rows, the rest pending
    assert list(t["status"]).count("ok") >= 2 and "pending" in set(t["status"])
    kept = {p: p.stat().st_mtime_ns for p in half[0].glob("job/*/chunk_*.npy")}
    assert _sweep(cfg, out) == 0
    assert all(p.stat().st_mtime_ns == ns for p, ns in kept.items())   # the half-done job resumed
    a, b = _without_seconds(out), _without_seconds(ref)
    for k in a:
        if a[k].dtype.kind == "f":
            np.testing.assert_allclose(a[k], b[k], rtol=1e-5, err_msg=k)
        else:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.slow
def test_played_inputs_and_sanity(tmp_path):
    cfg = _setup(tmp_path, """
agents = [{ card = "runs/tiny0.json", checkpoints = ["runs/tiny0.msgpack", "runs/tiny1.msgpack"], name = "tiny" }]
inputs = [{ play = 3, seed = 2 }]
metrics = ["sanity", "deletion"]
[methods]
gradient = { per_frame = true }
""")
    assert _sweep(cfg, tmp_path / "out") == 0
    t = jaxsal.load_sweep(tmp_path / "out")
    assert list(t["agent"]) == ["tiny", "tiny"] and list(t["checkpoint"]) == ["tiny0", "tiny1"]
    assert list(t["input"]) == ["play3-seed2"] * 2 and (t["frames"] == 3).all()
    assert np.isfinite(t["sanity_conv1_spearman"]).all() and np.isfinite(t["deletion_auc"]).all()
    for row, ckpt in enumerate(t["checkpoint"]):             # per-frame maps: the newest frame's share of each map
        maps = np.asarray(jaxsal.load_maps(tmp_path / "out" / "cells" / "tiny" / ckpt / "play3-seed2" / "gradient"
                                           / "job", "gradient"))
        assert maps.ndim == 4
        want = jaxsal.metrics.newest_share(jaxsal.metrics.frame_shares(maps, maps.shape[-1])).mean()
        assert 0 <= want <= 1
        np.testing.assert_allclose(t["newest_share"][row], want, rtol=1e-6)
    assert json.loads(t["input_spec"][0]) == {"play": 3, "seed": 2}
    assert (tmp_path / "out" / "cells" / "tiny" / "tiny1" / "play3-seed2" / "_rollout" / "input" / "obs.npy").exists()


def _object_sweep(tmp_path, n, metric):
    """A buffer of n states of the object test agent (tmp_path/buf.npy) and a sweep.toml explaining it with
    the gradient under `metric`; (the config's text, the states, their ObjectBoxes), the boxes not yet saved."""
    from tests._support import object_agent

    obs, ob = object_agent.buffer(n)
    np.save(tmp_path / "buf.npy", obs)
    text = f"""
agents = ["{ROOT / 'tests' / '_support' / 'object_agent.py'}:load"]
inputs = ["buf.npy"]
metrics = ["{metric}"]
[methods]
gradient = {{}}
"""
    (tmp_path / "sweep.toml").write_text(text)
    return text, obs, ob


def test_objects_metric_shares_per_class(tmp_path, capsys):
    text, _, ob = _object_sweep(tmp_path, 3, "objects")
    capsys.readouterr()
    assert _sweep(tmp_path / "sweep.toml", tmp_path / "out") == 2            # no boxes beside the buffer yet
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'objects'" in err[0] and "buf" in err[0] and not (tmp_path / "out").exists()
    ob.save(tmp_path / "buf.objects.npz")
    assert _sweep(tmp_path / "sweep.toml", tmp_path / "out") == 0
    t = jaxsal.load_sweep(tmp_path / "out")
    assert list(t["agent"]) == ["load"] and list(t["status"]) == ["ok"]
    assert t["objects_target_absolute"][0] > 0.99 and t["objects_other_absolute"][0] < 1e-3  # it reads BOX only
    np.testing.assert_allclose(t["objects_target_chance"], 144 / 84 ** 2, rtol=1e-5)
    assert t["objects_target_pointing"][0] == 1


@pytest.mark.parametrize("metric", ["objects", "effects"])
def test_class_names_of_one_column_name_are_refused(tmp_path, capsys, metric):
    """'ball!' and 'ball?' both make the columns objects_ball_*: one class's means overwrote the other's, without
    a word; now the sweep is refused in one line, naming both, before anything is written."""
    from jaxsal.game_objects import ObjectBoxes

    _, _, ob = _object_sweep(tmp_path, 3, metric)
    ObjectBoxes(ob.boxes, ob.labels, ("ball!", "ball?")).save(tmp_path / "buf.objects.npz")
    capsys.readouterr()
    assert _sweep(tmp_path / "sweep.toml", tmp_path / "out") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'ball!'" in err[0] and "'ball?'" in err[0] and f"{metric}_ball_" in err[0], err
    assert not (tmp_path / "out").exists()


def test_plan_names_every_cell_readably(tmp_path):
    make_agent_files(tmp_path / "runs" / "pong", seed=0)
    make_agent_files(tmp_path / "runs" / "pong", seed=1)
    np.save(tmp_path / "buf.npy", frames(2))
    (tmp_path / "minatar-breakout").mkdir()       # a folder named like a shipped agent: the name still wins
    raw = {"agents": ["minatar-breakout", "runs/pong/*.msgpack",
                      {"card": "runs/pong/tiny0.json", "checkpoints": ["runs/pong/tiny1.msgpack"], "name": "own"}],
           "inputs": ["buf.npy", {"play": 500, "seed": 1}, {"path": "buf.npy", "limit": 2}],
           "methods": {"gradcam": {"layer": "conv3"}, "coarse": {"method": "occlusion", "patch": 6}}}
    cells, metrics, sett = sw.plan(raw, tmp_path)
    assert metrics == [] and sett == sw.DEFAULTS
    assert len(cells) == 4 * 3 * 2
    assert [c.path for c in cells[:6]] == [f"cells/minatar-breakout/default/{i}/{m}"
                                           for i in ("buf", "play500-seed1", "buf-first2")
                                           for m in ("gradcam", "coarse")]
    assert cells[0].spec == "minatar-breakout" and cells[0].game == "minatar-breakout"
    assert [c.path for c in cells[6:24:6]] == ["cells/pong/tiny0/buf/gradcam", "cells/pong/tiny1/buf/gradcam",
                                               "cells/own/tiny1/buf/gradcam"]
    assert cells[18].spec == str(tmp_path / "runs/pong/tiny0.json") and cells[18].model.endswith("tiny1.msgpack")
    assert cells[1].method_name == "occlusion" and cells[1].options == {"patch": 6}
    assert cells[2].input_spec == {"play": 500, "seed": 1}
    assert cells[4].input_spec == {"path": str(tmp_path / "buf.npy"), "limit": 2}


@pytest.mark.slow  # end to end, 3-10 s: the slow stage (CI runs it)
def test_method_expressions_as_methods(tmp_path):
    """A [methods] entry's method (or its key) may be an expression: the cell's method_name is its
    canonical text, an unaliased one's folder its alias; the job's maps are the Python call's with
    the sweep's key, and the sanity metric runs on the expression too."""
    import jax
    import jaxsal_agents

    cfg = _setup(tmp_path, """
agents = ["runs/tiny0.msgpack"]
inputs = ["buf.npy"]
metrics = ["sanity"]
sanity_frames = 2
seed = 3
[methods]
sg = { method = "noise_tunnel( gradcam,n=2 )", layer = "conv1" }
"path_integral(gradient, steps=2)" = {}
""")
    cells, _, _ = sw.plan(sw.read_config(cfg), tmp_path)
    assert [(c.method, c.method_name) for c in cells] == [
        ("sg", "noise_tunnel(gradcam, n=2)"), ("path_integral-gradient-steps_2", "path_integral(gradient, steps=2)")]
    assert _sweep(cfg, tmp_path / "out") == 0
    t = jaxsal.load_sweep(tmp_path / "out")
    assert list(t["status"]) == ["ok", "ok"] and np.isfinite(t["sanity_conv1_spearman"]).all()
    agent = jaxsal_agents.load(str(tmp_path / "runs" / "tiny0.json"))
    x = np.load(tmp_path / "buf.npy")
    want = jaxsal.explain(agent.apply_fn, agent.params, x, method=jaxsal.noise_tunnel("gradcam", n=2), layer="conv1",
                          key=jax.random.PRNGKey(3))
    got = jaxsal.load_maps(tmp_path / "out" / cells[0].path / "job", "sg")
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * float(np.abs(want).max()))


def test_a_globs_checkpoints_come_in_natural_order(tmp_path):
    """step_2 before step_10 (lexical order has step_10 first), for files and for folders; equal numbers
    fall back to the text (ckpt_02 before ckpt_2), so the order never depends on the file system's."""
    card = json.dumps({"game": "minatar-breakout"})
    for n in ("10", "2", "1", "02", "100", "9"):
        (tmp_path / "runs" / f"ckpt_{n}.json").parent.mkdir(exist_ok=True)
        (tmp_path / "runs" / f"ckpt_{n}.json").write_text(card)
        (tmp_path / "runs" / f"ckpt_{n}.msgpack").write_bytes(b"")
        (tmp_path / "steps" / f"step_{n}").mkdir(parents=True)
        (tmp_path / "steps" / f"step_{n}" / "model.msgpack").write_bytes(b"")
    (tmp_path / "card.json").write_text(card)
    raw = {"agents": ["runs/ckpt_*.msgpack", {"card": "card.json", "checkpoints": "steps/step_*/model.msgpack"},
                      {"card": "card.json", "checkpoints": ["steps/step_9/model.msgpack", "steps/step_10/model.msgpack",
                                                            "steps/step_2/model.msgpack"], "name": "listed"}]}
    got = [(a, c) for a, c, *_ in sw.plan_agents(raw, tmp_path)]
    order = ["1", "02", "2", "9", "10", "100"]
    assert got == ([("runs", f"ckpt_{n}") for n in order] + [("card", f"step_{n}-model") for n in order]
                   + [("listed", f"step_{n}-model") for n in ("9", "10", "2")])   # a list keeps its order
    assert sorted(["b/x10", "a/x2", "b/x9", "a/x10"], key=sw.natural_key) == ["a/x2", "a/x10", "b/x9", "b/x10"]


def test_bad_command_line_exit_2_nothing_written(swept, tmp_path, capsys):
    d, cfg, ref = swept
    capsys.readouterr()
    assert _sweep(cfg, tmp_path / "out", "--workers", 0) == 2
    assert _sweep(tmp_path / "missing.toml", tmp_path / "out") == 2
    assert _sweep(tmp_path, tmp_path / "out") == 2                        # a folder, not a file
    moved = tmp_path / "moved"                                             # the same text, another folder
    shutil.copytree(d / "runs", moved / "runs")
    shutil.copy(d / "buf.npy", moved / "buf.npy")
    (moved / "sweep.toml").write_text(cfg.read_text())
    assert _sweep(moved / "sweep.toml", ref) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and "--workers" in err[0] and "does not exist" in err[1] and "cannot read" in err[2]
    assert "run that file" in err[3] and str(d) in err[3]
    assert not (tmp_path / "out").exists()


def test_a_worker_that_dies_is_recorded(swept, tmp_path, monkeypatch, capsys):
    d, cfg, ref = swept
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    for m in ("gradient", "gradcam"):
        (out / "cells" / "runs" / "tiny1" / "buf" / m / "cell.json").unlink()
    monkeypatch.setattr(sys, "executable", "/bin/sh")     # every worker fails to start: sh -c 'from jaxsal...'
    capsys.readouterr()
    assert _sweep(cfg, out, "--workers", 2) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("worker exited with code" in e for e in err)
    t = jaxsal.load_sweep(out)
    assert list(t["status"]) == ["ok"] * 3 + ["error", "error", "ok"]
    assert t["error"][3].startswith("worker exited with code ") and "sh:" in t["error"][3]  # its last stderr line


def test_effects_metric_removes_each_class_and_scores_agreement(tmp_path):
    """The effects metric on an agent that reads one object only: removing it changes Q, removing the other
    object changes nothing, and per class and method the table says so (issue 47 item 3)."""
    from tests._support import object_agent

    _, obs, ob = _object_sweep(tmp_path, 4, "effects")
    ob.save(tmp_path / "buf.objects.npz")
    assert _sweep(tmp_path / "sweep.toml", tmp_path / "out") == 0
    t = jaxsal.load_sweep(tmp_path / "out")
    assert list(t["status"]) == ["ok"]
    # by hand: Q_0 of each state minus Q_0 with the target's pixels filled, over the 4 states
    from jaxsal.io.object_files import load_object_effects
    from jaxsal.metrics import object_effects

    job = next((tmp_path / "out").rglob("job"))
    e = load_object_effects(job)
    apply_fn, params = object_agent.load()
    ref = object_effects(apply_fn, params, obs, ob)
    np.testing.assert_allclose(t["effects_target_effect"][0], np.asarray(ref.effect)[:, 0].mean(), rtol=1e-5)
    assert abs(t["effects_target_effect"][0]) > 1e-3 and t["effects_other_effect"][0] == 0.0
    want = np.asarray(ref.effect)     # Q-value differences of another program (the job's chunks): near 0 possible
    np.testing.assert_allclose(e["effect"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    assert t["effects_other_flips"][0] == 0.0
    # within-state agreement by hand: with two classes each state's Spearman rho is the sign of
    # (share difference) x (effect difference); the gradient's share is all on the target
    from jaxsal.io.object_files import load_object_shares

    sh = load_object_shares(job, "gradient")["positive"]
    rho = np.sign(sh[:, 0] - sh[:, 1]) * np.sign(e["effect"][:, 0] - e["effect"][:, 1])
    assert t["effects_agreement_within_state"][0] == pytest.approx(rho.mean()) and t["effects_agreement_states"][0] == 4


def test_effects_metric_needs_boxes_and_names_itself(tmp_path):
    raw = {"agents": [f"{ROOT / 'tests' / '_support' / 'object_agent.py'}:load"], "inputs": [{"play": 5, "seed": 0}],
           "metrics": ["effects"], "methods": {"gradient": {}}}
    with pytest.raises(sw.SweepConfigError, match="'effects' needs boxes"):
        sw.plan(raw, tmp_path)


def test_objects_metric_on_a_played_input_records_its_boxes(tmp_path):
    """A played input with the objects metric is played on the env that reads each state's boxes from
    the RAM (as `jaxsal explain --play N --objects`), so the cell's shares have their boxes."""
    pytest.importorskip("ale_py")
    (tmp_path / "sweep.toml").write_text("""
agents = ["pong"]
inputs = [{ play = 3, seed = 0 }]
metrics = ["objects"]
[methods]
gradient = {}
""")
    assert _sweep(tmp_path / "sweep.toml", tmp_path / "out") == 0
    t = jaxsal.load_sweep(tmp_path / "out")
    assert list(t["status"]) == ["ok"], t["error"]
    saved = next((tmp_path / "out").rglob("_rollout"))
    assert (saved / "input" / "obs.objects.npz").exists()
    shares = jaxsal.load_object_shares(next((tmp_path / "out").rglob("job")), "gradient")
    assert shares["positive"].shape[0] == 3 and "ball" in shares["classes"]
    assert 0 < t["objects_player_chance"][0] < 0.05 and t["objects_player_absolute"][0] > 0   # our paddle, from the RAM


def test_sanity_draws_average_the_draws(tmp_path):
    """sanity_draws = 2: each sanity column is the mean over the frames of both randomisation draws,
    as jaxsal.metrics.sanity_check(draws=(0, 1)) gives them; the default is draw 0 alone."""
    import jax
    import jaxsal_agents

    text = """
agents = ["runs/tiny0.msgpack"]
inputs = ["buf.npy"]
metrics = ["sanity"]
sanity_frames = 2
seed = 3
{draws}
[methods]
gradient = {{}}
"""
    one = _setup(tmp_path, text.format(draws=""))
    assert _sweep(one, tmp_path / "one") == 0
    (tmp_path / "sweep.toml").write_text(text.format(draws="sanity_draws = 2"))
    assert _sweep(tmp_path / "sweep.toml", tmp_path / "two") == 0
    t1, t2 = jaxsal.load_sweep(tmp_path / "one"), jaxsal.load_sweep(tmp_path / "two")
    agent = jaxsal_agents.load(str(tmp_path / "runs" / "tiny0.json"))
    x = np.load(tmp_path / "buf.npy")[:2]
    res = jaxsal.metrics.sanity_check(agent.model, agent.params, x, method="gradient",
                                      layers=sw.sanity_layers(agent.params), key=jax.random.PRNGKey(3), draws=(0, 1))
    col = "sanity_conv1_spearman"
    np.testing.assert_allclose(t1[col][0], np.mean(res[0]["conv1"]["spearman"]), rtol=1e-5)
    np.testing.assert_allclose(t2[col][0], np.mean(np.concatenate([res[0]["conv1"]["spearman"],
                                                                   res[1]["conv1"]["spearman"]])), rtol=1e-5)
    assert t1[col][0] != t2[col][0]
    (tmp_path / "sweep.toml").write_text(text.format(draws="sanity_draws = 0"))
    assert _sweep(tmp_path / "sweep.toml", tmp_path / "bad") == 2


def test_damaged_sweep_state_is_rerun_or_one_clear_error(swept, tmp_path, capsys):
    """Before: a cell.json edited into a list, or with metrics a list, and a sweep.json that is a list ended in
    'internal error AttributeError' (exit 1); a truncated, emptied or binary results.csv gave load_sweep's
    IndexError/StopIteration/UnicodeDecodeError."""
    d, cfg, ref = swept
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    cells = out / "cells" / "runs" / "tiny0" / "buf"
    (cells / "gradient" / "cell.json").write_text("[1]")                     # not a record: the cell runs again
    rec = json.loads((cells / "gradcam" / "cell.json").read_text())
    (cells / "gradcam" / "cell.json").write_text(json.dumps(dict(rec, metrics=[1])))
    csv_path = out / "results.csv"
    for damaged in (csv_path.read_bytes()[:-40], b"", b"\xff\xfe\x00"):
        csv_path.write_bytes(damaged)
        with pytest.raises(jaxsal.SaliencyInputError, match="results.csv is corrupt .*rerun the same `jaxsal sweep`"):
            jaxsal.load_sweep(out)
    assert _sweep(cfg, out) == 0                                              # rewrites the table, reruns 2 cells
    _same(_without_seconds(out), _without_seconds(ref))
    capsys.readouterr()
    for text in ("[1]", '{"config": [1]}', '{"config": '):
        (out / "sweep.json").write_text(text)
        assert _sweep(cfg, out) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "sweep.json is corrupt" in err and "choose another --out" in err, err


@pytest.mark.slow
def test_a_cell_record_that_is_a_directory_is_named(swept, tmp_path, capsys):
    """Before: the error named the record's temp file (`.cell.json.<pid>.tmp`), which the user never made."""
    d, cfg, ref = swept
    out = tmp_path / "out"
    shutil.copytree(ref, out)
    record = out / "cells" / "runs" / "tiny0" / "buf" / "gradient" / "cell.json"
    record.unlink()
    record.mkdir()
    capsys.readouterr()
    assert _sweep(cfg, out) != 0
    err = capsys.readouterr().err
    assert str(record) in err and ".tmp" not in err, err
