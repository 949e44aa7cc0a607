"""`import jaxsal` from the folder that holds a clone named `jaxsal` gives the package (issue 29.6).

A notebook started in the parent of a clone folder named `jaxsal` has that folder (no
__init__.py) on sys.path first. With setuptools' default editable install (a meta-path finder
consulted after the path search) the folder won as an empty namespace package:
`AttributeError: module 'jaxsal' has no attribute 'methods'`. The Makefile installs in strict
mode (a link tree on sys.path), where the regular package wins over the namespace portion.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._support import ROOT


CHECK = ("import jaxsal, jaxsal_agents, importlib.metadata as md; "
         "assert callable(jaxsal.explain) and callable(jaxsal.methods), jaxsal; "
         "eps = [e.value for e in md.entry_points(group='jaxsal.agents')]; "
         "assert 'jaxsal_agents.provider' in eps, eps; print(jaxsal.__file__)")


def _run_in(cwd):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-c", CHECK], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


@pytest.mark.slow  # 3-8 s (a subprocess, a game or a whole job): the slow stage, which CI runs
def test_a_folder_named_jaxsal_in_the_working_directory_does_not_shadow_the_package(tmp_path):
    (tmp_path / "jaxsal").symlink_to(ROOT, target_is_directory=True)  # the clone, named jaxsal
    proc = _run_in(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert Path(proc.stdout.strip()).name == "__init__.py"


@pytest.mark.slow  # 3-8 s (a subprocess, a game or a whole job): the slow stage, which CI runs
def test_a_copy_named_jaxsal_does_not_shadow_it_either(tmp_path):
    clone = tmp_path / "jaxsal"
    clone.mkdir()
    for name in ("README.md", "pyproject.toml", "Makefile"):
        (clone / name).write_bytes((ROOT / name).read_bytes())
    (clone / "tests").mkdir()  # folders of the clone, none of them an importable jaxsal
    proc = _run_in(tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
