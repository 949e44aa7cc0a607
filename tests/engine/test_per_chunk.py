"""Spec.per_chunk: arrays every group of a chunk reads (the clean output, a blurred copy) are
computed once per chunk, in a program of their own ahead of the inner loop, and the maps equal
those computed inline (one group, one program) and those of a spec that computes them per group."""
import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import engine
from jaxsal.engine.spec import Prepared, Spec
from tests._support.conformance import MODEL, PARAMS, _obs

GROUPS = 3


def _spec(calls, per_chunk: bool):
    """A toy inner-loop method: part g = (g + 1) * (Q of the chosen action on a blurred copy of x),
    summed over GROUPS groups; with per_chunk the blurred copy's Q comes from Spec.per_chunk."""
    def clean_q(ctx, params, rows):
        def count(n):
            calls.append(int(n))
        jax.debug.callback(count, rows.x.shape[0])
        q = ctx.apply_fn(params, rows.x * 0.5)
        return jnp.take_along_axis(q, rows.actions[:, None], axis=1)[:, 0]

    def prepare(call, apply_fn, params):
        return Prepared("toy", groups=tuple(np.float32(g + 1) for g in range(GROUPS)))

    def chunk(ctx, params, prep, rows, group, shared):
        q = rows.extra["q"] if per_chunk else clean_q(ctx, params, rows)
        return group * q

    def finalize(ctx, params, prep, rows, acc):
        return acc

    return Spec("toy", prepare, chunk, finalize,
                per_chunk=(lambda ctx, params, prep, rows: {"q": clean_q(ctx, params, rows)}) if per_chunk else None)


def test_per_chunk_arrays_are_computed_once_per_chunk_and_give_the_same_result():
    obs = _obs(6)
    runs = {}
    for per_chunk in (True, False):
        calls = []
        out = engine.run([(_spec(calls, per_chunk), {})], MODEL.apply, PARAMS, obs, batch_size=2)[0]
        jax.effects_barrier()
        runs[per_chunk] = (np.asarray(out), calls)
    (once, once_calls), (each, each_calls) = runs[True], runs[False]
    assert len(once_calls) == 3, once_calls                 # 3 chunks of 2 states: once each
    assert len(each_calls) == 3 * GROUPS, each_calls        # computed in every group's step
    # per-chunk and per-group Q-values are two programs: a Q near 0 is compared to rtol of the largest
    np.testing.assert_allclose(once, each, rtol=1e-6, atol=1e-6 * np.abs(each).max())
    q = np.asarray(MODEL.apply(PARAMS, np.asarray(obs, np.float32) * 0.5))
    want = sum(range(1, GROUPS + 1)) * q[np.arange(6), np.asarray(
        MODEL.apply(PARAMS, np.asarray(obs, np.float32))).argmax(-1)]
    np.testing.assert_allclose(once, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_per_chunk_arrays_inline_in_one_program_and_under_jit():
    """One group: the whole chunk in one program computes them inline; under the caller's jit the
    same maps."""
    obs = _obs(4)
    calls = []
    spec = _spec(calls, True)
    one = spec._replace(prepare=lambda call, apply_fn, params: Prepared("toy", groups=(np.float32(1.0),)))
    eager = np.asarray(engine.run([(one, {})], MODEL.apply, PARAMS, obs, batch_size=4)[0])
    jitted = jax.jit(lambda p, o: engine.run([(spec, {})], MODEL.apply, p, o, batch_size=2)[0])(PARAMS, obs)
    many = np.asarray(engine.run([(spec, {})], MODEL.apply, PARAMS, obs, batch_size=2)[0])
    np.testing.assert_allclose(np.asarray(jitted), many, rtol=1e-6, atol=1e-6 * np.abs(many).max())
    np.testing.assert_allclose(eager * sum(range(1, GROUPS + 1)), many, rtol=1e-5, atol=1e-5 * np.abs(many).max())
