"""Bad input to `jaxsal explain` is refused before anything is written: one `jaxsal: error:` line that
names the fix, exit 2, no traceback, and the output directory holds nothing new (not created when it
did not exist, untouched when it did, earlier results never deleted)."""
import json
import shutil

import pytest

import jaxsal
from jaxsal.cli import main
from jaxsal.io import job, store
from tests._support.bad_inputs import cases, run


def _tree(d):
    return {str(p.relative_to(d)): (p.read_bytes() if p.is_file() else None) for p in sorted(d.rglob("*"))} \
        if d.exists() else None


def _finished_job(d, card, out):
    assert main(["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(d / "ok.npy"),
                 "--out", str(out), "--quiet", "--chunk", "4"]) == 0


@pytest.fixture(scope="module")
def finished(bad_inputs, tmp_path_factory):
    """One finished job, copied for each case (15 runs of the same job would cost ~10 CPU s)."""
    d, card, _ = bad_inputs
    out = tmp_path_factory.mktemp("finished") / "job"
    _finished_job(d, card, out)
    return out


@pytest.mark.parametrize("where", ["new", "empty", "finished job"])
def test_bad_input_is_one_line_exit_2_nothing_written(bad_inputs, tmp_path, capsys, where, request):
    d, card, atari = bad_inputs
    failed = []
    for i, (name, (argv, what, fix)) in enumerate(cases(d, card, atari).items()):
        out = tmp_path / f"out{i}"
        if where == "empty":
            out.mkdir()
        elif where == "finished job":
            shutil.copytree(request.getfixturevalue("finished"), out)
        before = _tree(out)
        capsys.readouterr()
        code = run(d, name, argv + ["--out", str(out)])
        o, err = capsys.readouterr()
        lines = [line for line in err.splitlines() if line.strip()]
        one = len(lines) == 1 and lines[0].startswith("jaxsal: error: ")
        named = one and (where == "finished job" or (what in lines[0] and fix in lines[0]))  # or "a different job"
        ok = code == 2 and named and "Traceback" not in err + o and _tree(out) == before
        if not ok:
            failed.append((name, code, err.strip()[-300:], "files changed" if _tree(out) != before else ""))
    assert not failed, "\n".join(map(str, failed))


def test_a_big_float_input_is_checked_chunk_by_chunk(bad_inputs, tmp_path, monkeypatch, capsys):
    """Above job.SCAN_BYTES the input is not read twice: the first chunk is checked before anything is
    written, every later chunk before its own outputs are written (the finished chunks stay, resumable)."""
    d, card, _ = bad_inputs
    monkeypatch.setattr(job, "SCAN_BYTES", 1)
    argv = ["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(d / "nan.npy"),
            "--quiet", "--chunk", "2"]
    assert main(argv + ["--out", str(tmp_path / "late")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "frames 2:4" in err and "NaN" in err, err
    kept = sorted(str(p.relative_to(tmp_path / "late")) for p in (tmp_path / "late").rglob("chunk_*"))
    assert kept == ["_outputs/chunk_0000000.npz", "standin_grad/chunk_0000000.npy"]
    assert main(argv + ["--out", str(tmp_path / "first"), "--input", str(d / "inf.npy")]) == 2
    err = capsys.readouterr().err.strip()
    assert "NaN or inf" in err and not (tmp_path / "first").exists()


def test_a_failed_rerun_never_deletes_earlier_results(bad_inputs, tmp_path, monkeypatch, capsys):
    """A rerun that fails inside a method (after the manifest exists) removes only what it created."""
    d, card, _ = bad_inputs
    out = tmp_path / "o"
    _finished_job(d, card, out)
    (out / "standin_grad" / "chunk_0000001.npy").unlink()   # a stopped job: one chunk to do
    (out / "notes.txt").write_text("mine")
    before = _tree(out)
    from jaxsal.errors import SaliencyInputError
    from jaxsal.registry import METHODS

    def refuses(apply_fn, params, obs, *, target="q_chosen", actions=None, layout="NHWC", batch_size=None):
        raise SaliencyInputError("refused for the test")
    monkeypatch.setitem(METHODS, "standin_grad", refuses)
    assert main(["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(d / "ok.npy"),
                 "--out", str(out), "--quiet", "--chunk", "4"]) == 2
    assert "refused for the test" in capsys.readouterr().err
    assert _tree(out) == before


def test_a_refusal_after_the_manifest_leaves_nothing(bad_inputs, tmp_path, monkeypatch):
    """What the up-front checks cannot see (here a method refusing its input) still leaves no files."""
    d, card, _ = bad_inputs
    from jaxsal.errors import SaliencyInputError
    from jaxsal.registry import METHODS

    def refuses(apply_fn, params, obs, *, target="q_chosen", actions=None, layout="NHWC", batch_size=None):
        raise SaliencyInputError("refused for the test")
    monkeypatch.setitem(METHODS, "standin_grad", refuses)
    for out in (tmp_path / "new", tmp_path / "empty"):
        if out.name == "empty":
            out.mkdir()
        assert main(["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(d / "ok.npy"),
                     "--out", str(out), "--quiet"]) == 2
        assert (not out.exists()) if out.name == "new" else not any(out.iterdir())


def test_a_channel_first_model_with_layout_runs(bad_inputs, tmp_path):
    d, _, _ = bad_inputs
    out = tmp_path / "o"
    assert main(["explain", "--agent", f"{d / 'nchw_agent.py'}:load", "--methods", "gradient", "--layout", "NCHW",
                 "--input", str(d / "nchw.npy"), "--out", str(out), "--quiet"]) == 0
    assert jaxsal.load_maps(out, "gradient").shape == (3, 84, 84)
    assert json.loads((out / store.MANIFEST).read_text())["config"]["layout"] == "NCHW"


DEEP = {"~": "~" * 5000 + "1", "-": "-" * 100_000 + "1", "(": "(" * 5000 + "1" + ")" * 5000}


@pytest.mark.parametrize("flag,deep", [("--option", "~"), ("--option", "-"), ("--methods", "~"), ("--methods", "-"),
                                       ("--methods", "(")])
def test_a_value_nested_too_deep_is_bad_input_naming_its_flag(bad_inputs, tmp_path, capsys, flag, deep):
    """Thousands of '~' or '-' overflow Python's parser (RecursionError, MemoryError): one short line, exit 2
    (an --option value of thousands of '(' is no Python value, so it stays a string, as any such text)."""
    d, card, _ = bad_inputs
    text = DEEP[deep]
    methods, option = ("standin_grad", ["--option", f"standin_grad.x={text}"]) if flag == "--option" else (text, [])
    code = main(["explain", "--agent", str(card), f"--methods={methods}", *option, "--input", str(d / "ok.npy"),
                 "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "nested" in err and len(err) < 400, err[:300]
    assert ("--option standin_grad.x" if flag == "--option" else "method '") in err, err
    assert not (tmp_path / "o").exists()
