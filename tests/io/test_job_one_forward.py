"""The batch job runs no forward pass of its own: per chunk it stores the actions and model
outputs the engine's clean forward already computed (jaxsal.engine.run(outputs=True)), and
those equal the plain forward's."""
import jax
import numpy as np
import pytest

import jaxsal
from jaxsal.io import MethodSpec, open_source, run_job
from tests._support.conformance import MODEL, PARAMS, _obs

N, CHUNK = 6, 2


def _counted():
    """MODEL.apply that counts its executions (a debug callback runs once per executed call)."""
    runs = []

    def apply(p, x):
        jax.debug.callback(lambda: runs.append(1))
        return MODEL.apply(p, x)
    return apply, runs


def _job(tmp_path, apply_fn, methods, obs, actions=None, **kw):
    path = tmp_path / "in.npz"
    np.savez(path, obs=obs, **({} if actions is None else {"actions": actions}))
    out = tmp_path / "out"
    run_job(apply_fn, PARAMS, open_source(path), out, [MethodSpec(m, m, {}) for m in methods],
            quiet=True, chunk=CHUNK, **kw)
    return out


@pytest.mark.parametrize("methods,precision", [(["gradient"], "float32"), (["gradient", "gradcam"], "float32"),
                                              (["gradient", "gradcam"], "bfloat16")])
def test_a_chunk_runs_the_forwards_of_its_methods_only(tmp_path, methods, precision):
    # bfloat16: the explain call itself runs the float32 clean forward (the action, the stored output)
    # beside its bfloat16 backward; the job stores that forward's output and adds none
    obs = np.asarray(_obs(N))
    apply_fn, runs = _counted()
    jaxsal.explain(apply_fn, PARAMS, obs[:CHUNK], method=methods if len(methods) > 1 else methods[0],
                   precision=precision)
    jax.effects_barrier()
    per_chunk = len(runs)
    assert per_chunk == (1 if precision == "float32" else 2), per_chunk
    apply_fn, runs = _counted()  # a new function: nothing compiled for it yet
    _job(tmp_path, apply_fn, methods, obs, precision=precision)
    jax.effects_barrier()
    assert len(runs) == per_chunk * (N // CHUNK), (len(runs), per_chunk)


@pytest.mark.parametrize("target", ["q_chosen", "q_action"])
def test_stored_actions_and_outputs_are_the_plain_forwards(tmp_path, target):
    obs = np.asarray(_obs(N)).astype(np.float32)
    actions = np.array([2, 0, 1, 1, 0, 2]) if target == "q_action" else None
    out = _job(tmp_path, MODEL.apply, ["gradient", "occlusion"], obs, actions, target=target)
    got = jaxsal.load_outputs(out)
    q = np.asarray(MODEL.apply(PARAMS, obs))
    np.testing.assert_allclose(got["q"], q, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["action"], q.argmax(-1) if actions is None else actions)
    np.testing.assert_array_equal(got["index"], np.arange(N))


def test_a_job_of_methods_off_the_engine_still_stores_the_outputs(tmp_path):
    obs = np.asarray(_obs(N)).astype(np.float32)
    got = jaxsal.load_outputs(_job(tmp_path, MODEL.apply, ["occlusion"], obs))
    q = np.asarray(MODEL.apply(PARAMS, obs))
    np.testing.assert_allclose(got["q"], q, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(got["action"], q.argmax(-1))


def test_the_engine_returns_the_actions_and_outputs_it_computed():
    obs = np.asarray(_obs(5)).astype(np.float32)
    q = np.asarray(MODEL.apply(PARAMS, obs))
    spec = jaxsal.registry.SPECS["gradient"]
    maps, got = jaxsal.engine.run([(spec, {})], MODEL.apply, PARAMS, obs, batch_size=2, outputs=True)
    want = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, obs, method="gradient"))
    # another batch size is another program: float rounding, relative to each map's scale (a pixel near 0
    # may differ by far more than 1e-6 of itself)
    np.testing.assert_allclose(np.asarray(maps[0]), want, rtol=1e-6, atol=1e-6 * np.abs(want).max())
    np.testing.assert_allclose(np.asarray(got["output"]), q, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(got["actions"]), q.argmax(-1))
    _, alone = jaxsal.engine.run([], MODEL.apply, PARAMS, obs, target="q_action", actions=np.array([1, 0, 2, 2, 1]),
                                 outputs=True)
    np.testing.assert_allclose(np.asarray(alone["output"]), q, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(alone["actions"]), [1, 0, 2, 2, 1])
