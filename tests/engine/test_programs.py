"""The engine's programs: each compiles once in a first eager call, and no forward runs twice.

A method with an inner loop (perturbation index groups, noise samples or path steps in groups of
batch_size model rows) runs every group in one step program, with the actions in its inputs
from the first group on (a first group traced without them compiled the whole step a second
time: ~2-3 s on the Nature CNN). A single-backward method chooses the greedy action on its
backward's own forward (a separate forward for the choice cost ~20% of Grad-CAM's time)."""
from collections import Counter

import jax
import numpy as np
import pytest
from jax._src import monitoring

import jaxsal
from jaxsal import caching, engine
from jaxsal.checks import check_call
from jaxsal.engine.execute import bind
from tests._support.conformance import _spec
from tests._support.conformance import COMBINED, MODEL, PARAMS, _obs
from tests.test_conformance import CASES

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
    """Compiles per engine program name (jaxsal.caching.cached_jit's functions) of a first call."""
    built, real = [], caching.cached_jit
    monkeypatch.setattr(caching, "cached_jit", lambda *a, **k: built.append(real(*a, **k)) or built[-1])
    caching.clear_caches()  # a fresh process: every program is built and compiled anew
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


@pytest.mark.parametrize("method", ["gradcam", "gradient", "guided_backprop", ["gradcam", "guided_backprop"]])
def test_the_action_comes_from_the_backward_s_own_forward(method, monkeypatch):
    """A single-backward method (Spec.chooses) traces the model as often choosing the greedy
    action as when the actions are given: the choice is made on its backward's clean forward, not
    by a second forward; the maps are those of the given greedy actions."""
    traces = []

    def model(params, obs):  # a new function per test: its programs are traced afresh
        traces.append(1)
        return MODEL.apply(params, obs)

    real = engine.execute._chunks

    def counting(program, *a, **k):  # the model traces while the chunk program is built and run
        before = len(traces)
        out = real(program, *a, **k)
        counts.append(len(traces) - before)
        return out
    monkeypatch.setattr(engine.execute, "_chunks", counting)
    obs, opts = _obs(2), {"layer": "conv2"} if "gradcam" in method else {}
    acts = np.asarray(MODEL.apply(PARAMS, obs.astype(np.float32))).argmax(-1)
    counts = []
    chosen = jaxsal.explain(model, PARAMS, obs, method=method, **opts)
    given = jaxsal.explain(model, PARAMS, obs, method=method, actions=acts, **opts)
    assert counts[0] == counts[1] > 0, f"choosing the action traced the model {counts[0] - counts[1]} more time(s)"
    for a, b in zip(jax.tree.leaves(chosen), jax.tree.leaves(given)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


LIME_PROGRAMS = {"jit(_samples)", "jit(clean)", "jit(per_chunk_arrays)", "jit(step)", "jit(finalize)", "jit(add)",
                 "jit(whole)"}
"""What a first LIME call may compile: its samples' one program, the engine's programs (the clean
forward, the per-chunk arrays, step and finalize of an inner loop, or the whole chunk) and the sum
of the groups' parts."""


@pytest.mark.parametrize("batch_size", [BATCH, None], ids=["inner loop", "one group"])
def test_lime_s_host_setup_compiles_no_eager_program(batch_size):
    """LIME's setup outside the chunk programs compiles nothing of its own on a first call: the
    samples are one jitted program, the group offsets and the per-state segments and valid masks
    are host arrays (a jnp op on them compiled one program each: 22 compiles, now 6 or 2)."""
    obs = _obs(2)
    jax.clear_caches()  # a fresh process: JAX's own caches too (an eager op compiles once per shape)
    caching.clear_caches()
    _COMPILES.clear()
    np.asarray(jaxsal.explain(MODEL.apply, PARAMS, obs, method="lime", batch_size=batch_size, **CASES["lime"]))
    compiles = Counter(_COMPILES)
    assert set(compiles) <= LIME_PROGRAMS and max(compiles.values()) == 1, dict(compiles)
    assert "jit(_samples)" in compiles and len(compiles) == (6 if batch_size else 2), dict(compiles)
