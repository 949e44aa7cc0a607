"""Batch jobs share the backward pass: the single-backward methods of a `jaxsal explain`
job with the same settings are computed together per chunk, as `jaxsal.explain(method=[...])`
does, with the maps of separate single-method jobs; aliases with other settings (a layer) get
their own computation; a killed job with a method list resumes to identical files."""
import json
import os
import signal

import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from jaxsal.front import share_groups
from jaxsal.engine import execute
from tests._support.cli_support import files_at_least, frames, make_agent_files, start_job

LIST = ["gradcam", "g1gradcam", "guided_backprop", "gradient"]
METHODS = ",".join(LIST) + ",g=gradcam"  # g: Grad-CAM of conv2, next to the default layer (conv3)


@pytest.fixture(scope="module")
def nature(tmp_path_factory):
    """A random-init NatureDQN (84x84x4 frames) as a card, its loaded agent, and 10 frames on disk."""
    import jaxsal_agents

    d = tmp_path_factory.mktemp("nature")
    card = make_agent_files(d / "agent", game="breakout", num_actions=4)
    x = frames(10, seed=5, size=84)
    np.save(d / "x.npy", x)
    return card, jaxsal_agents.load(str(card)), x, d / "x.npy"


def _job(card, inp, out, methods, *extra):
    return main(["explain", "--agent", str(card), "--methods", methods, "--input", str(inp), "--out", str(out),
                 "--chunk", "4", "--quiet", *map(str, extra)])


def _close(got, want, tol=1e-5):
    want = np.asarray(want)
    np.testing.assert_allclose(np.asarray(got), want, rtol=0, atol=tol * float(np.abs(want).max()))


def _count_runs(monkeypatch):
    """Counts the jitted programs the engine runs (one per jaxsal.engine.run, each a cached program)."""
    runs = []
    real = execute._chunks

    def counting(program, *a, **k):
        runs.append(program)
        return real(program, *a, **k)
    monkeypatch.setattr(execute, "_chunks", counting)
    return runs


@pytest.mark.slow  # ~30 CPU s: six jobs; the fast loop keeps the program count and the partial-group resume
def test_list_job_matches_single_jobs_and_the_list_call(tmp_path, nature):
    card, agent, x, inp = nature
    assert _job(card, inp, tmp_path / "all", METHODS, "--option", "g.layer=conv2") == 0
    summary = json.loads((tmp_path / "all" / "summary-p0.json").read_text())
    assert summary["computed_together"] == [LIST]  # g (conv2) alone: other settings
    listed = jaxsal.explain(agent.apply_fn, agent.params, x, method=LIST)
    conv2 = jaxsal.explain(agent.apply_fn, agent.params, x, method="gradcam", layer="conv2")
    for alias in LIST + ["g"]:
        got = jaxsal.load_maps(tmp_path / "all", alias)
        assert got.shape == (10, 84, 84) and np.isfinite(np.asarray(got)).all(), alias
        _close(got, conv2 if alias == "g" else listed[alias])
        single = tmp_path / f"single_{alias}"
        extra = ("--option", "g.layer=conv2") if alias == "g" else ()
        assert _job(card, inp, single, alias if alias != "g" else "g=gradcam", *extra) == 0
        _close(got, jaxsal.load_maps(single, alias))
    # the alias really tapped its own layer: its maps are not the default layer's
    assert not np.allclose(np.asarray(jaxsal.load_maps(tmp_path / "all", "g")), np.asarray(listed["gradcam"]),
                           atol=1e-3 * float(np.abs(listed["gradcam"]).max()))


@pytest.mark.slow  # end to end, 3-10 s: the slow stage (CI runs it)
def test_list_job_runs_one_backward_program_per_group_and_chunk(tmp_path, nature, monkeypatch):
    card, _, _, inp = nature
    runs = _count_runs(monkeypatch)
    assert _job(card, inp, tmp_path / "o", METHODS, "--option", "g.layer=conv2") == 0
    # 10 frames in 3 chunks; 2 groups (the four default-layer methods; g): 6 programs, not 5 x 3
    assert len(runs) == 6, len(runs)
    assert len(set(map(id, runs))) == 2  # each group: one cached compiled function for every chunk
    runs.clear()
    assert _job(card, inp, tmp_path / "split", METHODS, "--option", "g.layer=conv2",
                "--option", "gradient.fast_conv=False") == 0  # a different setting: gradient alone
    assert len(runs) == 9, len(runs)


@pytest.mark.slow  # end to end, 3-10 s: the slow stage (CI runs it)
def test_resume_recomputes_a_partial_group_whole(tmp_path, nature, monkeypatch):
    """A chunk whose group lost one member's file (a kill between the writer's files) is computed
    whole again and only the missing file written: the same bytes as before."""
    card, _, _, inp = nature
    out = tmp_path / "o"
    assert _job(card, inp, out, METHODS, "--option", "g.layer=conv2") == 0
    ref = _files(out)
    (out / "g1gradcam" / "chunk_0000001.npy").unlink()
    kept = out / "gradcam" / "chunk_0000001.npy"
    before = kept.stat().st_mtime_ns
    runs = _count_runs(monkeypatch)
    assert _job(card, inp, out, METHODS, "--option", "g.layer=conv2") == 0
    assert len(runs) == 1  # chunk 1 of the shared group only
    assert _files(out) == ref and kept.stat().st_mtime_ns == before
    summary = json.loads((out / "summary-p0.json").read_text())
    assert summary["frames_computed"] == 4 and summary["complete"]


def test_q_action_list_job(tmp_path):
    """The buffer's actions reach every method of a shared group."""
    import jaxsal_agents

    card = make_agent_files(tmp_path / "agent", num_actions=3)
    agent = jaxsal_agents.load(str(card))
    x, acts = frames(9, seed=4), np.array([2, 0, 1, 1, 2, 0, 0, 1, 2])
    np.savez(tmp_path / "buf.npz", obs=x, actions=acts)
    assert _job(card, tmp_path / "buf.npz", tmp_path / "o", "gradcam,guided_backprop,gradient",
                "--target", "q_action") == 0
    assert json.loads((tmp_path / "o" / "summary-p0.json").read_text())["computed_together"] == [
        ["gradcam", "guided_backprop", "gradient"]]
    want = jaxsal.explain(agent.apply_fn, agent.params, x, method=["gradcam", "guided_backprop", "gradient"],
                          target="q_action", actions=acts)
    greedy = jaxsal.explain(agent.apply_fn, agent.params, x, method="gradient")
    for m, w in want.items():
        _close(jaxsal.load_maps(tmp_path / "o", m), w)
    assert not np.allclose(np.asarray(want["gradient"]), np.asarray(greedy))  # the buffer's actions


def test_share_groups_split_on_any_differing_setting():
    """Only identical call arguments and share keys group (per_frame is each method's own: it
    shares); input-gradient methods join the first CAM layer; methods without a share key, or
    with an option they do not take, stay alone."""
    base = dict(target="q_chosen", layer=None, per_frame=False, layout="NHWC", key=None, batch_size=8,
                actions=None)
    acts, other = np.zeros(4, np.int32), np.zeros(4, np.int32)

    def call(method, opts=None, **common):  # (method, common, options) as a job makes them
        return method, dict(base, **common), opts or {}
    calls = {
        "gradient": call("gradient"), "gradcam": call("gradcam"), "g1": call("g1gradcam"),
        "c2": call("gradcam", layer="conv2"), "gb2": call("guided_backprop", layer=None),
        "g1_c2": call("g1gradcam", layer="conv2"), "pf": call("gradient", per_frame=True),
        "v": call("gradcam", target="value"), "b16": call("gradcam", batch_size=16),
        "slow": call("gradcam", {"fast_conv": False}), "act": call("gradcam", {"layer_activation": "relu"}),
        "a1": call("gradient", actions=acts), "a2": call("gradcam", actions=acts), "a3": call("gradcam", actions=other),
        "rise": call("rise"), "bad": call("gradient", {"no_such_option": 1}),
    }
    assert share_groups(calls) == [["gradient", "gradcam", "g1", "gb2", "pf"], ["c2", "g1_c2"], ["v"],
                                   ["b16"], ["slow"], ["act"], ["a1", "a2"], ["a3"], ["rise"], ["bad"]]


# --------------------------------------------------------------------------- kill and resume
def _files(d):
    """Every finished chunk's bytes: the maps of each method and the per-frame outputs (_outputs)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("chunk_*.np[yz]"))}


@pytest.mark.slow  # end to end, 3-10 s: the slow stage (CI runs it)
def test_sigkill_then_resume_with_a_method_list(tmp_path):
    card = make_agent_files(tmp_path / "agent")
    np.savez_compressed(tmp_path / "buf.npz", obs=frames(24, seed=7))
    args = ["explain", "--agent", str(card), "--methods", "gradcam,g1gradcam,guided_backprop,slow=gradcam,"
            "standin_noise", "--option", "slow.fast_conv=False", "--option", "standin_noise.n_masks=4",
            "--input", str(tmp_path / "buf.npz"), "--chunk", "3", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "ref")]) == 0
    ref = _files(tmp_path / "ref")
    assert len(ref) == 48  # 8 chunks x (5 methods + _outputs)
    assert json.loads((tmp_path / "ref" / "summary-p0.json").read_text())["computed_together"] == [
        ["gradcam", "g1gradcam", "guided_backprop"]]

    out = tmp_path / "killed"
    # cli_env: the same XLA kernels as the reference, so bytes are compared
    proc = start_job(args, out, files_at_least(7, "chunk_*.npy"), timeout=300)
    os.kill(proc.pid, signal.SIGKILL)  # a real, unannounced kill in the middle of the job
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    (out / "guided_backprop" / "chunk_0000000.npy").unlink()  # a group member lost, the others kept
    partial = _files(out)
    assert 6 <= len(partial) < len(ref) - 1, len(partial)
    for name, data in partial.items():  # whatever exists is complete and already final
        assert data == ref[name], name

    assert main(args + ["--out", str(out)]) == 0
    assert _files(out) == ref  # maps of every method and _outputs, byte for byte
