"""The Paper B re-run's committed progress (experiments/paper_b/rerun_progress.py): results kept at
the outputs' precision, keyed pieces, episodes as seeds and actions replayed exactly, and a run
resumed on a fresh machine ending with the outputs of an uninterrupted one."""
import gzip
import json
import shutil
from argparse import Namespace

import numpy as np
import pytest

from experiments.common.machine import git_state
from experiments.paper_b import run as PB
from experiments.paper_b import rerun as RR
from experiments.paper_b import rerun_analysis as A
from experiments.paper_b import rerun_progress as P

RUN = {"game": "mspacman", "agent": "a", "agent_sha256": "0" * 64, "episodes": 20, "states": 1000,
       "sanity_states": 200, "epsilon": 0.01, "max_episode_steps": 27000, "seed": 0}


# ------------------------------------------------------------------ precision
def test_values_keep_the_outputs_precision_exactly():
    rng = np.random.default_rng(0)
    arrays = {"a": rng.uniform(-1, 1, (20, 1000)).astype(np.float32), "b": rng.normal(0, 1e-5, 5000),
              "c": rng.normal(0, 300, 5000), "d": np.array(0.25), "e": np.zeros((0, 3)),
              "f": np.array([-0.0, 0.0, -1e-7, 1e-7, 0.123455, -2.5e-6, 0.5, 3.0]),
              "nan": np.array([np.nan, 1.0]), "int": np.arange(3), "text": np.array("x")}
    z = P.pack(arrays, 5)
    assert sorted(k for k in z if k.startswith("raw:")) == ["raw:int", "raw:nan", "raw:text"]
    assert z["packed:values"].dtype == np.uint8 and z["packed:values"].shape == (4, 20000 + 10000 + 1 + 8)
    back = P.unpack(z)
    assert list(back) == list(arrays)           # the order too: the outputs' rows follow it
    for k, a in arrays.items():
        assert back[k].shape == a.shape, k
        if a.dtype.kind == "f" and np.isfinite(a).all():     # what the CSVs print, -0.0 included
            assert [repr(round(float(x), 5)) for x in back[k].flat] == [repr(round(float(x), 5)) for x in a.flat]
        else:
            assert back[k].dtype == a.dtype and np.array_equal(back[k], a, equal_nan=a.dtype.kind == "f")
    assert repr(float(back["f"][2])) == "-0.0" and back["f"][4] == round(0.123455, 5)
    assert P.unpack(P.pack({}, 5)) == {}


# ------------------------------------------------------------------ the folder
def test_a_folder_from_other_settings_is_refused(tmp_path):
    P.Progress(tmp_path / "p", RUN)
    P.Progress(tmp_path / "p", dict(RUN))                    # the same settings: fine
    with pytest.raises(P.ProgressMismatch, match=r"states.*--progress"):
        P.Progress(tmp_path / "p", {**RUN, "states": 8})
    assert P.Progress(None, {**RUN, "states": 8}).root is None      # off: nothing read or written


def _method_cache(d, rng, draws=2, n=12, n_s=4):
    auc = {f"auc/{m}/{s}/{c}": rng.normal(1.5, 0.5, n) for m, s, c in RR.SETTINGS}
    curve = {f"curve/{m}/{s}/{c}": rng.normal(1.5, 0.5, 85) for m, s, c in RR.SETTINGS}
    P.save_npz(d / "fidelity.npz", **auc, **curve)
    P.save_npz(d / "timing.npz", first_call_s=12.345, ms_per_map=3.21, load_avg_1min=2.5)
    P.save_npz(d / "maps.npz", maps=rng.random((n, 84, 84), np.float32))
    for k in range(draws):
        P.save_npz(d / f"sanity_d{k:02d}.npz", **{f"{g}/{m}": rng.uniform(-0.1, 1, n_s).astype(np.float32)
                                                  for g in PB.GROUPS for m in PB.METRICS})


def _printed(d):
    return {f.name: {k: [repr(round(float(x), 5)) for x in np.ravel(v)] for k, v in P.load_npz(f).items()}
            for f in sorted(d.glob("*.npz")) if f.stem != "maps"}


def test_method_pieces_restore_without_maps_and_a_stale_key_is_ignored(tmp_path):
    cache, prog = tmp_path / "cache" / "gradient", P.Progress(tmp_path / "p", RUN)
    _method_cache(cache, np.random.default_rng(1))
    prog.save_method("gradient", "k1", {"label": "gradient"}, cache)
    f = tmp_path / "p" / "methods" / "gradient.npz"
    z = P.load_npz(f)
    assert str(z["key"]) == "k1" and not any("maps" in k for k in z)
    assert "sanity_d01:q/spearman" in z["packed:names"].tolist()
    before = f.read_bytes()
    prog.save_method("gradient", "k1", {"label": "gradient"}, cache)
    assert f.read_bytes() == before                      # nothing new: the file keeps its bytes (no git change)
    fresh = tmp_path / "fresh" / "gradient"
    assert sorted(prog.restore_method("gradient", "k1", fresh)) == ["fidelity", "sanity_d00", "sanity_d01", "timing"]
    assert _printed(fresh) == _printed(cache)            # every value as the outputs print it
    for name in ("fidelity.npz", "sanity_d01.npz"):      # in the same order (the outputs' rows follow it)
        assert list(P.load_npz(fresh / name)) == list(P.load_npz(cache / name))
    assert not (fresh / "maps.npz").exists()
    assert prog.restore_method("gradient", "k1", fresh) == []      # the cache's own pieces are kept
    logs = []
    stale = P.Progress(tmp_path / "p", RUN, log=logs.append)
    assert stale.restore_method("gradient", "k2", tmp_path / "other") == []
    assert not (tmp_path / "other").exists() and "stale" in logs[0]
    # a record under another key is replaced, not merged
    (cache / "sanity_d01.npz").unlink()
    stale.save_method("gradient", "k2", {}, cache)
    z = P.load_npz(f)
    assert str(z["key"]) == "k2" and not any(k.startswith("sanity_d01:") for k in z)


def test_a_partly_finished_method_keeps_what_an_earlier_session_recorded(tmp_path):
    prog = P.Progress(tmp_path / "p", RUN)
    first, second = tmp_path / "s1" / "m", tmp_path / "s2" / "m"
    _method_cache(first, np.random.default_rng(2), draws=1)
    prog.save_method("m", "k", {}, first)
    prog.restore_method("m", "k", second)
    _method_cache(tmp_path / "extra", np.random.default_rng(3), draws=2)
    (tmp_path / "extra" / "sanity_d01.npz").rename(second / "sanity_d01.npz")     # session 2 adds draw 1
    prog.save_method("m", "k", {}, second)
    got = tmp_path / "s3" / "m"
    assert sorted(prog.restore_method("m", "k", got)) == ["fidelity", "sanity_d00", "sanity_d01", "timing"]
    assert _printed(got) == {**_printed(first), "sanity_d01.npz": _printed(second)["sanity_d01.npz"]}


def test_registered_size_method_and_episodes_stay_small(tmp_path):
    """One method at the registered size (1,000 states, 10 draws of 200 sanity states) with values
    of full entropy at the outputs' precision, and 20 long episodes of actions."""
    cache, prog = tmp_path / "cache" / "m", P.Progress(tmp_path / "p", RUN)
    _method_cache(cache, np.random.default_rng(4), draws=10, n=1000, n_s=200)
    prog.save_method("m", "k", {}, cache)
    size = (tmp_path / "p" / "methods" / "m.npz").stat().st_size
    assert size < 200_000, size
    print(f"one method at the registered size: {size / 1e3:.0f} KB")
    rng = np.random.default_rng(5)
    for e in range(20):
        actions = np.where(rng.random(5000) < 0.7, np.repeat(rng.integers(0, 9, 500), 10), rng.integers(0, 9, 5000))
        prog.save_episode(e, {"obs": np.zeros((50, 84, 84, 4), np.uint8), "actions": actions,
                              "trajectory_sha256": "f" * 64, "length": 5000, "return": 1.0, "truncated": False,
                              "random_actions": 50, "env_seed": 1000 + e})
    eps = sum(f.stat().st_size for f in (tmp_path / "p" / "episodes").iterdir())
    assert eps < 20 * 5000, eps


def _episode(rng, seed=1000):
    return {"obs": rng.integers(0, 255, (5, 84, 84, 4), np.uint8), "steps": np.arange(5), "length": 77,
            "return": 12.0, "truncated": False, "random_actions": 1, "env_seed": seed,
            "trajectory_sha256": "a" * 64, "actions": rng.integers(0, 9, 77)}


def test_a_recorded_episode_is_replayed_and_a_changed_one_refused(tmp_path):
    rng = np.random.default_rng(6)
    ep = _episode(rng)
    prog = P.Progress(tmp_path / "p", RUN)
    prog.save_episode(0, ep)
    seen = []
    got = prog.replay_episode(0, lambda seed, actions: seen.append((seed, actions)) or dict(ep))
    assert seen[0][0] == 1000 and np.array_equal(seen[0][1], ep["actions"]) and seen[0][1].dtype == np.uint8
    assert got["obs"] is ep["obs"]
    other = {**ep, "obs": ep["obs"].copy()}
    other["obs"][2, 40, 40, 3] ^= 1                      # one pixel differs
    with pytest.raises(P.ReplayMismatch, match="states_sha256"):
        prog.replay_episode(0, lambda seed, actions: other)
    with pytest.raises(P.ReplayMismatch, match="length"):
        prog.check_episode(0, {**ep, "length": 76})
    with pytest.raises(P.ReplayMismatch):                # never overwritten by another episode
        prog.save_episode(0, other)
    # a tampered record: its hash no longer matches the replay
    f = tmp_path / "p" / "episodes" / "ep000.npz"
    z = P.load_npz(f)
    P.save_npz(f, compressed=True, **{**z, "states_sha256": np.array("0" * 64)})
    with pytest.raises(P.ReplayMismatch, match="does not reproduce"):
        prog.replay_episode(0, lambda seed, actions: dict(ep))
    other_run = P.Progress(tmp_path / "p2", {**RUN, "seed": 1})
    (tmp_path / "p2" / "episodes").mkdir()
    f.rename(tmp_path / "p2" / "episodes" / "ep000.npz")           # a record copied from another run
    with pytest.raises(P.ProgressMismatch, match="another run"):
        other_run.replay_episode(0, lambda seed, actions: dict(ep))


@pytest.mark.slow
def test_atari_episode_replays_to_the_same_bytes():
    """The emulator is deterministic given the env seed: the recorded actions regenerate the
    played episode's frames, hashes and return exactly; a cut record is refused."""
    pytest.importorskip("envpool")
    import jaxsal_agents
    agent = jaxsal_agents.load("mspacman")
    ep = RR.play_episode(agent, "mspacman", 1000, 20, 0.05, 150)
    assert ep["length"] == 150 and ep["random_actions"] > 0 and len(ep["actions"]) == 150
    again = RR.play_episode(None, "mspacman", 1000, 20, 0.05, 150, actions=ep["actions"])
    assert again["obs"].tobytes() == ep["obs"].tobytes() and again["steps"].tolist() == ep["steps"].tolist()
    for k in ("trajectory_sha256", "return", "length", "truncated", "random_actions"):
        assert again[k] == ep[k], k
    cut = RR.play_episode(None, "mspacman", 1000, 20, 0.05, 150, actions=ep["actions"][:100])
    assert cut["length"] == 100 and cut["trajectory_sha256"] != ep["trajectory_sha256"]


# ------------------------------------------------------------------ the runner across machines
def _args(root, **kw):
    a = dict(episodes=2, states=8, sanity_states=4, draws=2, epsilon=RR.EPSILON, max_episode_steps=40,
             methods=["gradient", "grad_x_input"], agent_file=None, batch_size=256, seed=0,
             cache=str(root / "cache"), out=str(root / "out"), progress=None)
    a.update(kw)
    return Namespace(**a)


def _outputs(out):
    """The result files' contents (gzip members decompressed: their headers carry a time)."""
    read = lambda f: gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes()
    return {f.name: read(f) for f in sorted(out.iterdir()) if f.is_file() and f.name not in ("meta.json", "README.md",
                                                                                            "summary.json")}


def _work(logs):
    return [line for line in logs if any(w in line for w in ("maps on", "sanity check", "episode", "restored",
                                                             "stale"))]


@pytest.mark.slow
def test_a_run_resumed_on_a_fresh_machine_ends_as_an_uninterrupted_one(tmp_path, capsys):
    pytest.importorskip("gymnax")
    game = "minatar-breakout"
    whole = RR.run_game(game, _args(tmp_path / "whole", progress=""), log=lambda s: None)
    # session 1: one method, one draw; its progress is recorded as it goes
    s1 = tmp_path / "s"
    RR.run_game(game, _args(s1, draws=1, methods=["gradient"]), log=lambda s: None)
    prog = s1 / "out" / game / "progress"
    assert sorted(f.name for f in (prog / "methods").iterdir()) == ["gradient.npz", "random.npz"]
    assert sorted(f.name for f in (prog / "episodes").iterdir()) == ["ep000.npz", "ep001.npz"]
    shutil.rmtree(s1 / "cache")                          # a fresh machine: only the committed folder is left
    capsys.readouterr()
    logs = []
    out = RR.run_game(game, _args(s1), log=logs.append)
    printed = capsys.readouterr().out
    assert _work(logs) == ["[minatar-breakout] episode 0: replaying its recorded actions",
                           "[minatar-breakout] episode 1: replaying its recorded actions",
                           "[gradient] restored from the progress folder",
                           "[gradient] maps on 8 states",                 # the maps again, for draw 1 only
                           "[gradient] sanity check on 4 states, draw 1",
                           "[grad_x_input] maps on 8 states",
                           "[grad_x_input] sanity check on 4 states, draws 0, 1"], _work(logs)   # one call
    assert "fidelity gradient" not in printed and "fidelity random" not in printed and "fidelity grad_x_input" in printed
    got, want = _outputs(out), _outputs(whole)
    assert got.keys() == want.keys() and "sanity_per_state.csv.gz" in got
    timing = got.pop("timing.csv"), want.pop("timing.csv")        # measured: the same methods, other times
    assert [r.split(b",")[0] for r in timing[0].splitlines()] == [r.split(b",")[0] for r in timing[1].splitlines()]
    assert got == want
    s_got, s_want = (json.loads((d / "summary.json").read_text()) for d in (out, whole))
    assert {k: v for k, v in s_got.items() if k != "meta"} == {k: v for k, v in s_want.items() if k != "meta"}
    # a third session has nothing left to do, from the cache or from the folder alone
    logs.clear()
    RR.run_game(game, _args(s1), log=logs.append)
    assert _work(logs) == []
    shutil.rmtree(s1 / "cache")
    logs.clear()
    RR.run_game(game, _args(s1), log=logs.append)
    assert [w for w in _work(logs) if "replaying" not in w] == ["[gradient] restored from the progress folder",
                                                                "[grad_x_input] restored from the progress folder"]
    assert _outputs(out) | {"timing.csv": b""} == got | {"timing.csv": b""}
    # other settings the results depend on: the pieces are stale and recomputed, not reused
    logs.clear()
    RR.run_game(game, _args(s1, batch_size=128, methods=["gradient"]), log=logs.append)
    assert "[gradient] recorded progress is stale" in " ".join(logs) and "[gradient] maps on 8 states" in logs
    # other sampling settings: the folder is refused before anything runs
    with pytest.raises(P.ProgressMismatch, match="states"):
        RR.run_game(game, _args(s1, states=10), log=lambda s: None)
    # a replay that does not reproduce the record stops the run
    shutil.rmtree(s1 / "cache")
    f = prog / "episodes" / "ep001.npz"
    z = P.load_npz(f)
    P.save_npz(f, compressed=True, **{**z, "trajectory_sha256": np.array("0" * 64)})
    with pytest.raises(P.ReplayMismatch, match="episode 1 .*trajectory_sha256"):
        RR.run_game(game, _args(s1), log=lambda s: None)


# ------------------------------------------------------------------ rechecks of pieces made by other commits
def _made(**commits):
    return {piece: {"git_commit": c} for piece, c in commits.items()}


def test_each_earlier_commit_gets_one_recheck_of_its_lowest_draw_and_then_none():
    makers = _made(fidelity="a", sanity_d00="a", sanity_d01="a", sanity_d02="b", sanity_d03="c", sanity_d04="c")
    assert RR.pieces_to_recheck(makers, "c", 5) == [0, 2]           # a's lowest draw, b's; c is this run's
    assert RR.pieces_to_recheck(makers, "a", 5) == [2, 3]
    done = {**makers, **_made(recheck_d00="c", recheck_d02="c")}
    assert RR.pieces_to_recheck(done, "c", 5) == []
    assert RR.pieces_to_recheck(done, "d", 5) == []                 # a later session: c, a and b are covered
    assert RR.pieces_to_recheck(_made(sanity_d00="a", sanity_d01="a"), "a", 2) == []
    assert RR.pieces_to_recheck({}, "a", 2) == []                   # nothing recorded (progress folder off)


def test_the_readme_lists_the_commits_and_flags_a_recheck_that_differs():
    meta = {"piece_commits": {"rise": {"a" * 40: 3, "b" * 40: 9}},
            "rechecks": [{"method": "rise", "draw": 0, "recorded_commit": "a" * 40, "recheck_commit": "b" * 40,
                          "values": 4000, "differing": 0, "max_abs_diff": 0.0}]}
    text = "\n".join(A.code_versions(meta))
    assert "2 commit(s): rise aaaaaaaa x3, bbbbbbbb x9" in text and "| rise | 0 | aaaaaaaa | bbbbbbbb | 4000 | 0 | 0 |" in text
    assert "Every recheck agrees within 0.001" in text and "Deviation" not in text
    meta["rechecks"][0].update(differing=7, max_abs_diff=0.02)
    assert "**Deviation:** 1 recheck(s) differ by more than 0.001: rise draw 0." in "\n".join(A.code_versions(meta))
    assert A.code_versions({}) == []


@pytest.mark.slow
def test_draws_recorded_under_another_commit_are_recomputed_once_and_compared(tmp_path):
    pytest.importorskip("gymnax")
    game = "minatar-breakout"
    RR.run_game(game, _args(tmp_path, methods=["gradient"]), log=lambda s: None)
    f = tmp_path / "out" / game / "progress" / "methods" / "gradient.npz"
    z = P.load_npz(f)
    old = json.dumps({"git_commit": "0" * 40}, sort_keys=True)
    rec = {k: (np.array(old) if k in ("made_by/sanity_d01", "made_by/fidelity") else v) for k, v in z.items()}
    flat = P.unpack(rec)          # the recorded draw 1 made different by that commit, in one value
    flat["sanity_d01:q/spearman"] = flat["sanity_d01:q/spearman"] + np.eye(1, flat["sanity_d01:q/spearman"].size)[0] * 0.25
    P.save_npz(f, compressed=True, **{**P.pack(flat, RR.DECIMALS), **{k: v for k, v in rec.items()
                                                                      if not k.startswith("packed:")}})
    shutil.rmtree(tmp_path / "cache")
    logs = []
    out = RR.run_game(game, _args(tmp_path, methods=["gradient"]), log=logs.append)
    assert [line for line in logs if "recheck" in line] == [
        "[gradient] recheck of sanity draw 1 (recorded under 00000000) on 4 states"]
    meta = json.loads((out / "meta.json").read_text())
    (row,) = meta["rechecks"]
    assert (row["draw"], row["recorded_commit"], row["differing"], row["max_abs_diff"]) == (1, "0" * 40, 1, 0.25)
    assert "**Deviation:** 1 recheck(s)" in (out / "README.md").read_text()
    assert "## Deviations from the registration" in (out.parent / "README.md").read_text()
    assert set(meta["piece_commits"]["gradient"]) == {"0" * 40, git_state()["git_commit"]}
    logs.clear()
    RR.run_game(game, _args(tmp_path, methods=["gradient"]), log=logs.append)   # covered now: no second recheck
    assert not [line for line in logs if "recheck of" in line]


# ------------------------------------------------------------------ hosts (deviation 5) and the HOG fix (deviation 4)
HOST = {"cpu": "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "cpu_count": 8, "cpu_affinity": 8, "xla_flags": None,
        "jax": "0.10.2", "jaxlib": "0.10.2"}
OTHER = {**HOST, "cpu": "AMD EPYC 7R13 Processor", "cpu_count": 16, "cpu_affinity": 4,
         "xla_flags": "--xla_force_host_platform_device_count=1"}


def test_a_piece_records_its_host_beside_its_commit():
    h = RR.host_record()
    assert set(h) == {"cpu", "cpu_count", "cpu_affinity", "xla_flags", "jax", "jaxlib"}
    assert h["cpu"] and h["cpu_count"] >= 1 and 1 <= h["cpu_affinity"] <= h["cpu_count"]
    assert h["jaxlib"] and h["jax"]
    assert RR.host_name(None) == RR.host_name({}) == "unrecorded"
    assert RR.host_name(HOST) == ("Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz, 8 CPUs (8 usable), XLA_FLAGS unset, "
                                  "jax 0.10.2, jaxlib 0.10.2")
    assert 'AMD EPYC 7R13 Processor, 16 CPUs (4 usable), XLA_FLAGS="--xla_force_host_platform_device_count=1"' in \
        RR.host_name(OTHER)


def test_a_resumed_run_warns_once_per_other_host_naming_both():
    made = lambda host: {"git_commit": "a" * 40, **({"host": host} if host else {})}  # noqa: E731
    makers = {"rise": {"fidelity": made(OTHER), "sanity_d00": made(OTHER), "sanity_d01": made(HOST)},
              "gradient": {"fidelity": made(None), "sanity_d00": made(OTHER)}}
    (line,) = RR.host_warnings(makers, HOST)
    assert line.startswith("warning: 3 recorded piece(s) (rise x2, gradient x1) were computed on host [AMD EPYC")
    assert f"[{RR.host_name(OTHER)}]" in line and f"this run's host is [{RR.host_name(HOST)}]" in line
    assert RR.host_warnings(makers, OTHER) == [RR.host_warnings({"rise": {"x": made(HOST)}}, OTHER)[0]]
    assert RR.host_warnings({"gradient": {"fidelity": made(None)}}, HOST) == []     # unrecorded: nothing to compare
    assert RR.host_warnings({}, HOST) == []


def _commits():
    fixed, before = RR.full_commit(RR.HOG_FIX), RR.full_commit(RR.HOG_FIX + "~1")
    if fixed == RR.HOG_FIX or before.endswith("~1"):
        pytest.skip("this checkout's git history lacks the HOG fix commit")
    return fixed, before


def test_hog_before_its_fix_is_flagged_per_method_and_draw_from_the_pieces_commits():
    fixed, before = _commits()
    assert RR.contains_commit(fixed) is True and RR.contains_commit(before) is False
    assert RR.contains_commit("0" * 40) is None and RR.contains_commit(None) is None
    assert RR.contains_commit("--help") is None
    made = lambda c, host=None: {"git_commit": c, **({"host": host} if host else {})}  # noqa: E731
    makers = {"lime_slic": {"fidelity": made(before), "timing": made(before), "sanity_d00": made(before),
                            "sanity_d01": made(before), "sanity_d02": made(fixed, HOST), "sanity_d03": made("0" * 40),
                            "sanity_d04": {"backend": "cpu"}, "recheck_d00": made(fixed, HOST)},
              "gradient": {"fidelity": made(fixed, HOST), "sanity_d00": made(fixed, HOST),
                           "sanity_d01": made(fixed, OTHER)}}
    rep = RR.reporting_meta(makers)
    assert rep["hog_fix_commit"] == fixed
    assert rep["hog_before_fix"] == {"lime_slic": {"sanity_draws": [0, 1, 3, 4], "of": 5, "recheck_draws": []},
                                     "gradient": {"sanity_draws": [], "of": 2, "recheck_draws": []}}
    assert rep["hog_unknown_commits"] == {"0" * 40: 1, "unrecorded": 1}
    assert rep["piece_hosts"] == {"lime_slic": {"unrecorded": 6, RR.host_name(HOST): 1},
                                  "gradient": {RR.host_name(HOST): 2, RR.host_name(OTHER): 1}}
    assert rep["recheck_hosts"] == {"lime_slic": {RR.host_name(HOST): 1}}
    meta = RR.with_reporting({"game": "g", "piece_commits": {"x": 1}, "rechecks": [], "command": "c"}, rep)
    assert list(meta) == ["game", "piece_commits", *rep, "rechecks", "command"]
    assert list(RR.with_reporting(meta, rep)) == list(meta)                # placed again, not added twice


def test_the_readme_lists_the_hosts_and_the_draws_whose_hog_predates_the_fix():
    meta = {"piece_commits": {"lime_slic": {"a" * 40: 4, "b" * 40: 2}, "gradient": {"b" * 40: 3}},
            "piece_hosts": {"lime_slic": {"unrecorded": 4, RR.host_name(HOST): 2}, "gradient": {RR.host_name(HOST): 3}},
            "recheck_hosts": {"lime_slic": {RR.host_name(HOST): 1}}, "hog_fix_commit": "8c14aeac" + "0" * 32,
            "hog_before_fix": {"lime_slic": {"sanity_draws": [0, 1, 3], "of": 4, "recheck_draws": []},
                               "gradient": {"sanity_draws": [], "of": 2, "recheck_draws": []}},
            "hog_unknown_commits": {"c" * 40: 1},
            "rechecks": [{"method": "lime_slic", "draw": 0, "recorded_commit": "a" * 40, "recheck_commit": "b" * 40,
                          "values": 40, "differing": 3, "max_abs_diff": 0.03}]}
    lines = A.code_versions(meta)
    text = "\n".join(lines)
    versions, hog = text.split("### HOG similarity before its fix")
    assert versions.startswith("### Code versions") and "**Deviation:** 1 recheck(s)" in versions
    assert "- unrecorded: 4 piece(s) (lime_slic x4)" in versions
    assert f"- {RR.host_name(HOST)}: 5 piece(s) (lime_slic x2, gradient x3); 1 recheck(s) (lime_slic x1)" in versions
    assert "until commit 8c14aeac fixed it" in hog
    assert "| lime_slic | 0-1, 3 (3 of 4) | none |" in hog and "| gradient | none of 2 | none |" in hog
    assert "git here does not know their commit: cccccccc (1 piece(s))." in hog
    assert "Rechecks made after the fix of draws made before it (their HOG differences include the fix's): " \
           "lime_slic draw 0." in hog
    assert "No conclusion is drawn from HOG" in hog and lines[-1] == ""
    one = {"piece_commits": {"rise": {"a" * 40: 3}}, "piece_hosts": {"rise": {"unrecorded": 3}},
           "hog_before_fix": {"rise": {"sanity_draws": [0, 1, 2], "of": 3, "recheck_draws": []}}}
    assert "- unrecorded: 3 piece(s)\n" in "\n".join(A.code_versions(one)) + "\n"
    assert "| rise | 0-2 (all 3) | none |" in "\n".join(A.code_versions(one))
    old = {"piece_commits": {"rise": {"a" * 40: 3}}}          # a meta.json written before hosts and the flag
    assert A.code_versions(old) == ["### Code versions", "", "The methods' pieces (fidelity, sanity draws, timing) were "
                                    "computed under 1 commit(s): rise aaaaaaaa x3.", ""]


def test_the_host_in_made_by_leaves_recorded_progress_valid_and_its_bytes_unchanged(tmp_path):
    """made_by is no part of any key: pieces recorded without a host (every file before it, and those
    the run going on writes) restore as before, keep their bytes, and read as unrecorded."""
    cache = tmp_path / "cache" / "gradient"
    _method_cache(cache, np.random.default_rng(6))
    old = P.Progress(tmp_path / "p", RUN, made_by={"git_commit": "a" * 40, "jax": "0.10.2", "backend": "cpu"})
    fields = {"run": old.run_key, "label": "gradient"}
    key = P.key_of(fields)
    old.save_method("gradient", key, fields, cache)
    f = tmp_path / "p" / "methods" / "gradient.npz"
    before = f.read_bytes()
    new = P.Progress(tmp_path / "p", RUN, made_by={"git_commit": "b" * 40, "jax": "0.10.2", "backend": "cpu",
                                                   "host": HOST})
    assert new.run_key == old.run_key and P.FORMAT == 1
    assert sorted(new.restore_method("gradient", key, tmp_path / "fresh")) == ["fidelity", "sanity_d00", "sanity_d01",
                                                                               "timing"]
    new.save_method("gradient", key, fields, tmp_path / "fresh")
    assert f.read_bytes() == before                                  # nothing new: no change for git
    _method_cache(tmp_path / "extra", np.random.default_rng(7), draws=3)
    (tmp_path / "extra" / "sanity_d02.npz").rename(tmp_path / "fresh" / "sanity_d02.npz")
    new.save_method("gradient", key, fields, tmp_path / "fresh")       # a new draw: made here, host recorded
    makers = new.piece_makers("gradient", key)
    assert [m.get("host") for m in makers.values()] == [None, None, None, None, HOST]
    assert P.recorded_makers(tmp_path / "p") == {"gradient": makers}
    assert RR.reporting_meta({"gradient": makers})["piece_hosts"] == {"gradient": {"unrecorded": 4,
                                                                                   RR.host_name(HOST): 1}}
    z = P.load_npz(f)                               # a file under a key that is not its fields' is not read
    P.save_npz(f, compressed=True, **{**z, "key": np.array("0" * 64)})
    assert P.recorded_makers(tmp_path / "p") == {}
    assert P.recorded_makers(tmp_path / "none") == {}


def test_analyse_only_refreshes_the_hosts_and_hog_flag_from_the_progress_folder(tmp_path):
    fixed, before = _commits()
    game = tmp_path / "out" / "g"
    cache = tmp_path / "cache" / "gradient"
    _method_cache(cache, np.random.default_rng(8))
    prog = P.Progress(game / "progress", RUN, made_by={"git_commit": before})
    fields = {"run": prog.run_key, "label": "gradient"}
    prog.save_method("gradient", P.key_of(fields), fields, cache)
    meta = {"game": "g", "piece_commits": {"gradient": {before: 4}}, "rechecks": [], "x": [0.123456789, 1e-7]}
    game.mkdir(parents=True, exist_ok=True)
    (game / "meta.json").write_text(json.dumps(meta, indent=1))
    logs = []
    assert RR.refresh_reporting(game, game / "progress", logs.append)
    got = json.loads((game / "meta.json").read_text())
    assert list(got) == ["game", "piece_commits", "piece_hosts", "recheck_hosts", "hog_fix_commit", "hog_before_fix",
                         "hog_unknown_commits", "rechecks", "x"]
    assert {k: got[k] for k in meta} == meta
    assert got["hog_before_fix"] == {"gradient": {"sanity_draws": [0, 1], "of": 2, "recheck_draws": []}}
    assert got["piece_hosts"] == {"gradient": {"unrecorded": 4}}
    text = (game / "meta.json").read_text()
    assert not RR.refresh_reporting(game, game / "progress", logs.append)        # again: nothing changes
    assert (game / "meta.json").read_text() == text
    assert not RR.refresh_reporting(game, None, logs.append) and "left as they are" in logs[-1]
    (game / "meta.json").write_text(json.dumps({**meta, "piece_commits": {"gradient": {fixed: 4}}}, indent=1))
    with pytest.raises(P.ProgressMismatch, match="piece_commits"):
        RR.refresh_reporting(game, game / "progress", logs.append)


@pytest.mark.slow
def test_a_run_records_its_host_and_warns_when_resumed_on_another(tmp_path):
    pytest.importorskip("gymnax")
    game = "minatar-breakout"
    out = RR.run_game(game, _args(tmp_path, methods=["gradient"]), log=lambda s: None)
    f = tmp_path / "out" / game / "progress" / "methods" / "gradient.npz"
    z = P.load_npz(f)
    made = {k: json.loads(str(v)) for k, v in z.items() if k.startswith("made_by/")}
    assert made and all(m["host"] == RR.host_record() and m["git_commit"] == git_state()["git_commit"]
                        for m in made.values())
    meta = json.loads((out / "meta.json").read_text())
    assert meta["piece_hosts"] == {"gradient": {RR.host_name(RR.host_record()): 4}}
    assert meta["hog_before_fix"]["gradient"] == {"sanity_draws": [], "of": 2, "recheck_draws": []}
    readme = (out / "README.md").read_text()
    assert "Hosts the pieces ran on" in readme and "| gradient | none of 2 | none |" in readme
    # the fidelity recorded on another host: a resumed run says so, once, naming both hosts
    other = json.dumps({**json.loads(str(z["made_by/fidelity"])), "host": OTHER}, sort_keys=True)
    P.save_npz(f, compressed=True, **{**z, "made_by/fidelity": np.array(other)})
    shutil.rmtree(tmp_path / "cache")
    logs = []
    RR.run_game(game, _args(tmp_path, methods=["gradient"]), log=logs.append)
    warned = [line for line in logs if "warning" in line]
    assert warned == [f"[{game}] " + RR.host_warnings({"gradient": {"fidelity": {"host": OTHER}}},
                                                      RR.host_record())[0]]
    assert RR.host_name(OTHER) in warned[0] and RR.host_name(RR.host_record()) in warned[0]
    meta = json.loads((out / "meta.json").read_text())
    assert meta["piece_hosts"]["gradient"] == {RR.host_name(OTHER): 1, RR.host_name(RR.host_record()): 3}
    # the analyse-only mode reads the same from the progress folder and changes nothing
    before = {name: (out / name).read_text() for name in ("meta.json", "README.md", "summary.json")}
    RR.main(["--game", game, "--analyse", "--out", str(tmp_path / "out")])
    assert {name: (out / name).read_text() for name in before} == before


def test_a_restored_piece_holding_nan_keeps_its_bytes_and_its_maker(tmp_path):
    """A fidelity curve may hold NaN; restoring and saving it again is no recomputation: the file
    and the commit that made the piece stay as they were."""
    cache = tmp_path / "cache"
    _method_cache(cache, np.random.default_rng(8))
    z = P.load_npz(cache / "fidelity.npz")
    first = sorted(z)[0]
    z[first][3] = np.nan
    P.save_npz(cache / "fidelity.npz", **z)
    old = P.Progress(tmp_path / "p", RUN, made_by={"git_commit": "a" * 40})
    fields = {"run": old.run_key, "label": "m"}
    key = P.key_of(fields)
    old.save_method("m", key, fields, cache)
    f = tmp_path / "p" / "methods" / "m.npz"
    before = f.read_bytes()
    new = P.Progress(tmp_path / "p", RUN, made_by={"git_commit": "b" * 40})
    assert "fidelity" in new.restore_method("m", key, tmp_path / "fresh")
    new.save_method("m", key, fields, tmp_path / "fresh")
    assert f.read_bytes() == before
    assert new.piece_makers("m", key)["fidelity"]["git_commit"] == "a" * 40
