"""A call walks the params tree for its cache keys once: `params_signature` (every leaf's shape and
dtype) is computed in the call's check and handed to each key that needs it (the model check, the CAM
layer sites, SARFA's output check), first call or repeated, eager or under jit, the batch job too."""
import sys

import jax
import numpy as np
import pytest

import jaxsal
from jaxsal import caching, checks, engine
from tests._support.conformance import COMBINED, MODEL, PARAMS, _obs, _spec
from tests.test_conformance import CASES

# one of each kind of key: the model check, the CAM layer site (and the layer_activation site), SARFA's
# output check, a perturbation method, and two methods in one call
CALLS = {"gradient": {}, "gradcam": CASES["gradcam"], "gradcam, layer_activation": None, "sarfa": CASES["sarfa"],
         "lime": CASES["lime"], "gradcam+guided_backprop": None}


@pytest.fixture
def signatures(monkeypatch):
    """A list that grows by one at each params_signature call, wherever jaxsal imported it."""
    calls, real = [], checks.params_signature

    def counted(params):
        calls.append(1)
        return real(params)
    for name, module in list(sys.modules.items()):
        if name.startswith("jaxsal") and getattr(module, "params_signature", None) is real:
            monkeypatch.setattr(module, "params_signature", counted)
    return calls


def _explain(name, obs, params=PARAMS):
    if name == "gradcam, layer_activation":
        return jaxsal.explain(MODEL.apply, params, obs, method="gradcam", layer="conv2", layer_activation="module")
    if name == "gradcam+guided_backprop":
        return jaxsal.explain(MODEL.apply, params, obs, method=["gradcam", "guided_backprop"], layer="conv2")
    return jaxsal.explain(MODEL.apply, params, obs, method=COMBINED.get(name, name), **CALLS[name])


@pytest.mark.parametrize("name", list(CALLS))
def test_once_per_call_first_and_repeated(name, signatures):
    obs = _obs(2)
    caching.clear_caches()  # the first call: every cache misses (the model check's probe too)
    for _ in range(2):
        signatures.clear()
        jax.block_until_ready(_explain(name, obs))
        assert len(signatures) == 1, f"{name}: params_signature ran {len(signatures)} times in one call"


def test_once_per_trace_and_per_batch_job_chunk(signatures):
    obs = _obs(2)
    signatures.clear()
    jax.jit(lambda p, o: _explain("gradcam", o, p))(PARAMS, obs).block_until_ready()
    assert len(signatures) == 1
    signatures.clear()
    maps, out = engine.run([(_spec("gradcam"), CASES["gradcam"])], MODEL.apply, PARAMS, obs, outputs=True)
    assert len(signatures) == 1 and np.asarray(maps[0]).shape == (2,) + obs.shape[1:3]


def test_the_call_carries_the_signature_its_keys_are_made_of():
    call = checks.check_call(MODEL.apply, PARAMS, _obs(1), target="q_chosen", actions=None, layout=None,
                             batch_size=None)
    assert call.params_sig == checks.params_signature(PARAMS)
    other = jax.tree.map(lambda v: v.astype(np.float16), PARAMS)  # same structure, other dtypes: another key
    assert checks.check_call(MODEL.apply, other, _obs(1), target="q_chosen", actions=None, layout=None,
                             batch_size=None).params_sig != call.params_sig
