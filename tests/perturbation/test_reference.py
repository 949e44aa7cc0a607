"""Perturbation methods vs slow numpy references written straight from their definitions."""
import jax
import numpy as np
import pytest
from scipy.ndimage import gaussian_filter
from skimage.transform import resize

import jaxsal
from jaxsal.perturbation import lime, noise_sensitivity, occlusion, rise, rise_masks, sarfa
from jaxsal.perturbation._common import upsample_grid
from tests._support.perturbation_models import A, C, H, W, REGION, region_apply, tiny_apply, tiny_obs, tiny_params

P = tiny_params()


def q(x):
    return np.asarray(tiny_apply(P, np.asarray(x, np.float32)[None]))[0].astype(np.float64)


def softmax(v):
    e = np.exp(v - v.max())
    return e / e.sum()


def ref_occlusion(obs, patch, stride, fill, score):
    out = []
    for x in obs.astype(np.float64):
        q0 = q(x)
        a = int(np.argmax(q0))
        starts = range(0, H - patch + stride, stride) if (H - patch) % stride else range(0, H - patch + 1, stride)
        g = np.zeros((len(starts), len(starts)))
        for gi, si in enumerate(starts):
            for gj, sj in enumerate(starts):
                xp = x.copy()
                xp[si:si + patch, sj:sj + patch, :] = fill
                q1 = q(xp)
                g[gi, gj] = {"one_minus": 1 - q1[a], "drop": q0[a] - q1[a],
                             "softmax_drop": softmax(q0)[a] - softmax(q1)[a]}[score]
        out.append(g)
    return np.stack(out)


@pytest.mark.parametrize("patch,stride,fill,score", [(2, 2, 0.0, "one_minus"), (3, 2, 0.5, "drop"),
                                                     (4, 3, 0.0, "softmax_drop")])
def test_occlusion_matches_reference(patch, stride, fill, score):
    obs = tiny_obs(2)
    got = occlusion(tiny_apply, P, obs, patch=patch, stride=stride, fill=fill, score=score,
                    return_grid=True)
    want = ref_occlusion(obs, patch, stride, fill * 255.0, score)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-4)


def test_occlusion_mean_fill_is_each_states_mean_per_stacked_frame():
    """fill="mean": the patch takes the state's own mean of each stacked frame (one value per channel),
    not a mean over the frames together or over the batch."""
    obs = tiny_obs(2, seed=6)
    obs[1, ..., 1] //= 4  # frames of different brightness, states of different means
    got = np.asarray(occlusion(tiny_apply, P, obs, patch=3, stride=3, fill="mean", score="drop", return_grid=True))
    for i, x in enumerate(obs.astype(np.float64)):
        want = ref_occlusion(x[None], 3, 3, x.mean((0, 1)), "drop")[0]
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_output_l2_sums_every_output_leaf():
    """score="output_l2" is 1/2 ||f(x) - f(x')||^2 over the whole output: every leaf of a dict output."""
    def two_heads(p, x):
        q = tiny_apply(p, x)
        return {"q": q, "value": jax.numpy.tanh(q).sum(-1) * 5.0}

    def heads(x):
        qq = q(x)
        return np.concatenate([qq, [np.tanh(qq).sum() * 5.0]])

    obs = tiny_obs(2, seed=1)
    got = np.asarray(occlusion(two_heads, P, obs, patch=4, stride=4, score="output_l2", return_grid=True))
    for i, x in enumerate(obs.astype(np.float64)):
        h0 = heads(x)
        want = np.zeros((3, 3))
        for gi in range(3):
            for gj in range(3):
                xp = x.copy()
                xp[4 * gi:4 * gi + 4, 4 * gj:4 * gj + 4] = 0.0
                want[gi, gj] = 0.5 * np.sum((h0 - heads(xp)) ** 2)
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-6)


def test_grid_upsampling_is_bilinear_half_pixel():
    g = np.random.default_rng(1).random((2, 6, 6)).astype(np.float32)
    got = np.asarray(upsample_grid(g, (12, 12)))
    want = np.stack([resize(gi, (12, 12), order=1, mode="edge", anti_aliasing=False) for gi in g])
    np.testing.assert_allclose(got, want, atol=1e-5)
    m = occlusion(tiny_apply, P, tiny_obs(1))
    np.testing.assert_allclose(np.asarray(m), np.asarray(upsample_grid(
        occlusion(tiny_apply, P, tiny_obs(1), return_grid=True), (H, W))), atol=1e-6)


def greydanus_mask(center, size, r):
    y, x = np.ogrid[-center[0]:size[0] - center[0], -center[1]:size[1] - center[1]]
    keep = x * x + y * y <= 1
    mask = np.zeros(size)
    mask[keep] = 1
    mask = gaussian_filter(mask, sigma=r)
    return mask / mask.max()


def ref_local(obs, radius, stride, blur_sigma, alt, score):
    out = []
    for x in obs.astype(np.float64):
        blurred = np.stack([gaussian_filter(x[..., c], blur_sigma) for c in range(C)], -1)
        other = blurred if alt == "blur" else np.zeros_like(x)
        q0 = q(x)
        a = int(np.argmax(q0))
        cs = range(0, H, stride)
        g = np.zeros((len(cs), len(cs)))
        for gi, i in enumerate(cs):
            for gj, j in enumerate(cs):
                m = greydanus_mask((i, j), (H, W), radius)[..., None]
                q1 = q(x * (1 - m) + other * m)
                if score == "output_l2":
                    g[gi, gj] = 0.5 * np.sum((q0 - q1) ** 2)
                elif score == "chosen_action":
                    g[gi, gj] = 1 - softmax(q1)[a]
                else:  # SARFA, straight from Puri et al.
                    p, p1 = softmax(q0), softmax(q1)
                    dp = p[a] - p1[a]
                    rem = [b for b in range(A) if b != a]
                    pr, pr1 = softmax(q0[rem]), softmax(q1[rem])
                    kl = np.sum(pr * np.log(pr / pr1))
                    k = 1 / (1 + kl)
                    g[gi, gj] = 0.0 if dp <= 0 else 2 * k * dp / (k + dp)
        out.append(g)
    return np.stack(out)


@pytest.mark.parametrize("score", ["output_l2", "chosen_action"])
def test_noise_sensitivity_matches_reference(score):
    obs = tiny_obs(2)
    got = noise_sensitivity(tiny_apply, P, obs, radius=2.0, stride=3, blur_sigma=1.5, score=score,
                            return_grid=True)
    want = ref_local(obs, 2.0, 3, 1.5, "blur", score)
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-4, atol=1e-5)


def test_noise_blur_is_per_frame_not_across_stack():
    # A model reading only frame 1; frame 0 bright, frame 1 black: a cross-frame blur would
    # leak frame 0 into frame 1 and change Q; the per-frame blur of a black frame stays black.
    obs = np.zeros((1, H, W, C), np.uint8)
    obs[..., 0] = 255
    f = lambda p, x: np.float32(1.0) * x[..., 1].sum((1, 2))[:, None] * jax.numpy.ones((1, 2))  # noqa: E731
    g = noise_sensitivity(f, {}, obs, radius=2.0, stride=3, score="output_l2", return_grid=True)
    assert float(np.abs(np.asarray(g)).max()) == 0.0


def test_noise_black_variant_matches_reference():
    obs = tiny_obs(1)
    got = noise_sensitivity(tiny_apply, P, obs, radius=1.5, stride=4, perturbation="black",
                            score="chosen_action", return_grid=True)
    np.testing.assert_allclose(np.asarray(got), ref_local(obs, 1.5, 4, 0, "black", "chosen_action"),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("perturbation", ["black", "blur"])
def test_sarfa_gaussian_variant_matches_reference(perturbation):
    obs = tiny_obs(3, seed=2)
    got = sarfa(tiny_apply, P, obs, radius=2.0, stride=2, perturbation=perturbation,
                blur_sigma=2.0, mask_shape="gaussian", return_grid=True)
    want = ref_local(obs, 2.0, 2, 2.0, perturbation, "sarfa")
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-3, atol=1e-6)
    assert (np.asarray(got) >= 0).all()


def ref_sarfa_paper_b(obs, radius=2, stride=2):
    """SARFA as Paper B's code perturbs: every `stride` px, the pixels with dx^2 + dy^2 <= r^2
    set to black in all stacked frames (hard disk, no blur), scored with Puri et al.'s formula."""
    out = []
    for x in obs.astype(np.float64):
        q0 = q(x)
        a = int(np.argmax(q0))
        p = softmax(q0)
        rem = [b for b in range(A) if b != a]
        cs = range(0, H, stride)
        g = np.zeros((len(cs), len(cs)))
        for gi, i in enumerate(cs):
            for gj, j in enumerate(cs):
                xp = x.copy()
                for yy in range(H):
                    for xx in range(W):
                        if (yy - i) ** 2 + (xx - j) ** 2 <= radius ** 2:
                            xp[yy, xx, :] = 0.0
                q1 = q(xp)
                dp = p[a] - softmax(q1)[a]
                pr, pr1 = softmax(q0[rem]), softmax(q1[rem])
                k = 1 / (1 + np.sum(pr * np.log(pr / pr1)))
                g[gi, gj] = 0.0 if dp <= 0 else 2 * k * dp / (k + dp)
        out.append(g)
    return np.stack(out)


def test_sarfa_default_is_paper_b_hard_black_disk():
    obs = tiny_obs(3, seed=2)
    got = np.asarray(sarfa(tiny_apply, P, obs, return_grid=True))   # defaults: Paper B's
    want = ref_sarfa_paper_b(obs, radius=2, stride=2)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-6)
    assert (want > 0).any()                     # the check is not vacuous on this model
    soft = np.asarray(sarfa(tiny_apply, P, obs, mask_shape="gaussian", return_grid=True))
    assert np.abs(soft - want).max() > 1e-3     # the blurred disk is a different method


def test_sarfa_score_gradient_is_finite_and_that_of_its_definition():
    """d SARFA / d Q of the clean and the perturbed Q-vectors (what `jax.grad` of a loss of the maps in
    the parameters takes) equals the gradient of the formula with p_rem renormalised over the other
    actions (no -inf entries); it was NaN in the clean Q-vector."""
    from jaxsal.perturbation import sarfa_score

    rng = np.random.default_rng(0)
    q0, q1 = (jax.numpy.asarray(rng.normal(size=(6, A)), jax.numpy.float32) for _ in range(2))
    acts = jax.numpy.asarray(np.arange(6) % A)

    def by_definition(q0, q1):
        p0, p1 = jax.nn.softmax(q0), jax.nn.softmax(q1)
        pa0, pa1 = (jax.numpy.take_along_axis(v, acts[:, None], -1) for v in (p0, p1))
        rest = np.arange(A)[None] != np.asarray(acts)[:, None]
        r0, r1 = jax.numpy.where(rest, p0 / (1 - pa0), 1.0), jax.numpy.where(rest, p1 / (1 - pa1), 1.0)
        k = 1 / (1 + (r0 * jax.numpy.log(r0 / r1)).sum(-1))
        dp = (pa0 - pa1)[:, 0]
        return jax.numpy.where(dp > 0, 2 * k * dp / jax.numpy.where(dp > 0, k + dp, 1.0), 0.0)

    assert (np.asarray(by_definition(q0, q1)) > 0).sum() >= 2   # some rows take the formula, not the 0
    np.testing.assert_allclose(sarfa_score(q0, q1, acts), by_definition(q0, q1), rtol=1e-5, atol=1e-7)
    for arg in (0, 1):
        got = jax.grad(lambda u, v: sarfa_score(u, v, acts).sum(), argnums=arg)(q0, q1)
        want = jax.grad(lambda u, v: by_definition(u, v).sum(), argnums=arg)(q0, q1)
        assert np.isfinite(np.asarray(got)).all() and np.abs(np.asarray(want)).max() > 0
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)


def test_rise_with_given_masks_is_the_weighted_sum():
    obs = tiny_obs(2)
    masks = np.random.default_rng(3).random((37, H, W)).astype(np.float32)
    got = np.asarray(rise(tiny_apply, P, obs, masks=masks, p_keep=0.4, batch_size=16))
    for n, x in enumerate(obs.astype(np.float64)):
        a = int(np.argmax(q(x)))
        want = sum(q(x * m[..., None])[a] * m for m in masks) / (37 * 0.4)
        np.testing.assert_allclose(got[n], want, rtol=1e-4, atol=1e-5)


def test_rise_masks_follow_petsiuk():
    from jaxsal.perturbation.rise import rise_bits, rise_mask_geometry

    key = jax.random.PRNGKey(0)
    m = np.asarray(rise_masks(key, 400, (84, 84), grid=8, p_keep=0.5))
    assert m.shape == (400, 84, 84) and m.min() >= 0 and m.max() <= 1
    assert abs(m.mean() - 0.5) < 0.03
    cell, up = rise_mask_geometry((84, 84), (8, 8))
    assert cell == (11, 11) and up == (99, 99)
    bits, sy, sx = (np.asarray(v) for v in rise_bits(key, 400, (8, 8), cell, 0.5))
    for i in (0, 1, 57, 399):  # Petsiuk's code: skimage resize to 99 px, shift, crop
        big = resize(bits[i], up, order=1, mode="reflect", anti_aliasing=False)
        np.testing.assert_allclose(m[i], big[sy[i]:sy[i] + 84, sx[i]:sx[i] + 84], atol=1e-5)
    assert len(set(sy.tolist())) > 5


def test_lime_recovers_linear_superpixel_model():
    rng = np.random.default_rng(0)
    obs = rng.integers(1, 256, (2, H, W, C)).astype(np.uint8)
    seg = np.arange(H * W).reshape(H, W) // 24          # 6 superpixels, the same for both states
    counts = np.bincount(seg.ravel())
    coef = rng.normal(size=(A, 6))
    onehot = jax.nn.one_hot(seg.ravel(), 6) / counts

    def linear(params, x):  # Q_b = sum_j coef[b, j] * mean of x over superpixel j (on [0, 1])
        x = jax.numpy.asarray(x, jax.numpy.float32).sum(-1).reshape(x.shape[0], -1) / 255.0
        return (x @ onehot) @ coef.T

    acts = np.array([0, 2])
    maps, (got, _) = lime(linear, {}, obs, key=jax.random.PRNGKey(0), segments=np.stack([seg, seg]),
                          n_samples=300, ridge_alpha=0.0, actions=acts, return_coefficients=True)
    for i in range(2):
        x = obs[i].astype(np.float64).sum(-1) / 255.0
        want = coef[acts[i]] * np.bincount(seg.ravel(), weights=x.ravel()) / counts
        # a float32 fit of an exact linear model: ~2e-6 of the largest coefficient seen
        np.testing.assert_allclose(np.asarray(got)[i], want, rtol=5e-5, atol=5e-5 * np.abs(want).max())
        np.testing.assert_allclose(np.asarray(maps)[i], want[seg], rtol=5e-5, atol=5e-5 * np.abs(want).max())


def test_lime_ridge_matches_numpy_weighted_ridge():
    obs = tiny_obs(2)
    key = jax.random.PRNGKey(5)
    maps, (coef, segs) = lime(tiny_apply, P, obs, key=key, segmentation="felzenszwalb",
                              n_samples=64, return_coefficients=True)
    from jaxsal.perturbation.lime import lime_samples
    for i, x in enumerate(obs.astype(np.float64)):
        d = segs[i].max() + 1
        z = np.asarray(lime_samples(key, 64, int(segs.max()) + 1))[:, :d].astype(np.float64)
        a = int(np.argmax(q(x)))
        y = np.array([q(x * zz[segs[i]][..., None])[a] for zz in z])
        k = z.sum(1)
        dist = 1 - k / (np.sqrt(k) * np.sqrt(d) + 1e-300)
        wt = np.sqrt(np.exp(-dist ** 2 / 0.25 ** 2))
        xm, ym = wt @ z / wt.sum(), wt @ y / wt.sum()
        zc, yc = z - xm, y - ym
        beta = np.linalg.solve(zc.T @ (wt[:, None] * zc) + np.eye(d), zc.T @ (wt * yc))
        np.testing.assert_allclose(np.asarray(coef)[i, :d], beta, rtol=1e-5, atol=1e-5 * np.abs(beta).max())
        assert np.all(np.asarray(coef)[i, d:] == 0)


def test_known_region_agent():
    obs = tiny_obs(2, seed=4)
    inside = np.zeros((H, W), bool)
    inside[REGION] = True
    g = np.asarray(occlusion(region_apply, {}, obs, patch=1, stride=1, score="drop", return_grid=True))
    assert np.all(np.abs(g[:, ~inside]) < 1e-5) and np.all(g[:, inside] > 1e-3)
    s = np.asarray(sarfa(region_apply, {}, obs, radius=1.0, stride=1, mask_shape="hard",
                         return_grid=True))
    near = np.zeros((H, W), bool)
    near[1:6, 5:10] = True  # a radius-1 disk touches the region from these centres
    assert np.all(s[:, ~near] < 1e-5) and np.all(s[:, inside] > 1e-4)
    r = np.asarray(rise(region_apply, {}, obs, key=jax.random.PRNGKey(0), n_masks=500, grid=4))
    assert np.all(r[:, inside].mean(1) > r[:, ~inside].mean(1) + 0.05)
    lm = np.asarray(lime(region_apply, {}, obs, key=jax.random.PRNGKey(0),
                         segments=np.broadcast_to(((np.arange(H)[:, None] + 1) // 3) * 5 + np.arange(W)[None] // 3,
                                                  (2, H, W)), n_samples=200, ridge_alpha=0.0))
    assert np.all(np.abs(lm[:, ~inside]) < 1e-3) and np.all(lm[:, inside] > 0.1)


def test_explain_front_door_finds_all_methods():
    obs = tiny_obs(1)
    for m in ("occlusion", "noise_sensitivity", "rise", "lime", "sarfa"):
        assert m in jaxsal.methods()
    s = jaxsal.explain(tiny_apply, P, obs, method="rise", key=jax.random.PRNGKey(0), n_masks=50, grid=4)
    direct = rise(tiny_apply, P, obs, key=jax.random.PRNGKey(0), n_masks=50, grid=4)
    assert s.shape == (1, H, W)
    np.testing.assert_array_equal(np.asarray(s), np.asarray(direct))
    d = jaxsal.explain(tiny_apply, P, obs, method=["occlusion", "sarfa"])
    assert set(d) == {"occlusion", "sarfa"} and d["sarfa"].shape == (1, H, W)


def test_lime_without_ridge_penalty_fits_states_with_fewer_superpixels_than_the_batch():
    """ridge_alpha=0 on a batch whose states have 2, 3 and 16 superpixels: every map is finite and
    each state's coefficients equal those of the state explained alone (its own features only)."""
    obs = tiny_obs(3, seed=2)
    segs = np.zeros((3, H, W), np.int32)
    segs[0, :, W // 2:] = 1
    segs[1, :H // 2] = 1
    segs[1, H // 2:, W // 2:] = 2
    segs[2] = (np.arange(H)[:, None] * 4 // H) * 4 + np.arange(W)[None] * 4 // W
    kw = dict(key=jax.random.PRNGKey(1), n_samples=64, ridge_alpha=0.0, return_coefficients=True)
    maps, (coef, _) = lime(tiny_apply, P, obs, segments=segs, **kw)
    assert np.isfinite(np.asarray(maps)).all()
    for i in range(2):
        alone, (c1, _) = lime(tiny_apply, P, obs[i:i + 1], segments=segs[i:i + 1], **kw)
        d = int(segs[i].max()) + 1
        np.testing.assert_allclose(np.asarray(coef)[i, :d], np.asarray(c1)[0], rtol=1e-4, atol=1e-6)
        np.testing.assert_allclose(np.asarray(maps)[i], np.asarray(alone)[0], rtol=1e-4, atol=1e-6)
        assert np.all(np.asarray(coef)[i, d:] == 0)
