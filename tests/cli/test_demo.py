"""`jaxsal demo` end to end on a few frames, and `jaxsal agents`."""
import json

import numpy as np
import pytest
from PIL import Image

import jaxsal
from jaxsal.cli import main
from tests._support import cli_support  # noqa: F401  (registers the test stand-in methods)

pytestmark = pytest.mark.slow  # the demo end to end (make demo runs it too)


def test_demo_end_to_end_few_frames(tmp_path, capsys):
    pytest.importorskip("envpool")
    out = tmp_path / "demo"
    code = main(["demo", "--steps", "6", "--out", str(out), "--methods", "standin_grad,gradcam", "--quiet"])
    assert code == 0, capsys.readouterr().err
    maps = jaxsal.load_maps(out, "gradcam")
    assert maps.shape[1:] == (84, 84) and 1 <= len(maps) <= 6 and np.isfinite(np.asarray(maps)).all()
    assert json.loads((out / "manifest.json").read_text())["demo"] is True
    gal = out / "gallery"
    with Image.open(gal / "grid.png") as im:
        im.verify()
    assert (gal / "episode.mp4").read_bytes()[4:8] == b"ftyp"
    with Image.open(gal / "episode.gif") as im:
        assert im.n_frames == len(maps)
    assert "episode.mp4" in (gal / "index.html").read_text()

    # not quiet: throughput and where to look
    code = main(["demo", "--steps", "4", "--out", str(out), "--methods", "standin_grad", "--no-gif"])
    text = capsys.readouterr().out
    assert code == 0 and "maps/s per method: standin_grad" in text and "index.html" in text


def test_demo_refuses_a_non_demo_directory(tmp_path, capsys):
    (tmp_path / "job").mkdir()
    manifest = {"format": 1, "config": {"methods": {}, "chunk": 64, "n": 0}}  # an explain job's, not a demo's
    (tmp_path / "job" / "manifest.json").write_text(json.dumps(manifest))
    assert main(["demo", "--out", str(tmp_path / "job")]) == 2
    assert "non-demo" in capsys.readouterr().err
    assert (tmp_path / "job" / "manifest.json").exists()  # refused, not cleared


def test_demo_refuses_a_directory_with_a_corrupt_manifest(tmp_path, capsys):
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "manifest.json").write_text(json.dumps({"format": 1, "config": {}}))
    assert main(["demo", "--out", str(tmp_path / "job")]) == 2
    err = capsys.readouterr().err
    assert "corrupt" in err and "--out" in err
    assert (tmp_path / "job" / "manifest.json").exists()


def test_agents_lists_shipped(capsys):
    import jaxsal_agents

    assert main(["agents"]) == 0
    out = capsys.readouterr().out
    for name in jaxsal_agents.available():
        assert name in out
    if not jaxsal_agents.available():
        assert "no shipped agents" in out
