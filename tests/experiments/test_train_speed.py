"""experiments.benchmarks.train_speed's returns-per-CPU-hour table: which agents enter it and its arithmetic."""
from experiments.benchmarks import train_speed


def test_gain_per_cpu_hour_arithmetic():
    res = {"summary": {"jaxsal_steps_per_s": 500.0, "torch_steps_per_s": 250.0}, "machine": {"cpu_count": 2}}
    runs = [{"name": "b", "game": "breakout", "env_steps": 900_000, "return": 21.7, "warm_start": False}]
    row = train_speed.returns_per_cpu_hour(res, runs)[-1]
    # 900k steps at 500/s = 0.5 h on 2 cores = 1 CPU-hour (reference: 2); gain 21.7 - 1.7 = 20
    assert row == "| `b` | 900,000 | 21.7 | 1.7 | 1.00 | 20.0 | 2.00 | 10.0 |"


def test_only_pqn_agents_with_the_timed_settings_enter():
    names = {r["name"] for r in train_speed.shipped_pqn_runs()}
    assert {"breakout", "pong", "breakout-dddqn"} <= names
    assert not any(n.startswith("minatar") for n in names)      # other network and batch layout
    assert "breakout-split-attention" not in names               # distilled, not trained by PQN


def test_a_cuda_build_of_torch_is_refused_and_flagged():
    """The trainer's reference on a CUDA build of torch (its CPU convolutions several times slower) is refused
    unless asked for; then its build note and the table's bold warning say so."""
    import pytest

    with pytest.raises(SystemExit, match=r"torch 2.14.1\+cu130 is a CUDA build.*--allow-cuda-build-on-cpu"):
        train_speed.check_torch_build({"torch": "2.14.1+cu130", "torch_cuda": "13.0"}, allow_cuda_build=False)
    train_speed.check_torch_build({"torch": "2.14.1+cu130", "torch_cuda": "13.0"}, allow_cuda_build=True)
    train_speed.check_torch_build({"torch": "2.13.0+cpu", "torch_cuda": None}, allow_cuda_build=False)
    assert train_speed.build_note(None) == "CPU build"
    assert train_speed.build_note("13.0") == f"CUDA 13.0 build: {train_speed.CUDA_ON_CPU}"
