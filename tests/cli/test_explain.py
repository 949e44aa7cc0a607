"""`jaxsal explain`: every input format, options, reruns, metadata, and every bad input -> one line."""
import errno
import json

import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from jaxsal.io import store
from tests._support.cli_support import frames, make_agent_files
from tests.io.test_readers import dopamine_reference, write_dopamine


@pytest.fixture(scope="module")
def agent_card(tmp_path_factory):
    return make_agent_files(tmp_path_factory.mktemp("agent"))


@pytest.fixture(scope="module")
def agent(agent_card):
    import jaxsal_agents

    return jaxsal_agents.load(str(agent_card))


def _explain(card, inp, out, *extra, methods="standin_grad"):
    return main(["explain", "--agent", str(card), "--methods", methods, "--input", str(inp), "--out", str(out),
                 "--quiet", *map(str, extra)])


def _reference(agent, x, **kw):
    return np.asarray(jaxsal.explain(agent.apply_fn, agent.params, x, method="standin_grad", **kw))


def _close(a, b, rtol=1e-4):
    scale = np.abs(b).max()
    np.testing.assert_allclose(a, b, rtol=0, atol=rtol * scale)


@pytest.mark.slow
def test_every_input_format(tmp_path, agent_card, agent):
    x = frames(13, seed=1)
    np.savez_compressed(tmp_path / "buf.npz", obs=x)
    np.save(tmp_path / "buf.npy", x)
    shards = tmp_path / "shards"
    shards.mkdir()
    np.save(shards / "a.npy", x[:6])
    np.savez(shards / "b.npz", obs=x[6:])
    single = frames(11, seed=2)[..., 0]  # (11, 10, 10) single frames
    term = np.zeros(11, bool)
    term[4] = True
    write_dopamine(tmp_path / "dop", 0, single, term, add_count=16)  # wrapped: cursor 5
    want = _reference(agent, x)
    for name in ("buf.npz", "buf.npy", "shards"):
        assert _explain(agent_card, tmp_path / name, tmp_path / f"out_{name}", "--chunk", 5) == 0
        maps = jaxsal.load_maps(tmp_path / f"out_{name}", "standin_grad")
        assert maps.shape == (13, 10, 10) and maps.dtype == np.float32
        _close(np.asarray(maps), want)
    assert _explain(agent_card, tmp_path / "dop", tmp_path / "out_dop", "--chunk", 4) == 0
    idx, states = dopamine_reference(single, term, 16)
    _close(np.asarray(jaxsal.load_maps(tmp_path / "out_dop", "standin_grad")), _reference(agent, states))
    np.testing.assert_array_equal(jaxsal.load_outputs(tmp_path / "out_dop")["index"], idx)  # 9, 10, 0, 1, 2, 3
    for name in ("buf.npz", "buf.npy", "shards"):  # the row number of the input
        np.testing.assert_array_equal(jaxsal.load_outputs(tmp_path / f"out_{name}")["index"], np.arange(13))


def test_metadata_and_array_like(tmp_path, agent_card, agent):
    from jaxsal_agents.checkpoint import params_checksum

    x = frames(9)
    np.save(tmp_path / "x.npy", x)
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--chunk", 4,
                    "--option", "standin_grad.scale=2.0") == 0
    m = store.read_manifest(tmp_path / "o")
    cfg = m["config"]
    assert cfg["methods"] == {"standin_grad": {"method": "standin_grad", "options": {"scale": 2.0}}}
    assert cfg["agent"] == agent_card.stem and cfg["params_checksum"] == params_checksum(agent.params)
    assert len(cfg["input"]["checksum"]) == 64 and m["version"] == jaxsal.__version__ and m["created"]
    assert sorted(p.name for p in (tmp_path / "o" / "standin_grad").iterdir()) == [
        "chunk_0000000.npy", "chunk_0000001.npy", "chunk_0000002.npy", "meta.json"]
    meta = json.loads((tmp_path / "o" / "standin_grad" / "meta.json").read_text())
    assert meta["method"] == "standin_grad" and meta["options"] == {"scale": 2.0}
    assert meta["params_checksum"] == cfg["params_checksum"] and meta["input"] == cfg["input"]
    assert meta["version"] == jaxsal.__version__ and meta["created"] == m["created"]
    maps = jaxsal.load_maps(tmp_path / "o", "standin_grad")
    full = np.asarray(maps)
    _close(full, 2.0 * _reference(agent, x))
    np.testing.assert_array_equal(maps[7], full[7])
    np.testing.assert_array_equal(maps[-1], full[-1])
    np.testing.assert_array_equal(maps[2:8:3], full[2:8:3])
    np.testing.assert_array_equal(maps[[8, 0, 4]], full[[8, 0, 4]])
    np.testing.assert_array_equal(maps[3, 10:20, 5], full[3, 10:20, 5])
    assert len(maps) == 9 and len(list(maps)) == 9
    with pytest.raises(IndexError):
        maps[9]
    with pytest.raises(jaxsal.SaliencyInputError, match="no maps for method 'rise'"):
        jaxsal.load_maps(tmp_path / "o", "rise")


def test_agent_as_params_file(tmp_path, agent_card, agent):
    x = frames(3)
    np.save(tmp_path / "x.npy", x)
    assert _explain(agent_card.with_suffix(".msgpack"), tmp_path / "x.npy", tmp_path / "o") == 0
    _close(np.asarray(jaxsal.load_maps(tmp_path / "o", "standin_grad")), _reference(agent, x))


def test_dtype_batch_size_and_per_frame(tmp_path, agent_card, agent):
    x = frames(7, seed=3)
    np.save(tmp_path / "x.npy", x)
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--dtype", "float16", "--batch-size", 2,
                    "--chunk", 3, "--option", "standin_grad.per_frame=True") == 0
    maps = jaxsal.load_maps(tmp_path / "o", "standin_grad")
    assert maps.shape == (7, 10, 10, 4) and maps.dtype == np.float16
    _close(np.asarray(maps, np.float32), _reference(agent, x, per_frame=True), rtol=2e-3)


def test_rerun_resumes_and_different_options_refused(tmp_path, agent_card, capsys):
    np.save(tmp_path / "x.npy", frames(6))
    args = ["--chunk", 4, "--option", "standin_grad.scale=1.5"]
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", *args) == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "o" / "standin_grad").iterdir()}
    (tmp_path / "o" / "standin_grad" / "chunk_0000001.npy").unlink()
    stale = tmp_path / "o" / "standin_grad" / ".chunk_0000001.npy.99999.tmp"  # half-written by a killed run
    stale.write_bytes(b"\x93NUMPY half")
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", *args) == 0
    assert not stale.exists()
    summary = json.loads((tmp_path / "o" / "summary-p0.json").read_text())
    assert summary["frames_computed"] == 2 and summary["frames_resumed"] == 4 and summary["complete"]
    assert {p.name: p.read_bytes() for p in (tmp_path / "o" / "standin_grad").iterdir()} == before
    capsys.readouterr()
    code = _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--chunk", 4,
                    "--option", "standin_grad.scale=3")
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "different job" in err and "scale" in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "o" / "standin_grad").iterdir()} == before


def test_a_rerun_with_other_weights_is_refused(tmp_path, agent_card, capsys):
    """The same card and options with another parameter file (--model) is another job: its params checksum
    differs, so the rerun is refused instead of resuming, and no map of the other weights joins the old ones."""
    other = make_agent_files(tmp_path / "other", seed=1).with_suffix(".msgpack")
    np.save(tmp_path / "x.npy", frames(6))
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--chunk", 4) == 0
    (tmp_path / "o" / "standin_grad" / "chunk_0000001.npy").unlink()
    before = sorted((tmp_path / "o").rglob("*"))
    capsys.readouterr()
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--chunk", 4, "--model", other) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "different job" in err and "params_checksum" in err, err
    assert sorted((tmp_path / "o").rglob("*")) == before


CHANNEL_FIRST_AGENT = """
import jaxsal_agents


def load():
    agent = jaxsal_agents.load({card!r})
    return (lambda params, x: agent.apply_fn(params, x.transpose(0, 2, 3, 1))), agent.params
"""


@pytest.mark.parametrize("model", ["NHWC", "NCHW"])
def test_a_buffer_in_either_layout_gives_the_same_maps(tmp_path, agent_card, model):
    """Frames saved channel-last (N, H, W, 4) and channel-first (N, 4, H, W) reach the model in its own layout,
    transposed per chunk: the maps and outputs of both files are the same, for a channel-last model and for a
    channel-first one (square frames: a transpose that also swapped H and W would keep every shape)."""
    x = frames(6, seed=3)
    x[:, 0, :, :] = 255  # rows and columns differ: a swap of H and W changes the frames
    np.save(tmp_path / "nhwc.npy", x)
    np.save(tmp_path / "nchw.npy", x.transpose(0, 3, 1, 2))
    agent, extra = agent_card, []
    if model == "NCHW":
        (tmp_path / "nchw_agent.py").write_text(CHANNEL_FIRST_AGENT.format(card=str(agent_card)))
        agent, extra = f"{tmp_path}/nchw_agent.py:load", ["--layout", "NCHW"]
    for name in ("nhwc", "nchw"):
        assert _explain(agent, tmp_path / f"{name}.npy", tmp_path / name, "--chunk", 4, *extra,
                        methods="gradient") == 0
    want = jaxsal.load_maps(tmp_path / "nhwc", "gradient")
    assert want.shape == (6, 10, 10)
    np.testing.assert_array_equal(np.asarray(jaxsal.load_maps(tmp_path / "nchw", "gradient")), np.asarray(want))
    got, want = jaxsal.load_outputs(tmp_path / "nchw"), jaxsal.load_outputs(tmp_path / "nhwc")
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)


def test_failed_start_does_not_block_a_corrected_rerun(tmp_path, agent_card, capsys):
    np.save(tmp_path / "x.npy", frames(4))
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--target", "no_such_target") == 2
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--option", "standin_noise.n_masks=0",
                    methods="standin_noise") == 2  # fails inside the method, after the manifest
    err = capsys.readouterr().err
    assert err.count("jaxsal: error:") == 2 and "Traceback" not in err
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--option", "standin_noise.n_masks=3",
                    methods="standin_noise") == 0
    assert store.read_manifest(tmp_path / "o")["config"]["methods"]["standin_noise"]["options"] == {"n_masks": 3}


def test_stochastic_method_deterministic_under_seed(tmp_path, agent_card):
    np.save(tmp_path / "x.npy", frames(5))
    for d, seed in (("a", 1), ("b", 1), ("c", 2)):
        assert _explain(agent_card, tmp_path / "x.npy", tmp_path / d, "--seed", seed, "--chunk", 2,
                        "--option", "standin_noise.n_masks=6", methods="standin_noise") == 0
    a, b, c = (np.asarray(jaxsal.load_maps(tmp_path / d, "standin_noise")) for d in "abc")
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, c)


def test_progress_and_summary(tmp_path, agent_card, capsys):
    np.save(tmp_path / "x.npy", frames(4))
    code = main(["explain", "--agent", str(agent_card), "--methods", "standin_grad,twice=standin_grad",
                 "--option", "twice.scale=2", "--input", str(tmp_path / "x.npy"), "--out", str(tmp_path / "o")])
    out, err = capsys.readouterr()
    assert code == 0
    assert "frame/s" in err and "4/4" in err  # tqdm bar with rate
    assert "frames: 4" in out and "maps/s per method: standin_grad" in out and "twice" in out
    assert "wall time" in out and str((tmp_path / "o").absolute()) in out
    _close(np.asarray(jaxsal.load_maps(tmp_path / "o", "twice")),
           2 * np.asarray(jaxsal.load_maps(tmp_path / "o", "standin_grad")))


@pytest.mark.slow  # end to end, 3-10 s: the slow stage (CI runs it)
def test_play_rollout_saved_and_reused(tmp_path, agent_card, capsys):
    argv = ["explain", "--agent", str(agent_card), "--methods", "standin_grad", "--play", "5",
            "--out", str(tmp_path / "o")]
    assert main(argv) == 0
    obs = np.load(tmp_path / "o" / "input" / "obs.npy")
    assert obs.shape == (5, 10, 10, 4) and obs.dtype == np.uint8
    assert jaxsal.load_maps(tmp_path / "o", "standin_grad").shape == (5, 10, 10)
    capsys.readouterr()
    summary = (tmp_path / "o" / "summary-p0.json").read_bytes()
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "reusing the rollout" in said and "0 computed now, 5 already done" in said
    assert (tmp_path / "o" / "summary-p0.json").read_bytes() == summary  # a finished job: nothing rewritten


def test_real_methods_through_the_cli(tmp_path, agent_card):
    if not {"gradcam", "rise"} <= set(jaxsal.methods()):
        pytest.skip("gradcam/rise not registered")
    np.save(tmp_path / "x.npy", frames(3))
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--option", "gradcam.layer=conv1",
                    "--option", "rise.n_masks=8", methods="gradcam,rise") == 0
    for m in ("gradcam", "rise"):
        maps = np.asarray(jaxsal.load_maps(tmp_path / "o", m))
        assert maps.shape == (3, 10, 10) and np.isfinite(maps).all()


# --------------------------------------------------------------------------- bad input
def _bad_cases(tmp, card):
    np.save(tmp / "ok.npy", frames(3))
    np.save(tmp / "flat.npy", np.zeros((3, 10, 10), np.uint8))
    np.save(tmp / "atari.npy", np.zeros((3, 84, 84, 4), np.uint8))
    nan = frames(4).astype(np.float32)
    nan[3, 0, 0, 0] = np.nan
    np.save(tmp / "nan.npy", nan)
    (tmp / "bad.npz").write_bytes(b"junk")
    (tmp / "bad.msgpack").write_bytes(b"\x00\x01junk")
    (tmp / "afile").write_text("x")
    big = make_agent_files(tmp / "big", num_actions=6)
    write_dopamine(tmp / "dop", 0, np.zeros((8, 10, 10), np.uint8), np.zeros(8),  # serves indices 4, 5, 6
                   actions=np.array([0, 1, 0, 2, 3, 5, 1, 0]))
    write_dopamine(tmp / "dop_old", 0, np.zeros((8, 10, 10), np.uint8), np.zeros(8), counters=False)
    ok, c = str(tmp / "ok.npy"), str(card)
    base = ["explain", "--agent", c, "--methods", "standin_grad", "--out", str(tmp / "o"), "--quiet"]
    return {
        "missing input": (base + ["--input", str(tmp / "none.npy")], "does not exist"),
        "wrong shape": (base + ["--input", str(tmp / "flat.npy")], "(N, 84, 84, 4)"),
        "wrong frame size": (base + ["--input", str(tmp / "atari.npy")], "expects"),
        "corrupt npz": (base + ["--input", str(tmp / "bad.npz")], "not a valid .npz"),
        "unknown method": (base[:4] + ["nosuch"] + base[5:] + ["--input", ok], "unknown method 'nosuch'"),
        "unknown option": (base + ["--input", ok, "--option", "standin_grad.bogus=1"], "no option 'bogus'"),
        "option syntax": (base + ["--input", ok, "--option", "scale=2"], "METHOD.NAME=VALUE"),
        "option other method": (base + ["--input", ok, "--option", "rise.n_masks=5"], "not in --methods"),
        "unknown agent": (["explain", "--agent", "no-such-agent", "--methods", "standin_grad", "--input", ok,
                           "--out", str(tmp / "o")], "unknown agent"),
        "missing model": (base + ["--input", ok, "--model", str(tmp / "none.msgpack")], "does not exist"),
        "corrupt model": (base + ["--input", ok, "--model", str(tmp / "bad.msgpack")], "corrupt"),
        "model of other game": (base + ["--input", ok, "--model", str(big.with_suffix(".msgpack"))],
                                "does not match the model"),
        "action mismatch (buffer)": (base + ["--input", str(tmp / "dop")], "different games"),
        "dopamine without add_count": (base + ["--input", str(tmp / "dop_old")], "no add_count_ckpt.0.gz"),
        "action mismatch (play)": (base + ["--play", "5", "--game", "minatar-asterix"], "actions"),
        "out is a file": (base[:-3] + ["--out", str(tmp / "afile"), "--input", ok], "not a directory"),
        "out under a file": (base[:-3] + ["--out", str(tmp / "afile" / "sub"), "--input", ok], "part of its path is a file"),
        "input and play": (base + ["--input", ok, "--play", "3"], "exactly one"),
        "bad chunk": (base + ["--input", ok, "--chunk", "0"], "chunk"),
        "bad batch": (base + ["--input", ok, "--batch-size", "-1"], "--batch-size"),
        "NaN frames": (base + ["--input", str(tmp / "nan.npy"), "--chunk", "2", "--out", str(tmp / "o_nan")],
                       "frame 3 of the input holds NaN"),
        "distributed without coordinator": (base + ["--input", ok, "--num-processes", "2", "--process-id", "0"],
                                            "--coordinator"),
    }


def test_bad_input_one_line_nonzero_no_traceback(tmp_path, agent_card, capsys):
    cases = _bad_cases(tmp_path, agent_card)
    for name, (argv, fragment) in cases.items():
        capsys.readouterr()
        code = main(argv)
        out, err = capsys.readouterr()
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2, (name, code, err)
        assert len(lines) == 1 and lines[0].startswith("jaxsal: error: "), (name, err)
        assert fragment in lines[0], (name, lines[0])
        assert "Traceback" not in err + out, name


def test_disk_full_keeps_finished_chunks(tmp_path, agent_card, monkeypatch, capsys):
    np.save(tmp_path / "x.npy", frames(8))
    real, calls = store.write_chunk, []

    def flaky(out, method, index, maps):
        calls.append(index)
        if len(calls) > 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(store.chunk_path(out, method, index)))
        real(out, method, index, maps)

    monkeypatch.setattr(store, "write_chunk", flaky)
    code = _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--chunk", 2)
    err = capsys.readouterr().err.strip()
    assert code == 2 and "No space left on device" in err and "rerun" in err and "\n" not in err
    kept = sorted(p.name for p in (tmp_path / "o" / "standin_grad").glob("chunk_*.npy"))
    assert kept == ["chunk_0000000.npy", "chunk_0000001.npy"]
    first = (tmp_path / "o" / "standin_grad" / "chunk_0000000.npy").read_bytes()
    monkeypatch.setattr(store, "write_chunk", real)
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--chunk", 2) == 0
    assert (tmp_path / "o" / "standin_grad" / "chunk_0000000.npy").read_bytes() == first
    assert jaxsal.load_maps(tmp_path / "o", "standin_grad").shape == (8, 10, 10)


def test_a_chunk_cut_off_mid_write_is_never_left_as_done(tmp_path, agent_card, monkeypatch, capsys):
    """The disk fills in the middle of chunk 1's bytes: chunks are written to a temp file and renamed only when
    complete, so neither a partial chunk_0000001.npy (which a rerun would take as done) nor the temp file is
    left, and the rerun computes the chunk and ends with the maps of an uninterrupted run."""
    import io

    np.save(tmp_path / "x.npy", frames(6))
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "ref", "--chunk", 2) == 0
    real, calls = np.save, []

    def cut_off(file, arr, *args, **kwargs):  # write_chunk's np.save: half the bytes of the second chunk land
        calls.append(1)
        if len(calls) != 2:
            return real(file, arr, *args, **kwargs)
        whole = io.BytesIO()
        real(whole, arr, *args, **kwargs)
        file.write(whole.getvalue()[:len(whole.getvalue()) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(np, "save", cut_off)
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--chunk", 2) == 2
    monkeypatch.undo()
    assert "no space left" in capsys.readouterr().err.lower()
    assert sorted(p.name for p in (tmp_path / "o" / "standin_grad").iterdir()) == ["chunk_0000000.npy", "meta.json"]
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--chunk", 2) == 0
    np.testing.assert_array_equal(np.asarray(jaxsal.load_maps(tmp_path / "o", "standin_grad")),
                                  np.asarray(jaxsal.load_maps(tmp_path / "ref", "standin_grad")))


def test_incomplete_job_load_maps_says_rerun(tmp_path, agent_card):
    np.save(tmp_path / "x.npy", frames(4))
    assert _explain(agent_card, tmp_path / "x.npy", tmp_path / "o", "--chunk", 2) == 0
    (tmp_path / "o" / "standin_grad" / "chunk_0000001.npy").unlink()
    with pytest.raises(jaxsal.SaliencyInputError, match="incomplete.*rerun"):
        jaxsal.load_maps(tmp_path / "o", "standin_grad")
