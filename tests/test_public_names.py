"""Every public name of jaxsal means one thing: at the top level no function shares its name with
a submodule, and nowhere does one hide a package (a function `jaxsal.gradient` over the package
of the same name made `import jaxsal.backprop.cam` fail). Inside a method package, a method's
file carries the method's name (`jaxsal.perturbation.occlusion` holds `occlusion`), as a newcomer
looks for it. The module paths the docstrings recommend import and resolve."""
import importlib
import pkgutil

import jaxsal


def _submodules(pkg, packages_only: bool):
    return {m.name.rpartition(".")[2]: m.name for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + ".")
            if m.ispkg or not packages_only}


def test_no_public_name_is_both_a_module_and_something_else():
    clashes = []
    for pkg in (jaxsal, jaxsal.backprop, jaxsal.perturbation, jaxsal.metrics, jaxsal.io, jaxsal.loaders):
        for short, full in _submodules(pkg, packages_only=pkg is not jaxsal).items():
            value = getattr(pkg, short, None)
            if value is not None and not (hasattr(value, "__name__") and value.__name__ == full):
                clashes.append(f"{pkg.__name__}.{short} is {type(value).__name__}, and {full} is a module")
    assert not clashes, "\n".join(clashes)


def test_documented_module_paths_import():
    cam = importlib.import_module("jaxsal.backprop.cam")
    layers = importlib.import_module("jaxsal.backprop.layers")
    assert cam.CAMS and layers.layer_calls is jaxsal.layer_calls
    import jaxsal.backprop.strided_conv as sc  # noqa: F401  (the strided-conv backward rule)
    assert callable(jaxsal.explain) and callable(jaxsal.gradient) and callable(jaxsal.backprop.gradient)


def test_the_checker_sees_a_clash(monkeypatch):
    monkeypatch.setattr(jaxsal, "cpu", lambda: None)
    try:
        test_no_public_name_is_both_a_module_and_something_else()
    except AssertionError as e:
        assert "jaxsal.cpu is function" in str(e)
    else:
        raise AssertionError("a function named like a submodule went unnoticed")


def test_the_old_name_of_game_objects_warns_and_gives_the_same_names():
    import sys

    import pytest

    import jaxsal.game_objects as game_objects
    assert "jaxsal.objects" not in sys.modules  # nothing of jaxsal imports the old name
    try:
        with pytest.warns(DeprecationWarning, match="jaxsal.objects is now jaxsal.game_objects"):
            old = importlib.import_module("jaxsal.objects")
        assert set(old.__all__) == set(game_objects.__all__)
        assert all(getattr(old, n) is getattr(game_objects, n) for n in game_objects.__all__)
    finally:
        sys.modules.pop("jaxsal.objects", None)
        vars(jaxsal).pop("objects", None)
