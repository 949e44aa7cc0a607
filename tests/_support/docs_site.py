"""Build the documentation site as `make docs` does (`mkdocs build --strict`) into a given folder.

tests/conftest.py builds it once per session (the `docs_site` fixture): the build test checks the
build, the browser test opens the pages it wrote.
"""
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

from tests._support import ROOT

# the docs extra's modules (`pip install -e '.[docs]'`; `make test-slow` installs it)
DOCS_MODULES = ("mkdocs", "material", "mkdocstrings_handlers.python", "mkdocs_jupyter")


class BuiltSite(NamedTuple):
    path: Path  # the site folder
    returncode: int
    log: str  # the build's last output, for a failure message


def build_site(site: Path) -> BuiltSite:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(ROOT / "mkdocs.yml"), "--site-dir", str(site)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    return BuiltSite(site, proc.returncode, proc.stdout[-3000:] + proc.stderr[-6000:])
