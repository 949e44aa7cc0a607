"""jaxsal.cpu: the YNNPACK flag gives the same maps, is only set when this jaxlib takes it,
and never silently pretends to work once JAX has started."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxsal import cpu
from tests._support import ROOT

_MAPS = textwrap.dedent("""
    import sys
    from jaxsal import cpu
    used = cpu.use_fast_kernels()
    import jax, numpy as np, jaxsal
    from jaxsal_agents.networks import NatureDQN
    from jaxsal.backprop.strided_conv import fast_apply
    m = NatureDQN(6)
    p = m.init(jax.random.PRNGKey(0), np.zeros((1, 84, 84, 4), np.uint8))
    x = np.random.default_rng(0).integers(0, 256, (3, 84, 84, 4), dtype=np.uint8)
    out = {"gradient": jaxsal.explain(fast_apply(m.apply), p, x, method="gradient"),
           "gradcam": jaxsal.explain(m.apply, p, x, method="gradcam", layer="conv3"),
           "occlusion": jaxsal.explain(m.apply, p, x, method="occlusion", patch=8, stride=8),
           "rise": jaxsal.explain(m.apply, p, x, method="rise", n_masks=64, key=jax.random.PRNGKey(1))}
    np.savez(sys.argv[1], used=used, **{k: np.asarray(v) for k, v in out.items()})
""")


def _maps(tmp_path, name, fast: str):
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAXSAL_FAST_CPU=fast, JAX_PLATFORMS="cpu", XDG_CACHE_HOME=str(tmp_path / "cache"))
    out = tmp_path / f"{name}.npz"
    subprocess.run([sys.executable, "-c", _MAPS, str(out)], env=env, cwd=ROOT, check=True, timeout=600)
    return np.load(out)


@pytest.mark.slow  # two fresh processes, four methods on the Nature CNN each (~35 CPU s)
def test_fast_kernels_give_the_same_maps(tmp_path):
    plain, fast = _maps(tmp_path, "plain", "0"), _maps(tmp_path, "fast", "1")
    assert not bool(plain["used"])
    if not bool(fast["used"]):
        pytest.skip("this jaxlib does not accept the YNNPACK flag")
    for k in ("gradient", "gradcam", "occlusion", "rise"):
        a, b = plain[k], fast[k]
        assert np.abs(a).max() > 0
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * np.abs(a).max(), err_msg=k)


def test_the_flag_is_decided_from_the_jaxlib_version():
    assert cpu.flag_supported(cpu.YNN_FLAG, jaxlib_version="0.10.2")
    assert not cpu.flag_supported(cpu.YNN_FLAG, jaxlib_version="0.11.2")   # not verified there
    assert not cpu.flag_supported(cpu.YNN_FLAG, jaxlib_version="unknown")
    assert not cpu.flag_supported("--xla_cpu_no_such_flag_for_jaxsal=1", jaxlib_version="0.10.2")


_QUIET_IMPORT = textwrap.dedent("""
    import os, subprocess, sys
    def refuse(*a, **k):
        raise AssertionError("import jaxsal started a process")
    subprocess.Popen.__init__ = refuse
    os.fork = os.posix_spawn = os.system = refuse
    import jaxsal
    print(os.environ.get("XLA_FLAGS", ""))
""")


@pytest.mark.slow  # a fresh process (~3 s): the slow stage, which CI runs
def test_import_starts_no_process_and_writes_no_file(tmp_path):
    home, cache, tmp = (tmp_path / d for d in ("home", "cache", "tmp"))
    for d in (home, cache, tmp):
        d.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "JAXSAL_FAST_CPU")}
    env.update(HOME=str(home), XDG_CACHE_HOME=str(cache), TMPDIR=str(tmp), JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", _QUIET_IMPORT], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("ynn_fusion_type" in r.stdout) == cpu.flag_supported()   # the fast kernels stay the default
    written = [p for d in (home, cache, tmp) for p in d.rglob("*")]
    assert written == [], written


def test_too_late_or_turned_off_leaves_xla_flags_alone(monkeypatch):
    import jax.numpy as jnp
    float(jnp.ones(1)[0])  # the backend is running now
    monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=1")
    monkeypatch.setenv("JAXSAL_FAST_CPU", "1")
    with pytest.warns(UserWarning, match="before the first JAX computation"):
        assert cpu.use_fast_kernels() is False
    monkeypatch.setenv("JAXSAL_FAST_CPU", "0")
    assert cpu.use_fast_kernels() is False
    assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=1"
