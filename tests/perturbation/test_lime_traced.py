"""LIME under a trace: segments given on the host need no callback; the callback that segments traced
frames is refused, naming the fix, where JAX's CPU client would run it with one usable core (it hung)."""
import importlib

import jax
import numpy as np
import pytest

from jaxsal import SaliencyInputError, cpu
from jaxsal.perturbation import lime
from tests.perturbation.test_superpixel import KEY, model_params

lime_module = importlib.import_module("jaxsal.perturbation.lime")


def test_one_usable_core_refuses_the_callback_and_names_the_fix(monkeypatch):
    model, params, obs = model_params()
    monkeypatch.setattr(cpu, "usable_cores", lambda: 1)
    traced = jax.jit(lambda o: lime(model.apply, params, o, key=KEY, n_samples=24,
                                    segmentation_options={"n_segments": 6}))
    with pytest.raises(SaliencyInputError, match=r"one CPU core.*segments=jaxsal\.perturbation\.segment"):
        traced(obs)
    given = lime_module.segment(np.asarray(obs, np.float32), n_segments=6)  # the fix the message names
    fixed = jax.jit(lambda o: lime(model.apply, params, o, key=KEY, n_samples=24, segments=given))(obs)
    eager = lime(model.apply, params, obs, key=KEY, n_samples=24, segmentation_options={"n_segments": 6})
    np.testing.assert_allclose(np.asarray(fixed), np.asarray(eager), rtol=1e-4, atol=1e-5)


def test_usable_cores_counts_this_process_cores():
    assert 1 <= cpu.usable_cores() <= (__import__("os").cpu_count() or 1)
