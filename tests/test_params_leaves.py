"""The one reading of a parameter tree that the loaders, function agents and jaxsal_agents' msgpack files share:
its leaves by name (a tree of unsortable names refused with the caller's error) and the first leaf that is not
finite in float32."""
import jax.numpy as jnp
import numpy as np
import pytest

from jaxsal.checks import first_nonfinite_leaf, named_leaves


def test_the_first_leaf_not_finite_in_float32_is_named():
    tree = {"a": np.ones(2, np.float32), "b": np.arange(3), "c": jnp.array([1.0, jnp.nan]),
            "d": np.array([1e300]), "e": "text"}
    leaves = named_leaves(tree)
    assert list(leaves) == ["['a']", "['b']", "['c']", "['d']", "['e']"]
    assert first_nonfinite_leaf(leaves.items()) == "['c']"  # a jax array, read on its device
    assert first_nonfinite_leaf([("['d']", tree["d"])]) == "['d']"  # float64 beyond float32's range
    assert first_nonfinite_leaf([("i", np.array([2 ** 62])), ("x", float("nan"))]) is None  # no float dtype
    assert first_nonfinite_leaf(named_leaves({"w": np.zeros((2, 2), np.float16)}).items()) is None


def test_names_that_do_not_sort_raise_the_callers_error():
    mixed = {"a": np.ones(1), b"b": np.ones(1)}
    with pytest.raises(LookupError, match="refused: ValueError"):
        named_leaves(mixed, lambda e: LookupError(f"refused: {type(e).__name__}"))
    with pytest.raises((TypeError, ValueError)):
        named_leaves(mixed)
