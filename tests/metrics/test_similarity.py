"""Similarity metrics of the sanity check against scipy / scikit-image, plus bad input."""
import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.stats
from skimage.feature import hog
from skimage.metrics import structural_similarity

from jaxsal import SaliencyInputError
from jaxsal.metrics import hog_features, similarity


def _pairs(n=3, shape=(84, 84), seed=0):
    rng = np.random.default_rng(seed)
    a = rng.random((n,) + shape)
    # smooth structure + noise, so the metrics sit well inside (-1, 1)
    yy, xx = np.mgrid[:shape[0], :shape[1]]
    blob = np.exp(-((yy - 40) ** 2 + (xx - 30) ** 2) / 200.0)
    a = 0.5 * a + blob
    b = a + rng.normal(0, 0.4, a.shape)
    return a.astype(np.float32), b.astype(np.float32)


def _mm(x):
    return (x - x.min()) / (x.max() - x.min())


def test_raw_metrics_match_scipy_skimage():
    a, b = _pairs()
    a = np.stack([_mm(m) for m in a]).astype(np.float32)
    b = np.stack([_mm(m) for m in b]).astype(np.float32)
    r = similarity(a, b, invert=False, normalize=False)
    for i in range(len(a)):
        a64, b64 = a[i].astype(np.float64), b[i].astype(np.float64)
        assert float(r["spearman"][i]) == pytest.approx(scipy.stats.spearmanr(a64.ravel(), b64.ravel())[0], abs=1e-5)
        assert float(r["ssim"][i]) == pytest.approx(structural_similarity(a64, b64, data_range=1.0), abs=1e-5)
        assert float(r["ssim_flat"][i]) == pytest.approx(
            structural_similarity(a64.ravel(), b64.ravel(), data_range=1.0), abs=1e-5)
        ha, hb = hog(a64, pixels_per_cell=(3, 3)), hog(b64, pixels_per_cell=(3, 3))
        assert float(r["hog"][i]) == pytest.approx(scipy.stats.pearsonr(ha, hb)[0], abs=1e-4)


def test_hog_features_match_skimage_on_odd_size():
    rng = np.random.default_rng(1)
    img = rng.random((20, 23)).astype(np.float32)
    ours = np.asarray(hog_features(img))
    ref = hog(img.astype(np.float64), pixels_per_cell=(3, 3))
    assert ours.shape == ref.shape
    np.testing.assert_allclose(ours, ref, atol=1e-5)


_HOG_AS_USERS_COMPILE = """
import json, sys, numpy as np
from jaxsal.metrics import similarity
z = np.load(sys.argv[1])
print(json.dumps({k: np.asarray(similarity(z[k], z["b"], "hog")["hog"]).tolist() for k in ("a", "nudged")}))
"""


def test_hog_of_piecewise_constant_maps_matches_skimage(tmp_path):
    """LIME and occlusion maps are piecewise constant. Fused with the min-max normalisation, the
    gradient between two equal pixels was an FMA's rounding residual instead of 0, whose sign moved
    the edge between the first and last orientation bin: Paper B's HOG similarity sat up to 0.05
    below skimage's and moved with the maps' last bits (the Paper B re-run's rechecks). Run in a
    fresh process at the compile settings users get: the fast loop's XLA optimisation level 0
    forms no FMA, so it never saw this."""
    rng = np.random.default_rng(4)
    block = lambda: np.kron(rng.random((12, 12)), np.ones((7, 7)))     # noqa: E731  (84 x 84)
    a = np.stack([block() for _ in range(3)]).astype(np.float32)
    b = np.stack([block() for _ in range(3)]).astype(np.float32)
    nudged = (a * np.float32(1 + 2 ** -22)).astype(np.float32)        # the maps' last bits
    np.savez(tmp_path / "maps.npz", a=a, b=b, nudged=nudged)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    r = subprocess.run([sys.executable, "-c", _HOG_AS_USERS_COMPILE, str(tmp_path / "maps.npz")],
                       env={**env, "JAX_PLATFORMS": "cpu"}, cwd=Path(__file__).resolve().parents[2],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout.strip().splitlines()[-1])
    for i in range(len(a)):
        m, o = _mm(a[i].astype(np.float64)), _mm(b[i].astype(np.float64))
        hm = hog(m, pixels_per_cell=(3, 3))
        ref = max(scipy.stats.pearsonr(hm, hog(o, pixels_per_cell=(3, 3)))[0],
                  scipy.stats.pearsonr(hm, hog(1 - o, pixels_per_cell=(3, 3)))[0])   # Paper B's inverted max
        assert got["a"][i] == pytest.approx(ref, abs=1e-4)
    np.testing.assert_allclose(got["nudged"], got["a"], atol=1e-5)


def test_spearman_ties_match_scipy():
    rng = np.random.default_rng(2)
    a = rng.integers(0, 4, (2, 16, 16)).astype(np.float32)   # many ties
    b = (a + rng.integers(0, 3, a.shape)).astype(np.float32)
    r = similarity(a, b, "spearman", invert=False, normalize=False)["spearman"]
    for i in range(2):
        assert float(r[i]) == pytest.approx(scipy.stats.spearmanr(a[i].ravel(), b[i].ravel())[0], abs=1e-5)


def test_paper_b_normalisation_and_inversion():
    a, b = _pairs(seed=3)
    inv = similarity(a, -3.0 * b + 7.0)     # a sign flip + affine change is ignored
    same = similarity(a, b)
    for m in ("spearman", "ssim_flat", "ssim", "hog"):
        np.testing.assert_allclose(inv[m], same[m], atol=1e-4)
    # reference straight from the definition on min-max normalised maps
    for i in range(len(a)):
        m, r = _mm(a[i].astype(np.float64)), _mm(b[i].astype(np.float64))
        ref = max(structural_similarity(m, r, data_range=1.0), structural_similarity(m, 1 - r, data_range=1.0))
        assert float(same["ssim"][i]) == pytest.approx(ref, abs=1e-5)
        ref = max(structural_similarity(m.ravel(), r.ravel(), data_range=1.0),
                  structural_similarity(m.ravel(), 1 - r.ravel(), data_range=1.0))
        assert float(same["ssim_flat"][i]) == pytest.approx(ref, abs=1e-5)
        ref = max(scipy.stats.spearmanr(m.ravel(), r.ravel())[0], scipy.stats.spearmanr(m.ravel(), 1 - r.ravel())[0])
        assert float(same["spearman"][i]) == pytest.approx(ref, abs=1e-5)
    ident = similarity(a, a)
    np.testing.assert_allclose(ident["spearman"], 1.0, atol=1e-5)
    np.testing.assert_allclose(ident["ssim"], 1.0, atol=1e-5)
    np.testing.assert_allclose(ident["ssim_flat"], 1.0, atol=1e-5)
    np.testing.assert_allclose(ident["hog"], 1.0, atol=1e-5)


def test_batched_equals_per_pair_and_chunking():
    a, b = _pairs(n=5, seed=4)
    full = similarity(a, b, batch_size=None)
    chunked = similarity(a, b, batch_size=2)
    ones = [similarity(a[i:i + 1], b[i:i + 1]) for i in range(5)]
    for m in full:
        np.testing.assert_allclose(full[m], chunked[m], atol=1e-6)
        for i in range(5):
            assert float(ones[i][m][0]) == pytest.approx(float(full[m][i]), abs=1e-6)


def test_constant_map_is_finite():
    a, _ = _pairs(n=2)
    r = similarity(a, np.zeros_like(a))
    for m in r:
        assert np.isfinite(np.asarray(r[m])).all()
    assert np.allclose(r["spearman"], 0.0)


@pytest.mark.parametrize("bad, msg", [
    (np.zeros((3, 84, 83), np.float32), "expected"),
    (np.zeros((84, 84), np.float32), "maps\\[None\\]"),
    (np.zeros((3, 84, 84, 4), np.float32), "per-frame"),
    (np.full((3, 84, 84), np.nan, np.float32), "NaN"),
])
def test_bad_maps(bad, msg):
    a, _ = _pairs()
    with pytest.raises(SaliencyInputError, match=msg):
        similarity(a, bad)


def test_unknown_metric():
    a, b = _pairs(n=1)
    with pytest.raises(SaliencyInputError, match="unknown similarity"):
        similarity(a, b, ("pearson",))


def test_too_small_maps():
    a = np.random.default_rng(0).random((2, 8, 8)).astype(np.float32)
    with pytest.raises(SaliencyInputError, match="at least 9x9"):
        similarity(a, a)
    assert similarity(a, a, ("spearman", "ssim"))["ssim"].shape == (2,)


def test_flat_ssim_differs_from_2d_ssim_where_structure_is_vertical():
    # Paper B's flattened SSIM sees only horizontal neighbours: a map and its copy shifted one
    # row down share every 1-D window's statistics but one, so the flat SSIM stays high while
    # a vertical-stripe pattern shifted sideways is judged as a 2-D SSIM would
    rng = np.random.default_rng(5)
    a = rng.random((1, 30, 30)).astype(np.float32)
    b = np.roll(a, 1, axis=2)                       # shift by one column
    r = similarity(a, b, ("ssim_flat", "ssim"), invert=False, normalize=False)
    want_flat = structural_similarity(a[0].astype(np.float64).ravel(), b[0].astype(np.float64).ravel(),
                                      data_range=1.0)
    want_2d = structural_similarity(a[0].astype(np.float64), b[0].astype(np.float64), data_range=1.0)
    assert float(r["ssim_flat"][0]) == pytest.approx(want_flat, abs=1e-5)
    assert float(r["ssim"][0]) == pytest.approx(want_2d, abs=1e-5)
    assert abs(want_flat - want_2d) > 1e-3


def test_flat_ssim_needs_seven_pixels():
    with pytest.raises(SaliencyInputError, match="ssim_flat"):
        similarity(np.ones((1, 2, 3)), np.ones((1, 2, 3)), ("ssim_flat",))


def test_normalize_false_with_the_inverted_max_is_refused():
    """It was silently normalised anyway: the inverted max needs maps in [0, 1]."""
    a = np.random.default_rng(0).random((2, 9, 9), np.float32)
    with pytest.raises(SaliencyInputError, match="normalize=False needs invert=False"):
        similarity(a, a, "spearman", normalize=False)


def test_ranks_equal_scipy_rankdata_exactly():
    """The int32-key sort ranks like scipy.stats.rankdata('average'): ties averaged, negative values,
    -0.0 tied with 0.0, a constant map, values a float apart."""
    import jax
    import jax.numpy as jnp

    from jaxsal.metrics.similarity import _rank
    rng = np.random.default_rng(3)
    x = (rng.random(2000) - 0.4).astype(np.float32)
    cases = [x, np.round(x * 8) / 8, np.full(500, 0.25, np.float32),
             np.array([0.0, -0.0, 1e-30, -1e-30, 0.0, 3.0, -3.0, -0.0], np.float32),
             np.nextafter(np.float32(0.5), np.float32(1.0)) * np.ones(7, np.float32) - np.arange(7, dtype=np.float32) * 1e-8]
    for c in cases:
        np.testing.assert_array_equal(np.asarray(jax.jit(_rank)(jnp.asarray(c))),
                                      scipy.stats.rankdata(c.astype(np.float64)).astype(np.float32))


@functools.cache
def _both_sides(fn):
    """max(fn(m, r), fn(m, 1 - r)), compiled once per kernel (op by op, HOG takes seconds)."""
    import jax
    return jax.jit(lambda m, r: jax.numpy.maximum(fn(m, r), fn(m, 1.0 - r)))


def _inverted_by_definition(a, b):
    """Paper B's inverted max computed on both sides, max(sim(m, r), sim(m, 1 - r)), with the
    single-pair kernels: what `similarity` derives from one pass over each map."""
    import jax.numpy as jnp

    from jaxsal.metrics.similarity import _PAIR, minmax
    out = {k: [] for k in _PAIR}
    both = {k: _both_sides(fn) for k, fn in _PAIR.items()}
    for m, r in zip(a, b):
        m, r = minmax(jnp.asarray(m)), minmax(jnp.asarray(r))
        for k, fn in both.items():
            out[k].append(float(fn(m, r)))
    return {k: np.array(v) for k, v in out.items()}


def test_inverted_max_from_one_pass_equals_both_sides():
    """1 - r ranks in reverse, has r's HOG features and r's SSIM box means: the one-pass inverted
    max equals computing sim(m, 1 - r) as well, on smooth, anti-correlated, piecewise-constant and
    tied maps (the anti-correlated pairs are decided by the inverted side)."""
    a, b = _pairs(n=2, seed=6)
    rng = np.random.default_rng(6)
    block = lambda: np.kron(rng.random((12, 12)), np.ones((7, 7)))     # noqa: E731
    pc_a = np.stack([block(), block()]).astype(np.float32)
    tied = np.round(a * 3) / 3
    cases = [(a, b), (a, -b), (pc_a, 1 - pc_a + 0.3 * np.stack([block(), block()]).astype(np.float32)),
             (tied, -tied + 0.2 * b)]
    for x, y in cases:
        got = similarity(x, y)
        want = _inverted_by_definition(x, y)
        for k in want:
            np.testing.assert_allclose(np.asarray(got[k]), want[k], atol=2e-4, err_msg=k)
    neg = similarity(a, -b, invert=False)
    assert float(np.max(np.asarray(neg["spearman"]))) < -0.3       # the inverted side decided those


def test_several_others_at_once_equal_one_call_each():
    a, b = _pairs(n=3, seed=7)
    others = np.stack([b, -b, np.flip(b, 1), a])
    many = similarity(a, others, batch_size=2)
    for k, o in enumerate(others):
        one = similarity(a, o)
        for m in one:
            assert many[m].shape == (4, 3)
            np.testing.assert_allclose(np.asarray(many[m][k]), np.asarray(one[m]), atol=1e-6)
    raw = similarity(a, others, "spearman", invert=False, normalize=False)["spearman"]
    np.testing.assert_allclose(np.asarray(raw[0]), np.asarray(similarity(a, b, "spearman", invert=False,
                                                                          normalize=False)["spearman"]), atol=1e-6)


@pytest.mark.parametrize("bad", [np.zeros((2, 2, 84, 84), np.float32), np.zeros((2, 3, 84, 83), np.float32)])
def test_several_others_of_the_wrong_shape(bad):
    a, _ = _pairs()
    with pytest.raises(SaliencyInputError, match="compare each map with K others"):
        similarity(a, bad)
