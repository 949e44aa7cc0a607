"""Every jaxsal cache is one bounded, registered jaxsal.caching.LRU: `jaxsal.clear_caches()`
empties them all (found through the registry, so a new cache is covered without editing this
file), none grows past its bound, and no module keeps a cache of its own beside them."""
import ast
from pathlib import Path

import jax
import numpy as np
import pytest

import jaxsal
import jaxsal.cli.sweep_run  # noqa: F401  (its caches register on import)
import jaxsal.plugins  # noqa: F401
from jaxsal import caching
from jaxsal.perturbation import _disk
from tests._support.conformance import MODEL, PARAMS, _obs

ROOT = Path(jaxsal.__file__).parent
REGISTRIES = {"METHODS", "STOCHASTIC", "SPECS", "EXAMPLES", "TABLES", "REPLACED", "SHIPPED", "CAMS", "_CACHES"}  # what is registered, not cached


def test_clear_caches_empties_every_cache():
    obs = _obs()
    jaxsal.explain(MODEL.apply, PARAMS, obs, method=["gradcam", "gradient"], layer="conv2")
    jaxsal.explain(MODEL.apply, PARAMS, obs, method="rise", n_masks=8, key=jax.random.PRNGKey(0))
    jaxsal.explain(MODEL.apply, PARAMS, obs, method="scorecam", layer="conv2")
    filled = {c.name for c in caching.caches() if len(c)}
    assert {"jit", "checked model outputs", "layer sites", "RISE mask builders",
            "Score-CAM resize matrices"} <= filled, filled
    for c in caching.caches():  # the ones this workload does not reach
        c.get_or_build(("probe", c.name), lambda: 0)
    assert all(len(c) for c in caching.caches())
    jaxsal.clear_caches()
    assert {c.name: len(c) for c in caching.caches() if len(c)} == {}


def test_a_cleared_memo_recomputes_and_a_memo_hits():
    calls = []

    @caching.memo("test: counted", 8)
    def f(n, scale=1.0):
        calls.append(n)
        return n * scale

    try:
        assert f(2) == f(2) == 2 and calls == [2]
        assert f(2, scale=1) == 2 and calls == [2, 2]  # 1 and 1.0 are different keys (static_key)
        jaxsal.clear_caches()
        assert f(2) == 2 and calls == [2, 2, 2]
    finally:
        caching._CACHES.remove(f.cache)


def test_no_cache_outgrows_its_bound(monkeypatch):
    for c in caching.caches():
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


CACHE_WORDS = ("lru_cache", "functools.cache", "@cache", "OrderedDict", "cachetools")


def _empty_container(v) -> bool:
    """An expression that makes an empty, growable container: {}, [], set(), dict(), list(), a
    defaultdict (empty whatever its factory) or a deque without maxlen (tables like dict(a=1) are
    not)."""
    if isinstance(v, (ast.Dict, ast.List, ast.Set)):
        return not (getattr(v, "keys", None) or getattr(v, "elts", None))
    if not isinstance(v, ast.Call):
        return False
    name = getattr(v.func, "id", getattr(v.func, "attr", None))
    if name == "defaultdict":
        return True
    if name == "deque":
        return not any(k.arg == "maxlen" for k in v.keywords) and len(v.args) < 2
    return name in ("dict", "list", "set") and not v.args and not v.keywords


def _container(v) -> bool:
    """Any dict, list or set display or constructor call (a cache by its name, empty or not)."""
    return isinstance(v, (ast.Dict, ast.List, ast.Set)) or (isinstance(v, ast.Call) and getattr(
        v.func, "id", getattr(v.func, "attr", None)) in ("dict", "list", "set", "defaultdict", "OrderedDict"))


def own_caches(text: str, caching_module: bool = False) -> list[str]:
    """Caches in a module's source that clear_caches cannot see: functools/cachetools caches and
    OrderedDicts (outside caching.py), module-level empty containers (not the registries), and
    attributes named like a cache (`self._cache = {}`) made empty (a pickle reader's memo table is not one)."""
    found = [word for word in CACHE_WORDS if word in text and not caching_module]
    tree = ast.parse(text)
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            name = ast.unparse(node.targets[0] if isinstance(node, ast.Assign) else node.target)
            if _empty_container(node.value) and name not in REGISTRIES:
                found.append(f"{node.lineno}: module-level {name} = {ast.unparse(node.value)}")
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Attribute) and "cache" in t.attr.lower() and _container(node.value):
                    found.append(f"{node.lineno}: {ast.unparse(t)} = {ast.unparse(node.value)}")
    return found


def test_no_module_keeps_a_cache_of_its_own():
    """functools caches, OrderedDicts, module-level containers filled at run time and per-object
    cache dicts are caches that clear_caches does not see: every cache is a caching.LRU instead."""
    found = [f"{path.relative_to(ROOT.parent)}: {f}" for path in sorted(ROOT.rglob("*.py"))
             for f in own_caches(path.read_text(), path.name == "caching.py")]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("text", ["_SEEN = {}", "_SEEN: dict[str, int] = {}", "_SEEN = dict()", "_SEEN = []",
                                  "_BY = defaultdict(list)", "_BY = collections.defaultdict(dict, a=1)",
                                  "_Q = deque()", "import functools\n@functools.lru_cache\ndef f(): pass",
                                  "class A:\n    def __init__(self):\n        self._cache = {}",
                                  "class A:\n    def __init__(self, k, v):\n        self._cache: dict = {k: v}",
                                  "class A:\n    def f(self):\n        self.chunk_cache: dict = dict()"])
def test_the_scan_flags_a_cache(text):
    assert own_caches(text)


@pytest.mark.parametrize("text", ["OPTIONS = dict(a=1)", "TABLE = {'a': 1}", "NAMES = ['a']", "_Q = deque(maxlen=8)",
                                  "METHODS: dict = {}", "def f():\n    seen = {}\n    return seen",
                                  "class A:\n    def __init__(self):\n        self.rows = {}",
                                  "class Unpickler:\n    def __init__(self):\n        self.memo = {}"])  # a pickle memo table
def test_the_scan_leaves_tables_registries_and_locals_alone(text):
    assert own_caches(text) == []


def test_a_map_views_open_chunks_are_bounded_and_cleared(tmp_path):
    from jaxsal.io import MethodSpec, open_source, run_job
    from jaxsal.io.store import _OPEN_CHUNKS

    np.save(tmp_path / "x.npy", np.asarray(_obs(5)))
    run_job(MODEL.apply, PARAMS, open_source(tmp_path / "x.npy"), tmp_path / "o",
            [MethodSpec("gradient", "gradient", {})], quiet=True, chunk=2)
    jaxsal.clear_caches()
    maps = jaxsal.load_maps(tmp_path / "o", "gradient")
    whole = np.asarray(maps[:])
    assert len(_OPEN_CHUNKS) == 3  # every chunk touched once, each opened once
    jaxsal.clear_caches()
    assert len(_OPEN_CHUNKS) == 0
    np.testing.assert_array_equal(np.asarray(maps[:]), whole)  # reopened on the next touch
    np.testing.assert_array_equal(maps[4], whole[4])


def test_a_method_first_called_under_jit_then_eagerly():
    """A memo filled while the caller's jit traces keeps no tracer: the eager call after it works
    and gives the traced call's maps (RISE's mask builder once kept jax arrays made in the trace)."""
    jaxsal.clear_caches()
    obs, key = np.asarray(_obs(2), np.float32), jax.random.PRNGKey(0)
    opts = dict(method="rise", n_masks=8, grid=3, key=key)
    traced = jax.jit(lambda x: jaxsal.explain(MODEL.apply, PARAMS, x, **opts))(obs)
    eager = jaxsal.explain(MODEL.apply, PARAMS, obs, **opts)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(traced), rtol=1e-5, atol=1e-6)
