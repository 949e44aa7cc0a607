"""jaxsal.sizing.plan sizes every chunk of states and every group of a state's inner loop: it meets
its definition (at most batch_size rows per call, groups as large as fit), gives the sizes the
callers' own arithmetic gave (the compiled programs' shapes, hence the maps' bits, are unchanged),
the engine, the combinators, the perturbation methods and the sanity check use it with the caller's
batch_size, and a bad batch_size is refused the same way at every door."""
import itertools
import math
import re

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal import batching, sizing
from jaxsal.engine import execute
from jaxsal.errors import SaliencyInputError
from tests._support.conformance import KEY, MODEL, PARAMS, _obs


# ---------------------------------------------------------------- the sizes before (each caller's own)
def _old_chunk_size(n, batch_size, rows_per_state=1):
    """batching.chunk_size as it was (the engine's and map_batched's states per chunk)."""
    per = n if batch_size is None else max(1, batch_size // max(1, rows_per_state))
    if n < per:
        per = sizing.bucket(n, per)
    ndev = jax.local_device_count()
    return int(math.ceil(per / ndev) * ndev)


def _old_sample_groups(total, rows, rows_per_state):
    """combinators.sample_groups as the combinators called it: (samples per group, groups)."""
    s = max(1, min(total, max(1, rows // max(1, rows_per_state))))
    return s, int(math.ceil(total / s))


def _old_perturbation_groups(n_pert, rows):
    """perturbation._common.prepared's balanced index groups: (indices per group, groups)."""
    k = min(n_pert, rows)
    k = int(math.ceil(n_pert / math.ceil(n_pert / k)))
    return k, int(math.ceil(n_pert / k))


GRID = list(itertools.product((1, 2, 3, 11, 17, 64, 300), (1, 2, 7, 16, 64, 256), (1, 2, 5, 300), (1, 4, 50, 51)))


def test_bucket_sizes():
    assert [sizing.bucket(n, 64) for n in (1, 2, 4, 5, 16, 17, 50, 63, 64)] == [1, 4, 4, 16, 16, 64, 64, 64, 64]
    assert [sizing.bucket(n, 100) for n in (1, 3, 17, 64, 65, 100)] == [1, 4, 64, 64, 100, 100]


def test_plan_gives_the_sizes_the_callers_computed():
    for n, bs, rps, total in GRID:
        assert sizing.plan(n, bs, rps).states == _old_chunk_size(n, bs, rps)
        s, count = _old_sample_groups(total, bs, rps)
        p = sizing.plan(n, bs, rps, total)
        assert (p.group, p.groups) == (s, count), (n, bs, rps, total)
        assert p.states == _old_chunk_size(n, bs, s * rps)  # the engine's chunk of the combined spec
        k, kcount = _old_perturbation_groups(total, bs)
        q = sizing.plan(n, bs, 1, total, balanced=True)
        assert (q.group, q.groups, q.states) == (k, kcount, _old_chunk_size(n, bs, k)), (n, bs, total)
    for n in (1, 5, 64, 300):
        assert sizing.plan(n, None).states == _old_chunk_size(n, None)


def test_plan_meets_its_definition():
    """Searched, not computed: the largest group whose rows fit in one call (at least one item), as
    few groups as hold the total (balanced: the smallest equal size that does), then the most states
    whose rows fit (at least one), a bucket size for a smaller call, a multiple of the devices."""
    for n, bs, rps, total in GRID:
        full = max([g for g in range(1, total + 1) if g * rps <= bs], default=1)
        groups = next(c for c in itertools.count(1) if c * full >= total)
        for balanced in (False, True):
            p = sizing.plan(n, bs, rps, total, balanced=balanced)
            group = min(g for g in range(1, full + 1) if g * groups >= total) if balanced else full
            assert (p.group, p.groups) == (group, groups), (n, bs, rps, total, balanced)
            chunk = max([s for s in range(1, bs + 1) if s * group * rps <= bs], default=1)
            want = chunk if n >= chunk else min(b for b in (1, 4, 16, 64, 256, chunk) if b >= n and b <= chunk)
            assert p.states == sizing.device_multiple(want), (n, bs, rps, total, balanced)
            assert p.states % jax.local_device_count() == 0


@pytest.mark.parametrize("args,want", [
    # n smaller than a group: one state per chunk, 4 groups of 16 samples (the last one 14 padded)
    ((1, 16, 1, 50), (1, 16, 4)),
    # rows per state larger than batch_size: one item per group, one state per chunk
    ((10, 256, 300, 4), (1, 1, 4)),
    ((10, 256, 300, 1), (1, 1, 1)),
    # totals not divisible: 50 samples in rows of 16 -> 16, 16, 16, 2 (+14 padded)
    ((40, 16, 1, 50), (1, 16, 4)),
    ((40, 64, 1, 50), (1, 50, 1)),
    ((40, 100, 1, 50), (2, 50, 1)),
    # a call smaller than one chunk: a bucket size (1, 4, 16, ...) or the chunk itself
    ((3, 256, 1, 1), (4, 1, 1)),
    ((17, 256, 1, 1), (64, 1, 1)),
    ((300, 256, 1, 1), (256, 1, 1)),
    # batch_size None: everything in one call
    ((7, None, 3, 50), (7, 50, 1)),
])
def test_plan_edge_cases(args, want):
    ndev = jax.local_device_count()
    p = sizing.plan(*args)
    assert (p.states, p.group, p.groups) == (sizing.device_multiple(want[0]), want[1], want[2])
    assert ndev > 1 or p.states == want[0]


def test_balanced_groups_pad_less():
    assert sizing.plan(8, 16, 1, 50, balanced=True)[1:] == (13, 4)  # 52 rows per state, not 64
    assert sizing.plan(8, 16, 1, 48, balanced=True)[1:] == sizing.plan(8, 16, 1, 48)[1:] == (16, 3)


BAD = [0, -3, True, False, 2.5, 256.0, "8", [8]]


@pytest.mark.parametrize("bad", BAD, ids=repr)
def test_a_bad_batch_size_is_refused_naming_the_fix(bad):
    want = re.escape(f"batch_size must be a positive int (model rows per device call), e.g. batch_size=256, "
                     f"got {bad!r}")
    for call in (lambda: sizing.check_batch_size(bad), lambda: sizing.rows(bad), lambda: sizing.plan(5, bad),
                 lambda: sizing.plan(5, bad, 2, 10, balanced=True),
                 lambda: batching.map_batched(lambda p, x: x, None, np.zeros((3, 2)), batch_size=bad)):
        with pytest.raises(SaliencyInputError, match=want):
            call()


def test_a_numpy_int_batch_size_is_accepted():
    assert sizing.check_batch_size(np.int64(8)) == 8 and type(sizing.check_batch_size(np.int32(8))) is int
    assert sizing.check_batch_size(None) is None and sizing.rows(None) == sizing.default_rows()


@pytest.mark.parametrize("door", ["explain", "similarity", "object_attribution", "object_pointing", "sanity_check",
                                  "run_job"])
def test_every_door_refuses_a_bad_batch_size_the_same_way(door, tmp_path):
    from jaxsal.metrics import object_attribution, object_pointing, sanity_check, similarity

    maps, masks = np.ones((2, 16, 16), np.float32), np.zeros((2, 1, 16, 16), bool)
    calls = {
        "explain": lambda: jaxsal.explain(MODEL.apply, PARAMS, _obs(), method="gradient", batch_size=0),
        "similarity": lambda: similarity(maps, maps, "spearman", batch_size=0),
        "object_attribution": lambda: object_attribution(maps, masks, batch_size=0),
        "object_pointing": lambda: object_pointing(maps, masks, batch_size=0),
        "sanity_check": lambda: sanity_check(MODEL, PARAMS, _obs(), "gradient", layers=("q",), key=KEY,
                                             batch_size=0),
        "run_job": lambda: _run_job(tmp_path, batch_size=0),
    }
    with pytest.raises(SaliencyInputError, match=r"batch_size must be a positive int .*e\.g\. batch_size=256, got 0"):
        calls[door]()


def _run_job(tmp_path, batch_size):
    from jaxsal.io import MethodSpec
    from jaxsal.io.job import run_job
    from jaxsal.io.readers import ArraySource

    return run_job(MODEL.apply, PARAMS, ArraySource(np.asarray(_obs())), tmp_path / "out",
                   [MethodSpec("gradient", "gradient", {})], batch_size=batch_size, quiet=True)


# ---------------------------------------------------------------- the callers use it
FAMILIES = {  # one method per family: (options, model rows per inner item, inner items, balanced)
    "gradient": ({}, 1, 1, False),
    "gradcam": ({"layer": "conv2"}, 1, 1, False),
    "smoothgrad": ({"n_samples": 9, "key": KEY}, 1, 9, False),           # the noise tunnel
    "integrated_gradients": ({"steps": 9}, 1, 9, False),                 # the path integral
    "occlusion": ({"patch": 4, "stride": 3}, 1, 25, True),               # 5 x 5 patches: a perturbation table
    "rise": ({"n_masks": 25, "grid": 4, "key": KEY}, 1, 25, True),       # whole forward passes: forward rows
}
FORWARD = {"rise"}
"""Methods that run whole forward passes of perturbed inputs: with no batch_size, sized for
sizing.default_rows("forward")."""
"""Totals chosen so that full and balanced groups differ at some batch size (9 in rows of 8: 8 + 1
or 5 + 4; 25 in rows of 8: 8 + 8 + 8 + 1 or 7 + 6 + 6 + 6)."""


def _group_size(groups):
    """Items per group of an inner loop: offsets (noise samples, perturbation indices) step by it, the
    path's (alphas, weights) have it as their length."""
    if isinstance(groups[0], tuple):
        return groups[0][0].shape[0]
    return int(groups[1]) - int(groups[0]) if len(groups) > 1 else None


@pytest.mark.parametrize("method", [  # slow (3-5 s): smoothgrad groups as IG, occlusion as RISE
    pytest.param(m, marks=pytest.mark.slow) if m in ("smoothgrad", "occlusion") else m for m in sorted(FAMILIES)])
def test_each_family_runs_the_chunks_and_groups_the_caller_asked_for(method, monkeypatch):
    """The engine's chunks (states) and the inner loop's groups are those the callers' own arithmetic
    gave for the same batch_size (so the maps' bits are those of before), and batched == unbatched."""
    opts, rps, total, balanced = FAMILIES[method]
    obs = _obs(11, seed=5)
    seen = {}
    real_chunks, real_accumulate = execute._chunks, batching.accumulate
    monkeypatch.setattr(execute, "_chunks", lambda *a: seen.setdefault("states", a[3]) and real_chunks(*a))
    monkeypatch.setattr(batching, "accumulate",
                        lambda fn, statics, traced, first=None: seen.setdefault("groups", statics)
                        and real_accumulate(fn, statics, traced, first))
    unbatched = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, obs, method=method, batch_size=10_000, **opts))
    for bs in (1, 3, 8, 64, None):
        seen.clear()
        maps = np.asarray(jaxsal.explain(MODEL.apply, PARAMS, obs, method=method, batch_size=bs, **opts))
        rows = sizing.default_rows("forward" if method in FORWARD else "backward") if bs is None else bs
        if total == 1:
            group, count = 1, 1
        elif balanced:
            group, count = _old_perturbation_groups(total, rows)
        else:
            group, count = _old_sample_groups(total, rows, rps)
        assert seen["states"] == _old_chunk_size(11, rows, group * rps), (method, bs)
        assert len(seen.get("groups", [None])) == count, (method, bs)
        if count > 1:  # one group: the whole inner loop in one program
            assert _group_size(seen["groups"]) == group, (method, bs)
        np.testing.assert_allclose(maps, unbatched, rtol=1e-5, atol=1e-6 * float(np.abs(unbatched).max()),
                                   err_msg=f"{method}, batch_size={bs}")


def test_sanity_check_sizes_its_calls_with_the_callers_batch_size(monkeypatch):
    """The original model's action choice and the similarity calls use the caller's batch_size
    (the backend's default rows when None), not a size of their own; similarity_batch_size wins."""
    from jaxsal.metrics import sanity, sanity_check

    seen = []
    real = sanity.map_batched
    monkeypatch.setattr(sanity, "map_batched", lambda *a, **k: seen.append(("choose", k["batch_size"])) or real(*a, **k))
    real_sim = sanity.similarity
    monkeypatch.setattr(sanity, "similarity", lambda *a, **k: seen.append(("similarity", k["batch_size"]))
                        or real_sim(*a, **k))
    obs = _obs(5)
    for bs, sim_bs, want in ((3, None, (3, 3)), (None, None, (sizing.default_rows(),) * 2), (3, 2, (3, 2))):
        seen.clear()
        sanity_check(MODEL, PARAMS, obs, "gradient", layers=("q",), key=KEY, batch_size=bs,
                     similarity_batch_size=sim_bs, metrics=("spearman",))
        assert seen[0] == ("choose", want[0]) and {s for s in seen[1:]} == {("similarity", want[1])}, (bs, seen)


class _Normed(nn.Module):
    """A conv whose activations are normalised over their channels (LayerNorm), as the PQN agents'."""
    group_norm: bool = False

    @nn.compact
    def __call__(self, x):
        x = nn.Conv(4, (3, 3), (2, 2), padding="VALID")(x.astype(jnp.float32) / 255.0)
        x = nn.GroupNorm(num_groups=2)(x) if self.group_norm else nn.LayerNorm()(x)
        return nn.Dense(3)(nn.relu(x).reshape(x.shape[0], -1))


@pytest.mark.parametrize("model,want", [(_Normed(), True), (_Normed(group_norm=True), True), (None, False)])
def test_models_that_normalise_activations_are_found_from_their_jaxpr(model, want):
    from jaxsal.checks import check_call
    from jaxsal.perturbation._common import normalises_activations
    obs = _obs(2, seed=1)
    apply_fn, params = (MODEL.apply, PARAMS) if model is None else (model.apply, model.init(KEY, obs[:1]))
    call = check_call(apply_fn, params, obs, target="q_chosen", actions=None, layout=None, batch_size=None)
    assert normalises_activations(apply_fn, params, call) is want


class _NormedOnFloats(nn.Module):
    """Normalises its activations only when given float frames, as the engine always gives it."""

    @nn.compact
    def __call__(self, x):
        h = nn.Conv(4, (3, 3), (2, 2), padding="VALID")(x.astype(jnp.float32) / 255.0)
        h = h if x.dtype == jnp.uint8 else nn.LayerNorm()(h)
        return nn.Dense(3)(nn.relu(h).reshape(h.shape[0], -1))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_normalising_is_read_from_the_model_on_float_frames_whatever_the_frames_dtype(dtype):
    """The engine calls the model on float32 frames (checks.as_float), and the memo's key holds no dtype:
    uint8 frames are probed as float32 too (they were probed as uint8, here missing the LayerNorm)."""
    from jaxsal.checks import check_call
    from jaxsal.perturbation._common import normalises_activations
    obs = _obs(2, seed=3).astype(dtype)
    model = _NormedOnFloats()
    params = model.init(KEY, obs[:1].astype(np.float32))
    call = check_call(model.apply, params, obs, target="q_chosen", actions=None, layout=None, batch_size=None)
    assert normalises_activations(model.apply, params, call) is True


def test_whole_forward_methods_size_for_normalised_models_by_default(monkeypatch):
    """RISE with no batch_size on a LayerNorm model runs groups of sizing.default_rows("forward_normalised")
    rows, on a model without one groups of default_rows("forward"); the maps equal one big group's."""
    obs = _obs(3, seed=2)
    model = _Normed()
    params = model.init(KEY, obs[:1])
    opts = {"n_masks": 700, "grid": 4, "key": KEY}
    seen = []
    real = batching.accumulate
    monkeypatch.setattr(batching, "accumulate", lambda fn, statics, traced, first=None: seen.append(statics)
                        or real(fn, statics, traced, first))
    for apply_fn, p, work in ((model.apply, params, "forward_normalised"), (MODEL.apply, PARAMS, "forward")):
        seen.clear()
        maps = np.asarray(jaxsal.explain(apply_fn, p, obs, method="rise", **opts))
        want_group, _ = _old_perturbation_groups(700, sizing.default_rows(work))
        assert _group_size(seen[0]) == want_group, work
        one = np.asarray(jaxsal.explain(apply_fn, p, obs, method="rise", batch_size=10_000, **opts))
        np.testing.assert_allclose(maps, one, rtol=1e-5, atol=1e-6 * float(np.abs(one).max()))
    assert sizing.default_rows("forward_normalised") < sizing.default_rows("forward")
