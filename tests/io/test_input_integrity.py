"""Corrupt inputs are never explained: every .npz member a job reads (shards too) is checked against
its stored CRC-32 in one streaming pass before any map is written, with or without --limit (zipfile
checks a member only when it is read to its end); a job whose input fails while it runs marks its
folder, which load_maps, load_outputs, render and a rerun then refuse. The corrupt-member and
corrupt-shard cases through `jaxsal explain` are in tests/cli/test_bad_input.py."""
import json
import zipfile

import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from jaxsal.cli._agent import load_agent
from jaxsal.errors import SaliencyInputError
from jaxsal.io import open_source, readers, store
from jaxsal.io.layout import as_layout
from jaxsal.io.readers import verify_input
from tests._support.cli_support import corrupt_member, frames, make_agent_files


@pytest.fixture(scope="module")
def card(tmp_path_factory):
    return make_agent_files(tmp_path_factory.mktemp("agent"))


@pytest.mark.parametrize("save,nbytes,at", [(np.savez_compressed, 64, 0.3), (np.savez, 200, 0.1)],
                         ids=["deflated", "stored"])
def test_a_corrupt_member_is_refused_by_the_reader(tmp_path, save, nbytes, at):
    good = frames(48)
    path = tmp_path / "buf.npz"
    save(path, obs=good)
    verify_input(open_source(path))  # intact: passes
    corrupt_member(path, nbytes=nbytes, at=at)
    src = open_source(path)
    first = src.read(0, 8)  # what --limit 8 reads: zipfile does not see the damage
    if save is np.savez:
        assert not np.array_equal(first, good[:8])  # frames of corrupt bytes
    with pytest.raises(Exception):
        np.load(path)["obs"]  # numpy refuses the whole member, as jaxsal now does
    for wrapped in (src, as_layout(src, "NCHW")):
        with pytest.raises(SaliencyInputError, match=r"buf.npz: member 'obs.npy' is corrupt .*download the file again"):
            verify_input(wrapped)


def test_a_corrupt_actions_member_is_refused(tmp_path):
    path = tmp_path / "buf.npz"
    np.savez(path, obs=frames(4000), actions=np.arange(4000) % 3)  # a long actions member to corrupt
    with zipfile.ZipFile(path) as z:
        assert z.getinfo("actions.npy").compress_size > 1000
    corrupt_member(path, "actions.npy", nbytes=20, at=0.5)
    with pytest.raises(SaliencyInputError, match="'actions.npy' is corrupt"):
        verify_input(open_source(path))


def test_a_corrupt_shard_among_good_ones_is_named(tmp_path):
    for k in range(3):
        np.savez(tmp_path / f"part{k}.npz", obs=frames(4, seed=k))
    verify_input(open_source(tmp_path))
    corrupt_member(tmp_path / "part1.npz", nbytes=50, at=0.5)
    with pytest.raises(SaliencyInputError, match=r"part1.npz: member 'obs.npy' is corrupt"):
        verify_input(open_source(tmp_path))


def test_the_python_job_verifies_before_writing(tmp_path, card):
    path = tmp_path / "buf.npz"
    np.savez(path, obs=frames(48))
    corrupt_member(path, nbytes=200, at=0.1)
    agent = load_agent(str(card))
    spec = jaxsal.io.MethodSpec("standin_grad", "standin_grad", {})
    with pytest.raises(SaliencyInputError, match="is corrupt"):
        jaxsal.io.run_job(agent.apply_fn, agent.params, open_source(path), tmp_path / "out", [spec], quiet=True)
    assert not (tmp_path / "out").exists()


def test_verification_streams_in_bounded_blocks(tmp_path, monkeypatch):
    """The pass reads each member in VERIFY_BLOCK pieces, never the whole member at once."""
    path = tmp_path / "buf.npz"
    np.savez_compressed(path, obs=frames(400))
    sizes = []
    real_read = zipfile.ZipExtFile.read

    def read(self, n=-1):
        sizes.append(n)
        return real_read(self, n)
    monkeypatch.setattr(zipfile.ZipExtFile, "read", read)
    monkeypatch.setattr(readers, "VERIFY_BLOCK", 4096)
    readers._VERIFIED.clear()
    verify_input(open_source(path))
    assert len(sizes) > 10 and all(0 < n <= 4096 for n in sizes[-10:])


def _fail_from(monkeypatch, row):
    """NpySource.read fails (as a truncated or changed file does) for rows from `row` on."""
    real = readers.NpySource.read

    def read(self, a, b):
        if b > row:
            raise SaliencyInputError(f"{self.path}: file is truncated (rows {a}:{b})")
        return real(self, a, b)
    monkeypatch.setattr(readers.NpySource, "read", read)
    return real


def test_chunks_before_a_read_failure_are_never_served(tmp_path, card, monkeypatch, capsys):
    np.save(tmp_path / "x.npy", frames(8))
    out = tmp_path / "o"
    argv = ["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(tmp_path / "x.npy"),
            "--out", str(out), "--quiet", "--chunk", "2"]
    real = _fail_from(monkeypatch, 4)
    assert main(argv) == 2
    assert "file is truncated" in capsys.readouterr().err
    assert (out / "standin_grad" / "chunk_0000000.npy").exists()  # written before the failure, kept on disk
    assert json.loads((out / store.INPUT_FAILED).read_text())["error"].endswith("(rows 4:6)")
    monkeypatch.setattr(readers.NpySource, "read", real)
    for load in (lambda: jaxsal.load_maps(out, "standin_grad", allow_incomplete=True),
                 lambda: jaxsal.load_outputs(out, allow_incomplete=True)):
        with pytest.raises(SaliencyInputError, match="failed to read while the job ran.*remove"):
            load()
    for cmd in (["render", str(out), "--video", "none", "--quiet"], argv):  # render, and a rerun of the job
        capsys.readouterr()
        assert main(cmd) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "failed to read" in err and f"remove {out}" in err, err
        assert "resume" not in err
    assert not (out / "gallery").exists()


def test_a_rerun_on_a_replaced_input_does_not_advise_resuming(tmp_path, card, capsys):
    """The input changed since the job (a corrupt file replaced): resuming is not the fix."""
    np.save(tmp_path / "x.npy", frames(8))
    argv = ["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(tmp_path / "x.npy"),
            "--out", str(tmp_path / "o"), "--quiet", "--chunk", "4"]
    assert main(argv) == 0
    np.save(tmp_path / "x.npy", frames(8, seed=3))
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "another input" in err and "new --out" in err and "remove" in err and "resume" not in err, err


def test_a_sweep_verifies_its_inputs_before_any_cell(tmp_path, card, capsys):
    path = tmp_path / "buf.npz"
    np.savez(path, obs=frames(48))
    corrupt_member(path, nbytes=200, at=0.1)
    (tmp_path / "sweep.toml").write_text(f'agents = ["{card}"]\ninputs = [{{ path = "buf.npz", limit = 4 }}]\n'
                                         "[methods]\ngradient = {}\n")
    capsys.readouterr()
    assert main(["sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'obs.npy' is corrupt" in err, err
    assert not (tmp_path / "out").exists()


def test_render_refuses_corrupt_frames_to_draw_on(tmp_path, card, capsys):
    np.save(tmp_path / "x.npy", frames(4))
    out = tmp_path / "o"
    assert main(["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(tmp_path / "x.npy"),
                 "--out", str(out), "--quiet"]) == 0
    np.savez(tmp_path / "moved.npz", obs=frames(48))
    corrupt_member(tmp_path / "moved.npz", nbytes=200, at=0.1)
    capsys.readouterr()
    assert main(["render", str(out), "--input", str(tmp_path / "moved.npz"), "--video", "none", "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "'obs.npy' is corrupt" in err and not (out / "gallery").exists(), err


def test_a_corrupt_dopamine_observation_file_is_refused_before_any_frame(tmp_path):
    from tests.io.test_readers import write_dopamine

    rng = np.random.default_rng(0)
    write_dopamine(tmp_path, 0, rng.integers(0, 255, (64, 84, 84), dtype=np.uint8), np.zeros(64, bool))
    verify_input(open_source(tmp_path))                      # intact: passes
    obs = tmp_path / "$store$_observation_ckpt.0.gz"
    raw = bytearray(obs.read_bytes())
    raw[-6] ^= 0xFF                                           # the gzip trailer's CRC-32
    obs.write_bytes(bytes(raw))
    src = open_source(tmp_path)
    assert src.read(0, 4).shape[0] == 4                       # the first frames read fine: no CRC yet
    with pytest.raises(SaliencyInputError, match=r"observation_ckpt\.0\.gz is corrupt.*download the file again"):
        verify_input(open_source(tmp_path))


@pytest.mark.parametrize("claimed", [6, 10 ** 9])
def test_an_npz_whose_header_claims_more_frames_than_it_holds_is_refused_before_writing(tmp_path, card, claimed,
                                                                                         capsys):
    """An `obs.npy` member whose header claims more frames than the member holds (its CRC intact, so the
    verification pass accepts it): before, a job wrote the first chunks and then failed on a truncated read
    (10^9 claimed frames: ran on for minutes, past 20 GB of memory); now refused when opened, as a .npy is."""
    from tests._support import crafted_files as C

    path = tmp_path / "lying.npz"
    path.write_bytes(C.zip_bytes({"obs.npy": C.deflated(C.npy_header((claimed, 10, 10, 4), "|u1")
                                                        + frames(4).tobytes())}))
    with pytest.raises(SaliencyInputError, match=rf"lying.npz: member 'obs.npy' is truncated: its header says "
                                                 rf"{claimed} frames but it holds 4"):
        open_source(path)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(path), "--out",
                 str(out), "--quiet", "--chunk", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is truncated" in err and not out.exists(), err


def test_a_dopamine_observation_file_shorter_than_its_header_is_refused_before_any_chunk(tmp_path, card, capsys):
    """A well-formed gzip (its CRC intact) whose .npy header claims 64 frames and holds 40: before, a job wrote
    the chunks of the first frames and then failed on a truncated read; now the verification pass, which reads
    the file to its end anyway, refuses it first."""
    import gzip

    from tests._support import crafted_files as C
    from tests.io.test_readers import write_dopamine

    rng = np.random.default_rng(0)
    write_dopamine(tmp_path / "dop", 0, rng.integers(0, 255, (64, 10, 10), dtype=np.uint8), np.zeros(64, bool))
    with gzip.open(tmp_path / "dop" / "$store$_observation_ckpt.0.gz", "wb") as f:
        f.write(C.npy_header((64, 10, 10), "|u1") + rng.integers(0, 255, (40, 10, 10), dtype=np.uint8).tobytes())
    with pytest.raises(SaliencyInputError, match=r"observation_ckpt\.0\.gz is truncated: its header says 64 "
                                                 r"frames but it holds 40; nothing was explained"):
        verify_input(open_source(tmp_path / "dop"))
    (tmp_path / "agent.py").write_text(C.AGENT_PY)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["explain", "--agent", f"{tmp_path / 'agent.py'}:load", "--methods", "gradient", "--input",
                 str(tmp_path / "dop"), "--out", str(out), "--quiet", "--chunk", "8"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is truncated" in err and not out.exists(), err


def test_a_dopamine_observation_file_longer_than_its_header_is_refused_before_any_chunk(tmp_path):
    """Frames past the header's 64 in a well-formed gzip: refused by the verification pass that reads it whole."""
    import gzip

    from tests._support import crafted_files as C
    from tests.io.test_readers import write_dopamine

    rng = np.random.default_rng(0)
    write_dopamine(tmp_path / "dop", 0, rng.integers(0, 255, (64, 10, 10), dtype=np.uint8), np.zeros(64, bool))
    verify_input(open_source(tmp_path / "dop"))   # as Dopamine writes it: accepted
    with gzip.open(tmp_path / "dop" / "$store$_observation_ckpt.0.gz", "ab") as f:
        f.write(rng.integers(0, 255, (3, 10, 10), dtype=np.uint8).tobytes())
    with pytest.raises(SaliencyInputError, match=r"observation_ckpt\.0\.gz: 300 bytes after the 64 frames its header "
                                                 r"declares; nothing was explained"):
        verify_input(open_source(tmp_path / "dop"))


def _appended_npy(path, n_declared: int, n_held: int):
    """A .npy whose header declares n_declared frames followed by n_held frames (a writer that appended
    frames and never rewrote its header)."""
    from tests._support.crafted_files import npy_header

    path.write_bytes(npy_header((n_declared, 10, 10, 4), "|u1") + frames(n_held).tobytes())
    return path


@pytest.mark.parametrize("kind", ["npy", "npz", "npz actions"])
def test_bytes_after_the_declared_frames_are_refused_before_writing(tmp_path, card, kind, capsys):
    """Frames appended after the header's count: np.load reads the first n_declared and drops the rest
    without a word; jaxsal refuses the file when it opens it, naming the bytes, before a job writes anything."""
    from tests._support import crafted_files as C

    if kind == "npy":
        path = _appended_npy(tmp_path / "appended.npy", 4, 6)
        assert np.load(path).shape[0] == 4          # what numpy makes of it: two frames gone, silently
        match = r"appended.npy: 800 bytes after the 4 frames its header declares \(shape \(4, 10, 10, 4\)\)"
    elif kind == "npz":
        path = tmp_path / "appended.npz"
        path.write_bytes(C.zip_bytes({"obs.npy": C.deflated(C.npy_header((4, 10, 10, 4), "|u1")
                                                            + frames(6).tobytes())}))
        match = r"appended.npz\['obs'\]: 800 bytes after the 4 frames"
    else:
        path = tmp_path / "appended.npz"
        acts = C.npy_header((4,), "<i8") + np.arange(5, dtype="<i8").tobytes()
        path.write_bytes(C.zip_bytes({"obs.npy": C.deflated(C.npy_header((4, 10, 10, 4), "|u1")
                                                            + frames(4).tobytes()),
                                      "actions.npy": C.deflated(acts)}))
        match = r"appended.npz\['actions'\]: data after its 4 actions"
    target = ["--target", "q_action"] if kind == "npz actions" else []
    if kind != "npz actions":
        with pytest.raises(SaliencyInputError, match=match):
            open_source(path)
    else:
        with pytest.raises(SaliencyInputError, match=match):
            open_source(path).actions(0, 4)
    out = tmp_path / "out"
    capsys.readouterr()
    assert main(["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(path), "--out",
                 str(out), "--quiet", "--chunk", "2", *target]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and ("bytes after" in err or "data after" in err) and not out.exists(), err


def test_a_file_np_save_wrote_has_nothing_after_its_frames(tmp_path):
    """The check refuses only bytes past the data: files numpy writes (.npy, .npz stored and deflated,
    with actions) open as before."""
    np.save(tmp_path / "a.npy", frames(5))
    np.savez(tmp_path / "b.npz", obs=frames(5), actions=np.arange(5))
    np.savez_compressed(tmp_path / "c.npz", obs=frames(5), actions=np.arange(5))
    for name in ("a.npy", "b.npz", "c.npz"):
        src = open_source(tmp_path / name)
        assert np.array_equal(src.read(0, 5), frames(5)), name
    assert np.array_equal(open_source(tmp_path / "c.npz").actions(0, 5), np.arange(5))
