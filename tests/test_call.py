"""One checked call for every method: the same bad input gives the same error from a gradient
and a perturbation method, because both run jaxsal.checks.check_call first. Cases come from the
conformance table, so a newly registered method is covered here too."""
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.errors import SaliencyInputError
from tests.test_conformance import CASES, MODEL, PARAMS, _obs

BAD = {
    "not callable": (lambda m: dict(apply_fn=None), "apply_fn must be callable"),
    "wrong channels": (lambda m: dict(obs=_obs()[..., :1]), "failed on obs of shape"),
    "q_action without actions": (lambda m: dict(target="q_action"), "needs actions"),
    "actions out of range": (lambda m: dict(actions=np.array([0, 1, 9])), "actions"),
    "actions wrong shape": (lambda m: dict(actions=np.array([0, 1])), r"shape \(N,\)"),
    "target not per sample": (lambda m: dict(target=lambda out: out), "one scalar per sample"),
    "batch_size zero": (lambda m: dict(batch_size=0), "batch_size must be an integer"),
    "NaN frames": (lambda m: dict(obs=jnp.full((3, 16, 16, 2), jnp.nan)), "NaN"),
}


@pytest.mark.parametrize("bad", sorted(BAD))
@pytest.mark.parametrize("method", sorted(CASES))
def test_every_method_rejects_bad_input_the_same_way(method, bad):
    change, message = BAD[bad]
    call = dict(apply_fn=MODEL.apply, params=PARAMS, obs=_obs(), method=method, **CASES[method])
    call.update(change(method))
    with pytest.raises(SaliencyInputError, match=message):
        jaxsal.explain(call.pop("apply_fn"), call.pop("params"), call.pop("obs"), **call)
