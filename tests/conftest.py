"""Shared test setup.

XLA compiles dominate this suite on CPU: many tests build the same small programs (the same model
and method on the same shapes) as new Python functions, which jax's in-memory caches cannot match.
A session-wide persistent compilation cache (keyed on the program, its compile options and the XLA
flags) lets every later compile of an identical program load the executable instead; it lives in a
temporary folder shared by the xdist workers and the CLI subprocesses (through the environment) and
is removed at the end, so each run starts cold. JAXSAL_TEST_COMPILE_CACHE=0 turns it off; a
JAX_COMPILATION_CACHE_DIR set by the caller is used as it is.

The fast loop (`-m 'not slow'`, the default) also compiles at XLA's backend optimisation level 0:
on these small programs compiling costs far more than running (a quarter less CPU time in all).
LLVM's passes can change the last bits of a result (level 0 forms no fused multiply-add), so a
test whose answer depends on such bits runs its code in a fresh process at the users' settings
(tests/metrics/test_similarity.py's HOG test does). The slow tests (training,
peers, benchmarks) and any other selection compile as users do. JAXSAL_TEST_XLA_OPT=default keeps
the default everywhere.
"""
import atexit
import os
import re
import shutil
import sys
import tempfile

import pytest

from tests._support import docs_site as _docs_site


def _session_compile_cache():
    if os.environ.get("JAXSAL_TEST_COMPILE_CACHE", "1") == "0" or os.environ.get("JAX_COMPILATION_CACHE_DIR"):
        return
    d = tempfile.mkdtemp(prefix="jaxsal-test-xla-")
    atexit.register(shutil.rmtree, d, True)  # the process that made it (the xdist controller) removes it
    os.environ.update(JAX_COMPILATION_CACHE_DIR=d, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                      JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    if "jax" in sys.modules:  # imported before this file: the environment was read already
        import jax
        jax.config.update("jax_compilation_cache_dir", d)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
        jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


_session_compile_cache()


OPT0 = "--xla_backend_optimization_level=0"


def _fast_loop(config) -> bool:
    """This run is the fast loop (`-m "not slow"`, pyproject's default)."""
    return (config.getoption("markexpr") or "").strip() == "not slow"


def pytest_configure(config):
    """Level-0 compiles for the fast loop only; set before any backend starts (xdist workers inherit it)."""
    if _fast_loop(config) and os.environ.get("JAXSAL_TEST_XLA_OPT") != "default" \
            and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {OPT0}".strip()


WHOLLY_SLOW = re.compile(r"^pytestmark = pytest\.mark\.slow\b", re.M)


def pytest_ignore_collect(collection_path, config):
    """The fast loop does not import a test file whose every test is slow (`pytestmark = pytest.mark.slow`):
    it would only deselect them, after importing torch, captum or a trainer in every xdist worker."""
    if _fast_loop(config) and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        try:
            return True if WHOLLY_SLOW.search(collection_path.read_text()) else None
        except OSError:
            return None
    return None


@pytest.fixture(scope="session")
def docs_site(tmp_path_factory):
    """The documentation site, built once per session (slow: tests/docs/test_build.py, test_browser.py).

    Skipped where the docs extra is not installed."""
    for module in _docs_site.DOCS_MODULES:
        pytest.importorskip(module)
    return _docs_site.build_site(tmp_path_factory.mktemp("docs") / "site")


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory):
    """(folder, agent card, Atari agent card): the bad inputs `jaxsal explain` must refuse, written once
    per module (tests/_support/bad_inputs.py has them and the cases that run them)."""
    from tests._support import bad_inputs  # imported here: it registers the CLI tests' stand-in methods

    return bad_inputs.write(tmp_path_factory.mktemp("bad"))
