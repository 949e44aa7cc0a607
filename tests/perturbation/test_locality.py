"""The trace-time locality proof: it accepts what is local pixel by pixel and rejects the rest."""
import jax
import jax.numpy as jnp
import pytest

from jaxsal.perturbation import _locality

NHWC, NCHW = (0, 1, 2, None), (0, None, 1, 2)
X = jax.ShapeDtypeStruct((6, 8, 8, 3), jnp.float32)
P = jnp.ones((3,))


def _layer_norm(x):
    m = x.mean(-1, keepdims=True)
    return (x - m) * jax.lax.rsqrt(((x - m) ** 2).mean(-1, keepdims=True) + 1e-6) * P + P


LOCAL = {
    "scale": lambda x: x / 255.0,
    "relu": jax.nn.relu,
    "gelu_tanh_clip": lambda x: jnp.clip(jnp.tanh(jax.nn.gelu(x)), -0.5, 0.5),
    "layer_norm_over_channels": _layer_norm,
    "uint8_cast": lambda x: x.astype(jnp.uint8).astype(jnp.float32),
    "channel_max": lambda x: jnp.broadcast_to(x.max(-1, keepdims=True), x.shape),
    "where": lambda x: jnp.where(x > 0.5, x, P),
    "jit_inside": jax.jit(lambda x: jax.nn.sigmoid(x) * 2),
    "independent": lambda x: jnp.zeros((6, 8, 8, 3)) + P,
}
NOT_LOCAL = {
    "spatial_mean": lambda x: x - x.mean(axis=(1, 2), keepdims=True),
    "frame_mean": lambda x: x - x.mean(axis=(1, 2, 3), keepdims=True),
    "batch_norm_stats": lambda x: x - x.mean(axis=0, keepdims=True),
    "roll": lambda x: jnp.roll(x, 1, axis=1),
    "flip": lambda x: x[:, ::-1],
    "transpose_hw": lambda x: jnp.swapaxes(x, 1, 2),
    "row_index": lambda x: x + jnp.arange(6.0)[:, None, None, None],
    "pixel_broadcast": lambda x: x[:, :1, :1] + 0 * x,
    "pad_and_crop": lambda x: jnp.pad(x, ((0, 0), (1, 0), (0, 0), (0, 0)))[:, :8],
    "dense_over_flattened": lambda x: (x.reshape(6, -1) @ jnp.ones((192, 192))).reshape(6, 8, 8, 3),
    "random_mask": lambda x: x * jax.random.bernoulli(jax.random.PRNGKey(0), 0.5, x.shape),
    "map_over_rows": lambda x: jax.lax.map(lambda r: jnp.roll(r, 1, axis=0), x),
    "scan_over_rows": lambda x: jax.lax.scan(lambda c, r: (c + r, c + r), jnp.zeros(x.shape[1:]), x)[1],
}


@pytest.mark.parametrize("name", sorted(LOCAL))
def test_local_code_is_proven(name):
    closed = jax.make_jaxpr(LOCAL[name])(X)
    assert _locality.is_local(closed, [NHWC])


@pytest.mark.parametrize("name", sorted(NOT_LOCAL))
def test_non_local_code_is_not_proven(name):
    closed = jax.make_jaxpr(NOT_LOCAL[name])(X)
    assert not _locality.is_local(closed, [NHWC])


def test_channel_first_input_transposed_to_nhwc_is_local():
    closed = jax.make_jaxpr(lambda x: jax.nn.relu(jnp.transpose(x, (0, 2, 3, 1)) / 255.0))(
        jax.ShapeDtypeStruct((6, 3, 8, 8), jnp.float32))
    assert _locality.is_local(closed, [NCHW])
    assert not _locality.is_local(closed, [NHWC])  # read with the wrong layout: not proven


def test_dependence_on_an_input_not_known_local_is_not_proven():
    closed = jax.make_jaxpr(lambda x, y: jax.nn.relu(y) + x)(X, X)
    assert _locality.is_local(closed, [None, NHWC])
    assert not _locality.is_local(closed, [_locality.BAD, NHWC])
