"""Scale-out and memory: 4 forced host devices == 1 device; two jax.distributed processes fill one
output; peak memory stays flat when the buffer grows 12x."""
import json
import re
import socket
import subprocess
import sys

import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from tests._support.cli_support import ROOT, cli_env, frames, make_agent_files, run_cli
import pytest

pytestmark = pytest.mark.slow  # subprocesses, multi-device and buffer-size scaling


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _args(card, inp, out, *extra):
    return ["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(inp), "--out", str(out),
            "--quiet", *map(str, extra)]


def test_sharded_over_four_devices_equals_one(tmp_path):
    card = make_agent_files(tmp_path / "agent")
    np.save(tmp_path / "x.npy", frames(13, seed=3))
    assert main(_args(card, tmp_path / "x.npy", tmp_path / "one", "--chunk", 5)) == 0
    r = run_cli(*_args(card, tmp_path / "x.npy", tmp_path / "four", "--chunk", 5),
                env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert json.loads((tmp_path / "four" / "summary-p0.json").read_text())["devices"] == 4
    one = np.asarray(jaxsal.load_maps(tmp_path / "one", "standin_grad"))
    four = np.asarray(jaxsal.load_maps(tmp_path / "four", "standin_grad"))
    np.testing.assert_allclose(four, one, rtol=0, atol=1e-5 * np.abs(one).max())


@pytest.mark.slow  # two jax.distributed CLI processes; the 4-device subprocess above stays in the fast loop
def test_two_processes_share_one_output(tmp_path):
    card = make_agent_files(tmp_path / "agent")
    np.save(tmp_path / "x.npy", frames(10, seed=4))
    assert main(_args(card, tmp_path / "x.npy", tmp_path / "single", "--chunk", 3)) == 0
    port = _free_port()
    env = cli_env()  # same XLA kernels as the in-process single run above (exact equality asserted)
    procs = [subprocess.Popen([sys.executable, str(ROOT / "tests" / "_support" / "cli_support.py"),
                               *_args(card, tmp_path / "x.npy", tmp_path / "multi", "--chunk", 3,
                                      "--coordinator", f"localhost:{port}", "--num-processes", 2, "--process-id", pid)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for pid in (0, 1)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    s0, s1 = (json.loads((tmp_path / "multi" / f"summary-p{i}.json").read_text()) for i in (0, 1))
    assert (s0["frames_computed"], s1["frames_computed"]) == (6, 4)  # chunks 0,2 and 1,3 of 3 frames
    np.testing.assert_array_equal(np.asarray(jaxsal.load_maps(tmp_path / "multi", "standin_grad")),
                                  np.asarray(jaxsal.load_maps(tmp_path / "single", "standin_grad")))


def _peak_rss_mb(card, inp, out):
    r = run_cli("explain", "--agent", card, "--methods", "standin_pool", "--input", inp, "--out", out, "--quiet",
                "--chunk", 256, "--dtype", "float16", env={"JAXSAL_TEST_RSS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    peak, base = re.search(r"PEAK_RSS_KB=(\d+) BASE_RSS_KB=(\d+)", r.stderr).groups()
    return int(peak) / 1024, int(base) / 1024


@pytest.mark.slow  # two CLI subprocesses over 160 MB of frames
def test_peak_memory_flat_in_buffer_size(tmp_path):
    card = make_agent_files(tmp_path / "agent", game="breakout", num_actions=4)
    rng = np.random.default_rng(0)
    for name, n in (("small", 512), ("large", 5120)):  # 14 MB vs 145 MB of uint8 frame stacks
        arr = np.lib.format.open_memmap(tmp_path / f"{name}.npy", "w+", np.uint8, (n, 84, 84, 4))
        for i in range(0, n, 512):
            arr[i:i + 512] = rng.integers(0, 256, (min(512, n - i), 84, 84, 4), dtype=np.uint8)
        arr.flush()
        del arr
    (small, base_s), (large, base_l) = (_peak_rss_mb(card, tmp_path / f"{k}.npy", tmp_path / f"o_{k}")
                                        for k in ("small", "large"))
    maps = jaxsal.load_maps(tmp_path / "o_large", "standin_pool")
    assert maps.shape == (5120, 84, 84) and maps.dtype == np.float16
    # the input grew by 130 MB (and the output by 70 MB); the job's peak may only wobble
    print(f"peak RSS: {small:.0f} MB for 512 frames, {large:.0f} MB for 5120 frames "
          f"(after imports: {base_s:.0f} / {base_l:.0f} MB)")
    assert large - small < 50, (small, large)
