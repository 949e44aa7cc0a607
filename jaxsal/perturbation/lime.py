"""LIME (Ribeiro et al. 2016) on superpixels: weighted ridge on random on/off segment samples.

Segmentation runs on host per state (scikit-image); the perturbed inputs, model calls and the
weighted ridge regression of every state run in JAX, batched over states.
"""
from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from jaxsal import cpu
from jaxsal.batching import is_traced
from jaxsal.checks import to_nhwc
from jaxsal.errors import SaliencyInputError
from jaxsal.perturbation import _common as C
from jaxsal.perturbation import _superpixel
from jaxsal.checks import check_key, check_positive_int

# Paper B's parameters per segmentation (scikit-image argument names) and sample counts.
SEGMENTATIONS = {
    "slic": dict(n_segments=200, compactness=10.0, sigma=0.25),
    "quickshift": dict(kernel_size=1, max_dist=2, ratio=0.0),
    "felzenszwalb": dict(scale=21, sigma=0.5, min_size=4),
}
DEFAULT_SAMPLES = {"slic": 2000, "quickshift": 1500, "felzenszwalb": 1000}
SEGMENT_ON = ("stack", "last", "mean")


def _segment_one(img, segmentation, opts):
    """Labels of one (H, W, C) image in [0, 1]; the C stacked frames are channels (never Lab)."""
    from skimage import segmentation as seg

    multi = img.shape[-1] > 1
    if segmentation == "slic":
        return seg.slic(img if multi else img[..., 0], start_label=0,
                        channel_axis=-1 if multi else None, **opts)
    if segmentation == "quickshift":
        return seg.quickshift(img, convert2lab=False, channel_axis=-1, **opts)
    return seg.felzenszwalb(img if multi else img[..., 0], channel_axis=-1 if multi else None,
                            **opts)


def segment(obs_nhwc, segmentation: str = "slic", segment_on: str = "stack", obs_max: float = 255.0,
            **options):
    """(N, H, W) int32 superpixel labels 0..d_i-1 per state, from scikit-image on host.

    The frame stack is scaled to [0, 1] by obs_max; segment_on="stack" segments all stacked
    frames as channels, "last" the newest frame, "mean" the frame average. `options` override
    the segmentation's parameters (Paper B's: see SEGMENTATIONS).
    """
    if segmentation not in SEGMENTATIONS:
        raise SaliencyInputError(
            f"unknown segmentation {segmentation!r}; choose one of {sorted(SEGMENTATIONS)} "
            "or pass segments=(N, H, W) integer labels")
    if segment_on not in SEGMENT_ON:
        raise SaliencyInputError(f"segment_on must be one of {list(SEGMENT_ON)}, got {segment_on!r}")
    unknown = set(options) - set(SEGMENTATIONS[segmentation]) - {"max_num_iter", "enforce_connectivity",
                                                                  "min_size_factor", "max_size_factor",
                                                                  "slic_zero", "max_iter"}
    if unknown:
        raise SaliencyInputError(
            f"segmentation {segmentation!r} has no option {sorted(unknown)}; its parameters: "
            f"{sorted(SEGMENTATIONS[segmentation])}")
    opts = {**SEGMENTATIONS[segmentation], **options}
    x = np.asarray(obs_nhwc, np.float64) / obs_max
    if segment_on == "last":
        x = x[..., -1:]
    elif segment_on == "mean":
        x = x.mean(-1, keepdims=True)
    out = np.empty(x.shape[:3], np.int32)
    with warnings.catch_warnings():  # skimage warns that 4 channels may not be "intended"
        warnings.filterwarnings("ignore", message=".*third dimension.*")
        for i in range(x.shape[0]):
            out[i] = np.unique(_segment_one(x[i], segmentation, opts), return_inverse=True)[1] \
                .reshape(x.shape[1:3])
    return out


def _check_segments(segments, n, hw):
    s = np.asarray(segments)
    if s.shape != (n,) + tuple(hw):
        raise SaliencyInputError(f"segments must have shape (N, H, W) = {(n,) + tuple(hw)}, got {s.shape}")
    if not np.issubdtype(s.dtype, np.integer):
        raise SaliencyInputError(f"segments must be integer labels, got dtype {s.dtype}")
    # relabel each state's segments to 0..d-1
    return np.stack([np.unique(si, return_inverse=True)[1].reshape(hw) for si in s]).astype(np.int32)


def _traced_segments(x, obs_max, segments, segmentation, segment_on, opts, max_segments, shape):
    """(labels (N, H, W) int32 from a host callback, static d_max) for a traced call."""
    if max_segments is None:
        if segments is not None or segmentation != "slic":
            raise SaliencyInputError(
                "LIME under jit/vmap needs a static bound on the superpixels per state: pass "
                "max_segments= (e.g. 2000), or call it eagerly")
        max_segments = 2 * int(opts.get("n_segments", SEGMENTATIONS["slic"]["n_segments"]))
    max_segments = check_positive_int("max_segments", max_segments)
    _check_callback_can_run()
    n, h, w = shape

    def host(x, top, given):
        if segments is None:
            segs = segment(np.asarray(x), segmentation, segment_on, float(top), **opts)
        else:
            segs = _check_segments(np.asarray(given), n, (h, w))
        if segs.max() >= max_segments:
            raise SaliencyInputError(f"LIME: a state has {int(segs.max()) + 1} superpixels, more "
                                     f"than max_segments={max_segments}; raise max_segments")
        return segs.astype(np.int32)

    given = jnp.zeros((n, h, w), jnp.int32) if segments is None else jnp.asarray(segments)
    out = jax.pure_callback(host, jax.ShapeDtypeStruct((n, h, w), jnp.int32), x,
                            jnp.asarray(obs_max, jnp.float32), given,
                            vmap_method="sequential")
    return out, max_segments


def lime_samples(key, n_samples: int, n_features: int):
    """(n_samples, n_features) {0,1} samples, each on with probability 1/2 (lime_image); row 0
    is all ones (the unperturbed state). Column j depends only on (key, j), so a state's
    samples do not depend on how many segments the other states of the batch have. One jitted
    program per (n_samples, n_features): eager, its dozen ops would each compile one of their own."""
    return _samples(key, int(n_samples), int(n_features))


@functools.partial(jax.jit, static_argnums=(1, 2))
def _samples(key, n_samples, n_features):
    cols = jax.vmap(lambda j: jax.random.bernoulli(jax.random.fold_in(key, j), 0.5, (n_samples,)))(
        jnp.arange(n_features))
    return cols.T.astype(jnp.float32).at[0].set(1.0)


@jax.jit
def _ridge(z, y, valid, kernel_width, alpha):
    """Weighted ridge with intercept (sklearn Ridge semantics) per state.

    z (n, d) samples; y (S, n) scores; valid (S, d) which features the state has.
    Weights sqrt(exp(-dist^2 / kw^2)), dist = cosine distance of z*valid to all-ones. A state's
    missing features get coefficient 0, its own the fit of its features alone.
    """
    hi = jax.lax.Precision.HIGHEST
    d_i = valid.sum(-1)                                              # (S,)
    k = jnp.einsum("nd,sd->sn", z, valid, precision=hi)               # features on
    dist = 1.0 - jnp.sqrt(k / d_i[:, None])
    w = jnp.sqrt(jnp.exp(-dist ** 2 / kernel_width ** 2))             # (S, n)
    sw = w.sum(-1, keepdims=True)
    x = z[None] * valid[:, None, :]                                   # (S, n, d)
    xm = jnp.einsum("sn,snd->sd", w, x, precision=hi) / sw
    ym = (w * y).sum(-1, keepdims=True) / sw
    xc = x - xm[:, None, :]
    a = jnp.einsum("snd,sn,sne->sde", xc, w, xc, precision=hi)
    # features a state lacks (it has fewer superpixels than the batch's largest) have zero rows and
    # columns: a unit diagonal there solves them to 0 and keeps the system regular when alpha = 0
    a = a + jnp.eye(z.shape[1])[None] * (alpha + (1.0 - valid))[:, None, :]
    b = jnp.einsum("snd,sn->sd", xc, w * (y - ym), precision=hi)
    coef = jnp.linalg.solve(a, b[..., None])[..., 0]
    return coef * valid


# the method's signature and docstring; the function registered below runs SPEC on the engine
def lime(apply_fn, params, obs, *, target="q_chosen", actions=None, layout=None, key=None,
         batch_size=None, precision="float32", segmentation: str = "slic", n_samples: int | None = None,
         kernel_width: float = 0.25, fill=0.0, ridge_alpha: float = 1.0, segments=None,
         segment_on: str = "stack", segmentation_options: dict | None = None, obs_max=None,
         return_coefficients: bool = False, max_segments: int | None = None, fast_superpixels: bool = True):
    """LIME maps (Ribeiro et al. 2016): each pixel gets its superpixel's signed coefficient in a
    weighted ridge fit of the target on random superpixel on/off samples.

    Samples z in {0, 1}^d switch superpixels off (set to `fill`); each is weighted by
    sqrt(exp(-d^2 / kernel_width^2)), d its cosine distance to all-ones, and a weighted ridge
    with intercept (lime's defaults) is fitted to the raw target (Q_a). Segmentation runs on the
    host (scikit-image); under jit/vmap it runs through `jax.pure_callback` and the number of
    superpixels must be bounded statically (`max_segments`).

    Args:
        apply_fn (Callable): the model, `apply_fn(params, obs) -> output` (Q-values (N, A), or a
            dict/tuple with them or policy logits).
        params (PyTree): the model's parameters.
        obs (jax.Array | numpy.ndarray): states (N, H, W, C), or (N, C, H, W) in layout "NCHW".
        target (str | Callable): what is explained (`jaxsal.targets`: a name or a callable
            `output -> (N,)`).
        actions (jax.Array | None): (N,) actions to explain (needed by "q_action"); None: the
            target's choice on the clean input, fixed once.
        layout (str | None): "NHWC" or "NCHW"; None: the model's declared layout, else NHWC.
        key (jax.Array): PRNG key of the samples, shared by every state. Required.
        batch_size (int | None): model rows (states x samples) per forward pass; None: the
            backend's default.
        precision (str): "float32" or "bfloat16", the precision of the model's convolutions and
            matmuls (the explained action is the float32 choice).
        segmentation (str): Paper B's superpixels: "slic" (default; n_segments 200,
            compactness 10, sigma 0.25), "quickshift" (kernel 1, max_dist 2, ratio 0) or
            "felzenszwalb" (scale 21, sigma 0.5, min_size 4).
        n_samples (int | None): samples per state; None: Paper B's count for the segmentation
            (2000 slic, 1500 quickshift, 1000 felzenszwalb).
        kernel_width (float): the sample weights' kernel width, > 0.
        fill (float | str): what switched-off superpixels become: a fraction of the value range
            (0 black, 0.5 grey = 127.5 for 0..255 frames; see `obs_max`), or "black", "grey",
            "white" or "mean" (each state's mean per stacked frame).
        ridge_alpha (float): the ridge penalty, >= 0.
        segments (jax.Array | numpy.ndarray | None): your own (N, H, W) integer superpixel
            labels, instead of segmenting; as a host array they serve traced calls too (jit, vmap)
            without `max_segments` or a host callback.
        segment_on (str): what is segmented: "stack" (default; the stacked frames as
            channels), "last" (the newest frame) or "mean" (the frames' average).
        segmentation_options (dict | None): scikit-image arguments overriding the
            segmentation's defaults.
        obs_max (float | None): the top of the observations' value range, which `fill`
            fractions scale; None: 255 for integer frames, for float frames 1.0 when every
            value is <= 1, else 255.
        return_coefficients (bool): also return the coefficients and segments.
        max_segments (int | None): static bound on the superpixels per state where traced frames
            are segmented (default there: 2 x SLIC's n_segments; required for quickshift and
            felzenszwalb).
            A state with more segments raises at run time; the bound does not change the maps.
        fast_superpixels (bool): compute the model's first conv as a sum over the few
            superpixels each of its windows sees (exact, to float rounding; 1.3-1.6x faster on
            Atari frames) where it is a flax `nn.Conv` fed pixel by pixel from the frames, in
            calls whose superpixels are known on the host (eager calls, or `segments` given as
            a host array); False: every sample's full forward pass.

    Returns:
        jax.Array | tuple: the maps, shape (N, H, W) float32; with `return_coefficients=True`
            `(maps, (coef, segments))`, coef (N, d_max) and segments (N, H, W).

    Raises:
        jaxsal.SaliencyInputError: a missing `key`; an unknown `segmentation` (without `segments`)
            or `segment_on`; bad `segments`, `n_samples`, `kernel_width`, `ridge_alpha`, `fill`,
            `obs_max`, `max_segments` or
            `fast_superpixels`; or a bad call (obs, target, actions, layout, batch_size),
            as `jaxsal.explain` reports it.
    """


def _prepare(call, apply_fn, params, *, key, segmentation, n_samples, kernel_width, fill, ridge_alpha, segments,
             segment_on, segmentation_options, obs_max, return_coefficients, max_segments, fast_superpixels):
    n, (h, w, _) = call.x.shape[0], call.hwc
    check_key(key, "lime")
    _check_segmentation(segmentation, segments)
    if n_samples is None:
        n_samples = DEFAULT_SAMPLES.get(segmentation, 1000)
    n_samples = check_positive_int("n_samples", n_samples)
    kernel_width = C.check_positive_float("kernel_width", kernel_width)
    ridge_alpha = C.check_positive_float("ridge_alpha", ridge_alpha, allow_zero=True)
    opts = dict(segmentation_options or {})
    top = C.resolve_obs_max(call.x, obs_max)
    if is_traced(segments) or segments is None and is_traced(call.x, top):
        x = to_nhwc(jnp.asarray(call.x, jnp.float32), call.layout)
        segs, d_max = _traced_segments(x, top, segments, segmentation, segment_on, opts, max_segments, (n, h, w))
        valid = (jnp.arange(d_max)[None, :] <= segs.reshape(n, -1).max(-1)[:, None]).astype(jnp.float32)
    else:
        if segments is None:
            segs = _host_segments(call, segmentation, segment_on, opts, top)
        else:
            segs = _check_segments(segments, n, (h, w))
        d_max = int(segs.max()) + 1
        valid = (np.arange(d_max)[None, :] <= segs.reshape(n, -1).max(-1)[:, None]).astype(np.float32)
    kind, value = C.fill_value(fill, call.x, obs_max)
    z = lime_samples(key, n_samples, d_max)
    consts, per_state, superpixels = {"z": z, "fill": value}, {"seg": segs, "valid": valid}, None
    if not isinstance(fast_superpixels, bool):
        raise SaliencyInputError(f"fast_superpixels must be True or False, got {fast_superpixels!r}")
    # any call whose superpixels are known on the host (the slot tables are), weights and frames traced
    # or not: the sanity check's draws, vmapped over the weights, ran Paper B's cascade 1.04-1.20x faster
    geometry = None if is_traced(segs) or not fast_superpixels else _superpixel.first_conv(
        apply_fn, params, call.x.shape, call.layout)
    if geometry is not None:  # the exact superpixel pass (jaxsal.perturbation._superpixel)
        conv, pixel_slot, slot_segment = _superpixel.slot_tables(segs, geometry)
        per_state.update(sp_pixel_slot=pixel_slot, sp_slot_segment=slot_segment)
        superpixels = (conv, kind)

    def perturb(consts, st, idx):
        m = consts["z"][idx][st["seg"]][:, :, None]
        return st["x"] * m + C.fill_of(kind, consts["fill"], st["x"]) * (1.0 - m)

    def finish(consts, x, extra, y):
        """The ridge coefficients of each state, painted on its segments."""
        coef = _ridge(consts["z"], y, extra["valid"], kernel_width, ridge_alpha)
        segs = extra["seg"]
        maps = jnp.take_along_axis(coef, segs.reshape(segs.shape[0], -1), axis=1).reshape(segs.shape)
        return (maps, (coef, segs)) if return_coefficients else maps

    return C.prepared(call, perturb=perturb, score=C.make_score("target", call.target), finish=finish,
                      n_pert=n_samples, consts=consts, per_state=per_state, model=(apply_fn, params),
                      superpixels=superpixels)


def _check_callback_can_run():
    """Refuse the host callback where JAX's CPU client runs it on a one-thread pool: with one usable core
    it hung in 3 of 4 calls (jaxlib 0.10.2, converting its own arguments), where a clear error costs nothing."""
    if cpu.usable_cores() == 1 and jax.default_backend() == "cpu":
        raise SaliencyInputError(
            "LIME under jit/vmap segments traced frames in a host callback, which can hang JAX where the process "
            "may use only one CPU core (taskset, Slurm's --cpus-per-task=1, a container's cpuset): segment the "
            "frames first and pass them as a NumPy array, segments=jaxsal.perturbation.segment(frames), or call "
            "LIME outside jit/vmap")


def _check_segmentation(segmentation, segments):
    if segmentation not in SEGMENTATIONS and segments is None:
        raise SaliencyInputError(
            f"unknown segmentation {segmentation!r}; choose one of {sorted(SEGMENTATIONS)} "
            "or pass segments=(N, H, W) integer labels")


def _host_segments(call, segmentation, segment_on, opts, top):
    """(N, H, W) labels of a call's frames (on the host: its frames are not traced)."""
    x = np.asarray(call.x, np.float32)
    return segment(x if call.layout == "NHWC" else x.transpose(0, 2, 3, 1), segmentation, segment_on, top, **opts)


def _frames_only(call, options: dict) -> dict:
    """The options with `segments` set to the frames' superpixels, segmented once: the sanity check's
    draws (the same frames under other weights) then segment nothing, run without a host callback
    under their trace, and take the superpixel pass. As given where segments are, or the frames traced."""
    opt = lambda k: options.get(k, OPTIONS[k])  # noqa: E731
    if opt("segments") is not None or is_traced(call.x):
        return options
    _check_segmentation(opt("segmentation"), None)
    top = C.resolve_obs_max(call.x, opt("obs_max"))
    return dict(options, segments=_host_segments(call, opt("segmentation"), opt("segment_on"),
                                                 dict(opt("segmentation_options") or {}), top))


OPTIONS = C.options_of(lime)
SPEC = C.perturbation_spec("lime", _prepare, OPTIONS, stochastic=True, frames_only=_frames_only,
                           example={"n_samples": 24, "segmentation_options": {"n_segments": 6}})
lime = C.register(SPEC, lime)
