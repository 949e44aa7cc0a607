"""The benchmarks' own logic, without torch: the docs page's tables are what the committed results
file gives, and a CUDA build of torch is refused on the CPU (it would flatter jaxsal several times over)."""
import json
import re
import sys
import types
from pathlib import Path

import pytest

from experiments.benchmarks import against_peers as AP

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"


def _generated(begin: str, end: str, source_pattern: str):
    """(the page's text, its generated block, the results file it names, that file's results)."""
    text = PAGE.read_text()
    block = text.split(begin, 1)[1].split(end, 1)[0]
    source = re.search(source_pattern, block).group(1)
    return text, block, source, json.loads((ROOT / source).read_text())


def test_the_docs_table_is_generated_from_the_committed_results():
    text, block, source, res = _generated(AP.DOCS_BEGIN, AP.DOCS_END, r"Results: `([^`]+\.json)`")
    assert block.strip() == AP.docs_table(res, source).strip(), \
        "docs/benchmarks.md's table is stale: regenerate it with --render RESULTS.json --docs docs/benchmarks.md"
    assert AP.render_docs(res, PAGE, source) == text


def test_a_cuda_build_timed_on_the_cpu_is_flagged_in_the_tables():
    res = json.loads((ROOT / "experiments/results/against_peers_call/against_peers.json").read_text())
    assert "+cu" in res["machine"]["torch"]
    assert "**Warning: a CUDA build of torch timed on the CPU" in AP.docs_table(res, "x")
    quiet = {**res, "machine": {**res["machine"], "torch": "2.13.0+cpu", "torch_build": "CPU build"}}
    assert "Warning" not in AP.docs_table(quiet, "x")


def _fake_torch(monkeypatch, cuda):
    torch = types.ModuleType("torch")
    torch.__version__ = "2.14.1+cu130" if cuda else "2.13.0+cpu"
    torch.version = types.SimpleNamespace(cuda=cuda)
    monkeypatch.setitem(sys.modules, "torch", torch)


def test_a_cuda_build_is_refused_on_the_cpu_unless_allowed(monkeypatch):
    _fake_torch(monkeypatch, "13.0")
    with pytest.raises(SystemExit, match="CUDA build.*--allow-cuda-build-on-cpu"):
        AP.check_torch_build("cpu", allow_cuda_build=False)
    AP.check_torch_build("cpu", allow_cuda_build=True)
    AP.check_torch_build("cuda", allow_cuda_build=False)      # on its GPU a CUDA build is right
    assert AP.CUDA_ON_CPU in AP.torch_build_note("cpu")
    assert AP.torch_build_note("cuda") == "CUDA 13.0 build"


def test_a_cpu_build_is_timed(monkeypatch):
    _fake_torch(monkeypatch, None)
    AP.check_torch_build("cpu", allow_cuda_build=False)
    assert AP.torch_build_note("cpu") == "CPU build"


def test_the_peak_is_the_best_measured_matmul(monkeypatch):
    import numpy as np

    got = AP.matmul_peak(shapes=((64, 32, 16), (8, 8, 8)), rounds=2)
    assert set(got["per_shape"]) == {"64x32x16", "8x8x8"}
    assert got["flops"] == max(got["per_shape"].values()) and np.isfinite(got["flops"]) and got["flops"] > 0
    # the rate is FLOPs over the median call time: a clock that always advances 1 s per call gives 2mkn
    ticks = iter(range(10**6))
    monkeypatch.setattr(AP.time, "perf_counter", lambda: float(next(ticks)))
    assert AP.matmul_peak(shapes=((4, 3, 2),), rounds=3)["flops"] == 2 * 4 * 3 * 2


def test_the_roofline_counts_the_flops_jaxsal_computes():
    """XLA's cost analysis of one compiled call: an input gradient is a forward and a backward to the
    input (~2 forwards, not the peer's 3 with its separate action choice), Grad-CAM's backward stops at
    conv3, and occlusion's incremental windows do a third of the plain algorithm's work."""
    import jax
    from jaxsal_agents.networks import NatureDQN
    model = NatureDQN(6)
    params = model.init(jax.random.PRNGKey(0), AP._obs(1, 0))
    fwd = AP.nature_forward_flops(6) / 1e6
    grad = AP.jaxsal_mflop_per_map(model.apply, params, "gradient", {"method": "gradient"})
    cam = AP.jaxsal_mflop_per_map(model.apply, params, "gradcam", {"method": "gradcam", "layer": "conv3"})
    assert 1.9 * fwd < grad < 2.2 * fwd
    assert fwd < cam < grad
    occ = AP.jaxsal_mflop_per_map(model.apply, params, "occlusion", {"method": "occlusion", "patch": 2, "stride": 2})
    assert occ < 0.5 * AP.forward_equivalents("occlusion") * fwd


def test_the_table_uses_the_measured_flops_where_the_results_have_them(tmp_path):
    res = json.loads((ROOT / "experiments/results/against_peers.json").read_text())
    res.pop("jaxsal_mflop_per_map", None)
    AP.write(res, tmp_path / "old")
    old = (tmp_path / "old" / "against_peers.md").read_text()
    assert "the peer's work, not jaxsal's" in old
    name = next(n for n, rows in res["timing"].items() if any("error" not in r for r in rows))
    res["jaxsal_mflop_per_map"] = {name: 1.0}
    AP.write(res, tmp_path / "new")
    new = (tmp_path / "new" / "against_peers.md").read_text()
    assert "XLA's cost analysis" in new
    row = next(line for line in new.splitlines() if line.startswith(f"| {name} |") and "maps" not in line
               and line.count("|") > 12)
    assert "| 1 |" in row  # 1 MFLOP/map: the measured count, not the peer algorithm's


def test_the_every_method_table_is_generated_from_the_committed_throughput_results():
    from experiments.benchmarks import throughput as TP
    _, block, source, res = _generated(TP.DOCS_BEGIN, TP.DOCS_END, r"\(`([^`]+\.json)`\)")
    assert block.strip() == TP.docs_table(res, source).strip(), \
        "docs/benchmarks.md's Every-method table is stale: regenerate it with throughput --render RESULTS.json --docs"
    assert len(re.findall(r"^\| .+ \| [0-9.]+ \| [0-9.]+ \|$", block, re.M)) == len(TP.CASES)   # every case timed
