"""One job writes an output directory at a time: a second `jaxsal explain` on the same --out while the
first runs is refused in one line (before, it computed the same chunks again, deleted the first's
temporary files, and a second job of other options could replace the first's manifest before its first
chunk); the lock goes with its process, so a killed job resumes as before."""
import numpy as np
import pytest

from jaxsal.cli import main
from jaxsal.io import store
from tests._support.cli_support import files_at_least, frames, make_agent_files, start_job

BUSY = "another jaxsal job is writing"


def _args(tmp_path, methods="standin_grad"):
    card = make_agent_files(tmp_path / "agent")
    if not (tmp_path / "buf.npy").exists():
        np.save(tmp_path / "buf.npy", frames(24, seed=7))
    return ["explain", "--agent", str(card), "--methods", methods, "--input", str(tmp_path / "buf.npy"),
            "--chunk", "3", "--quiet"]


def test_a_job_on_a_directory_another_job_holds_is_refused_and_takes_nothing_back(tmp_path, capsys):
    out = tmp_path / "out"
    args = _args(tmp_path) + ["--out", str(out)]
    with store.job_lock(out):                      # the other job, writing
        (out / "theirs.txt").write_text("x")       # a file of its own, new since this run looked
        capsys.readouterr()
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and BUSY in err and str(out) in err, err
        assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]   # nothing written, nothing taken back
    (out / "theirs.txt").unlink()
    assert main(args) == 0                         # released: the job runs
    assert len(list((out / "standin_grad").glob("chunk_*.npy"))) == 8


def test_the_processes_of_one_job_share_the_lock_and_exclude_a_single_job(tmp_path):
    out = tmp_path / "out"
    with store.job_lock(out, shared=True), store.job_lock(out, shared=True):
        with pytest.raises(store.JobBusyError, match=BUSY):
            with store.job_lock(out):
                pass
    with store.job_lock(out):                      # all released
        with pytest.raises(store.JobBusyError):
            with store.job_lock(out, shared=True):
                pass


@pytest.mark.slow
def test_a_second_job_while_the_first_runs_is_refused_and_the_first_ends_as_if_alone(tmp_path, capsys):
    """A real first job (its own process): the same command, and one of other options before the first's
    first chunk, are both refused; the first ends with the chunks of an uninterrupted run."""
    args = _args(tmp_path)
    assert main(args + ["--out", str(tmp_path / "ref")]) == 0
    ref = {str(p.relative_to(tmp_path / "ref")): p.read_bytes() for p in (tmp_path / "ref").rglob("chunk_*.np[yz]")}
    out = tmp_path / "out"
    proc = start_job(args, out, lambda o: (o / "manifest.json").exists(), slow_write=0.5)
    manifest = (out / "manifest.json").read_bytes()
    capsys.readouterr()
    assert main(_args(tmp_path, "standin_noise") + ["--out", str(out)]) == 2     # other options: would replace it
    assert main(args + ["--out", str(out)]) == 2                                  # the same job: would redo it
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(BUSY in line for line in err), err
    assert proc.wait(timeout=240) == 0, proc.stderr.read().decode()[-2000:]
    assert (out / "manifest.json").read_bytes() == manifest
    got = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("chunk_*.np[yz]")}
    assert got == ref
    assert not list(out.rglob(".chunk_*.tmp"))
    assert files_at_least(16)(out)


def test_a_filesystem_without_locks_runs_the_job_unguarded(tmp_path, monkeypatch):
    """flock failing with ENOLCK (a network mount without a lock manager) must not stop the job."""
    import errno
    import fcntl

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    out = tmp_path / "out"
    assert main(_args(tmp_path) + ["--out", str(out)]) == 0
    assert len(list((out / "standin_grad").glob("chunk_*.npy"))) == 8
