"""The GPU benchmark's parts that run anywhere: it installs nothing from the network, the 1M-frame
buffer step places (or shrinks) its buffer to fit the disk, and runs `jaxsal explain` end to end."""
import json
import re
import shutil
from collections import namedtuple

import numpy as np
import pytest

from experiments.benchmarks import buffer_end_to_end as E
from tests._support import ROOT


def test_gpu_scripts_install_nothing_from_the_network():
    """The lent GPU machine has no network: every pip install there is --no-index from .whl/."""
    for script in ("experiments/benchmarks/gpu_benchmark.sh", "agents/train_gpu.sh"):
        text = (ROOT / script).read_text()
        code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
        for m in re.finditer(r"pip (install|download)[^\n]*", code):
            assert m.group(1) == "install" and "--no-index" in m.group(0), (script, m.group(0))
    bench = (ROOT / "experiments/benchmarks/gpu_benchmark.sh").read_text()
    assert "agents/checkout_env.sh" in bench          # the checkout is imported, not installed
    assert "pip install -e" not in bench


Usage = namedtuple("Usage", "total used free")


def test_place_keeps_the_frames_that_fit(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(0, 0, E.need_bytes(5000) + 10))
    where, frames, note = E.place(5000, str(tmp_path))
    assert (where, frames, note) == (tmp_path, 5000, "")


def test_place_shrinks_the_buffer_and_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(0, 0, E.need_bytes(3000)))
    where, frames, note = E.place(2 ** 20, str(tmp_path))
    assert frames == 2048 and "2,048 of the 1,048,576" in note


def test_place_stops_when_nothing_fits(tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda p: Usage(0, 0, E.SLACK))
    with pytest.raises(SystemExit, match="pass --dir"):
        E.place(4096, str(tmp_path))


def test_write_buffer_is_a_plain_npy(tmp_path):
    E.write_buffer(tmp_path / "b.npy", 20, block=8)
    a = np.load(tmp_path / "b.npy", mmap_mode="r")
    assert a.shape == (20, 84, 84, 4) and a.dtype == np.uint8
    np.testing.assert_array_equal(a[8:16], a[:8])     # tiled from one block


@pytest.mark.slow
def test_buffer_end_to_end_explains_every_frame(tmp_path):
    res = E.main(["--frames", "300", "--methods", "gradient", "--dir", str(tmp_path), "--out", str(tmp_path / "res"),
                  "--tag", "t"])
    (run,) = res["runs"]
    assert "error" not in run, run
    assert run["frames"] == 300 and run["all_finite"] and run["maps_per_s"] > 0
    assert json.loads((tmp_path / "res" / "buffer_end_to_end_t.json").read_text())["frames"] == 300
    assert not list(tmp_path.glob("jaxsal-e2e-*"))   # buffer and maps removed


def test_throughput_writes_maps_per_s_and_the_device_memory_column(tmp_path):
    from experiments.benchmarks import throughput
    res = throughput.main(["--batches", "2", "--methods", "gradient", "--budget", "1", "--repeats", "1",
                           "--out", str(tmp_path), "--tag", "t"])
    (row,) = res["cases"]["gradient"]
    assert row["maps_per_s"] > 0 and row["first_call_s"] > 0
    md = (tmp_path / "throughput_t.md").read_text()
    assert "device peak MB so far" in md and "| gradient | 2 | 2 |" in md
