"""A shipped method is one file with its registration: `import jaxsal` imports every module of
jaxsal.backprop and jaxsal.perturbation (`jaxsal.registry.discover`), so a new gradient method,
CAM variant or perturbation method dropped into one of them is registered, shipped, runs through
`jaxsal.explain` and gets the generated conformance case (tests/_support/conformance.py), with no edit
to a package `__init__` or a test list. Shown with three such files: added to the packages'
search path in this process, and dropped into a copy of jaxsal imported by a fresh one."""
import importlib
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal import registry
from tests._support import conformance as K

FILES = {
    "backprop/found_abs_gradient.py": '''
        """|dy/dx| summed over the stacked frames: a gradient method."""
        import jax
        import jax.numpy as jnp

        import jaxsal
        from jaxsal.engine import Prepared, Spec, objective


        def _prepare(call, apply_fn, params):
            return Prepared(static=None)


        def _chunk(ctx, params, prep, rows, group, shared):
            return jax.grad(lambda x: objective(ctx.target, ctx.apply_fn(params, x), rows.actions).sum())(rows.x)


        def _finalize(ctx, params, prep, rows, acc):
            a = jnp.abs(acc) if ctx.layout == "NHWC" else jnp.abs(jnp.transpose(acc, (0, 2, 3, 1)))
            return a.sum(-1)


        found_abs_gradient = jaxsal.register(Spec("found_abs_gradient", _prepare, _chunk, _finalize,
                                                  kind="gradient", doc="The magnitude of the input gradient."))
    ''',
    "backprop/found_twice_gradcam.py": '''
        """Grad-CAM's channel weights doubled: a CAM variant (its maps are twice Grad-CAM's)."""
        import jaxsal
        from jaxsal.backprop.cam import CamSpec


        def twice_weights(A, g):
            return 2.0 * g.mean(axis=(1, 2))


        found_twice_gradcam = jaxsal.register(CamSpec(twice_weights), name="found_twice_gradcam")
    ''',
    "perturbation/found_patch_drop.py": '''
        """The target's drop when each patch of a tiling grid is set to 0: a perturbation method."""
        import jax.numpy as jnp
        import numpy as np

        import jaxsal
        from jaxsal.engine import Prepared, Spec, objective


        def _prepare(call, apply_fn, params, *, patch=4):
            h, w, _ = call.hwc
            if not isinstance(patch, int) or patch < 1 or h % patch or w % patch:
                raise jaxsal.SaliencyInputError(f"patch must be a positive int dividing {h}x{w}, got {patch!r}")
            corners = tuple(np.array([i, j], np.int32) for i in range(0, h, patch) for j in range(0, w, patch))
            return Prepared(static=(patch, h, w), groups=corners)


        def _chunk(ctx, params, prep, rows, corner, shared):
            patch, h, w = prep.static
            ii, jj = jnp.arange(h)[:, None], jnp.arange(w)[None, :]
            m = ((ii >= corner[0]) & (ii < corner[0] + patch) & (jj >= corner[1]) & (jj < corner[1] + patch)
                 ).astype(jnp.float32)
            keep = 1.0 - (m[None, :, :, None] if ctx.layout == "NHWC" else m[None, None])
            return -objective(ctx.target, ctx.apply_fn(params, rows.x * keep), rows.actions)[:, None, None] * m


        def _finalize(ctx, params, prep, rows, acc):
            return objective(ctx.target, ctx.apply_fn(params, rows.x), rows.actions)[:, None, None] + acc


        found_patch_drop = jaxsal.register(Spec("found_patch_drop", _prepare, _chunk, _finalize,
                                                options={"patch": 4}, example={"patch": 4}))
    ''',
}
NAMES = sorted(Path(f).stem for f in FILES)
MODULES = [f"jaxsal.{f.removesuffix('.py').replace('/', '.')}" for f in FILES]


def _write(folder: Path):
    for rel, text in FILES.items():
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(textwrap.dedent(text).lstrip())


@pytest.fixture(scope="module")
def found(tmp_path_factory):
    """The three files in a folder per method package, on the packages' search path; discovered."""
    extra = tmp_path_factory.mktemp("method_files")
    _write(extra)
    packages = [importlib.import_module(p) for p in registry.METHOD_PACKAGES]
    saved = [pkg.__path__ for pkg in packages]
    for pkg in packages:
        pkg.__path__ = [*pkg.__path__, str(extra / pkg.__name__.rpartition(".")[2])]
    assert not set(NAMES) & set(registry.METHODS)  # nothing but discovery registers them
    try:
        yield registry.discover()
    finally:
        for pkg, path in zip(packages, saved):
            pkg.__path__ = path
        for name in NAMES:
            registry.SHIPPED.pop(name, None)  # shipped ones cannot be unregistered
            if name in registry.METHODS:
                jaxsal.unregister(name)
        for module in MODULES:
            sys.modules.pop(module, None)
            parent, _, leaf = module.rpartition(".")
            vars(sys.modules[parent]).pop(leaf, None)


def test_discovery_registers_and_ships_each_file(found):
    assert found == NAMES
    assert set(NAMES) <= set(jaxsal.methods()) and "found_twice_gradcam" in jaxsal.cam_methods()
    assert all(K.shipped(n) for n in NAMES) and set(NAMES) <= set(K.cases(only_shipped=True))
    assert K.example("found_patch_drop") == {"patch": 4} and jaxsal.method_options("found_patch_drop") == {"patch": 4}
    assert registry.discover() == []  # found once: a module already imported is not run again
    with pytest.raises(jaxsal.SaliencyInputError, match="ships with jaxsal"):
        jaxsal.unregister("found_patch_drop")


@pytest.mark.slow  # 3-8 s (a subprocess, a game or a whole job): the slow stage, which CI runs
def test_the_found_methods_run_through_explain(found):
    obs = K._obs()
    f = lambda **kw: jaxsal.explain(K.MODEL.apply, K.PARAMS, obs, **kw)  # noqa: E731
    K._close(f(method="found_abs_gradient"), jnp.abs(f(method="gradient", per_frame=True)).sum(-1), "abs gradient")
    occ = f(method="occlusion", patch=4, stride=4, score="drop", upsample="nearest")
    np.testing.assert_allclose(f(method="found_patch_drop"), occ, rtol=1e-5, atol=1e-6)
    many = f(method=["found_twice_gradcam", "gradcam", "found_patch_drop"], layer="conv2")  # one shared backward
    assert float(jnp.abs(many["gradcam"]).max()) > 0
    np.testing.assert_allclose(many["found_twice_gradcam"], 2 * many["gradcam"], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(many["found_patch_drop"], occ, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", [  # the fast loop runs one (2 s each); test_own_methods runs them on others
    n if n == NAMES[0] else pytest.param(n, marks=pytest.mark.slow) for n in NAMES])
def test_each_passes_the_generated_checks(found, name):
    K.check_shapes_batching_chunking_layout(name)
    K.check_bad_input(name)


@pytest.mark.slow  # a compile each under jit, vmap and scan
@pytest.mark.parametrize("name", NAMES)
def test_each_passes_the_traced_generated_checks(found, name):
    K.check_shapes_batching_chunking_layout(name, jax.jit, eager=False)
    K.check_deterministic_vmap_and_scan(name)


_IMPORT = textwrap.dedent("""
    import jaxsal
    from jaxsal import registry
    assert jaxsal.__file__.startswith(sys.argv[1]), jaxsal.__file__   # the copy with the three files
    assert registry.SHIPPED == registry.METHODS, sorted(set(registry.METHODS) - set(registry.SHIPPED))
    print(" ".join(sorted(registry.SHIPPED)))
""")


@pytest.mark.slow  # 3-8 s (a subprocess, a game or a whole job): the slow stage, which CI runs
def test_import_jaxsal_finds_files_dropped_into_its_packages(tmp_path):
    """A fresh process imports a copy of jaxsal with the three files in its backprop/ and
    perturbation/ folders (no other file of the copy changed): all three are shipped methods."""
    copy = tmp_path / "jaxsal"
    shutil.copytree(Path(jaxsal.__file__).parent, copy)  # with __pycache__: its bytecode stays valid
    _write(copy)
    r = subprocess.run([sys.executable, "-c", "import sys\n" + _IMPORT, str(copy)], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    shipped = r.stdout.split()
    assert set(NAMES) <= set(shipped) and set(shipped) - set(NAMES) == set(registry.SHIPPED) - set(NAMES)
