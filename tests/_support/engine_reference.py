"""Reference maps of the gradient and CAM methods, recorded from the implementation before the
one-engine port (tests/data/engine_reference.npz): `python -m tests._support.engine_reference` rewrites
the file; tests/backprop/test_engine_reference.py checks every case still gives the same maps.

Tiny models keep it cheap: a strided-conv CNN (ReLUs for the guided rules, named layers for the
CAMs) and a time-distributed trunk (one conv on each of 3 frames) for per-frame CAMs."""
from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

import jaxsal
from tests._support import DATA
from tests._support.reference import write_reference
from tests._support.conformance import A, C, H, W, Tiny  # the conformance CNN

PATH = DATA / "engine_reference.npz"
N = 5


class Trunk(nn.Module):
    """(N, H, W, 3*2) frame-major stacks -> one 'conv' on N*3 frames -> 'q'."""
    @nn.compact
    def __call__(self, x):
        n, h, w, c = x.shape
        f = jnp.moveaxis(x.reshape(n, h, w, 3, c // 3), 3, 1).reshape(n * 3, h, w, c // 3)
        a = nn.Conv(3, (2, 2), (2, 2), padding="VALID", name="conv")(f / 255.0)
        return nn.Dense(A, name="q")(nn.relu(a).reshape(n, -1))


@functools.cache
def models():
    """The two models, their params and states: built once per process, when a case first runs."""
    tiny, trunk = Tiny(), Trunk()
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.integers(0, 256, (N, H, W, C)), jnp.uint8)
    xt = jnp.asarray(rng.integers(0, 256, (N, 8, 8, 6)), jnp.uint8)
    p = tiny.init(jax.random.PRNGKey(0), jnp.zeros((1, H, W, C)))
    pt = trunk.init(jax.random.PRNGKey(1), jnp.zeros((1, 8, 8, 6)))
    return (tiny.apply, p, x), (trunk.apply, pt, xt)


KEY = jax.random.PRNGKey(3)
ACTS = np.array([2, 0, 1, 1, 0], np.int32)
SINGLE = ("gradient", "grad_x_input", "guided_backprop", "deconvnet", "gradcam", "gradcam_pp",
          "g1gradcam", "g2gradcam", "guided_gradcam", "xgradcam")
LIST = ["gradcam", "gradcam_pp", "guided_backprop", "g2gradcam", "gradient", "xgradcam"]


def cases():
    """name -> thunk giving the maps (an array, or a dict for a method list)."""
    e = lambda **kw: (lambda: jaxsal.explain(*models()[0], **kw))  # noqa: E731
    c = {f"{m}": e(method=m) for m in SINGLE}
    c.update({
        "list": e(method=LIST),
        "list_conv1": e(method=LIST, layer="conv1", batch_size=2),
        "gradient_per_frame": e(method="gradient", per_frame=True),
        "g2gradcam_per_frame": e(method="g2gradcam", per_frame=True),
        "list_q_action": e(method=["gradcam", "guided_backprop"], target="q_action", actions=ACTS),
        "gradcam_advantage": e(method="gradcam", target="advantage"),
        "gradcam_post_relu": e(method="gradcam", layer_activation="post_relu"),
        "gradient_slow_conv": e(method="gradient", fast_conv=False),
        "trunk_per_frame": lambda: jaxsal.explain(*models()[1], method=["gradcam", "g1gradcam", "g2gradcam",
                                                                      "guided_gradcam"], per_frame=True),
        "trunk_sum": lambda: jaxsal.explain(*models()[1], method=["gradcam_pp", "g2gradcam"]),
        "smoothgrad": e(method="smoothgrad", n_samples=5, key=KEY),
        "smoothgrad_groups": e(method="smoothgrad", n_samples=5, key=KEY, batch_size=4),
        "smoothgrad_sg2": e(method="smoothgrad", n_samples=5, key=KEY, variant="sg2"),
        "smoothgrad_vargrad": e(method="smoothgrad", n_samples=5, key=KEY, variant="vargrad", per_frame=True),
        "smoothgrad_guided": e(method="smoothgrad", n_samples=5, key=KEY, rule="guided"),
        "smoothgrad_no_prefix": e(method="smoothgrad", n_samples=5, key=KEY, fast_prefix=False, sigma=0.3),
        "ig": e(method="integrated_gradients", steps=5),
        "ig_groups": e(method="integrated_gradients", steps=5, batch_size=4),
        "ig_blur": e(method="integrated_gradients", steps=4, baseline="blur", blur_sigma=2.0),
        "ig_uniform": e(method="integrated_gradients", steps=4, baseline="uniform", key=KEY),
        "ig_const": e(method="integrated_gradients", steps=4, baseline=np.full((H, W, C), 30.0, np.float32)),
        "ig_per_state": e(method="integrated_gradients", steps=4,
                          baseline=np.arange(N * H * W * C, dtype=np.float32).reshape(N, H, W, C) % 97),
        "ig_gl": lambda: jaxsal.integrated_gradients(*models()[0], steps=4, method="gausslegendre", per_frame=True),
        "ig_trapezoid_guided": lambda: jaxsal.integrated_gradients(*models()[0], steps=4, method="riemann_trapezoid",
                                                                   rule="guided"),
        "ig_error": e(method="integrated_gradients", steps=4, return_error=True, fast_prefix=False),
        "ig_q_action": e(method="integrated_gradients", steps=4, target="q_action", actions=ACTS),
    })
    return c


if __name__ == "__main__":
    write_reference(PATH, cases())
