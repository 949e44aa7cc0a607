"""Kill-and-resume: a job SIGKILLed mid-way and rerun ends with exactly the files of an uninterrupted run
(maps and the per-frame outputs, byte for byte)."""
import os
import signal

import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from tests._support.cli_support import files_at_least, frames, make_agent_files, start_job


def _files(d):
    """Every finished chunk's bytes: the maps of each method and the per-frame outputs (_outputs)."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("chunk_*.np[yz]"))}


@pytest.mark.slow
def test_sigkill_then_resume_gives_identical_output(tmp_path):
    card = make_agent_files(tmp_path / "agent")
    np.savez_compressed(tmp_path / "buf.npz", obs=frames(24, seed=7))
    args = ["explain", "--agent", str(card), "--methods", "standin_grad,standin_noise", "--input",
            str(tmp_path / "buf.npz"), "--chunk", "3", "--option", "standin_noise.n_masks=4", "--quiet"]
    # uninterrupted reference run
    assert main(args + ["--out", str(tmp_path / "ref")]) == 0
    ref = _files(tmp_path / "ref")
    assert len(ref) == 24                                    # 8 chunks x (2 methods + _outputs)
    assert sum(k.startswith("_outputs/") for k in ref) == 8

    out = tmp_path / "killed"
    # cli_env: the same XLA kernels as the reference, so bytes are compared
    proc = start_job(args, out, files_at_least(3, "chunk_*.npy"), slow_write=0.4)
    os.kill(proc.pid, signal.SIGKILL)  # a real, unannounced kill in the middle of the job
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    partial = _files(out)
    assert 3 <= len(partial) < len(ref), len(partial)
    assert any(k.startswith("_outputs/") for k in partial)   # chunk 0's outputs landed before the kill
    for name, data in partial.items():  # whatever exists is complete and already final
        assert data == ref[name], name

    assert main(args + ["--out", str(out)]) == 0
    assert _files(out) == ref          # maps and _outputs (action, Q-values per frame), byte for byte
    np.testing.assert_array_equal(np.asarray(jaxsal.load_maps(out, "standin_noise")),
                                  np.asarray(jaxsal.load_maps(tmp_path / "ref", "standin_noise")))
    got, want = jaxsal.load_outputs(out), jaxsal.load_outputs(tmp_path / "ref")
    assert set(got) == set(want) >= {"frame", "index", "action", "q"} and len(want["action"]) == 24
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_rerun_adds_the_index_to_outputs_of_an_older_version(tmp_path):
    """Chunks an older jaxsal wrote have no "index": load_outputs refuses to mix them (a shorter
    column would misalign every row after it), and a rerun rewrites only their outputs."""
    import zipfile

    from jaxsal.io import store

    card = make_agent_files(tmp_path / "agent")
    np.save(tmp_path / "buf.npy", frames(9, seed=3))
    args = ["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(tmp_path / "buf.npy"),
            "--chunk", "3", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "ref")]) == 0
    ref = _files(tmp_path / "ref")
    np.testing.assert_array_equal(jaxsal.load_outputs(tmp_path / "ref")["index"], np.arange(9))
    out = tmp_path / "old"
    assert main(args + ["--out", str(out)]) == 0
    for i in (0, 2):  # as jaxsal before "index" wrote them
        path = store.outputs_path(out, i)
        with np.load(path) as z:
            old = {k: z[k] for k in z.files if k != "index"}
        store.write_outputs(out, i, old)
        assert "index.npy" not in zipfile.ZipFile(path).namelist()
    maps_before = {str(q): q.stat().st_mtime_ns for q in out.glob("standin_grad/chunk_*.npy")}
    try:
        jaxsal.load_outputs(out)
        raise AssertionError("mixed chunks loaded")
    except jaxsal.SaliencyInputError as e:
        assert "rerun the same `jaxsal explain` command" in str(e)
    assert main(args + ["--out", str(out)]) == 0
    assert _files(out) == ref  # outputs rewritten with the index, maps untouched (and identical)
    assert {str(q): q.stat().st_mtime_ns for q in out.glob("standin_grad/chunk_*.npy")} == maps_before
    np.testing.assert_array_equal(jaxsal.load_outputs(out)["index"], np.arange(9))
