"""`jaxsal explain --objects --effects`: per-frame causal object effects (`jaxsal.metrics.object_effects`)
stored beside the object shares, resumable; `jaxsal render` draws them; bad flag combinations end in one
line with nothing written."""
import json
import re
import shutil

import numpy as np
import pytest
from PIL import Image

import jaxsal
from jaxsal.cli import main
from jaxsal.io import object_files as objs
from jaxsal.metrics import object_effects
from jaxsal.game_objects.draw import PALETTE
from jaxsal.cli.render.pictures import FLAG_COLOUR, effect_bars
from tests._support import object_agent
from tests.cli.test_objects import AGENT, N, _same, _small_job, _state
from tests._support.cli_support import sigkill_after_chunks


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """The synthetic one-object agent (it reads only "target") with --objects --effects, chunks of 4."""
    d = tmp_path_factory.mktemp("effects")
    obs, ob = object_agent.buffer(N)
    np.save(d / "buf.npy", obs)
    ob.save(d / "buf.objects.npz")
    argv = ["explain", "--agent", AGENT, "--methods", "gradient", "--input", str(d / "buf.npy"), "--objects",
            "--effects", "--chunk", "4", "--out", str(d / "o"), "--quiet"]
    assert main(argv) == 0
    return d, obs, ob


@pytest.mark.slow  # 3-8 s (a subprocess, a game or a whole job): the slow stage, which CI runs
def test_stored_effects_are_object_effects_of_the_frames(job):
    d, obs, ob = job
    out = d / "o"
    assert sorted(p.name for p in (out / "_objects" / "_effects").iterdir()) == ["chunk_0000000.npz",
                                                                                "chunk_0000001.npz"]
    e = jaxsal.load_object_effects(out)
    apply_fn, params = object_agent.load()
    ref = object_effects(apply_fn, params, obs, ob)
    assert e["classes"] == ref.classes == ("target", "other")
    np.testing.assert_array_equal(e["frame"], np.arange(N))
    np.testing.assert_allclose(e["effect"], np.asarray(ref.effect), rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(e["flips"], np.asarray(ref.flips))
    np.testing.assert_array_equal(e["present"], np.asarray(ref.present))
    np.testing.assert_allclose(e["score"], np.asarray(ref.score), rtol=1e-6)
    np.testing.assert_array_equal(e["action"], np.asarray(ref.actions))
    assert e["effect"].dtype == np.float32 and e["flips"].dtype == bool and e["action"].dtype == np.int32
    # what each removal did, as object_effects' defaults (every frame, the ring fill) report it
    np.testing.assert_array_equal(e["overlap"], np.asarray(ref.overlap))
    np.testing.assert_array_equal(e["residue"], np.asarray(ref.residue))
    np.testing.assert_allclose(e["residue_share"], np.asarray(ref.residue_share), rtol=1e-6)
    assert e["overlap"].dtype == np.float32 and e["residue"].dtype == np.int32
    assert (e["overlap"] == 0).all()                    # the two boxes do not touch
    # the agent reads only "target": removing it moves Q_0, removing "other" changes nothing
    assert np.abs(e["effect"][:, 0]).min() > 1e-3 and (e["effect"][:, 1] == 0).all()
    # the same actions the maps explain
    np.testing.assert_array_equal(e["action"], jaxsal.load_outputs(out)["action"])
    s = jaxsal.load_object_shares(out, "gradient", effects=True)
    for k in ("effect", "flips", "score", "action") + objs.REMOVAL_KEYS:
        np.testing.assert_array_equal(s[k], e[k], err_msg=k)
    assert jaxsal.io.read_manifest(out)["config"]["objects"]["effects"] == {"fill": "ring", "frames": "all",
                                                                         "margin": 2, "ring_width": 3}
    plain = jaxsal.load_object_shares(out, "gradient")
    assert "effect" not in plain
    for k in objs.SHARE_KEYS:
        np.testing.assert_array_equal(s[k], plain[k], err_msg=k)
    # a job without --effects has none, and says how to get them
    shutil.copytree(out, d / "no_eff")
    cfg = jaxsal.io.read_manifest(d / "no_eff")
    del cfg["config"]["objects"]["effects"]
    (d / "no_eff" / "manifest.json").write_text(json.dumps(cfg))
    with pytest.raises(jaxsal.SaliencyInputError, match="--objects --effects"):
        jaxsal.load_object_effects(d / "no_eff")
    with pytest.raises(jaxsal.SaliencyInputError, match="--objects --effects"):
        jaxsal.load_object_shares(d / "no_eff", "gradient", effects=True)


def test_q_action_effects_use_the_buffers_actions(job, tmp_path):
    """--target q_action: the effects are for the action taken in the buffer, as the maps are."""
    _, obs, ob = job
    acts = np.array([1, 0, 1, 1, 0, 1])
    np.savez(tmp_path / "buf.npz", obs=obs, actions=acts)
    ob.save(tmp_path / "buf.objects.npz")
    assert main(["explain", "--agent", AGENT, "--methods", "gradient", "--input", str(tmp_path / "buf.npz"),
                 "--objects", "--effects", "--target", "q_action", "--chunk", "4", "--out", str(tmp_path / "o"),
                 "--quiet"]) == 0
    e = jaxsal.load_object_effects(tmp_path / "o")
    apply_fn, params = object_agent.load()
    ref = object_effects(apply_fn, params, obs, ob, target="q_action", actions=acts)
    np.testing.assert_array_equal(e["action"], acts)
    np.testing.assert_allclose(e["effect"], np.asarray(ref.effect), rtol=1e-5, atol=1e-6)
    assert (e["effect"][acts == 1] == 0).all()          # Q_1 is a constant: removing anything changes nothing
    assert np.abs(e["effect"][acts == 0, 0]).min() > 1e-3


def test_incomplete_effects(job, tmp_path):
    d, _, _ = job
    out = tmp_path / "cut"
    shutil.copytree(d / "o", out)
    (out / "_objects" / "_effects" / "chunk_0000000.npz").unlink()
    with pytest.raises(jaxsal.SaliencyInputError, match="1 of 2 chunks of object effects missing"):
        jaxsal.load_object_effects(out)
    e = jaxsal.load_object_effects(out, allow_incomplete=True)
    np.testing.assert_array_equal(e["frame"], [4, 5])
    s = jaxsal.load_object_shares(out, "gradient", allow_incomplete=True, effects=True)
    np.testing.assert_array_equal(s["frame"], [4, 5])          # only the chunks that have both
    assert s["positive"].shape == s["effect"].shape == (2, 2)


def _effect_files(out):
    return {p.name: p.read_bytes() for p in (out / "_objects" / "_effects").glob("chunk_*.npz")}


def _eff_same(out, ref):
    a, b = jaxsal.load_object_effects(out), jaxsal.load_object_effects(ref)
    for k in objs.EFFECT_KEYS + ("frame",):
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)


@pytest.mark.slow  # end to end, 3-10 s: the slow stage (CI runs it)
def test_resume_computes_only_the_missing_effects(tmp_path):
    args = _small_job(tmp_path) + ["--effects"]
    assert main(args + ["--out", str(tmp_path / "ref")]) == 0
    ref = _state(tmp_path / "ref")
    assert len(ref[0]) == 4 * (2 + 2 + 1 + 1)       # 4 chunks x (2 maps + 2 shares + effects + outputs)
    out = tmp_path / "cut"
    shutil.copytree(tmp_path / "ref", out)
    eff = out / "_objects" / "_effects"
    (eff / "chunk_0000001.npz").unlink()                                  # maps and shares kept, effects lost
    (eff / "chunk_0000002.npz").unlink()                                  # effects and a map lost
    (out / "standin_grad" / "chunk_0000002.npy").unlink()
    (out / "_objects" / "standin_noise" / "chunk_0000003.npz").unlink()   # shares lost, effects kept
    (eff / ".chunk_0000001.npz.77.tmp").write_bytes(b"partial")
    before = {p: p.stat().st_mtime_ns for p in out.rglob("chunk_*")}
    assert main(args + ["--out", str(out)]) == 0
    _same(_state(out), ref)
    _eff_same(out, tmp_path / "ref")
    assert sorted(_effect_files(out)) == sorted(_effect_files(tmp_path / "ref"))
    assert not list(out.rglob("*.tmp"))
    assert all(p.stat().st_mtime_ns == t for p, t in before.items())    # nothing finished is rewritten
    # the same job without --effects, or a job without effects asked for them: another job, refused
    assert main(_small_job(tmp_path) + ["--out", str(out)]) == 2
    plain = tmp_path / "plain"
    assert main(_small_job(tmp_path) + ["--out", str(plain)]) == 0
    assert main(args + ["--out", str(plain)]) == 2
    assert not (plain / "_objects" / "_effects").exists()


@pytest.mark.slow
def test_sigkill_then_resume_keeps_effects_aligned(tmp_path):
    args = _small_job(tmp_path) + ["--effects"]
    assert main(args + ["--out", str(tmp_path / "ref")]) == 0
    ref = _state(tmp_path / "ref")
    out = tmp_path / "killed"
    partial = sigkill_after_chunks(args, out, 5)
    assert 5 <= len(partial) < len(ref[0]), partial
    assert main(args + ["--out", str(out)]) == 0
    _same(_state(out), ref)
    _eff_same(out, tmp_path / "ref")
    assert sorted(_effect_files(out)) == sorted(_effect_files(tmp_path / "ref"))


def test_bad_flag_combinations_write_nothing(job, tmp_path, capsys):
    d, _, _ = job
    buf = str(d / "buf.npy")
    cases = [
        (["--input", buf, "--effects"], "add --objects"),
        (["--input", buf, "--effects", "--store", "shares"], "add --objects"),
        (["--play", "5", "--objects", buf.replace(".npy", ".objects.npz")], "give --objects without FILE"),
    ]
    for extra, frag in cases:
        out = tmp_path / "o"
        capsys.readouterr()
        assert main(["explain", "--agent", AGENT, "--methods", "gradient", "--out", str(out), "--quiet", *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("jaxsal: error:") and "\n" not in err and frag in err, (extra, err)
        assert not out.exists(), extra
    capsys.readouterr()
    assert main(["explain", "--agent", AGENT, "--methods", "gradient", "--input", buf, "--effects",
                 "--out", str(tmp_path / "o")]) == 2
    assert "--effects removes the objects of the boxes that --objects reads" in capsys.readouterr().err


def test_render_draws_the_effects(job, tmp_path):
    d, _, _ = job
    gal = tmp_path / "gal"
    assert main(["render", str(d / "o"), "--video", "none", "--grid-frames", "2", "--scale", "3",
                 "--out", str(gal), "--quiet"]) == 0
    figs = sorted(p.name for p in gal.glob("effects_*.png"))
    assert figs == ["effects_000000.png", "effects_000005.png"]
    assert "effects_000000.png" in (gal / "index.html").read_text()
    img = np.asarray(Image.open(gal / "effects_000000.png").convert("RGB"))
    tiles = 2 * 84 * 3                                  # frame | gradient overlay, then the bars
    assert img.shape[1] == tiles + 240
    top = 14 + 14
    y0, x0, y1, x1 = object_agent.BOX
    assert (img[top + 3 * y0, 3 * x0:3 * x1] == PALETTE[0]).all()          # the boxes on the frame
    bars = img[top - 14:, tiles:]
    e = jaxsal.load_object_effects(d / "o")
    assert e["effect"][0, 0] != 0 and (bars == PALETTE[0]).all(-1).sum() > 50   # the "target" bar
    assert not (bars == PALETTE[1]).all(-1).any()                          # "other" changes nothing: no bar
    # without effects in the job: no effects figure
    plain = tmp_path / "plain"
    assert main(["explain", "--agent", AGENT, "--methods", "gradient", "--input", str(d / "buf.npy"), "--objects",
                 "--chunk", "4", "--out", str(tmp_path / "p"), "--quiet"]) == 0
    assert main(["render", str(tmp_path / "p"), "--video", "none", "--grid-frames", "2", "--out", str(plain),
                 "--quiet"]) == 0
    assert not list(plain.glob("effects_*.png"))


def test_effect_bars_scale_and_flips():
    """Bar lengths follow the effects on one scale; a flipped class is outlined thick and marked in red."""
    img = effect_bars([2.0, 1.0, -1.0, 0.0], [True, False, False, False], [True, True, True, False],
                      ("ball", "paddle", "bricks", "enemy"), height=140)
    assert img.shape == (140, 240, 3)
    width = [(img == PALETTE[k]).all(-1).sum(1).max() for k in range(3)]
    assert abs(width[0] - 2 * width[1]) <= 3 and abs(width[1] - width[2]) <= 2 and width[1] > 10
    cols = [np.flatnonzero((img == PALETTE[k]).all(-1).any(0)) for k in range(3)]
    assert cols[2].max() < cols[1].min()                # the negative bar lies left of zero
    values = img[:, max(c.max() for c in cols) + 3:].astype(int)    # the column of numbers right of the bars
    red = (values[..., 0] > 120) & (values[..., 1] < 60) & (values[..., 2] < 60)
    rows = np.flatnonzero(red.any(1))
    ball_rows = np.flatnonzero((img == PALETTE[0]).all(-1).any(1))
    assert len(rows) and rows.min() >= ball_rows.min() - 4 and rows.max() <= ball_rows.max() + 4  # "flips"
    for k, thick in ((0, 2), (1, 1)):                   # the outline left of each bar (from zero)
        r = np.flatnonzero((img == PALETTE[k]).all(-1).any(1))[0] + 3
        first = cols[k].min()
        edge = img[r, first - 3:first]
        assert ((edge == 0).all(-1)).sum() == thick, (k, edge)
    assert not (img == PALETTE[3]).all(-1).any()        # an absent class gets no bar


def test_a_job_stored_before_the_removal_fields_still_loads(job, tmp_path):
    """Effects files without overlap/residue (a job from before them, background fill): loaded without those keys."""
    d, _, _ = job
    old = tmp_path / "old"
    shutil.copytree(d / "o", old)
    cfg = jaxsal.io.read_manifest(old)
    cfg["config"]["objects"]["effects"] = {"fill": "background"}
    (old / "manifest.json").write_text(json.dumps(cfg))
    for p in (old / "_objects" / "_effects").glob("chunk_*.npz"):
        with np.load(p) as z:
            kept = {k: z[k] for k in z.files if k not in objs.REMOVAL_KEYS}
        np.savez(p, **kept)
    e = jaxsal.load_object_effects(old)
    assert not set(objs.REMOVAL_KEYS) & set(e) and e["effect"].shape == (N, 2)
    s = jaxsal.load_object_shares(old, "gradient", effects=True)
    assert "effect" in s and "overlap" not in s
    assert any("object effects" in line for line in objs.summary_lines(old, ["gradient"], effects=True))


def test_effect_bars_flag_kept_and_residue():
    """A class mostly inside other boxes says "kept N%", one with pixels left around it "residue", in amber."""
    args = ([2.0, 1.0, 0.5], [False, False, False], [True, True, True], ("ball", "paddle", "bricks"))
    plain = effect_bars(*args, height=140)
    flagged = effect_bars(*args, height=140, overlap=[0.6, 0.01, 0.0], residue=[0, 0, 3])
    def grey(img):                                      # amber text (anti-aliased) right of the bars
        v, f = img.astype(int), np.asarray(FLAG_COLOUR)
        near = (np.abs(v - f) <= 40).all(-1) & (v[..., 0] - v[..., 2] > 100)
        right = max(np.flatnonzero((img == PALETTE[k]).all(-1).any(0)).max() for k in range(3)) + 2
        return near & (np.arange(img.shape[1]) > right)
    assert not grey(plain).any()
    row_h = min(22, (140 - 34) // 3)
    rows = np.flatnonzero(grey(flagged).any(1))
    hit = {int((r - 20) // row_h) for r in rows if 20 <= r < 20 + 3 * row_h}
    assert hit == {0, 2}, rows                          # ball (kept 60%) and bricks (residue), not paddle (1%)
    none = effect_bars(*args, height=140, overlap=[0.0, 0.0, 0.0], residue=[0, 0, 0])
    np.testing.assert_array_equal(none, plain)


def _npz_edit(path, **arrays):
    """Rewrite an .npz with some arrays replaced (None: dropped)."""
    with np.load(path) as z:
        kept = {k: z[k] for k in z.files}
    np.savez(path, **{k: v for k, v in {**kept, **arrays}.items() if v is not None})


def _manifest_objects(edit):
    def mutate(out):
        m = json.loads((out / "manifest.json").read_text())
        m["config"]["objects"] = edit(m["config"]["objects"])
        (out / "manifest.json").write_text(json.dumps(m))
    return mutate


_SHARES, _EFFECTS = "_objects/gradient/chunk_0000001.npz", "_objects/_effects/chunk_0000001.npz"
CORRUPT = {  # name -> (mutate the copied job, what the error says); before: BadZipFile, KeyError, numpy
    # concatenate errors, TypeError, or shares and effects of other rows joined to the frames silently
    "truncated shares": (lambda o: (o / _SHARES).write_bytes((o / _SHARES).read_bytes()[:-20]), "BadZipFile"),
    "emptied effects": (lambda o: (o / _EFFECTS).write_bytes(b""), "EOFError"),
    "shares with fewer rows": (lambda o: _npz_edit(o / _SHARES, positive=np.zeros((1, 2), np.float32)), "(1, 2)"),
    "shares of other classes": (lambda o: _npz_edit(o / _SHARES, positive=np.zeros((2, 3), np.float32)), "(2, 3)"),
    "shares without pointing": (lambda o: _npz_edit(o / _SHARES, pointing=None), "no pointing"),
    "effects with fewer rows": (lambda o: _npz_edit(o / _EFFECTS, effect=np.zeros((1, 2), np.float32)), "(1, 2)"),
    "effects without flips": (lambda o: _npz_edit(o / _EFFECTS, flips=None), "no flips"),
    "effects of fractional actions": (lambda o: _npz_edit(o / _EFFECTS, action=np.full(2, 0.5)), "'action'"),
    "effects chunk a directory": (lambda o: ((o / _EFFECTS).unlink(), (o / _EFFECTS).mkdir()), "IsADirectoryError"),
    "manifest classes a number": (_manifest_objects(lambda ob: ob | {"classes": 5}), "manifest.json is corrupt"),
    "manifest frames a string": (_manifest_objects(lambda ob: ob | {"frames": "4"}), "manifest.json is corrupt"),
}


@pytest.mark.parametrize("name", list(CORRUPT))
def test_a_corrupted_shares_or_effects_file_is_one_clear_error(job, tmp_path, name):
    mutate, says = CORRUPT[name]
    out = tmp_path / "o"
    shutil.copytree(job[0] / "o", out)
    mutate(out)
    loaders = [lambda: jaxsal.load_object_shares(out, "gradient", effects=True)]
    if "shares" not in name:
        loaders.append(lambda: jaxsal.load_object_effects(out))
    for load in loaders:
        with pytest.raises(jaxsal.SaliencyInputError, match=re.escape(says)) as e:
            load()
        msg = str(e.value)
        assert "\n" not in msg and ("delete it and rerun the same `jaxsal explain`" in msg or "new --out" in msg)


@pytest.mark.parametrize("damage", ["effects chunk", "summary"])
def test_render_refuses_a_damaged_effects_chunk_or_summary_before_drawing(job, tmp_path, capsys, damage):
    """Before: the grid and stack PNGs were drawn first, then 'internal error BadZipFile' (effects) or
    'internal error JSONDecodeError' (a truncated summary-p0.json), exit 1."""
    out = tmp_path / "o"
    shutil.copytree(job[0] / "o", out)
    path = out / (_EFFECTS if damage == "effects chunk" else "summary-p0.json")
    path.write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    assert main(["render", str(out), "--video", "none", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{path.name} is corrupt" in err and "rerun the same `jaxsal explain`" in err, err
    assert not (out / "gallery").exists()
