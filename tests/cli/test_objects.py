"""`jaxsal explain --objects`: per-frame object shares next to (or instead of) the maps, resumable;
`jaxsal render` draws the boxes; every bad objects input ends in one line naming the fix."""
import shutil

import numpy as np
import pytest
from PIL import Image

import jaxsal
from jaxsal.cli import main
from jaxsal.io import object_files as objs
from jaxsal.metrics import object_attribution, object_pointing
from jaxsal.game_objects import ObjectBoxes
from jaxsal.game_objects.draw import PALETTE
from tests._support import object_agent
from tests._support.cli_support import ROOT, frames, make_agent_files, sigkill_after_chunks

AGENT = f"{ROOT / 'tests' / '_support' / 'object_agent.py'}:load"
N = 6


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The synthetic one-object agent explained with and without per-frame maps, with --objects
    (occlusion recovers the object too: tests/metrics/test_object_shares.py; here CPU time is short)."""
    d = tmp_path_factory.mktemp("objects")
    obs, ob = object_agent.buffer(N)
    np.save(d / "buf.npy", obs)
    ob.save(d / "buf.objects.npz")               # found beside the input by --objects without FILE
    argv = ["explain", "--agent", AGENT, "--methods", "gradient,pf=gradient", "--option",
            "pf.per_frame=true", "--input", str(d / "buf.npy"), "--objects",
            "--chunk", "4", "--out", str(d / "o"), "--quiet"]
    assert main(argv) == 0
    return d, obs, ob


def test_shares_next_to_maps_recover_the_object(job):
    d, obs, ob = job
    out = d / "o"
    cfg = jaxsal.io.read_manifest(out)["config"]
    assert cfg["objects"]["classes"] == ["target", "other"] and cfg["objects"]["frames"] == 4
    assert sorted(p.name for p in (out / "_objects" / "gradient").iterdir()) == ["chunk_0000000.npz",
                                                                                "chunk_0000001.npz"]
    for method, least in (("gradient", 0.999), ("pf", 0.999)):
        s = jaxsal.load_object_shares(out, method)
        assert s["classes"] == ("target", "other")
        np.testing.assert_array_equal(s["frame"], np.arange(N))
        assert s["absolute"][:, 0].min() > least, (method, s["absolute"][:, 0])   # the object the agent reads
        assert s["absolute"][:, 1].max() < 1e-3 and s["present"].all() and s["pointing"][:, 0].all()
        np.testing.assert_allclose(s["chance"], 144 / 84 ** 2)
        # the stored shares are object_attribution / object_pointing of the stored maps
        maps = np.asarray(jaxsal.load_maps(out, method))
        ref = object_attribution(maps, ob)
        for k in ("positive", "absolute", "chance", "per_frame_positive", "per_frame_absolute"):
            if k.startswith("per_frame") and method != "pf":
                continue
            np.testing.assert_allclose(s[k], np.asarray(getattr(ref, k)), rtol=1e-5, atol=1e-6, err_msg=k)
        np.testing.assert_array_equal(s["pointing"], np.asarray(object_pointing(maps, ob)[0]))
        assert s["per_frame_positive"].shape == (N, 4, 2)
        if method == "pf":   # per-frame maps: frame f's map on frame f's objects; they add up
            np.testing.assert_allclose(s["per_frame_positive"].sum(1), s["positive"], rtol=1e-5)
            np.testing.assert_allclose(s["per_frame_chance"].sum(1), s["chance"], rtol=1e-5)
        else:                # a map of the stack on each stacked frame's objects (same boxes here)
            for f in range(4):
                np.testing.assert_allclose(s["per_frame_positive"][:, f], s["positive"], rtol=1e-5)
    means = objs.mean_shares(jaxsal.load_object_shares(out, "gradient"))
    assert means["target"]["positive"] > 0.99 and means["target"]["states"] == N


def test_store_shares_only(job, tmp_path, capsys):
    d, _, _ = job
    out = tmp_path / "shares"
    assert main(["explain", "--agent", AGENT, "--methods", "gradient", "--input", str(d / "buf.npy"),
                 "--objects", str(d / "buf.objects.npz"), "--store", "shares", "--chunk", "4", "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "gradient: target 1.00 (chance 0.02), other 0.00 (chance 0.02)" in said
    assert not list(out.rglob("*.npy")) and len(list((out / "_objects" / "gradient").glob("chunk_*.npz"))) == 2
    a, b = jaxsal.load_object_shares(out, "gradient"), jaxsal.load_object_shares(d / "o", "gradient")
    for k in objs.SHARE_KEYS:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-5, atol=1e-7, err_msg=k)
    shares_bytes = sum(p.stat().st_size for p in (out / "_objects" / "gradient").glob("*.npz"))
    assert shares_bytes < sum(p.stat().st_size for p in (d / "o" / "gradient").glob("*.npy")) / 20
    assert len(jaxsal.load_outputs(out)["action"]) == N
    with pytest.raises(jaxsal.SaliencyInputError, match="load_object_shares"):
        jaxsal.load_maps(out, "gradient")
    assert main(["render", str(out)]) == 2
    assert "stored only object shares" in capsys.readouterr().err


def _small_job(tmp_path, n=12):
    """A tiny MinAtar-sized agent and buffer with 10x10 boxes (fast, for resume tests)."""
    card = make_agent_files(tmp_path / "agent")
    np.save(tmp_path / "x.npy", frames(n, seed=3))
    rng = np.random.default_rng(0)
    y0, x0 = rng.integers(0, 8, (2, n, 4, 2))
    b = np.stack([y0, x0, y0 + 2, x0 + 2], -1).astype(np.int16)
    ObjectBoxes(b, np.tile(np.array([0, 1], np.int8), (n, 4, 1)), ("ball", "paddle"), 10, 10).save(
        tmp_path / "x.objects.npz")
    return ["explain", "--agent", str(card), "--methods", "standin_grad,standin_noise", "--option",
            "standin_noise.n_masks=4", "--input", str(tmp_path / "x.npy"), "--objects", "--chunk", "3", "--quiet"]


def _state(out):
    """Every stored file name, the maps' bytes and the shares' arrays."""
    names = sorted(str(p.relative_to(out)) for p in out.rglob("chunk_*"))
    maps = {k: p.read_bytes() for k, p in ((str(p.relative_to(out)), p) for p in out.rglob("chunk_*.npy"))}
    shares = {m: jaxsal.load_object_shares(out, m) for m in ("standin_grad", "standin_noise")}
    return names, maps, shares


def _same(a, b):
    assert a[0] == b[0] and a[1] == b[1]
    for m in a[2]:
        for k in objs.SHARE_KEYS:
            np.testing.assert_array_equal(a[2][m][k], b[2][m][k], err_msg=(m, k))


def test_each_chunk_uses_its_own_states_boxes(tmp_path):
    """Boxes that move from state to state (the fixture's stay put): each chunk's shares and effects use its own
    states' boxes, and --limit keeps the boxes of the first states with the first frames, so the stored arrays
    are object_attribution / object_pointing / object_effects of frames 0..6 with boxes 0..6."""
    import jaxsal_agents
    from jaxsal.metrics import object_effects

    _small_job(tmp_path)                          # 12 frames of a tiny agent, boxes of every state beside them
    out = tmp_path / "o"
    assert main(["explain", "--agent", str(tmp_path / "agent" / "tiny0.json"), "--methods", "standin_grad",
                 "--input", str(tmp_path / "x.npy"), "--objects", "--effects", "--chunk", "3", "--limit", "7",
                 "--out", str(out), "--quiet"]) == 0
    ob = objs.read_objects(tmp_path / "x.objects.npz").boxes[:7]
    x = np.load(tmp_path / "x.npy")[:7]
    maps = np.asarray(jaxsal.load_maps(out, "standin_grad"))
    s = jaxsal.load_object_shares(out, "standin_grad")
    ref = object_attribution(maps, ob)
    for k in ("positive", "absolute", "chance"):
        np.testing.assert_allclose(s[k], np.asarray(getattr(ref, k)), rtol=1e-5, atol=1e-6, err_msg=k)
    np.testing.assert_array_equal(s["pointing"], np.asarray(object_pointing(maps, ob)[0]))
    for f in range(4):  # a map of the stack on stacked frame f's own boxes
        want = np.asarray(object_attribution(maps, ob, frame=f).positive)
        np.testing.assert_allclose(s["per_frame_positive"][:, f], want, rtol=1e-5, atol=1e-6)
    agent = jaxsal_agents.load(str(tmp_path / "agent" / "tiny0.json"))
    e, want = jaxsal.load_object_effects(out), object_effects(agent.apply_fn, agent.params, x, ob)
    np.testing.assert_allclose(e["effect"], np.asarray(want.effect), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(e["present"], np.asarray(want.present))

def test_resume_computes_only_what_is_missing(tmp_path):
    args = _small_job(tmp_path)
    assert main(args + ["--out", str(tmp_path / "ref")]) == 0
    ref = _state(tmp_path / "ref")
    assert len(ref[0]) == 4 * (2 + 2 + 1)       # 4 chunks x (2 maps + 2 shares + outputs)
    out = tmp_path / "cut"
    shutil.copytree(tmp_path / "ref", out)
    (out / "_objects" / "standin_grad" / "chunk_0000001.npz").unlink()   # a map kept, its shares lost
    (out / "standin_noise" / "chunk_0000002.npy").unlink()               # shares kept, the map lost
    for p in list((out / "_objects" / "standin_noise").glob("chunk_000000[3].npz")) + \
            [out / "standin_grad" / "chunk_0000003.npy"]:
        p.unlink()
    (out / "_objects" / "standin_grad" / ".chunk_0000003.npz.99.tmp").write_bytes(b"partial")
    before = {p: p.stat().st_mtime_ns for p in out.rglob("chunk_*")}
    assert main(args + ["--out", str(out)]) == 0
    _same(_state(out), ref)
    assert not list(out.rglob("*.tmp"))
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())   # nothing finished is rewritten
    # shares-only into a job that stored maps is another job: refused, naming the fix
    assert main(args + ["--store", "shares", "--out", str(out)]) == 2


@pytest.mark.slow
def test_sigkill_then_resume_keeps_maps_and_shares_aligned(tmp_path):
    args = _small_job(tmp_path)
    assert main(args + ["--out", str(tmp_path / "ref")]) == 0
    ref = _state(tmp_path / "ref")
    out = tmp_path / "killed"
    partial = sigkill_after_chunks(args, out, 4)
    assert 4 <= len(partial) < len(ref[0]), partial
    assert main(args + ["--out", str(out)]) == 0
    _same(_state(out), ref)


def test_render_draws_boxes(job, tmp_path):
    d, obs, ob = job
    gal = tmp_path / "gal"
    assert main(["render", str(d / "o"), "--methods", "gradient", "--video", "none", "--grid-frames", "2",
                 "--scale", "3", "--out", str(gal), "--quiet"]) == 0
    img = np.asarray(Image.open(gal / "grid.png").convert("RGB"))
    top = 14 + 14                                 # row caption strip, then the tile's name strip
    for k, (y0, x0, y1, x1) in enumerate((object_agent.BOX, object_agent.OTHER)):
        for tile in (0, 1):                        # the frame and the gradient overlay
            xo = tile * 84 * 3
            assert (img[top + 3 * y0, xo + 3 * x0:xo + 3 * x1] == PALETTE[k]).all()          # top edge
            assert (img[top + 3 * y1 - 1, xo + 3 * x0:xo + 3 * x1] == PALETTE[k]).all()      # bottom edge
            assert (img[top + 3 * y0:top + 3 * y1, xo + 3 * x1 - 1] == PALETTE[k]).all()     # right edge
            assert not (img[top + 3 * y0 + 4, xo + 3 * x0 + 4:xo + 3 * x1 - 4] == PALETTE[k]).all(-1).any()
    grid_h = 2 * (14 + 14 + 84 * 3)
    strip = img[grid_h:grid_h + 14]              # the class legend below the grid
    for k in (0, 1):
        assert (strip == PALETTE[k]).all(-1).sum() >= 20
    stack = np.asarray(Image.open(next(gal.glob("stack_*.png"))).convert("RGB"))
    for j in range(4):                            # every stacked frame's own boxes
        assert (stack[14 + 3 * 10, j * 252 + 60:j * 252 + 96] == PALETTE[0]).all()
    # --no-boxes: the same pixels are the grey frame again
    assert main(["render", str(d / "o"), "--methods", "gradient", "--video", "none", "--grid-frames", "2",
                 "--out", str(tmp_path / "plain"), "--no-boxes", "--quiet"]) == 0
    plain = np.asarray(Image.open(tmp_path / "plain" / "grid.png").convert("RGB"))
    edge = plain[top + 30, 60:96]
    assert (edge[:, 0] == edge[:, 1]).all() and (edge[:, 1] == edge[:, 2]).all()
    assert plain.shape[0] == img.shape[0] - 14


def _bad_objects(d, name, **arrays):
    np.savez(d / name, **arrays)
    return str(d / name)


def test_errors_name_the_fix(job, tmp_path, capsys):
    d, obs, ob = job
    buf = str(d / "buf.npy")
    good = dict(boxes=ob.boxes, labels=ob.labels, classes=np.asarray(ob.classes))
    card = make_agent_files(tmp_path / "agent")            # a MinAtar card: its game has no object table
    np.save(tmp_path / "m.npy", frames(4))
    pickled = tmp_path / "pickled.npz"
    np.savez(pickled, boxes=ob.boxes, labels=ob.labels, classes=np.asarray(ob.classes, object))
    cases = [
        (["--objects", _bad_objects(tmp_path, "n.npz", **dict(good, boxes=ob.boxes[:5], labels=ob.labels[:5]))],
         "boxes for 5 states but the input has 6 frames"),
        (["--objects", _bad_objects(tmp_path, "f.npz", **dict(good, boxes=ob.boxes[:, :1], labels=ob.labels[:, :1]))],
         "1 stacked frame(s) per state but the frames stack 4"),
        (["--objects", _bad_objects(tmp_path, "s.npz", **good, size=np.asarray([80, 80]))],
         "boxes for 80x80 frames but the frames are 84x84"),
        (["--objects", _bad_objects(tmp_path, "k.npz", boxes=ob.boxes, classes=good["classes"])], "has no labels"),
        (["--objects", _bad_objects(tmp_path, "l.npz", **dict(good, labels=ob.labels + 2))], "labels must be -1"),
        (["--objects", str(pickled)], "store classes as a str array"),
        (["--objects", str(tmp_path / "nowhere.npz")], "does not exist"),
        (["--objects", "--limit", "3"], "no boxes for"),                       # nothing beside m.npy's copy
        (["--store", "shares"], "add --objects"),
    ]
    shutil.copy(d / "buf.npy", tmp_path / "lonely.npy")
    for extra, frag in cases:
        inp = str(tmp_path / "lonely.npy") if "--limit" in extra else buf
        capsys.readouterr()
        argv = ["explain", "--agent", AGENT, "--methods", "gradient", "--input", inp, "--out",
                str(tmp_path / "o"), "--quiet", *extra]
        assert main(argv) == 2, extra
        err = capsys.readouterr().err.strip()
        assert err.startswith("jaxsal: error:") and "\n" not in err and frag in err, (extra, err)
    more = [
        (["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(tmp_path / "m.npy"),
          "--objects", "--out", str(tmp_path / "o2")], "game 'minatar-breakout' has no object table"),
        (["explain", "--agent", str(card), "--methods", "standin_grad", "--play", "5", "--objects", "--out",
          str(tmp_path / "o3")], "--objects: minatar-breakout has no object table"),
        (["explain", "--agent", AGENT, "--methods", "gradient", "--input", str(tmp_path / "lonely.npy"), "--objects",
          "--out", str(tmp_path / "o4")], "python -m jaxsal_agents.record_objects"),
    ]
    # the boxes a job used went away: render says how to go on
    moved = tmp_path / "moved"
    shutil.copytree(d / "o", moved)
    meta = jaxsal.io.read_manifest(moved)
    meta["objects_source"]["path"] = str(tmp_path / "gone.objects.npz")
    (moved / "manifest.json").write_text(__import__("json").dumps(meta))
    more.append((["render", str(moved), "--video", "none"], "render --objects FILE"))
    more.append((["render", str(moved), "--video", "none", "--objects", _bad_objects(
        tmp_path, "other.npz", **dict(good, boxes=ob.boxes + 1))], "not the objects file"))
    for argv, frag in more:
        capsys.readouterr()
        assert main(argv) == 2, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("jaxsal: error:") and "\n" not in err and frag in err, (argv, err)
    assert main(["render", str(moved), "--video", "none", "--grid-frames", "1", "--quiet", "--objects",
                 str(d / "buf.objects.npz")]) == 0


def test_game_mismatch_and_the_recorded_buffer(tmp_path, capsys):
    """Frames recorded by agents.record_objects (ale-py, RAM boxes) go straight into explain --objects;
    an objects file of another game is refused."""
    pytest.importorskip("ale_py")
    import jaxsal_agents
    from jaxsal_agents.record_objects import main as record_main, record

    pong = jaxsal_agents.load("pong")
    paths = record(pong, 4, tmp_path / "buf", epsilon=0.0)
    got = objs.read_objects(paths["objects"], "pong")
    assert got.game == "pong" and got.classes == jaxsal.game_objects.table("pong").classes
    assert len(got.boxes) == len(np.load(paths["obs"])) == 4
    assert main(["explain", "--agent", "pong", "--methods", "standin_pool", "--input", str(paths["obs"]),
                 "--objects", "--store", "shares", "--out", str(tmp_path / "o"), "--quiet"]) == 0
    s = jaxsal.load_object_shares(tmp_path / "o", "standin_pool")
    assert s["positive"].shape == (4, 3) and s["per_frame_positive"].shape == (4, 4, 3)
    assert s["present"][:, s["classes"].index("player")].any()   # our paddle, from the RAM
    # the same file claimed for another game's agent
    other = tmp_path / "b.objects.npz"
    ObjectBoxes.load(paths["objects"]).save(other, game="breakout")
    capsys.readouterr()
    assert main(["explain", "--agent", "pong", "--methods", "standin_pool", "--input", str(paths["obs"]),
                 "--objects", str(other), "--out", str(tmp_path / "o5")]) == 2
    assert "holds boxes of 'breakout' but the agent plays 'pong'" in capsys.readouterr().err
    assert record_main(["--game", "minatar-breakout", "--out", str(tmp_path / "m")]) == 2
    assert "has no object table" in capsys.readouterr().err
    assert record_main(["--agent", "pong", "--steps", "2", "--out", str(tmp_path / "buf")]) == 2
    assert "already holds a recorded buffer" in capsys.readouterr().err


@pytest.mark.slow  # 3-8 s (a subprocess, a game or a whole job): the slow stage, which CI runs
def test_play_with_objects_records_the_boxes_of_its_frames(tmp_path, capsys):
    """--play N --objects plays on ale-py (the frames record_objects writes at the same seed) and keeps
    each state's RAM boxes beside the rollout, where --objects finds them; a rerun reuses both; a rollout
    recorded without boxes, a boxes FILE with --play and a game without an object table are refused."""
    pytest.importorskip("ale_py")
    import jaxsal_agents
    from jaxsal_agents.record_objects import record

    out = tmp_path / "o"
    argv = ["explain", "--agent", "pong", "--methods", "standin_pool", "--play", "4", "--objects", "--store",
            "shares", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    ref = record(jaxsal_agents.load("pong"), 4, tmp_path / "ref", epsilon=0.0, seed=0)
    np.testing.assert_array_equal(np.load(out / "input" / "obs.npy"), np.load(ref["obs"]))
    got, want = ObjectBoxes.load(out / "input" / "obs.objects.npz"), ObjectBoxes.load(ref["objects"])
    np.testing.assert_array_equal(got.boxes, want.boxes)
    assert got.classes == want.classes
    s = jaxsal.load_object_shares(out, "standin_pool")
    assert s["positive"].shape == (4, 3) and s["present"][:, s["classes"].index("player")].any()
    before = (out / "input" / "obs.objects.npz").stat().st_mtime_ns
    assert main(argv) == 0                                        # rerun: reuses the rollout and its boxes
    assert (out / "input" / "obs.objects.npz").stat().st_mtime_ns == before
    plain = tmp_path / "plain"
    assert main(["explain", "--agent", "pong", "--methods", "standin_pool", "--play", "3", "--out", str(plain),
                 "--quiet"]) == 0
    cases = [
        (["--agent", "pong", "--play", "3", "--objects", "--out", str(plain)], "recorded without object boxes"),
        (["--agent", "pong", "--play", "3", "--objects", str(ref["objects"]), "--out", str(tmp_path / "x")],
         "give --objects without FILE"),
        (["--agent", "minatar-breakout", "--play", "3", "--objects", "--out", str(tmp_path / "y")],
         "has no object table"),
    ]
    for extra, frag in cases:
        capsys.readouterr()
        assert main(["explain", "--methods", "standin_pool", "--quiet", *extra]) == 2, extra
        err = capsys.readouterr().err.strip()
        assert err.startswith("jaxsal: error:") and "\n" not in err and frag in err, (extra, err)
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_a_provider_that_cannot_record_boxes_says_so():
    import types

    from jaxsal.plugins import _NAMES, AgentProvider, AgentProviderError

    module = types.ModuleType("bare_provider")
    for name in _NAMES:
        setattr(module, name, lambda *a, **k: None)
    with pytest.raises(AgentProviderError, match="cannot record object boxes.*--input FILE --objects BOXES"):
        AgentProvider(module, "bare").record_objects(None, 3, "pong")


def test_crafted_objects_files_are_one_clear_error(tmp_path):
    """A size that is not (height, width) (an IndexError or TypeError before), more classes than int8 labels
    hold or a size beyond int16 boxes (both wrapped silently before), a damaged member (BadZipFile before)."""
    from tests._support.cli_support import corrupt_member

    boxes = np.zeros((3, 4, 2, 4), np.int64)
    boxes[..., 2:] = 5
    good = dict(boxes=boxes, labels=np.zeros((3, 4, 2), np.int64), classes=np.asarray(["ball"]),
                size=np.asarray([84, 84]))
    big = boxes.copy()
    big[..., 2:] = 70000
    cases = {"size of one number": (dict(size=np.asarray([84])), "size must be the frame's"),
             "size of three numbers": (dict(size=np.asarray([84, 84, 3])), "size must be"),
             "size beyond int16": (dict(boxes=big, size=np.asarray([100000, 100000])), "from 1 to 4096"),
             "game of two names": (dict(game=np.asarray(["pong", "breakout"])), "game must be one name"),  # str()'d
             "game a number": (dict(game=np.asarray(3)), "game must be one name"),                 # before, silently
             "200 classes": (dict(labels=np.full((3, 4, 2), 150), classes=np.asarray([f"c{i}" for i in range(200)])),
                             "1 to 127 names")}
    for name, (change, says) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.npz"
        np.savez(path, **dict(good, **change))
        with pytest.raises(jaxsal.SaliencyInputError, match=says):
            objs.read_objects(path)
    path = tmp_path / "damaged.npz"
    np.savez_compressed(path, **dict(good, boxes=np.zeros((200, 4, 8, 4), np.int16),
                                     labels=np.zeros((200, 4, 8), np.int8)))
    corrupt_member(path, "boxes.npy", nbytes=16, at=0.3)
    with pytest.raises(jaxsal.SaliencyInputError, match="damaged.npz is corrupt"):
        objs.read_objects(path)
    import zipfile                       # boxes of one more frame after the array its header declares
    np.savez(path, **good)
    with zipfile.ZipFile(path) as z:
        members = {name: z.read(name) for name in z.namelist()}
    members["boxes.npy"] += np.zeros((1, 4, 2, 4), np.int16).tobytes()
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    assert np.load(path)["boxes"].shape == good["boxes"].shape          # numpy drops them without a word
    with pytest.raises(jaxsal.SaliencyInputError, match=r"damaged.npz is corrupt \(64 bytes after array 'boxes'"):
        objs.read_objects(path)


def test_an_objects_file_that_is_no_npz_or_names_a_class_twice_is_one_clear_error(tmp_path):
    """An emptied or cut-off objects file (EOFError, BadZipFile before), an .npy under an .npz name (a
    TypeError before) and class names given twice (loaded, and merged by name in the summary and a sweep's
    columns, so one class's shares silently stood for both) are refused naming the file."""
    boxes = np.zeros((3, 4, 2, 4), np.int16)
    good = dict(boxes=boxes, labels=np.full((3, 4, 2), -1, np.int8), classes=np.asarray(["ball"]))
    np.savez(tmp_path / "good.npz", **good)
    raw = (tmp_path / "good.npz").read_bytes()
    (tmp_path / "empty.npz").write_bytes(b"")
    (tmp_path / "cut.npz").write_bytes(raw[:len(raw) // 2])
    np.save(tmp_path / "array.npy", boxes)
    (tmp_path / "array.npy").rename(tmp_path / "array.npz")
    np.savez(tmp_path / "twice.npz", **dict(good, classes=np.asarray(["ball", "paddle", "ball"])))
    for name, says in {"empty.npz": "is not a readable .npz", "cut.npz": "is not a readable .npz",
                       "array.npz": "is not a readable .npz", "twice.npz": "names class 'ball' twice"}.items():
        with pytest.raises(jaxsal.SaliencyInputError, match=f"objects file .*{name}.*{says}") as e:
            objs.read_objects(tmp_path / name)
        assert "\n" not in str(e.value)
    assert objs.read_objects(tmp_path / "good.npz").classes == ("ball",)
