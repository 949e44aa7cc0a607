"""Jobs that must end well: a target without an action stores none, a finished job reruns on a
read-only disk, SIGTERM stops like Ctrl-C (resumable, nothing partial counted), `jaxsal render` finds
the input from any directory (old manifests too), `jaxsal agents` counts frames as the cards do."""
import builtins
import errno
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from jaxsal.io import store
from tests.test_cli_support import ROOT, cli_env, frames, make_agent_files

AC_AGENT = '''
import flax.linen as nn
import jax
import jax.numpy as jnp


class AC(nn.Module):   # a tiny actor-critic: {"logits", "value"}
    @nn.compact
    def __call__(self, x):
        h = nn.relu(nn.Conv(8, (3, 3), name="conv1")(x / 255.0)).reshape(x.shape[0], -1)
        return {"logits": nn.Dense(3, name="pi")(h), "value": nn.Dense(1, name="v")(h)[:, 0]}


def load():
    m = AC()
    return m.apply, m.init(jax.random.PRNGKey(0), jnp.zeros((1, 10, 10, 4)))
'''


@pytest.fixture(scope="module")
def card(tmp_path_factory):
    return make_agent_files(tmp_path_factory.mktemp("agent"))


def _explain(agent, inp, out, *extra, methods="standin_grad"):
    return main(["explain", "--agent", str(agent), "--methods", methods, "--input", str(inp), "--out", str(out),
                 "--quiet", *map(str, extra)])


def _files(d):
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(Path(d).rglob("*")) if p.is_file()}


# --------------------------------------------------------------------------- 7a: no action for value
def test_value_target_stores_no_action(tmp_path):
    from jaxsal.render import _captions

    (tmp_path / "ac.py").write_text(AC_AGENT)
    np.save(tmp_path / "x.npy", frames(5))
    agent = f"{tmp_path / 'ac.py'}:load"
    assert _explain(agent, tmp_path / "x.npy", tmp_path / "v", "--target", "value", "--chunk", 3) == 0
    o = jaxsal.load_outputs(tmp_path / "v")
    assert "action" not in o, "a value map explains no action"
    assert o["value"].shape == (5,) and o["logits"].shape == (5, 3)
    caps = _captions(tmp_path / "v", 0, 5, store.load_outputs)
    assert len(caps) == 5 and all("no action" in c and "V = " in c and "action 0" not in c for c in caps.values())
    # a job of an older jaxsal stored action 0 for every frame: still not read as an action
    for p in sorted((tmp_path / "v" / "_outputs").glob("chunk_*.npz")):
        with np.load(p) as z:
            arrays = dict(z)
        arrays["action"] = np.zeros(len(arrays["value"]), np.int32)
        with open(p, "wb") as f:
            store._write_npz(f, arrays)
    assert "action" not in jaxsal.load_outputs(tmp_path / "v")
    # a target that depends on the action stores it
    assert _explain(agent, tmp_path / "x.npy", tmp_path / "p", "--target", "policy_logit") == 0
    o = jaxsal.load_outputs(tmp_path / "p")
    np.testing.assert_array_equal(o["action"], o["logits"].argmax(-1))

