"""The machine a benchmark ran on (backend, devices, versions, CPU, load), recorded with its figures."""
from __future__ import annotations

import datetime as _dt
import os
import platform

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
