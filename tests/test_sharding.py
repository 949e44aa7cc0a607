"""Sharded == unsharded: the batch axis split over 4 host devices gives the same maps."""
import json
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
    import jax, numpy as np
    import jaxsal
    from tests._support.gradient_models import ConvHead, init, obs
    m = ConvHead(kernel=2, stride=2)
    x = obs((6, 8, 8, 2), seed=3, lo=0, hi=255)
    p = init(m, x.shape, seed=1)
    key = jax.random.PRNGKey(5)
    out = jaxsal.explain(m.apply, p, x, method=["gradient", "gradcam", "smoothgrad"], layer="conv",
                         key=key, n_samples=5, batch_size=12)
    out["gradcam_b3"] = jaxsal.gradcam(m.apply, p, x, layer="conv", batch_size=3)
    out["ndev"] = np.array(jax.local_device_count())
    np.savez({out_path!r}, **{{k: np.asarray(v) for k, v in out.items()}})
""")


def _run(tmp_path, ndev):
    out = tmp_path / f"maps_{ndev}.npz"
    env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={ndev}",
               JAX_PLATFORMS="cpu")
    code = SCRIPT.format(root=str(ROOT), out_path=str(out))
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return dict(np.load(out))


def _run_here(tmp_path):
    """The same script in this process, on its one device (a subprocess start saved)."""
    out = tmp_path / "maps_here.npz"
    exec(SCRIPT.format(root=str(ROOT), out_path=str(out)), {})
    return dict(np.load(out))


@pytest.mark.slow  # end to end, 3-10 s: the slow stage (CI runs it)
def test_sharded_equals_unsharded(tmp_path):
    one = _run_here(tmp_path)
    four = _run(tmp_path, 4)
    assert int(one.pop("ndev")) == 1 and int(four.pop("ndev")) == 4
    assert set(one) == set(four)
    for k in one:
        assert one[k].shape[0] == 6, k
        np.testing.assert_allclose(four[k], one[k], rtol=1e-5, atol=1e-7, err_msg=k)
    np.testing.assert_allclose(one["gradcam_b3"], one["gradcam"], rtol=1e-4, atol=1e-6)
