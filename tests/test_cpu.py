"""jaxsal.cpu: the YNNPACK flag gives the same maps, is only set when this jaxlib takes it,
and never silently pretends to work once JAX has started."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from jaxsal import cpu

_MAPS = textwrap.dedent("""
    import sys
    from jaxsal import cpu
    used = cpu.use_fast_kernels()
    import jax, numpy as np, jaxsal
    from jaxsal_agents.networks import NatureDQN
    from jaxsal.fastconv import fast_apply
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
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-c", _MAPS, str(out)], env=env, cwd=root, check=True, timeout=600)
    return np.load(out)


def test_fast_kernels_give_the_same_maps(tmp_path):
    plain, fast = _maps(tmp_path, "plain", "0"), _maps(tmp_path, "fast", "1")
    assert not bool(plain["used"])
    if not bool(fast["used"]):
        pytest.skip("this jaxlib does not accept the YNNPACK flag")
    for k in ("gradient", "gradcam", "occlusion", "rise"):
        a, b = plain[k], fast[k]
        assert np.abs(a).max() > 0
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * np.abs(a).max(), err_msg=k)


def test_unknown_flag_is_refused_and_cached(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu, "_CACHE", tmp_path / "flags.json")
    assert not cpu.flag_supported("--xla_cpu_no_such_flag_for_jaxsal=1")
    cache = json.loads((tmp_path / "flags.json").read_text())
    assert list(cache.values()) == [False]
    monkeypatch.setattr(cpu, "_probe", lambda flag: pytest.fail("probed again"))
    assert not cpu.flag_supported("--xla_cpu_no_such_flag_for_jaxsal=1")


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
