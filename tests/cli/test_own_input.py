"""No silently wrong answer: swapped layouts and off-scale pixels are one clear error (API and CLI,
nothing written), q_action uses a Dopamine buffer's actions, SIGINT exits 130 and resumes, and
finished chunks of an incomplete job load and render."""
import os
import signal

import jax
import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from tests._support import foreign_agents as F
from tests._support.cli_support import files_at_least, frames, make_agent_files, start_job
from tests.io.test_readers import write_dopamine

LAYOUT_METHODS = ["gradient", "guided_backprop", "gradcam", "g2gradcam", "integrated_gradients"]


@pytest.fixture(scope="module")
def cleanrl_q():
    q = F.QNetwork(action_dim=4)
    return q.apply, q.init(jax.random.PRNGKey(0), F.atari_nchw(1))


@pytest.mark.parametrize("method", LAYOUT_METHODS)
def test_channel_first_frames_without_layout_is_an_error(cleanrl_q, method):
    apply_fn, params = cleanrl_q
    x = F.atari_nchw(2)
    with pytest.raises(jaxsal.SaliencyInputError, match="layout='NCHW'"):
        jaxsal.explain(apply_fn, params, x, method=method)
    assert np.asarray(jaxsal.explain(apply_fn, params, x, method=method, layout="NCHW")).shape == (2, 84, 84)


def test_channel_last_frames_to_a_declared_nchw_model_is_an_error(cleanrl_q):
    from jaxsal.agent_spec import DeclaredFn

    apply_fn, params = cleanrl_q
    with pytest.raises(jaxsal.SaliencyInputError, match="channel-last"):
        jaxsal.explain(DeclaredFn(apply_fn, "NCHW"), params, F.atari_nchw(2).transpose(0, 2, 3, 1))


@pytest.fixture(scope="module")
def atari_card(tmp_path_factory):
    return make_agent_files(tmp_path_factory.mktemp("atari"), num_actions=4, game="breakout")


BAD_PIXELS = {"floats in [0, 1]": (lambda x: x.astype(np.float32) / 255.0, "0..255"),
              "negative": (lambda x: x.astype(np.float32) - 128.0, "0..255"),
              "above 255": (lambda x: x.astype(np.float32) * 2.0, "0..255")}


def test_off_scale_pixels_api(atari_card):
    import jaxsal_agents

    agent = jaxsal_agents.load(str(atari_card))
    x = frames(2, seed=1, size=84)
    for name, (bad, fragment) in BAD_PIXELS.items():
        with pytest.raises(jaxsal.SaliencyInputError, match=fragment):
            jaxsal.explain(agent.apply_fn, agent.params, bad(x), method="gradient")


def test_off_scale_pixels_cli_one_line_nothing_written(tmp_path, atari_card, capsys):
    x = frames(5, seed=1, size=84)
    for i, (name, (bad, fragment)) in enumerate(BAD_PIXELS.items()):
        np.save(tmp_path / f"in{i}.npy", bad(x))
        out = tmp_path / f"out{i}"
        capsys.readouterr()
        code = main(["explain", "--agent", str(atari_card), "--methods", "gradient", "--input",
                     str(tmp_path / f"in{i}.npy"), "--out", str(out), "--quiet"])
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert code == 2 and len(err) == 1 and err[0].startswith("jaxsal: error:") and fragment in err[0], (name, err)
        assert not out.exists() or not any(out.rglob("chunk_*")), name


def test_q_action_uses_the_dopamine_actions(tmp_path):
    card = make_agent_files(tmp_path / "agent", num_actions=3)
    single = frames(9, seed=4)[..., 0]
    actions = np.array([2, 0, 1, 1, 2, 0, 0, 1, 2])
    write_dopamine(tmp_path / "dop", 0, single, np.zeros(9, bool), actions, add_count=15)  # serves 1..4
    out = tmp_path / "out"
    assert main(["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(tmp_path / "dop"),
                 "--out", str(out), "--quiet", "--target", "q_action", "--chunk", "3"]) == 0
    import jaxsal_agents

    agent = jaxsal_agents.load(str(card))
    src = jaxsal.io.open_source(tmp_path / "dop")
    x, index = src.read(0, len(src)), src.row_ids(0, len(src))["index"]
    np.testing.assert_array_equal(index, [1, 2, 3, 4])
    want = jaxsal.explain(agent.apply_fn, agent.params, x, method="standin_grad", target="q_action",
                          actions=actions[index])
    np.testing.assert_allclose(np.asarray(jaxsal.load_maps(out, "standin_grad")), np.asarray(want), rtol=0,
                               atol=1e-5 * float(np.abs(want).max()))
    o = jaxsal.load_outputs(out)
    np.testing.assert_array_equal(o["index"], index)
    np.testing.assert_array_equal(o["action"], actions[o["index"]])  # maps join with the buffer's actions
    np.testing.assert_allclose(o["q"], np.asarray(agent.apply_fn(agent.params, x)), atol=1e-5)
    assert jaxsal.io.read_manifest(out)["resolved"]["standin_grad"]["options"]["target"] == "q_action"


@pytest.mark.slow  # end to end, 3-10 s: the slow stage (CI runs it)
def test_sigint_exits_130_resumes_and_partial_renders(tmp_path):
    card = make_agent_files(tmp_path / "agent")
    np.save(tmp_path / "buf.npy", frames(30, seed=7))
    args = ["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(tmp_path / "buf.npy"),
            "--chunk", "3", "--quiet"]
    out = tmp_path / "out"
    proc = start_job(args, out, files_at_least(2, "standin_grad/chunk_*.npy"), slow_write=0.4)
    written = len(list(out.glob("standin_grad/chunk_*.npy")))
    assert proc.poll() is None, f"the job ended (rc {proc.returncode}) before the interrupt, {written} chunks written"
    os.kill(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    err = proc.stderr.read().decode()
    assert proc.returncode == 130, (proc.returncode, written, err[-2000:])
    assert "interrupted" in err and "Traceback" not in err
    done = len(list(out.glob("standin_grad/chunk_*.npy")))
    assert 2 <= done < 10
    part = jaxsal.load_maps(out, "standin_grad", allow_incomplete=True)
    assert np.isfinite(part[:3]).all() and np.isnan(part[27:]).all()
    assert len(jaxsal.load_outputs(out, allow_incomplete=True)["action"]) >= 3 * (done - 1)
    from jaxsal.cli.render.gallery import render_dir

    res = render_dir(out, videos=(), grid_frames=3)
    assert res["pngs"][0].exists()
    assert main(args + ["--out", str(out)]) == 0
    assert np.isfinite(np.asarray(jaxsal.load_maps(out, "standin_grad"))).all()
