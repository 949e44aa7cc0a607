"""A method with an inner loop (perturbation index groups, noise samples or path steps in groups of
batch_size model rows) compiles each of its engine programs once in a first eager call: every
group runs the same step program, with the actions in its inputs from the first group on (a first
group traced without them compiled the whole step a second time: ~2-3 s on the Nature CNN)."""
from collections import Counter

import numpy as np
import pytest
from jax._src import monitoring

import jaxsal
from jaxsal import batching, engine
from jaxsal.checks import check_call
from jaxsal.engine.execute import bind
from tests._conformance import _spec
from tests.test_conformance import CASES, COMBINED, MODEL, PARAMS, _obs

BATCH = 2
"""Model rows per step: every inner loop of the conformance cases then has several groups."""

_COMPILES = []
monitoring.register_event_duration_secs_listener(
    lambda event, secs, **kw: _COMPILES.append(kw.get("fun_name"))
    if event.endswith("backend_compile_duration") else None)


def _groups(method, obs) -> int:
    spec = _spec(method)
    call = check_call(MODEL.apply, PARAMS, obs, target="q_chosen", actions=None, layout=None, batch_size=BATCH)
    return len(spec.prepare(call, MODEL.apply, PARAMS, **bind(spec, CASES[method])).groups)


LOOPED = sorted(m for m in CASES if _groups(m, _obs(1)) > 1)


def test_the_inner_loop_methods_are_found():
    assert {"occlusion", "rise", "lime", "noise_sensitivity", "sarfa", "scorecam", "smoothgrad",
            "integrated_gradients"} <= set(LOOPED)


def _first_call_compiles(monkeypatch, call) -> Counter:
    """Compiles per engine program name (jaxsal.batching.cached_jit's functions) of a first call."""
    built, real = [], batching.cached_jit
    monkeypatch.setattr(batching, "cached_jit", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    batching.clear_caches()  # a fresh process: every program is built and compiled anew
    _COMPILES.clear()
    call()
    names = {f"jit({fn.__name__})" for fn in built}
    assert len(names) > 1, "no inner loop ran: the case tests nothing"
    return Counter(n for n in _COMPILES if n in names)


QUICK = {"occlusion", "smoothgrad"}
"""The outputs=True (batch job) case of these two runs in the fast loop, the others' are slow tests."""


@pytest.mark.parametrize("method,outputs", [(m, False) for m in LOOPED] + [
    (m, True) if m in QUICK else pytest.param(m, True, marks=pytest.mark.slow) for m in LOOPED])
def test_each_engine_program_compiles_once(method, outputs, monkeypatch):
    spec, obs = _spec(method), _obs(2)
    if outputs:  # the batch job's call: the model outputs come back too
        call = lambda: engine.run([(spec, CASES[method])], MODEL.apply, PARAMS, obs, batch_size=BATCH,  # noqa: E731
                                  outputs=True)[0][0]
    else:
        call = lambda: jaxsal.explain(MODEL.apply, PARAMS, obs, method=COMBINED.get(method, method),  # noqa: E731
                                      batch_size=BATCH, **CASES[method])
    compiles = _first_call_compiles(monkeypatch, lambda: np.asarray(call()))
    assert max(compiles.values()) == 1, f"{method}: programs compiled more than once: {dict(compiles)}"
