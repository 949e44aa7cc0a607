"""Metrics sharded over 4 host devices (subprocess) == the same metrics in this process."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests._support import ROOT


SCRIPT = textwrap.dedent("""
    import sys
    sys.path.insert(0, {root!r})
    import flax.linen as nn, jax, jax.numpy as jnp, numpy as np
    from jaxsal.metrics import deletion, insertion, similarity

    class Tiny(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.relu(nn.Conv(4, (3, 3), (2, 2))(x / 255.0))
            return nn.Dense(3)(x.reshape(x.shape[0], -1)) + 2.0

    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (5, 12, 12, 2)).astype(np.uint8)
    maps = rng.random((5, 12, 12)).astype(np.float32)
    others = rng.random((5, 12, 12)).astype(np.float32)
    m = Tiny()
    p = m.init(jax.random.PRNGKey(1), jnp.zeros((1, 12, 12, 2)))
    ins = insertion(m.apply, p, obs, maps, substrate="random", key=jax.random.PRNGKey(2),
                    pixels_per_step=16, score="all", batch_size=20)
    dele = deletion(m.apply, p, obs, maps, substrate="blur", blur_sigma=1.0, pixels_per_step=16,
                    batch_size=30)
    sim = similarity(maps, others, batch_size=3)
    out = dict(ins_q=ins["q_value"]["curves"], ins_a=ins["advantage"]["curves"],
               del_q=dele["curves"], ndev=np.array(jax.local_device_count()),
               **{{"sim_" + k: v for k, v in sim.items()}})
    np.savez({out_path!r}, **{{k: np.asarray(v) for k, v in out.items()}})
""")


def _run(tmp_path, ndev):
    out = tmp_path / f"metrics_{ndev}.npz"
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={ndev}",
               JAX_PLATFORMS="cpu")
    r = subprocess.run([sys.executable, "-c", SCRIPT.format(root=str(ROOT), out_path=str(out))],
                       env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(np.load(out))


def _run_here(tmp_path):
    """The same script in this process, on its one device (a subprocess start saved)."""
    out = tmp_path / "metrics_here.npz"
    exec(SCRIPT.format(root=str(ROOT), out_path=str(out)), {})
    return dict(np.load(out))


@pytest.mark.slow  # a 4-device subprocess; tests/test_sharding.py and tests/cli/test_scale.py keep one each fast
def test_sharded_metrics_equal_unsharded(tmp_path):
    one, four = _run_here(tmp_path), _run(tmp_path, 4)
    assert int(one.pop("ndev")) == 1 and int(four.pop("ndev")) == 4
    assert set(one) == set(four)
    for k in one:
        assert one[k].shape[0] == 5, k
        np.testing.assert_allclose(four[k], one[k], rtol=1e-5, atol=1e-6, err_msg=k)
