"""Every jaxsal cache is one bounded, registered jaxsal.batching.LRU: `jaxsal.clear_caches()`
empties them all (found through the registry, so a new cache is covered without editing this
file), none grows past its bound, and no module keeps a cache of its own beside them."""
import ast
from pathlib import Path

import jax
import numpy as np

import jaxsal
import jaxsal.cli.sweep_run  # noqa: F401  (its caches register on import)
import jaxsal.plugins  # noqa: F401
from jaxsal import batching
from jaxsal.perturbation import _disk
from tests.test_conformance import MODEL, PARAMS, _obs

ROOT = Path(jaxsal.__file__).parent
REGISTRIES = {"METHODS", "STOCHASTIC", "SPECS", "EXAMPLES", "TABLES", "REPLACED", "SHIPPED", "CAMS", "_CACHES"}  # what is registered, not cached


def test_clear_caches_empties_every_cache():
    obs = _obs()
    jaxsal.explain(MODEL.apply, PARAMS, obs, method=["gradcam", "gradient"], layer="conv2")
    jaxsal.explain(MODEL.apply, PARAMS, obs, method="rise", n_masks=8, key=jax.random.PRNGKey(0))
    jaxsal.explain(MODEL.apply, PARAMS, obs, method="scorecam", layer="conv2")
    filled = {c.name for c in batching.caches() if len(c)}
    assert {"jit", "checked model outputs", "layer sites", "RISE mask builders",
            "Score-CAM resize matrices"} <= filled, filled
    for c in batching.caches():  # the ones this workload does not reach
        c.get_or_build(("probe", c.name), lambda: 0)
    assert all(len(c) for c in batching.caches())
    jaxsal.clear_caches()
    assert {c.name: len(c) for c in batching.caches() if len(c)} == {}


def test_a_cleared_memo_recomputes_and_a_memo_hits():
    calls = []

    @batching.memo("test: counted", 8)
    def f(n, scale=1.0):
        calls.append(n)
        return n * scale

    try:
        assert f(2) == f(2) == 2 and calls == [2]
        assert f(2, scale=1) == 2 and calls == [2, 2]  # 1 and 1.0 are different keys (static_key)
        jaxsal.clear_caches()
        assert f(2) == 2 and calls == [2, 2, 2]
    finally:
        batching._CACHES.remove(f.cache)


def test_no_cache_outgrows_its_bound(monkeypatch):
    for c in batching.caches():
        monkeypatch.setattr(c, "maxsize", 3)
        c.clear()
        for i in range(10):
            c.get_or_build(("bound", i), lambda: i)
            c[("set", i)] = i
            assert len(c) <= 3, c.name
        c.get_or_build(("set", 8), lambda: None)  # a hit makes it the most recently used
        c[("new",)] = 0
        assert list(c) == [("set", 9), ("set", 8), ("new",)], c.name  # least recently used left first
        c.clear()


def test_a_memoised_function_stays_within_its_bound():
    _disk._blur_matrix_np.cache_clear()
    for n in range(1, _disk._blur_matrix_np.cache.maxsize + 20):
        _disk._blur_matrix_np(n, 1.0)
    assert len(_disk._blur_matrix_np.cache) == _disk._blur_matrix_np.cache.maxsize
    np.testing.assert_allclose(_disk.blur_matrix(5, 0.0), np.eye(5))


def test_no_module_keeps_a_cache_of_its_own():
    """functools caches, OrderedDicts and module-level dicts filled at run time are caches that
    clear_caches does not see: every cache is a batching.LRU instead."""
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        text = path.read_text()
        rel = path.relative_to(ROOT.parent)
        for word in ("lru_cache", "functools.cache", "@cache", "OrderedDict", "cachetools"):
            if word in text and path.name != "batching.py":
                found.append(f"{rel}: {word}")
        for node in ast.parse(text).body:
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                v = node.value
                empty = (isinstance(v, (ast.Dict, ast.List, ast.Set)) and not (
                    getattr(v, "keys", None) or getattr(v, "elts", None))) or (
                    isinstance(v, ast.Call) and getattr(v.func, "id", getattr(v.func, "attr", None))
                    in ("dict", "list", "set", "defaultdict"))
                name = ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
                if empty and name not in REGISTRIES:
                    found.append(f"{rel}:{node.lineno}: module-level {name} = {ast.unparse(v)}")
    assert not found, "\n".join(found)
