"""This install seen as a wheel's: its shipped-agents folder holds the manifest and the demo agent's
weights only (the cards stay where they are), and the weights cache is empty. For the tests of a
shipped agent whose weights are not installed (`jaxsal agents fetch`)."""
import contextlib
import shutil
from pathlib import Path

import pytest

from tests._support import ROOT

SHIPPED = ROOT / "agents" / "shipped"
DEMO = "breakout"


def make(folder: Path) -> Path:
    """Write the wheel's shipped folder under `folder` (folder/shipped); returns `folder`."""
    from jaxsal_agents import weights

    (folder / "shipped").mkdir(parents=True, exist_ok=True)
    for f in (weights.MANIFEST, f"{DEMO}.msgpack"):
        shutil.copy(SHIPPED / f, folder / "shipped" / f)
    return folder


@contextlib.contextmanager
def installed_as_wheel(folder: Path):
    """Within: the shipped agents' weights are those of `make(folder)`, the cache folder/cache (empty
    until something is fetched). Yields the folder fetched weights go to."""
    from jaxsal_agents import weights

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(weights, "SHIPPED_DIR", folder / "shipped")
        mp.setenv(weights.CACHE_ENV, str(folder / "cache"))
        yield folder / "cache" / "agents"
