"""Jobs that must end well: a target without an action stores none, a finished job reruns on a
read-only disk, SIGTERM stops like Ctrl-C (resumable, nothing partial counted), `jaxsal render` finds
the input from any directory (old manifests too), `jaxsal agents` counts frames as the cards do."""
import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from jaxsal.io import store
from tests._support.cli_support import ROOT, files_at_least, frames, make_agent_files, start_job

AC_AGENT = '''
import flax.linen as nn
import jax
import jax.numpy as jnp


class AC(nn.Module):   # a tiny actor-critic: {"logits", "value"}
    @nn.compact
    def __call__(self, x):
        h = nn.relu(nn.Conv(8, (3, 3), name="conv1")(x / 255.0)).reshape(x.shape[0], -1)
        return {"logits": nn.Dense(3, name="pi")(h), "value": nn.Dense(1, name="v")(h)[:, 0]}


def load():
    m = AC()
    return m.apply, m.init(jax.random.PRNGKey(0), jnp.zeros((1, 10, 10, 4)))
'''


@pytest.fixture(scope="module")
def card(tmp_path_factory):
    return make_agent_files(tmp_path_factory.mktemp("agent"))


def _explain(agent, inp, out, *extra, methods="standin_grad"):
    return main(["explain", "--agent", str(agent), "--methods", methods, "--input", str(inp), "--out", str(out),
                 "--quiet", *map(str, extra)])


def _files(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(Path(d).rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- 7a: no action for value
def test_value_target_stores_no_action(tmp_path):
    from jaxsal.cli.render.gallery import _captions

    (tmp_path / "ac.py").write_text(AC_AGENT)
    np.save(tmp_path / "x.npy", frames(5))
    agent = f"{tmp_path / 'ac.py'}:load"
    assert _explain(agent, tmp_path / "x.npy", tmp_path / "v", "--target", "value", "--chunk", 3) == 0
    o = jaxsal.load_outputs(tmp_path / "v")
    assert "action" not in o, "a value map explains no action"
    assert o["value"].shape == (5,) and o["logits"].shape == (5, 3)
    caps = _captions(tmp_path / "v", 0, 5, store.load_outputs)
    assert len(caps) == 5 and all("no action" in c and "V = " in c and "action 0" not in c for c in caps.values())
    # a job of an older jaxsal stored action 0 for every frame: still not read as an action
    for p in sorted((tmp_path / "v" / "_outputs").glob("chunk_*.npz")):
        with np.load(p) as z:
            arrays = dict(z)
        arrays["action"] = np.zeros(len(arrays["value"]), np.int32)
        with open(p, "wb") as f:
            store._write_npz(f, arrays)
    assert "action" not in jaxsal.load_outputs(tmp_path / "v")
    # a target that depends on the action stores it
    assert _explain(agent, tmp_path / "x.npy", tmp_path / "p", "--target", "policy_logit") == 0
    o = jaxsal.load_outputs(tmp_path / "p")
    np.testing.assert_array_equal(o["action"], o["logits"].argmax(-1))


# --------------------------------------------------------------------------- 7c: read-only rerun (read_only: conftest.py)
def test_finished_job_reruns_read_only(tmp_path, card, read_only, capsys):
    np.save(tmp_path / "x.npy", frames(6))
    out = tmp_path / "o"
    assert _explain(card, tmp_path / "x.npy", out, "--chunk", 4) == 0
    before = _files(out)
    capsys.readouterr()
    read_only(out)
    code = _explain(card, tmp_path / "x.npy", out, "--chunk", 4)
    err = capsys.readouterr().err
    assert code == 0, err
    assert _files(out) == before
    # an unfinished job on a read-only disk: one line naming the fix
    code = _explain(card, tmp_path / "x.npy", tmp_path / "o" / "sub", "--chunk", 4)
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.count("\n") == 0 and "writable --out" in err


# --------------------------------------------------------------------------- 7d: SIGTERM
@pytest.mark.slow
def test_sigterm_stops_like_ctrl_c_and_resumes(tmp_path):
    card = make_agent_files(tmp_path / "agent")
    np.save(tmp_path / "buf.npy", frames(30, seed=7))
    args = ["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(tmp_path / "buf.npy"),
            "--chunk", "3", "--quiet"]
    assert main(args + ["--out", str(tmp_path / "ref")]) == 0
    ref = {k: v for k, v in _files(tmp_path / "ref").items() if "chunk_" in k}
    out = tmp_path / "out"
    proc = start_job(args, out, files_at_least(2, "standin_grad/chunk_*.npy"), slow_write=0.4)
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=120)
    err = proc.stderr.read().decode()
    lines = [line for line in err.splitlines() if line.strip()]
    assert proc.returncode == 143, (proc.returncode, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("jaxsal: error: terminated (SIGTERM)"), err[-2000:]
    assert "rerun the same command to resume" in lines[0] and "Traceback" not in err
    got = {k: v for k, v in _files(out).items() if "chunk_" in k}
    done = sum(f"standin_grad/chunk_{i:07d}.npy" in got and f"_outputs/chunk_{i:07d}.npz" in got for i in range(10))
    assert 2 <= done < 10 and f"{done} of 10 chunks are saved in {out}" in lines[0], lines[0]
    assert all(got[k] == ref[k] for k in got)  # what is there is whole and final
    assert main(args + ["--out", str(out)]) == 0
    assert {k: v for k, v in _files(out).items() if "chunk_" in k} == ref
    assert not list(out.rglob("*.tmp"))


# --------------------------------------------------------------------------- 7e: render from anywhere
def test_render_finds_the_input_from_another_directory(tmp_path, card, monkeypatch):
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir()
    elsewhere.mkdir()
    np.save(work / "buf.npy", frames(6))
    monkeypatch.chdir(work)
    assert _explain(card, "buf.npy", "maps", "--chunk", 4) == 0  # relative paths, as people type them
    monkeypatch.chdir(elsewhere)
    argv = ["render", str(work / "maps"), "--video", "none", "--quiet"]
    assert main(argv) == 0
    assert (work / "maps" / "gallery" / "grid.png").exists()
    # a manifest written before paths were absolute: found beside the output directory, checked by checksum
    m = json.loads((work / "maps" / store.MANIFEST).read_text())
    m["input_source"]["path"] = "buf.npy"
    (work / "maps" / store.MANIFEST).write_text(json.dumps(m))
    assert main(argv) == 0
    np.save(elsewhere / "buf.npy", frames(6, seed=9))   # another buffer of the same name where render runs
    assert main(argv) == 0                               # not taken: its checksum differs
    (work / "buf.npy").unlink()
    assert main(argv) == 2


def test_render_refuses_a_changed_input(tmp_path, card, capsys):
    np.save(tmp_path / "buf.npy", frames(6))
    assert _explain(card, tmp_path / "buf.npy", tmp_path / "maps") == 0
    np.save(tmp_path / "buf.npy", frames(6, seed=5))    # rewritten in place after the job
    capsys.readouterr()
    assert main(["render", str(tmp_path / "maps"), "--video", "none"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--input" in err and "changed" in err


def test_play_records_the_rollout_path_absolute(tmp_path, card, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["explain", "--agent", str(card), "--methods", "standin_grad", "--play", "4", "--out", "o",
                 "--quiet"]) == 0
    assert Path(store.read_manifest(tmp_path / "o")["input_source"]["path"]) == tmp_path / "o" / "input" / "obs.npy"


# --------------------------------------------------------------------------- 7h: frames, as the cards say
def test_agents_report_frames_as_the_cards_do(capsys):
    from jaxsal.plugins import agent_provider

    provider = agent_provider()
    if "breakout" not in provider.available():
        pytest.skip("shipped agents not installed")
    assert main(["agents"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    for name in provider.available():
        c = provider.card(name)
        if "frames_trained" in c:
            assert f"trained={c['frames_trained']:,} frames" in lines[name], lines[name]
            if c["frames_trained"] != c.get("env_steps_trained"):
                assert f"{c['env_steps_trained']:,} env steps x{c['frames_trained'] // c['env_steps_trained']}" \
                    in lines[name], lines[name]
    assert "trained=6,266,880 frames" in lines["breakout"]
    from jaxsal_agents.export import cards_markdown

    page = (ROOT / "docs" / "agents.md").read_text()
    assert "| 6,266,880 |" in page  # the documentation's table counts frames too
    assert cards_markdown() in page, ("docs/agents.md must hold the cards' table: paste the output of "
                                      "`python -m jaxsal_agents.export --table`")
