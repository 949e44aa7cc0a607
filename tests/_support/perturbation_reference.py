"""Reference maps of the perturbation methods and Score-CAM, recorded from the implementation
before their port to the one engine (tests/data/perturbation_reference.npz):
`python -m tests._support.perturbation_reference` rewrites the file; tests/perturbation/test_engine_reference.py
checks every case still gives the same maps.

The conformance CNN (two flax convs, so incremental occlusion windows both) on 12x12x2 uint8
frames keeps it small and fast."""
from __future__ import annotations

import jax
import numpy as np

import jaxsal
from tests._support import DATA
from tests._support.reference import write_reference
from tests._support.conformance import PARAMS, MODEL, H, W, C

PATH = DATA / "perturbation_reference.npz"
N = 3
KEY = jax.random.PRNGKey(5)
ACTS = np.array([2, 0, 1], np.int32)


def obs():
    return np.random.default_rng(11).integers(0, 256, (N, H, W, C)).astype(np.uint8)


def cases():
    """name -> thunk giving the maps (an array or a tuple)."""
    f, p, x = MODEL.apply, PARAMS, obs()
    e = lambda m, **kw: (lambda: jaxsal.explain(f, p, x, method=m, **kw))  # noqa: E731
    return {
        "occlusion": e("occlusion"),
        "occlusion_plain": e("occlusion", incremental=False),
        "occlusion_incremental": e("occlusion", incremental=True, batch_size=20),
        "occlusion_grid_drop": e("occlusion", patch=3, stride=2, fill=0.5, score="drop", return_grid=True),
        "occlusion_mean_l2": e("occlusion", patch=4, stride=3, fill="mean", score="output_l2",
                               upsample="nearest"),
        "occlusion_q_action": e("occlusion", target="q_action", actions=ACTS, score="softmax_drop"),
        "noise_sensitivity": e("noise_sensitivity", radius=1.5, stride=3),
        "noise_sensitivity_plain": e("noise_sensitivity", radius=1.5, stride=3, incremental=False),
        "noise_sensitivity_original": e("noise_sensitivity", radius=2.0, stride=4, score="output_l2"),
        "noise_sensitivity_black_hard": e("noise_sensitivity", radius=1.0, stride=2, perturbation="black",
                                          fill=0.5, mask_shape="hard", return_grid=True),
        "sarfa": e("sarfa"),
        "sarfa_plain": e("sarfa", incremental=False, batch_size=16),
        "sarfa_blurred": e("sarfa", perturbation="blur", blur_sigma=2.0, mask_shape="gaussian", radius=1.0,
                           stride=3),
        "sarfa_q_action": e("sarfa", target="q_action", actions=ACTS, return_grid=True),
        "rise": e("rise", n_masks=40, grid=4, key=KEY),
        "rise_chunked": e("rise", n_masks=40, grid=4, key=KEY, batch_size=16, fill="grey", p_keep=0.3),
        "rise_given_masks": lambda: jaxsal.rise(f, p, x, masks=jaxsal.rise_masks(KEY, 12, (H, W), 3),
                                                target="q_action", actions=ACTS),
        "lime_slic": e("lime", n_samples=30, key=KEY, segmentation_options={"n_segments": 8}),
        "lime_slic_chunked": e("lime", n_samples=30, key=KEY, segmentation_options={"n_segments": 8},
                               batch_size=16, ridge_alpha=0.5, kernel_width=0.4),
        "lime_quickshift": e("lime", segmentation="quickshift", n_samples=30, key=KEY),
        "lime_felzenszwalb": e("lime", segmentation="felzenszwalb", n_samples=30, key=KEY,
                               target="q_action", actions=ACTS),
        "lime_coefficients": lambda: jaxsal.lime(f, p, x, n_samples=25, key=KEY, segment_on="last",
                                                 segmentation_options={"n_segments": 6},
                                                 return_coefficients=True),
        "scorecam": e("scorecam", layer="conv2"),
        "scorecam_conv1_chunked": e("scorecam", layer="conv1", batch_size=3),
        "scorecam_softmax_q_action": e("scorecam", target="q_action", actions=ACTS),
        "scorecam_post_relu": e("scorecam", layer_activation="post_relu"),
    }


if __name__ == "__main__":
    write_reference(PATH, cases())
