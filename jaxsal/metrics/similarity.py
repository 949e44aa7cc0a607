"""Map similarity of Paper B's sanity check: Spearman, SSIM and HOG-Pearson, batched in JAX.

Each is a jitted, vmapped re-implementation of the scipy / scikit-image definition
(`scipy.stats.spearmanr`, `skimage.metrics.structural_similarity` with its defaults on the
2-D maps and, as Paper B's code computes it, on the flattened maps, `skimage.feature.hog` with
pixels_per_cell 3x3 + Pearson), so thousands of map pairs are
compared on device in one call; the tests check each against the library it copies.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal.batching import map_batched
from jaxsal.caching import cached_jit
from jaxsal.errors import SaliencyInputError

# "ssim_flat" is Paper B's SSIM (its code flattens the maps: a 1-D window of 7 along the raster
# order); "ssim" is the usual 2-D SSIM with a 7x7 window, our variant, reported beside it.
METRICS = ("spearman", "ssim_flat", "ssim", "hog")


def check_maps(maps, name: str = "maps", shape: tuple | None = None):
    """Validate a batch of 2-D saliency maps (N, H, W): finite numbers; returns float32 array."""
    if isinstance(maps, dict):
        raise SaliencyInputError(
            f"{name} is a dict (keys {sorted(maps)}): pass one method's maps, e.g. {name}['gradient']")
    a = np.shape(maps)
    if len(a) == 4:
        raise SaliencyInputError(
            f"{name} has shape {a}: per-frame maps (N, H, W, C) are not accepted here; "
            "sum over frames first (maps.sum(-1)) or explain with per_frame=False")
    if len(a) != 3:
        hint = " Add a batch axis with maps[None] for a single map." if len(a) == 2 else ""
        raise SaliencyInputError(f"{name} must be a batch of 2-D maps (N, H, W), got shape {a}.{hint}")
    if shape is not None and tuple(a) != tuple(shape):
        raise SaliencyInputError(f"{name} has shape {tuple(a)}, expected {tuple(shape)} "
                                 "(one (H, W) map per observation)")
    if a[0] == 0:
        raise SaliencyInputError(f"{name} is empty (N = 0)")
    dtype = np.dtype(maps.dtype if hasattr(maps, "dtype") else np.asarray(maps).dtype)
    if not (np.issubdtype(dtype, np.floating) or np.issubdtype(dtype, np.integer) or dtype == np.bool_):
        raise SaliencyInputError(f"{name} must hold numbers, got dtype {dtype}")
    x = jnp.asarray(maps, jnp.float32)
    if not bool(jnp.isfinite(x).all()):
        bad = int((~jnp.isfinite(x)).reshape(a[0], -1).any(-1).sum())
        raise SaliencyInputError(f"{name} contains NaN or inf values ({bad} of {a[0]} maps); "
                                 "fix the method or drop those states first")
    return x


# ---------------------------------------------------------------- single-pair kernels (H, W)

def minmax(m):
    """Min-max normalise a map to [0, 1]; a constant map becomes all zeros."""
    lo, hi = m.min(), m.max()
    span = hi - lo
    return jnp.where(span > 0, (m - lo) / jnp.where(span > 0, span, 1.0), 0.0)


def _pearson(x, y):
    """Pearson correlation of two vectors; 0 when either is constant (undefined)."""
    return _corr(*_centred(x), *_centred(y))


def _centred(v):
    """(v - mean, sum of squares): one side of a Pearson correlation."""
    c = v - v.mean()
    return c, (c * c).sum()


def _corr(x, sxx, y, syy):
    """Pearson correlation from two centred sides (`_centred`); 0 when either is constant."""
    ok = (sxx > 0) & (syy > 0)
    return jnp.where(ok, (x * y).sum() / jnp.sqrt(jnp.where(ok, sxx * syy, 1.0)), 0.0)


def _order_key(x):
    """int32 keys ordered as the float32 values x (finite; -0.0 counted as 0.0, as `<` does): XLA:CPU
    sorts a lone int32 array ~6x faster than float32 (measured on 84x84 maps)."""
    bits = jax.lax.bitcast_convert_type(jnp.where(x == 0, jnp.zeros_like(x), x), jnp.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def _rank(x):
    """1-based ranks with ties averaged (scipy.stats.rankdata 'average'), of finite values: a value's
    tie group starts where a binary search puts it in the sorted keys and ends where the sorted keys
    next change (one reverse running minimum, read at the start: 1.5x faster than a second search)."""
    k = _order_key(x)
    s = jnp.sort(k)
    n = k.shape[0]
    left = jnp.searchsorted(s, k, side="left")
    idx = jax.lax.iota(jnp.int32, n)
    last = jnp.concatenate([s[1:] != s[:-1], jnp.ones((1,), bool)])           # a group ends here
    end = jax.lax.cummin(jnp.where(last, idx, n), axis=0, reverse=True)
    return (left + end[left] + 2).astype(jnp.float32) / 2.0


def spearman_pair(a, b):
    """Spearman rank correlation of two maps (0 when one is constant: undefined)."""
    return _pearson(_rank(a.ravel()), _rank(b.ravel()))


def _box_flat(v, win: int = 7):
    """Means over a 1-D window of `win` (VALID)."""
    return jax.lax.reduce_window(v, 0.0, jax.lax.add, (win,), (1,), "VALID") / win


def _box_mean(x, win):
    s = jax.lax.reduce_window(x, 0.0, jax.lax.add, (win, win), (1, 1), "VALID")
    return s / (win * win)


def ssim_pair(a, b, data_range: float = 1.0, win_size: int = 7):
    """Mean SSIM as skimage.metrics.structural_similarity (uniform 7x7 window, sample covariance,
    K1=0.01, K2=0.03). skimage crops the window half-width at the border, so the mean is over
    exactly the fully-inside windows: a VALID box filter."""
    np_ = win_size * win_size
    cov_norm = np_ / (np_ - 1.0)
    ux, uy = _box_mean(a, win_size), _box_mean(b, win_size)
    uxx, uyy, uxy = _box_mean(a * a, win_size), _box_mean(b * b, win_size), _box_mean(a * b, win_size)
    vx, vy, vxy = cov_norm * (uxx - ux * ux), cov_norm * (uyy - uy * uy), cov_norm * (uxy - ux * uy)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return s.mean()


def ssim_flat_pair(a, b, data_range: float = 1.0, win_size: int = 7):
    """Paper B's SSIM: skimage's structural_similarity of the *flattened* maps, i.e. a 1-D
    uniform window of `win_size` along the raster order (windows run across row ends), sample
    covariance (cov_norm = 7/6), mean over the fully-inside windows. Unlike the 2-D SSIM it
    sees no vertical structure."""
    x, y = a.ravel(), b.ravel()
    box = lambda v: _box_flat(v, win_size)  # noqa: E731
    cov_norm = win_size / (win_size - 1.0)
    ux, uy = box(x), box(y)
    vx, vy = cov_norm * (box(x * x) - ux * ux), cov_norm * (box(y * y) - uy * uy)
    vxy = cov_norm * (box(x * y) - ux * uy)
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))
    return s.mean()


def _diff(a, b):
    """a - b, exactly 0 where a == b. Fused with the map's producer (e.g. the min-max
    normalisation (m - lo) * (1 / span)), XLA:CPU contracts the difference of two products into an
    FMA, which leaves the product's rounding error (~1e-9) where two pixels are equal; the sign of
    that residual moves an axis-parallel edge from the first orientation bin to the last (or out of
    both), and on piecewise-constant maps (LIME, occlusion) the HOG similarity moved by up to 0.05
    from skimage's and with the maps' last bits."""
    return jnp.where(a == b, 0.0, a - b)


def hog_features(img, orientations: int = 9, cell: int = 3, block: int = 3):
    """HOG descriptor of one map, as `skimage.feature.hog(img, orientations, (cell, cell),
    (block, block), "L2-Hys")` flattened: what `hog_pearson` correlates.

    Args:
        img (jax.Array): one 2-D map (H, W), float (not a batch: vmap it for many).
        orientations (int): orientation bins over 0..180 degrees.
        cell (int): pixels per cell along each axis.
        block (int): cells per block along each axis.

    Returns:
        jax.Array: the feature vector, shape (br * bc * block * block * orientations,) with
            br = H // cell - block + 1 and bc = W // cell - block + 1 blocks per axis.
    """
    h, w = img.shape
    g_row = jnp.zeros_like(img).at[1:-1, :].set(_diff(img[2:, :], img[:-2, :]))
    g_col = jnp.zeros_like(img).at[:, 1:-1].set(_diff(img[:, 2:], img[:, :-2]))
    mag = jnp.hypot(g_col, g_row)
    ori = jnp.mod(jnp.rad2deg(jnp.arctan2(g_row, g_col)), 180.0)
    width = 180.0 / orientations
    lo = width * jnp.arange(orientations)
    onehot = (ori[..., None] >= lo) & (ori[..., None] < lo + width)        # (H, W, O)
    nr, nc = h // cell, w // cell
    weighted = (onehot * mag[..., None])[:nr * cell, :nc * cell]
    hist = weighted.reshape(nr, cell, nc, cell, orientations).sum((1, 3)) / (cell * cell)
    br, bc = nr - block + 1, nc - block + 1
    blocks = jnp.stack([jnp.stack([hist[r:r + br, c:c + bc] for c in range(block)], axis=2)
                        for r in range(block)], axis=2)                    # (br, bc, block, block, O)
    eps = 1e-5
    norm = jnp.sqrt((blocks ** 2).sum((2, 3, 4), keepdims=True) + eps ** 2)
    out = jnp.minimum(blocks / norm, 0.2)
    out = out / jnp.sqrt((out ** 2).sum((2, 3, 4), keepdims=True) + eps ** 2)
    return out.ravel()


def hog_pair(a, b, cell: int = 3):
    """Pearson correlation of the HOG feature vectors of two maps (pixels_per_cell cell x cell)."""
    return _pearson(hog_features(a, cell=cell), hog_features(b, cell=cell))


_PAIR = {"spearman": spearman_pair, "ssim_flat": ssim_flat_pair, "ssim": ssim_pair, "hog": hog_pair}


# ------------------------------------------- one map's quantities, computed once per map and reused

def _features(m, metrics: tuple, normalize: bool) -> dict:
    """What the metrics read from one map, computed once however many maps it is compared with:
    its centred ranks, centred HOG features, and its values less 0.5 with their window means (SSIM),
    all of the min-max normalised map (or the raw one, less 0, with normalize=False)."""
    a = minmax(m) if normalize else m
    f = {}
    if "spearman" in metrics:
        f["rank"], f["rank_ss"] = _centred(_rank(a.ravel()))
    if "hog" in metrics:
        f["hog"], f["hog_ss"] = _centred(hog_features(a))
    if "ssim" in metrics or "ssim_flat" in metrics:
        # window statistics of the normalised map less 0.5 (variances and covariances do not change):
        # E[y^2] - E[y]^2 then cancels on values of at most 0.5, not 1, and 0 and 1 stay exact, so a
        # flat window still has variance 0 (on Breakout sanity maps within 1.7e-5 of skimage's float64)
        f["c"] = jnp.float32(0.5 if normalize else 0.0)
        f["centred"] = a - f["c"]
    if "ssim" in metrics:
        f["u2"], f["uu2"] = _box_mean(f["centred"], 7), _box_mean(f["centred"] * f["centred"], 7)
    if "ssim_flat" in metrics:
        v = f["centred"].ravel()
        f["u1"], f["uu1"] = _box_flat(v), _box_flat(v * v)
    return f


def _ssim_mean(fa, fb, k: str, uxy, n: int, invert: bool):
    """Mean SSIM from both maps' window means of their centred values (`_features`, "u"+k and
    "uu"+k) and of their product (uxy); sample covariance over n pixels per window, data range 1.
    With invert, the larger of it and the SSIM against 1 - y (whose window mean is 1 - uy, variance
    the same, covariance negated)."""
    cov_norm = n / (n - 1.0)
    sx, sy = fa["u" + k], fb["u" + k]
    vx, vy = cov_norm * (fa["uu" + k] - sx * sx), cov_norm * (fb["uu" + k] - sy * sy)
    vxy = cov_norm * (uxy - sx * sy)
    ux, uy = sx + fa["c"], sy + fb["c"]
    c1, c2 = 0.01 ** 2, 0.03 ** 2

    def mean(uy, vxy):
        return (((2 * ux * uy + c1) * (2 * vxy + c2)) / ((ux * ux + uy * uy + c1) * (vx + vy + c2))).mean()

    return jnp.maximum(mean(uy, vxy), mean(1.0 - uy, -vxy)) if invert else mean(uy, vxy)


def _compare(fa: dict, fb: dict, metrics: tuple, invert: bool) -> dict:
    """The metrics of one pair from both maps' `_features`. With invert (Paper B's inverted max
    max(sim(m, r), sim(m, 1 - r))) nothing is computed twice: 1 - r ranks in reverse, so its
    Spearman is minus r's; its image gradients are r's negated, whose magnitudes and orientations
    modulo 180 degrees (HOG's bins) are r's, so its HOG features are r's; its SSIM follows from
    r's box means. Equal to computing both sides up to float rounding (tests)."""
    out = {}
    for name in metrics:
        if name == "spearman":
            s = _corr(fa["rank"], fa["rank_ss"], fb["rank"], fb["rank_ss"])
            out[name] = jnp.abs(s) if invert else s
        elif name == "hog":
            out[name] = _corr(fa["hog"], fa["hog_ss"], fb["hog"], fb["hog_ss"])
        elif name == "ssim":
            out[name] = _ssim_mean(fa, fb, "2", _box_mean(fa["centred"] * fb["centred"], 7), 49, invert)
        else:
            out[name] = _ssim_mean(fa, fb, "1", _box_flat(fa["centred"].ravel() * fb["centred"].ravel()), 7, invert)
    return out


def _build(metrics: tuple, invert: bool, normalize: bool):
    """(_, maps (n, H, W), others (n, K, H, W)) -> {metric: (n, K)}: each map's features once,
    the K others one after another (a lax.map: memory of one comparison at a time)."""
    feats = jax.vmap(lambda m: _features(m, metrics, normalize))

    def batch(_, maps, others):
        fa = feats(maps)

        def one_other(b):
            return jax.vmap(lambda x, y: _compare(x, y, metrics, invert))(fa, feats(b))

        out = jax.lax.map(one_other, jnp.swapaxes(others, 0, 1))       # {metric: (K, n)}
        return {k: v.T for k, v in out.items()}
    return batch


def similarity(maps, others, metrics=METRICS, invert: bool = True, normalize: bool = True,
               batch_size: int | None = 256):
    """Similarity of each pair of maps `(maps[i], others[i])` under Paper B's metrics, on device.

    Both maps of a pair are min-max normalised to [0, 1] first; with `invert` (Paper B's
    inverted max) each similarity is max(sim(m, r), sim(m, 1 - r)), so a map and its sign-flip
    count as alike (computed without a second pass: 1 - r's ranks are r's reversed, its HOG
    features are r's and its SSIM follows from r's box means). `invert=False, normalize=False`
    gives the raw metric.

    Args:
        maps (jax.Array | numpy.ndarray): a batch of maps (N, H, W), finite.
        others (jax.Array | numpy.ndarray): the maps they are compared with, the same shape; or
            (K, N, H, W) to compare each map with K others (each map's ranks, HOG features and box
            means are then computed once, not K times).
        metrics (str | Sequence[str]): one or more of "spearman" (rank correlation), "ssim_flat"
            (Paper B's SSIM of the flattened maps), "ssim" (2-D SSIM, 7x7 window) and "hog"
            (Pearson correlation of HOG features). Defaults to all four.
        invert (bool): take the inverted max (Paper B).
        normalize (bool): min-max normalise each map first; False needs `invert=False`.
        batch_size (int | None): pairs compared at once (a memory knob).

    Returns:
        dict[str, jax.Array]: `{metric: (N,)}`, one similarity per pair for each metric asked;
            `{metric: (K, N)}` for others of shape (K, N, H, W).

    Raises:
        jaxsal.SaliencyInputError: an unknown or empty `metrics`; `normalize=False` with `invert`;
            `maps` not (N, H, W) or not finite; `others` of another shape; maps smaller than the
            metrics need (7x7 for "ssim", 9x9 for "hog", 7 pixels for "ssim_flat").
    """
    metrics = tuple([metrics] if isinstance(metrics, str) else metrics)
    bad = [m for m in metrics if m not in _PAIR]
    if bad or not metrics:
        raise SaliencyInputError(f"unknown similarity metric(s) {bad}; choose from {list(METRICS)}")
    if invert and not normalize:
        raise SaliencyInputError("normalize=False needs invert=False: the inverted max compares a map with 1 - the "
                                 "other, which is defined for min-max normalised maps only")
    a = check_maps(maps, "maps")
    several = np.ndim(others) == 4
    if several:
        if tuple(np.shape(others)[1:]) != tuple(a.shape):
            raise SaliencyInputError(
                f"others has shape {tuple(np.shape(others))}: pass maps of the shape of `maps` {tuple(a.shape)}, "
                f"or (K, {', '.join(map(str, a.shape))}) to compare each map with K others (per-frame maps "
                "(N, H, W, C) are not accepted: sum over frames first)")
        b = check_maps(jnp.reshape(jnp.asarray(others), (-1,) + a.shape[1:]), "others").reshape(np.shape(others))
    else:
        b = check_maps(others, "others", shape=a.shape)[None]
    need = 9 if "hog" in metrics else 7 if "ssim" in metrics else 1
    if min(a.shape[1:]) < need:
        raise SaliencyInputError(f"maps must be at least {need}x{need} for {', '.join(metrics)} "
                                 f"(SSIM 7x7 window, HOG 3x3 blocks of 3x3 cells), got {a.shape[1:]}")
    if "ssim_flat" in metrics and a.shape[1] * a.shape[2] < 7:
        raise SaliencyInputError(f"maps must have at least 7 pixels for ssim_flat (1-D window of 7), "
                                 f"got {a.shape[1:]}")
    fn = cached_jit(_build, metrics, bool(invert), bool(normalize))
    out = map_batched(fn, None, a, jnp.swapaxes(b, 0, 1), batch_size=batch_size)   # {metric: (N, K)}
    return {k: v.T if several else v[:, 0] for k, v in out.items()}


def spearman(maps, others, **kw):
    """Spearman rank correlation of each pair of maps (`similarity` with "spearman").

    Args:
        maps (jax.Array | numpy.ndarray): a batch of maps (N, H, W).
        others (jax.Array | numpy.ndarray): the maps they are compared with, the same shape.
        **kw (Any): `invert`, `normalize` and `batch_size` of `similarity` (by default Paper B's
            inverted max of min-max normalised maps).

    Returns:
        jax.Array: shape (N,), the similarity of each pair.

    Raises:
        jaxsal.SaliencyInputError: on the inputs `similarity` refuses.
    """
    return similarity(maps, others, ("spearman",), **kw)["spearman"]


def ssim(maps, others, **kw):
    """2-D SSIM (7x7 window, data_range 1) of each pair of maps (`similarity` with "ssim").

    Args:
        maps (jax.Array | numpy.ndarray): a batch of maps (N, H, W).
        others (jax.Array | numpy.ndarray): the maps they are compared with, the same shape.
        **kw (Any): `invert`, `normalize` and `batch_size` of `similarity` (by default Paper B's
            inverted max of min-max normalised maps).

    Returns:
        jax.Array: shape (N,), the similarity of each pair.

    Raises:
        jaxsal.SaliencyInputError: on the inputs `similarity` refuses.
    """
    return similarity(maps, others, ("ssim",), **kw)["ssim"]


def ssim_flat(maps, others, **kw):
    """Paper B's SSIM of each pair of flattened maps (a 1-D window of 7 along the raster order,
    data_range 1; `similarity` with "ssim_flat").

    Args:
        maps (jax.Array | numpy.ndarray): a batch of maps (N, H, W).
        others (jax.Array | numpy.ndarray): the maps they are compared with, the same shape.
        **kw (Any): `invert`, `normalize` and `batch_size` of `similarity` (by default Paper B's
            inverted max of min-max normalised maps).

    Returns:
        jax.Array: shape (N,), the similarity of each pair.

    Raises:
        jaxsal.SaliencyInputError: on the inputs `similarity` refuses.
    """
    return similarity(maps, others, ("ssim_flat",), **kw)["ssim_flat"]


def hog_pearson(maps, others, **kw):
    """Pearson correlation of the HOG features (3x3 pixels per cell) of each pair of maps
    (`similarity` with "hog").

    Args:
        maps (jax.Array | numpy.ndarray): a batch of maps (N, H, W).
        others (jax.Array | numpy.ndarray): the maps they are compared with, the same shape.
        **kw (Any): `invert`, `normalize` and `batch_size` of `similarity` (by default Paper B's
            inverted max of min-max normalised maps).

    Returns:
        jax.Array: shape (N,), the similarity of each pair.

    Raises:
        jaxsal.SaliencyInputError: on the inputs `similarity` refuses.
    """
    return similarity(maps, others, ("hog",), **kw)["hog"]
