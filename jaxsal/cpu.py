"""XLA:CPU speed setting: run convolutions through YNNPACK (XLA's newer CPU kernel library).

Measured on a 2-core AMD EPYC (jaxlib 0.10.2): the Nature-CNN's forward convs run 2-2.9x
faster (forward pass 3.8k -> 9.4k states/s at 64 rows), maps equal to float rounding. XLA
reads XLA_FLAGS once, when its CPU backend starts (the first JAX computation), so
`import jaxsal` turns it on (`auto()`) when JAX has not started yet; if it has, one warning
says how to get it. JAXSAL_FAST_CPU=0 (set before the import) turns it off.

The flag is experimental in XLA and an unknown flag aborts the process, so it is only set
after a throw-away subprocess has started XLA with it: once per jaxlib version, cached in
~/.cache/jaxsal (or the temp dir when that is not writable); child processes inherit the
flag through XLA_FLAGS and never probe again.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

YNN_FLAG = "--xla_cpu_experimental_ynn_fusion_type=dot"
"""Hands XLA:CPU's dot and convolution work to YNNPACK (default list is empty in jaxlib 0.10)."""

_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "jaxsal" / "xla_flags.json"
_FALLBACK = Path(tempfile.gettempdir()) / f"jaxsal-{os.getuid() if hasattr(os, 'getuid') else 0}" \
    / "xla_flags.json"


def _jaxlib_version() -> str:
    try:
        import jaxlib
        return str(jaxlib.__version__)
    except Exception:  # noqa: BLE001
        return "unknown"


def _probe(flag: str, timeout: float = 120.0) -> bool:
    """True if a fresh Python process starts XLA:CPU with `flag` and computes."""
    env = dict(os.environ, XLA_FLAGS=f"{os.environ.get('XLA_FLAGS', '')} {flag}".strip(),
               JAX_PLATFORMS="cpu")
    code = "import jax.numpy as jnp; assert float(jnp.ones(3).sum()) == 3.0"
    try:
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return False
    return r.returncode == 0


def flag_supported(flag: str = YNN_FLAG) -> bool:
    """Whether this jaxlib accepts `flag` (probed once per jaxlib version, cached on disk)."""
    key = f"{_jaxlib_version()} {flag}"
    for path in (_CACHE, _FALLBACK):
        try:
            cache = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if key in cache:
            return bool(cache[key])
    ok = _probe(flag)
    for path in (_CACHE, _FALLBACK):
        try:
            try:
                cache = json.loads(path.read_text())
            except (OSError, ValueError):
                cache = {}
            path.parent.mkdir(parents=True, exist_ok=True)
            cache[key] = ok
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cache, indent=1))
            tmp.replace(path)
            break
        except OSError:
            continue
    return ok


def backend_started() -> bool:
    """Whether JAX has already started its backends (XLA_FLAGS changes then have no effect)."""
    try:
        from jax._src import xla_bridge
        return bool(xla_bridge.backends_are_initialized())
    except Exception:  # noqa: BLE001 (private API moved: assume not started)
        return False


def turned_off() -> bool:
    """JAXSAL_FAST_CPU=0/false/no/off."""
    return os.environ.get("JAXSAL_FAST_CPU", "1").strip().lower() in ("0", "false", "no", "off")


_WARNED = False
STARTED_WARNING = (
    "jaxsal: JAX started before `import jaxsal`, so XLA:CPU runs without its faster YNNPACK "
    "kernels (forward convs 2-3x slower). Import jaxsal before the first JAX computation, or "
    "set XLA_FLAGS=" + YNN_FLAG + " before starting Python; JAXSAL_FAST_CPU=0 silences this.")


def auto() -> bool:
    """What `import jaxsal` does: the fast kernels on unless turned off (JAXSAL_FAST_CPU=0) or
    unsupported; if JAX's CPU backend already runs, warn once (never on GPU/TPU backends)."""
    global _WARNED
    if "ynn_fusion_type" in os.environ.get("XLA_FLAGS", ""):
        return True
    if turned_off():
        return False
    if backend_started():
        try:
            import jax
            on_cpu = jax.default_backend() == "cpu"
        except Exception:  # noqa: BLE001
            on_cpu = False
        if on_cpu and not _WARNED:
            _WARNED = True
            warnings.warn(STARTED_WARNING, stacklevel=3)
        return False
    return use_fast_kernels(warn=False)


def use_fast_kernels(warn: bool = True) -> bool:
    """Add YNN_FLAG to XLA_FLAGS for this process if this jaxlib supports it.

    Returns True when the flag is in effect for the coming backend start (or was already set),
    False when skipped: JAXSAL_FAST_CPU=0, unsupported jaxlib, or JAX already started (then
    warns unless warn=False).
    """
    flags = os.environ.get("XLA_FLAGS", "")
    if "ynn_fusion_type" in flags:
        return True
    if turned_off():
        return False
    if backend_started():
        if warn:
            warnings.warn("jaxsal.cpu.use_fast_kernels(): JAX has already started, so XLA_FLAGS can no "
                          "longer change; call it before the first JAX computation", stacklevel=2)
        return False
    if not flag_supported(YNN_FLAG):
        return False
    os.environ["XLA_FLAGS"] = f"{flags} {YNN_FLAG}".strip()
    return True
