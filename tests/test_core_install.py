"""The core wheel in a clean venv: built without a setuptools warning, small (of the shipped agents'
weights only the demo agent's), no EnvPool, gymnax or ale-py, and still the library and `jaxsal explain
--agent file.py:load` on a user's model; playing says which extra to install; another shipped agent says
how to fetch its weights, and loads once fetched (slow: builds the wheel and installs its dependencies
into a new venv)."""
import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests._support import ROOT

LEFT_OUT = ("envpool", "gymnax", "ale_py", "torch")   # (optax and orbax come with flax)

AGENT = textwrap.dedent('''
    import jax, jax.numpy as jnp, flax.linen as nn, flax.serialization
    import jaxsal

    class QNet(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = x.astype(jnp.float32) / 255.0
            x = nn.relu(nn.Conv(8, (8, 8), (4, 4), padding="VALID", name="conv1")(x))
            x = nn.relu(nn.Conv(8, (3, 3), (1, 1), padding="VALID", name="conv2")(x))
            return nn.Dense(4, name="q")(x.reshape(x.shape[0], -1))

    def save(path):
        params = QNet().init(jax.random.PRNGKey(0), jnp.zeros((1, 84, 84, 4), jnp.uint8))
        open(path, "wb").write(flax.serialization.to_bytes(params))

    def load():
        return jaxsal.loaders.flax_msgpack("params.msgpack", QNet(), obs_shape=(84, 84, 4), pixels="uint8")
''')

SCRIPT = textwrap.dedent('''
    import importlib.util, json, numpy as np
    import jaxsal, my_agent
    my_agent.save("params.msgpack")
    agent = my_agent.load()
    obs = np.random.default_rng(0).integers(0, 256, (5, 84, 84, 4), dtype=np.uint8)
    np.save("obs.npy", obs)
    maps = jaxsal.explain(agent.apply_fn, agent.params, obs, method="gradcam")
    print(json.dumps({"shape": list(np.shape(maps)), "finite": bool(np.isfinite(np.asarray(maps)).all()),
                      "absent": [m for m in %r if importlib.util.find_spec(m) is None],
                      "file": jaxsal.__file__}))
''' % (LEFT_OUT,))


def run(cmd, cwd, **kw):
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=1200, **kw)


@pytest.mark.slow
def test_core_wheel_explains_a_users_model_without_the_agents_extra(tmp_path):
    src = tmp_path / "src"        # the sources alone: a checkout's old build/ folder would leak into the wheel
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for name in ("jaxsal", "agents"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    wheels = tmp_path / "wheels"
    r = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-w", str(wheels), str(src)], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    # no setuptools warning ("Package would be ignored", deprecations); this machine's pip config may warn
    # about its local indexes
    noise = [line for line in (r.stdout + r.stderr).splitlines()
             if ("warn" in line.lower() or "would be ignored" in line) and "Location 'file:" not in line]
    assert not noise, noise
    wheel, = wheels.glob("jaxsal-*.whl")
    weights = [n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".msgpack")]
    assert weights == ["jaxsal_agents/shipped/breakout.msgpack"] and wheel.stat().st_size < 5e6, \
        (weights, wheel.stat().st_size)
    venv = tmp_path / "venv"
    assert run([sys.executable, "-m", "venv", str(venv)], tmp_path).returncode == 0
    r = run([str(venv / "bin" / "pip"), "install", "--quiet", str(wheel)], tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    # no warning from the package itself (this machine's pip config may warn about its local indexes)
    warnings = [l for l in r.stderr.splitlines() if "warning" in l.lower() and "Location 'file:" not in l]
    assert not warnings, warnings

    work = tmp_path / "work"                      # outside the repository: the installed files only
    work.mkdir()
    (work / "my_agent.py").write_text(AGENT)
    (work / "script.py").write_text(SCRIPT)
    r = run([str(venv / "bin" / "python"), "script.py"], work)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["shape"] == [5, 84, 84] and out["finite"]
    assert sorted(out["absent"]) == sorted(LEFT_OUT), "the core install brought an agents-only package"
    assert str(venv) in out["file"]

    r = run([str(venv / "bin" / "jaxsal"), "explain", "--agent", "my_agent.py:load", "--input", "obs.npy",
             "--methods", "gradient,gradcam", "--out", "maps"], work)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (work / "maps").is_dir() and any((work / "maps").rglob("*.npy"))

    # playing needs the emulators: one line naming the extra, exit 2, nothing written
    r = run([str(venv / "bin" / "jaxsal"), "demo", "--out", "demo"], work)
    assert r.returncode == 2, (r.stdout[-2000:], r.stderr[-2000:])
    err = r.stderr.strip()
    assert err.count("\n") == 0 and err.startswith("jaxsal: error:") and "jaxsal[agents]" in err, err
    assert not (work / "demo").exists()

    # the demo agent's weights come with the wheel; another agent's are fetched (checked) into the cache
    env = dict(os.environ, JAXSAL_CACHE_DIR=str(tmp_path / "cache"))
    jaxsal = str(venv / "bin" / "jaxsal")
    assert run([jaxsal, "agents", "--layers", "breakout"], work, env=env).returncode == 0
    r = run([jaxsal, "agents", "--layers", "pong"], work, env=env)
    err = r.stderr.strip()
    assert r.returncode == 2 and err.count("\n") == 0 and "jaxsal agents fetch pong --from" in err, err
    r = run([jaxsal, "agents", "fetch", "pong", "--from", (ROOT / "agents" / "shipped").as_uri()], work, env=env)
    assert r.returncode == 0 and (tmp_path / "cache" / "agents" / "pong.msgpack").is_file(), r.stderr[-2000:]
    r = run([jaxsal, "agents", "--layers", "pong"], work, env=env)
    assert r.returncode == 0 and "conv3" in r.stdout, r.stderr[-2000:]
