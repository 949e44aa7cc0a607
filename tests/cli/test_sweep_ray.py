"""`jaxsal sweep --ray local|ADDRESS`: the cells as Ray tasks (the cell spec as JSON in, its record as
JSON out) writing into the shared --out, the same table as a local run; Ray is an optional extra
(jaxsal[ray]) whose absence is one line naming the install."""
import importlib.util
import os
import subprocess
import sys

import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from tests._support.cli_support import ROOT, frames, make_agent_files

N = 3
CONFIG = """
agents = ["runs/*.msgpack"]
inputs = ["buf.npy", { play = 4, seed = 1 }]
metrics = ["insertion"]
chunk = 2
[methods]
gradient = {}
gradcam = { layer = "conv1" }
"""


def _setup(d):
    make_agent_files(d / "runs", seed=0)
    make_agent_files(d / "runs", seed=1)
    np.save(d / "buf.npy", frames(N, seed=1))
    (d / "sweep.toml").write_text(CONFIG)
    return d / "sweep.toml"


def _table(out):
    return {k: v for k, v in jaxsal.load_sweep(out).items() if k != "seconds"}


def test_without_ray_one_line_naming_the_extra_nothing_written(tmp_path, monkeypatch, capsys):
    cfg = _setup(tmp_path)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "out"), "--ray", "local", "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--ray needs Ray" in err[0] and "pip install 'jaxsal[ray]'" in err[0]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, words", [
    (["--cpus-per-cell", "2"], ["--cpus-per-cell", "are for --ray"]),
    (["--gpus-per-cell", "1"], ["--gpus-per-cell", "are for --ray"]),
    (["--ray", "local", "--workers", "2"], ["--workers is for local processes", "--cpus-per-cell"]),
    (["--ray", "local", "--cpus-per-cell", "0"], ["--cpus-per-cell must be positive"]),
    (["--ray", "local:two"], ["'local:two'", "local:CPUS"]),
])
def test_ray_options_refused_in_one_line(tmp_path, capsys, extra, words):
    cfg = _setup(tmp_path)
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "out"), "--quiet", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and all(w in err[0] for w in words), err
    assert not (tmp_path / "out").exists()


def test_ray_task_env_cpu_without_gpus_and_a_memory_share_for_a_gpu_fraction():
    from jaxsal.cli.sweep_run import ray_task_env

    assert ray_task_env(0) == {"env_vars": {"JAX_PLATFORMS": "cpu"}}
    assert ray_task_env(0.25) == {"env_vars": {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.225"}}
    assert ray_task_env(1) is None and ray_task_env(2) is None


@pytest.mark.slow
def test_ray_local_gives_the_local_table(tmp_path, capsys):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'jaxsal[ray]')")
    import ray

    cfg = _setup(tmp_path)
    # the local run in a process on the CPU, as the Ray tasks without --gpus-per-cell
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT))
    subprocess.run([sys.executable, "-m", "jaxsal.cli", "sweep", str(cfg), "--out", str(tmp_path / "local"),
                    "--quiet"], env=env, check=True, timeout=600)
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "ray"), "--ray", "local:2"]) == 0
    said = capsys.readouterr().out
    assert "Ray tasks (local:2, 1 CPU(s) each)" in said and "8 of 8 cells ok" in said
    assert not ray.is_initialized()                                   # the instance it started is shut down
    a, b = _table(tmp_path / "local"), _table(tmp_path / "ray")
    assert a.keys() == b.keys() and set(a["status"]) == {"ok"}
    for k in a:
        np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    # the played rollout was played once per checkpoint and shared by its methods, in the shared --out
    assert len(list((tmp_path / "ray" / "cells").rglob("_rollout/input/obs.npy"))) == 2
    # a rerun has nothing to do: the same table, no Ray instance needed for the finished cells
    before = (tmp_path / "ray" / "results.csv").read_bytes()
    assert main(["sweep", str(cfg), "--out", str(tmp_path / "ray"), "--ray", "local:2", "--quiet"]) == 0
    assert (tmp_path / "ray" / "results.csv").read_bytes() == before


@pytest.mark.slow
def test_a_ray_task_that_raises_is_recorded_and_the_others_complete(tmp_path, monkeypatch, capsys):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (pip install 'jaxsal[ray]')")
    make_agent_files(tmp_path / "runs", seed=0)
    np.save(tmp_path / "buf.npy", frames(N, seed=1))
    (tmp_path / "sweep.toml").write_text('agents = ["runs/*.msgpack"]\ninputs = ["buf.npy"]\n[methods]\n'
                                         'gradient = {}\ngradcam = { layer = "conv9" }\n')
    # JAXSAL_DEBUG (inherited by the Ray workers) makes the cell raise out of its task instead of
    # recording its own error: the sweep records the failed task
    monkeypatch.setenv("JAXSAL_DEBUG", "1")
    assert main(["sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "out"), "--ray", "local:2",
                 "--quiet"]) == 1
    t = jaxsal.load_sweep(tmp_path / "out")
    assert list(t["status"]) == ["ok", "error"]
    assert t["error"][1].startswith("Ray task failed") and "conv9" in t["error"][1]
    assert "cell cells/runs/tiny0/buf/gradcam failed: Ray task failed" in capsys.readouterr().err
