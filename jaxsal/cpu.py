"""XLA:CPU speed setting: run convolutions through YNNPACK (XLA's newer CPU kernel library).

Measured on a 2-core AMD EPYC (jaxlib 0.10.2): the Nature-CNN's forward convs run 2-2.9x
faster (forward pass 3.8k -> 9.4k states/s at 64 rows), maps equal to float rounding. XLA
reads XLA_FLAGS once, when its CPU backend starts (the first JAX computation), so
`import jaxsal` turns it on (`auto()`) when JAX has not started yet; if it has, one warning
says how to get it. JAXSAL_FAST_CPU=0 (set before the import) turns it off.

The flag is experimental: an XLA that does not know it aborts the process, and other
releases may treat it differently. So it is set only on the jaxlib releases it was verified on
(`VERIFIED_JAXLIB`), decided from the installed version: `import jaxsal` starts no process and
writes no file. Child processes inherit the flag through XLA_FLAGS.
"""
from __future__ import annotations

import os
import warnings

YNN_FLAG = "--xla_cpu_experimental_ynn_fusion_type=dot"
"""Hands XLA:CPU's dot and convolution work to YNNPACK (default list is empty in jaxlib 0.10)."""

VERIFIED_JAXLIB = ("0.10.",)
"""jaxlib release prefixes on which YNN_FLAG was verified to start XLA and give the same maps
(tests/test_cpu.py checks it on the installed one)."""


def _jaxlib_version() -> str:
    try:
        from importlib.metadata import version
        return version("jaxlib")
    except Exception:  # noqa: BLE001 (not installed as a distribution: unknown)
        return "unknown"


def flag_supported(flag: str = YNN_FLAG, jaxlib_version: str | None = None) -> bool:
    """Whether `flag` is known to work on this jaxlib (only YNN_FLAG on VERIFIED_JAXLIB)."""
    v = _jaxlib_version() if jaxlib_version is None else jaxlib_version
    return flag == YNN_FLAG and v.startswith(VERIFIED_JAXLIB)


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


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity where the OS keeps one (taskset, Slurm's
    --cpus-per-task, a container's cpuset), which is what XLA:CPU sizes its thread pool by."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # no affinity on this OS (macOS)
        return os.cpu_count() or 1


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
