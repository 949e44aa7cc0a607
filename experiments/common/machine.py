"""The machine a benchmark ran on (backend, devices, versions, CPU, load), recorded with its figures."""
from __future__ import annotations

import datetime as _dt
import os
import platform
import socket
import subprocess
from pathlib import Path

import jax

import jaxsal


def device_peak_mb():
    """Peak accelerator memory in use by this process so far (MB), where the backend reports it."""
    stats = jax.local_devices()[0].memory_stats() or {}
    return round(stats["peak_bytes_in_use"] / 2**20, 1) if "peak_bytes_in_use" in stats else None


def machine_info() -> dict:
    info = {"date_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
            "python": platform.python_version(), "jax": jax.__version__,
            "jaxsal": jaxsal.__version__, "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "xla_flags": os.environ.get("XLA_FLAGS", "")}
    try:
        import flax
        info["flax"] = flax.__version__
    except ImportError:
        pass
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        info["load_avg_1_5_15"] = list(os.getloadavg())
    except OSError:
        pass
    return info


def git_state(repo=None) -> dict:
    """The checkout's commit and whether its tracked files differ from it (None where git is absent)."""
    repo = Path(repo or Path(__file__).resolve().parents[2])

    def git(*args):
        try:
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD")
    return {"git_commit": commit or None,
            "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")) if commit else None}


def cpu_flags() -> list[str]:
    """The CPU's feature flags (Linux /proc/cpuinfo), sorted; empty where unknown."""
    try:
        with open("/proc/cpuinfo") as f:
            line = next(l for l in f if l.startswith("flags"))
    except (OSError, StopIteration):
        return []
    return sorted(line.split(":", 1)[1].split())


_LOADED: dict = {}


def provenance() -> dict:
    """What a training run records each time it starts or resumes: host, CPU and its flags, versions,
    load, and the git commit (with a dirty flag) of the code that runs: the checkout as it was at this
    process's first call, since a process keeps the modules it loaded then (a later run of the same
    process records the same commit, and `git_commit_on_disk` if the checkout has moved since)."""
    now = git_state()
    loaded = _LOADED.setdefault("git", now)
    rec = {**machine_info(), "hostname": socket.gethostname(), "cpu_flags": cpu_flags(), **loaded}
    if now != loaded:
        rec["git_commit_on_disk"] = now["git_commit"]
    return rec
