"""Test support for the CLI/IO tests: tiny stand-in methods, a random agent on disk, a CLI runner.

The stand-ins are registered only inside the tests (never shipped), so the pipeline is
tested independently of the real methods. Run as a script it registers them and calls
`jaxsal.cli.main`, which lets subprocess tests (SIGKILL, two processes) use them too.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from jaxsal.registry import METHODS, register  # noqa: E402
from jaxsal.targets import get_target, resolve_actions  # noqa: E402
from jaxsal.checks import check_obs, check_positive_int  # noqa: E402
from jaxsal.batching import map_batched  # noqa: E402
from jaxsal.caching import cached_jit  # noqa: E402


def _score_fn(apply_fn, target, actions):
    t = get_target(target)

    def score(params, x, a):
        return t.score(apply_fn(params, x), a).sum()
    return t, score


def _forward(apply_fn):
    return apply_fn


def _grad_builder(apply_fn, target, per_frame, scale):
    _, score = _score_fn(apply_fn, target, None)

    def f(p, xs, acts):
        g = jax.grad(score, argnums=1)(p, xs, acts) * scale
        return g if per_frame else g.sum(-1)
    return f


def _noise_builder(apply_fn, target):
    t, _ = _score_fn(apply_fn, target, None)

    def f(pm, xs, acts):  # the masks travel with params: traced, never captured by the build
        p, mk = pm

        def one(m):
            return t.score(apply_fn(p, xs * m[None, :, :, None]), acts)
        s = jax.lax.map(one, mk)  # (n, N)
        return jnp.einsum("kn,khw->nhw", s, mk) / mk.shape[0]
    return f


def _pool():
    return lambda p, xs: xs.mean(-1)


def standin_grad(apply_fn, params, obs, *, target="q_chosen", actions=None, layout="NHWC", key=None,
                 batch_size=None, per_frame=False, scale=1.0):
    """Test stand-in: signed input gradient summed over the stack (or per frame), times `scale`."""
    x = check_obs(obs, layout)
    t, _ = _score_fn(apply_fn, target, actions)
    a = resolve_actions(t, cached_jit(_forward, apply_fn)(params, x), actions)
    fn = cached_jit(_grad_builder, apply_fn, target, per_frame, scale)
    return map_batched(fn, params, x, a, batch_size=batch_size)


def standin_noise(apply_fn, params, obs, *, target="q_chosen", actions=None, layout="NHWC", key=None,
                  batch_size=None, n_masks=8):
    """Test stand-in (stochastic): RISE-like average of n random 84x84 binary masks by score."""
    if key is None:
        from jaxsal.errors import SaliencyInputError
        raise SaliencyInputError("standin_noise is stochastic: pass key")
    n_masks = check_positive_int("n_masks", n_masks)
    x = check_obs(obs, layout)
    t, _ = _score_fn(apply_fn, target, actions)
    a = resolve_actions(t, cached_jit(_forward, apply_fn)(params, x), actions)
    masks = jax.random.bernoulli(key, 0.5, (n_masks,) + tuple(x.shape[1:3])).astype(jnp.float32)
    fn = cached_jit(_noise_builder, apply_fn, target)
    return map_batched(fn, (params, masks), x, a, batch_size=batch_size, rows_per_state=n_masks)


def standin_pool(apply_fn, params, obs, *, target="q_chosen", layout="NHWC", batch_size=None):
    """Test stand-in that never runs the model: the frame stack's mean (cheap, for I/O tests)."""
    x = check_obs(obs, layout)
    fn = cached_jit(_pool)
    return map_batched(fn, None, x, batch_size=batch_size)


def register_standins():
    if "standin_grad" not in METHODS:
        register("standin_grad")(standin_grad)
        register("standin_noise", stochastic=True)(standin_noise)
        register("standin_pool")(standin_pool)


register_standins()


def make_agent_files(directory, seed: int = 0, num_actions: int = 3, game: str = "minatar-breakout") -> Path:
    """A random-init agent as card .json + .msgpack; returns the card path.

    The default is a MinAtar Breakout net on (10, 10, 4) frames: small, so tests stay fast.
    """
    from jaxsal_agents import build_model
    from jaxsal_agents.checkpoint import export_params

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    size = 10 if game.startswith("minatar") else 84
    model = build_model(game, "dqn", num_actions)
    params = model.init(jax.random.PRNGKey(seed), jnp.zeros((1, size, size, 4)))
    card = {"game": game, "arch": "dqn", "num_actions": num_actions, "obs_shape": [size, size, 4],
            "layer_norm": True}
    path = directory / f"tiny{seed}.json"
    path.write_text(json.dumps(card))
    export_params(path.with_suffix(".msgpack"), params)
    return path


def frames(n: int, seed: int = 0, size: int = 10) -> np.ndarray:
    """Breakout-like uint8 frame stacks (N, size, size, 4): dark background, a brick row, dots."""
    rng = np.random.default_rng(seed)
    x = (rng.random((n, size, size, 4)) < 0.1).astype(np.uint8) * 200
    x[:, size // 4, 1:-1] = 140
    return x


def corrupt_member(path, member: str = "obs.npy", nbytes: int = 64, at: float = 0.5):
    """Flip `nbytes` bytes of an archive member's stored data (a fraction `at` into it, past the .npy
    header), leaving the zip directory intact: what a bad download or disk does to an .npz."""
    import zipfile

    with zipfile.ZipFile(path) as z:
        info = z.getinfo(member)
    raw = bytearray(Path(path).read_bytes())
    off = info.header_offset
    name_len, extra_len = (int.from_bytes(raw[off + k:off + k + 2], "little") for k in (26, 28))
    start = off + 30 + name_len + extra_len  # the local file header, then the member's stored bytes
    pos = start + max(128, int(info.compress_size * at))
    assert pos + nbytes <= start + info.compress_size, "member too small to corrupt there"
    for i in range(pos, pos + nbytes):
        raw[i] ^= 0xFF
    Path(path).write_bytes(bytes(raw))
    return path


def cli_env(**extra) -> dict:
    """Environment for a CLI subprocess: this checkout importable, CPU, XLA's default kernels (as
    the in-process runs it is compared with; the YNNPACK flag is tested in test_cpu)."""
    return dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu", JAXSAL_FAST_CPU="0", **extra)


def start_job(args, out, ready, slow_write: float = 0.3, timeout: float = 240.0) -> subprocess.Popen:
    """Start `jaxsal *args --out out` (stand-ins registered) in a subprocess whose chunk writes each
    take slow_write seconds, and return it, still running, once ready(out) holds (or after timeout s):
    the kill-and-resume tests then signal it mid-job."""
    import time

    proc = subprocess.Popen([sys.executable, __file__, *map(str, args), "--out", str(out)],
                            env=cli_env(JAXSAL_TEST_SLOW_WRITE=str(slow_write)), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.time() + timeout
    while time.time() < deadline and not ready(Path(out)):
        assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
        time.sleep(0.05)
    return proc


def files_at_least(n: int, pattern: str = "chunk_*"):
    """start_job's `ready`: n files matching pattern anywhere under out."""
    return lambda out: len(list(out.rglob(pattern))) >= n


def sigkill_after_chunks(args, out, n: int, timeout: float = 240.0) -> list[str]:
    """Run `jaxsal *args --out out` with slow writes, SIGKILL it once n chunk files exist, and return
    the chunk files it left (relative to out), for the kill-and-resume tests."""
    import signal

    proc = start_job(args, out, files_at_least(n), timeout=timeout)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    return sorted(str(q.relative_to(out)) for q in Path(out).rglob("chunk_*"))


def run_cli(*args, env=None, timeout=300, **kw) -> subprocess.CompletedProcess:
    """Run the CLI in a subprocess with the stand-ins registered (environment: `cli_env`)."""
    e = cli_env(**(env or {}))
    e.pop("JAXSAL_DEBUG", None)
    return subprocess.run([sys.executable, __file__, *map(str, args)], capture_output=True, text=True,
                          env=e, timeout=timeout, **kw)


if __name__ == "__main__":
    from jaxsal.cli import main

    if os.environ.get("JAXSAL_TEST_SLOW_WRITE"):  # stretch the job so a test can kill it mid-way
        import signal
        import time

        # Ctrl-C as a terminal delivers it, whatever the test process passed down: a SIGINT ignored
        # (SIG_IGN is inherited across exec: tests started by `nohup ... &`) or blocked there would make
        # the job finish unasked. Reset silently: the tests read the job's stderr line by line.
        if signal.getsignal(signal.SIGINT) is not signal.default_int_handler or \
                signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []):
            signal.signal(signal.SIGINT, signal.default_int_handler)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])

        from jaxsal.io import store

        _write = store.write_chunk

        def slow_write(*a, **k):
            time.sleep(float(os.environ["JAXSAL_TEST_SLOW_WRITE"]))
            _write(*a, **k)
        store.write_chunk = slow_write
        from jaxsal.io import object_files as _objects

        _write_shares = _objects.write_shares

        def slow_write_shares(*a, **k):
            time.sleep(float(os.environ["JAXSAL_TEST_SLOW_WRITE"]))
            _write_shares(*a, **k)
        _objects.write_shares = slow_write_shares
    if os.environ.get("JAXSAL_TEST_RSS"):  # report peak resident memory (KiB) of the job at exit
        import atexit

        import jaxsal_agents  # noqa: F401  (imports are not the job: reset the peak after them)
        import jaxsal.io  # noqa: F401

        def _status(field):
            with open("/proc/self/status") as f:
                return next(int(line.split()[1]) for line in f if line.startswith(field))
        base = _status("VmRSS:")
        with open("/proc/self/clear_refs", "w") as f:  # Linux: reset the peak (VmHWM) to the current RSS
            f.write("5")
        atexit.register(lambda: print(f"PEAK_RSS_KB={_status('VmHWM:')} BASE_RSS_KB={base}", file=sys.stderr))
    main()
