"""The results a job wrote, corrupted or replaced since (a truncated copy, an emptied file, a manifest
edited by hand): `load_maps`, `load_outputs` and `jaxsal render` refuse them in one clear error naming
the file and the fix, never a numpy or zipfile traceback nor maps or outputs joined to the wrong frames."""
import json
import re
import shutil

import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from jaxsal.errors import SaliencyInputError
from tests._support.cli_support import frames, make_agent_files


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    d = tmp_path_factory.mktemp("job")
    card = make_agent_files(d / "agent")
    np.save(d / "in.npy", frames(6))
    assert main(["explain", "--agent", str(card), "--methods", "gradient", "--input", str(d / "in.npy"),
                 "--out", str(d / "out"), "--quiet", "--chunk", "4"]) == 0
    return d / "out"


def _copy(job, tmp_path, mutate=None):
    """A copy of the finished job to damage (the module's job stays intact), `mutate` applied."""
    out = tmp_path / "out"
    shutil.copytree(job, out)
    if mutate is not None:
        mutate(out)
    return out


def _manifest(edit):
    def mutate(out):
        path = out / "manifest.json"
        path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return mutate


def _truncate(path):
    path.write_bytes(path.read_bytes()[:-20])


CASES = {  # name -> (mutate the copied output directory, what the error says)
    "manifest a list": (_manifest(lambda m: [m]), "manifest.json is corrupt"),
    "manifest chunk 0": (_manifest(lambda m: m | {"config": m["config"] | {"chunk": 0}}), "manifest.json is corrupt"),
    "truncated map chunk": (lambda o: _truncate(o / "gradient" / "chunk_0000001.npy"), "chunk_0000001.npy is corrupt"),
    "emptied map chunk": (lambda o: (o / "gradient" / "chunk_0000001.npy").write_bytes(b""), "chunk_0000001.npy is corrupt"),
    "map chunk of other maps": (lambda o: np.save(o / "gradient" / "chunk_0000001.npy", np.zeros((2, 12, 12), np.float32)),
                                "not 2 maps of"),
    "map chunk with fewer rows": (lambda o: np.save(o / "gradient" / "chunk_0000000.npy", np.zeros((2, 10, 10), np.float32)),
                                  "holds 2 rows, as only a job's last chunk does"),
    "truncated outputs": (lambda o: _truncate(o / "_outputs" / "chunk_0000001.npz"), "chunk_0000001.npz is corrupt"),
    # before: the chunk was blamed for the rows n implies ("delete it and rerun", which cannot help)
    "manifest n edited": (_manifest(lambda m: m | {"config": m["config"] | {"n": 5}}), "its n is 5 but"),
    # before: IsADirectoryError / UnicodeDecodeError from the Python API
    "manifest a directory": (lambda o: ((o / "manifest.json").unlink(), (o / "manifest.json").mkdir()),
                             "manifest.json is corrupt"),
    "manifest not text": (lambda o: (o / "manifest.json").write_bytes(b"\xff\xfe{"), "manifest.json is corrupt"),
    # before: AttributeError / TypeError inside `jaxsal render`, and a resume kept the edited manifest
    "manifest input_source not an object": (_manifest(lambda m: m | {"input_source": "x"}), "its input_source is"),
    "manifest input_source path a number": (_manifest(lambda m: m | {"input_source": {"path": 5}}),
                                            "its input_source is"),
    "manifest input not an object": (_manifest(lambda m: m | {"config": m["config"] | {"input": "x"}}), "its input is"),
    "manifest input checksum a number": (_manifest(lambda m: m | {"config": m["config"] | {"input": {"checksum": 5}}}),
                                         "its input is"),
    "manifest frame_shape not a shape": (_manifest(lambda m: m | {"config": m["config"] | {"frame_shape": "x"}}),
                                         "its frame_shape is"),
    "map chunk a directory": (lambda o: ((o / "gradient" / "chunk_0000001.npy").unlink(),
                                         (o / "gradient" / "chunk_0000001.npy").mkdir()), "chunk_0000001.npy is corrupt"),
    "outputs a directory": (lambda o: ((o / "_outputs" / "chunk_0000001.npz").unlink(),
                                       (o / "_outputs" / "chunk_0000001.npz").mkdir()), "chunk_0000001.npz is corrupt"),
    "outputs of other length": (lambda o: np.savez(o / "_outputs" / "chunk_0000001.npz", **{
        **dict(np.load(o / "_outputs" / "chunk_0000001.npz")), "action": np.zeros(5, np.int64)}), "not 2 rows"),
    # before: load_outputs gave them as they were; render's captions raised IndexError (exit 1) or, for -1,
    # captioned the frame with the last action's Q-value
    "outputs action beyond the model's": (lambda o: _edit_outputs(o, action=np.array([10 ** 12, 1])),
                                          "'action' holds 1000000000000, not one of the 3 actions"),
    "outputs action negative": (lambda o: _edit_outputs(o, action=np.array([-1, 1], np.int32)),
                                "'action' holds -1, not one of the 3 actions"),
    # before: np.load read the header's array and ignored the rest, without a word
    "map chunk with bytes appended": (lambda o: _append(o / "gradient" / "chunk_0000001.npy"),
                                      r"chunk_0000001.npy is corrupt \(8 bytes after its maps\)"),
    "outputs with bytes appended to a member": (lambda o: _append_member(o / "_outputs" / "chunk_0000001.npz"),
                                                r"chunk_0000001.npz is corrupt \(8 bytes after array"),
    # before: a MemoryError (numpy allocated the 10^12 rows the header declares: 364 TiB)
    "outputs member declaring 10**12 rows": (lambda o: _declare_rows(o / "_outputs" / "chunk_0000001.npz", 10 ** 12),
                                             r"chunk_0000001.npz is corrupt \(the header of array .* declares"),
}


def _edit_outputs(out, **arrays):
    path = out / "_outputs" / "chunk_0000001.npz"
    np.savez(path, **{**dict(np.load(path)), **arrays})


def _declare_rows(path, rows):
    """The archive rewritten with its first member's header declaring `rows` rows (its bytes unchanged)."""
    import io
    import zipfile
    with zipfile.ZipFile(path) as z:
        members = {name: z.read(name) for name in z.namelist()}
    first = next(iter(members))
    f = io.BytesIO(members[first])
    np.lib.format.read_magic(f)
    shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
    head = io.BytesIO()
    np.lib.format.write_array_header_1_0(head, {"shape": (rows,) + tuple(shape[1:]), "fortran_order": fortran,
                                                "descr": np.lib.format.dtype_to_descr(dtype)})
    members[first] = head.getvalue() + f.read()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


def _append(path):
    with open(path, "ab") as f:
        f.write(bytes(8))


def _append_member(path):
    """The archive rewritten with 8 bytes after the array of its first member (its CRC made to match)."""
    import zipfile
    with zipfile.ZipFile(path) as z:
        members = {name: z.read(name) for name in z.namelist()}
    first = next(iter(members))
    members[first] += bytes(8)
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)


@pytest.mark.parametrize("name", list(CASES))
def test_a_corrupted_result_is_one_clear_error_naming_the_fix(job, tmp_path, capsys, name):
    mutate, says = CASES[name]
    out = _copy(job, tmp_path, mutate)
    outputs = "outputs" in name
    with pytest.raises(SaliencyInputError, match=says) as e:
        np.asarray(jaxsal.load_outputs(out)) if outputs else np.asarray(jaxsal.load_maps(out, "gradient"))
    assert "\n" not in str(e.value) and ("choose a new --out" in str(e.value) or "rerun" in str(e.value))
    if not outputs:  # render needs the maps (not the outputs) and says the same in one line, exit 2
        assert main(["render", str(out), "--video", "none", "--quiet"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says.split(" is ")[0] in err, err


RENDER_FLAGS = {  # name -> (flags of `jaxsal render`, what the error says); before: exit 1, an empty gallery/ left
    "--grid-frames 0": (["--grid-frames", "0"], "--grid-frames must be an integer >= 1, got 0"),  # ValueError
    "--grid-frames -1": (["--grid-frames", "-1"], "--grid-frames must be an integer >= 1, got -1"),  # ValueError
    "--fps 0": (["--fps", "0", "--video", "gif"], "--fps must be an integer >= 1, got 0"),
    "--scale 10000": (["--scale", "10000"], "use --scale 409 or less"),  # MemoryError: 27.9 GiB for one picture
}


@pytest.mark.parametrize("name", list(RENDER_FLAGS))
def test_render_numbers_out_of_range_are_one_line_and_nothing_written(job, tmp_path, capsys, name):
    flags, says = RENDER_FLAGS[name]
    out = _copy(job, tmp_path)
    before = sorted(out.rglob("*"))
    capsys.readouterr()
    argv = ["render", str(out), "--quiet"] + flags
    assert main(argv + ([] if "--video" in flags else ["--video", "none"])) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "internal error" not in err, err
    assert sorted(out.rglob("*")) == before


def test_a_shares_only_job_is_never_resumed_as_another_job(tmp_path, capsys):
    """`--store shares` writes no maps: a rerun with another input (here: another frame order) once took the
    old job's shares as done and replaced its manifest (exit 0, the old input's shares under the new input's
    name); now it is refused like any job with results of another configuration."""
    from tests._support import object_agent
    from tests.cli.test_objects import AGENT

    obs, ob = object_agent.buffer(4)
    np.save(tmp_path / "a.npy", obs)
    ob.save(tmp_path / "a.objects.npz")
    np.save(tmp_path / "b.npy", obs[::-1].copy())
    ob.save(tmp_path / "b.objects.npz")
    argv = ["explain", "--agent", AGENT, "--methods", "gradient", "--objects", "--store", "shares",
            "--out", str(tmp_path / "out"), "--quiet", "--input"]
    assert main(argv + [str(tmp_path / "a.npy")]) == 0
    before = (tmp_path / "out" / "manifest.json").read_bytes()
    capsys.readouterr()
    assert main(argv + [str(tmp_path / "b.npy")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another input" in err, err
    assert (tmp_path / "out" / "manifest.json").read_bytes() == before


OBJECTS_EDITS = {  # name -> (edit the manifest of a job with --objects, what the error says)
    "objects not an object": (lambda m: m["config"].update(objects="x"), "its objects is"),
    "objects without checksum": (lambda m: m["config"]["objects"].pop("checksum"), "its objects is"),
    "objects checksum a number": (lambda m: m["config"]["objects"].update(checksum=5), "its objects is"),
    "objects_source not an object": (lambda m: m.update(objects_source="x"), "its objects_source is"),
    "frame_shape of two numbers": (lambda m: m["config"].update(frame_shape=[84, 84]), "its frame_shape is"),
    "input removed": (lambda m: m["config"].pop("input"), "has no input entry"),
}


@pytest.fixture(scope="module")
def objects_job(tmp_path_factory):
    from tests._support import object_agent
    from tests.cli.test_objects import AGENT

    d = tmp_path_factory.mktemp("objects_job")
    obs, ob = object_agent.buffer(4)
    np.save(d / "a.npy", obs)
    ob.save(d / "a.objects.npz")
    argv = ["explain", "--agent", AGENT, "--methods", "gradient", "--objects", "--input", str(d / "a.npy"), "--quiet"]
    assert main(argv + ["--out", str(d / "out")]) == 0
    return d / "out", argv


@pytest.mark.parametrize("name", list(OBJECTS_EDITS))
def test_a_manifest_field_of_the_wrong_type_is_one_error_for_render_and_resume(objects_job, tmp_path, capsys, name):
    """The fields render and a resume read (input, input_source, frame_shape, objects and its checksum), edited by
    hand: one line naming the manifest, exit 2, nothing written; before, an AttributeError, TypeError or KeyError
    traceback (or, for a resume, the edited manifest kept)."""
    job, argv = objects_job
    edit, says = OBJECTS_EDITS[name]
    out = _copy(job, tmp_path)
    m = json.loads((out / "manifest.json").read_text())
    edit(m)
    (out / "manifest.json").write_text(json.dumps(m))
    commands = [["render", str(out), "--video", "none", "--quiet"]]
    if name != "input removed":  # a resume without input is refused as another input's job, as before
        commands.append(argv + ["--out", str(out)])
    for command in commands:
        before = sorted(p for p in out.rglob("*"))
        capsys.readouterr()
        assert main(command) == 2, command[0]
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(out / "manifest.json") in err and says in err, err
        assert sorted(p for p in out.rglob("*")) == before


def _n_edited_copy(job, tmp_path):
    """A copy of the job whose manifest n and meta.json n (so the two agree) say 10^15 frames."""
    out = _copy(job, tmp_path)
    for path in (out / "manifest.json", out / "gradient" / "meta.json"):
        m = json.loads(path.read_text())
        (m["config"] if "config" in m else m)["n"] = 10 ** 15
        path.write_text(json.dumps(m))
    return out


@pytest.mark.parametrize("how", ["job's input", "--input", "resume"])
def test_a_manifest_n_beyond_its_input_is_refused_before_it_is_used(job, tmp_path, capsys, how):
    """n (and each method's meta.json, so the two agree) edited to 10^15: render allocated a flag per frame
    (MemoryError, or a loop over 10^15 / chunk chunks); now n is bounded by the frames the input holds."""
    out = _n_edited_copy(job, tmp_path)
    before = sorted(out.rglob("*"))
    frames = str(job.parent / "in.npy")
    argv = {"job's input": ["render", str(out), "--video", "none", "--quiet"],
            "--input": ["render", str(out), "--video", "none", "--quiet", "--input", frames],
            "resume": ["explain", "--agent", str(next((job.parent / "agent").glob("*.json"))), "--methods", "gradient",
                       "--input", frames, "--out", str(out), "--quiet", "--chunk", "4"]}[how]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "1000000000000000" in err and ("holds 6 frames" in err or how == "resume"), err
    assert sorted(out.rglob("*")) == before


def test_the_python_api_on_a_manifest_n_edited_far_beyond_its_chunks_answers_at_once(job, tmp_path):
    """n (and meta.json) edited to 10^15: load_maps, load_outputs and finished_frames looped over its 10^15 / chunk
    chunks (hours) or allocated n flags; now their work follows the chunk files present."""
    out = _n_edited_copy(job, tmp_path)
    chunks = 10 ** 15 // 4
    for load in (lambda: jaxsal.load_maps(out, "gradient"), lambda: jaxsal.load_outputs(out)):
        with pytest.raises(SaliencyInputError, match=f"{chunks - 2} of {chunks} chunks"):
            load()
    maps = jaxsal.load_maps(out, "gradient", allow_incomplete=True)  # lazy: the files written read as they are
    np.testing.assert_array_equal(maps[:4], jaxsal.load_maps(job, "gradient")[:4])
    assert np.isnan(maps[10 ** 15 - 1]).all()
    with pytest.raises(SaliencyInputError, match="holds 2 rows, as only a job's last chunk does, .* n is 10+ "):
        maps[4]  # the job's short last chunk where n puts a full one
    with pytest.raises(SaliencyInputError, match="_outputs/chunk_0000001.npz holds 2 rows, as only a job's last"):
        jaxsal.load_outputs(out, allow_incomplete=True)
    with pytest.raises(SaliencyInputError, match="1000000000000000 frames"):
        from jaxsal.io.store import finished_frames
        finished_frames(out, ["gradient"])


def test_only_a_jobs_own_chunk_names_count_as_finished(job, tmp_path):
    """A chunk is finished only under its exact name and below the manifest's chunk count: a leftover
    `chunk_0000001.npy.tmp` or a stray `chunk_0000002.npy` (one past the last) never stands in for the missing
    chunk 1, so the job reads as incomplete and chunk 1's frames as unfinished, not as NaN maps of a done job."""
    from jaxsal.io.store import chunk_path, chunks_on_disk, finished_frames, missing_chunks, outputs_path

    out = _copy(job, tmp_path)
    for folder, suffix in ((out / "gradient", "npy"), (out / "_outputs", "npz")):
        chunk1 = folder / f"chunk_0000001.{suffix}"
        shutil.copy(chunk1, folder / f"chunk_0000001.{suffix}.tmp")
        chunk1.rename(folder / f"chunk_0000002.{suffix}")
    assert chunks_on_disk(lambda i: chunk_path(out, "gradient", i), 2) == [0]
    assert chunks_on_disk(lambda i: outputs_path(out, i), 2) == [0]
    assert missing_chunks(out, "gradient", 2) == [1]
    np.testing.assert_array_equal(finished_frames(out, ["gradient"]), [True] * 4 + [False] * 2)
    for load in (lambda: jaxsal.load_maps(out, "gradient"), lambda: jaxsal.load_outputs(out)):
        with pytest.raises(SaliencyInputError, match="1 of 2 chunks"):
            load()
    maps = np.asarray(jaxsal.load_maps(out, "gradient", allow_incomplete=True))
    np.testing.assert_array_equal(maps[:4], np.asarray(jaxsal.load_maps(job, "gradient"))[:4])
    assert np.isnan(maps[4:]).all()
    np.testing.assert_array_equal(jaxsal.load_outputs(out, allow_incomplete=True)["frame"], np.arange(4))


def test_render_names_a_map_chunk_holding_nan_and_its_fix(job, tmp_path, capsys):
    """Before: "maps contain NaN or inf; cannot choose a colour scale", naming neither the file nor a fix."""
    out = _copy(job, tmp_path)
    path = out / "gradient" / "chunk_0000001.npy"
    maps = np.load(path)
    maps[1, 0, 0] = np.nan
    np.save(path, maps)
    before = sorted(out.rglob("*"))
    capsys.readouterr()
    assert main(["render", str(out), "--video", "none", "--quiet"]) == 2
    err = capsys.readouterr().err
    frame = len(np.load(out / "gradient" / "chunk_0000000.npy")) + 1
    assert err.count("\n") == 1 and f"chunk_0000001.npy: its maps hold NaN or inf (frame {frame})" in err, err
    assert "delete it and rerun" in err and sorted(out.rglob("*")) == before


RESUMED = {name: CASES[name] for name in CASES if name.startswith("map chunk") or name.endswith("map chunk")} | {
    # before: a resumed job counted it as done and ended "complete" (exit 0); load_maps refused it only later
    "map chunk of complex maps": (lambda o: np.save(o / "gradient" / "chunk_0000001.npy", np.zeros((2, 10, 10), np.complex64)),
                                  r"chunk_0000001.npy is corrupt \(dtype complex64\)"),
}


@pytest.mark.parametrize("name", list(RESUMED))
def test_a_resumed_job_names_a_damaged_map_chunk_instead_of_counting_it_done(job, tmp_path, capsys, name):
    mutate, says = RESUMED[name]
    out = _copy(job, tmp_path, mutate)
    chunks = {p: p.read_bytes() for p in sorted((out / "gradient").glob("chunk_*")) if p.is_file()}
    capsys.readouterr()
    d = job.parent
    assert main(["explain", "--agent", str(d / "agent" / "tiny0.json"), "--methods", "gradient", "--input",
                 str(d / "in.npy"), "--out", str(out), "--quiet", "--chunk", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(says, err) and "internal error" not in err, err
    assert {p: p.read_bytes() for p in chunks} == chunks
