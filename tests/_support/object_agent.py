"""A synthetic agent that reads only one object, as an --agent FILE.py:FUNCTION spec for the CLI tests.

Q_0 depends (nonlinearly) only on the pixels of BOX in all four stacked frames; Q_1 is a
constant below it, so the explained action is always 0 and every faithful map sits on BOX.
"""
import jax
import jax.numpy as jnp
import numpy as np

BOX = (10, 20, 22, 32)      # (y0, x0, y1, x1): the object the agent reads, 12x12 px of an 84x84 frame
OTHER = (60, 50, 72, 62)    # an object it ignores


def load():
    return one_object_agent(BOX)


def one_object_agent(box):
    """(apply_fn, params): Q_0 reads only the pixels of `box` (all 4 frames, nonlinearly); Q_1 is a constant below it."""
    y0, x0, y1, x1 = box
    w = jax.random.normal(jax.random.PRNGKey(0), (y1 - y0, x1 - x0, 4))

    def apply_fn(params, obs):
        x = jnp.asarray(obs, jnp.float32) / 255.0
        q0 = jnp.tanh((x[:, y0:y1, x0:x1, :] * params).sum((1, 2, 3)) / 10.0) + 2.0
        return jnp.stack([q0, jnp.full_like(q0, -5.0)], -1)
    return apply_fn, w


def buffer(n: int = 6, seed: int = 0):
    """(frames (n, 84, 84, 4) uint8, ObjectBoxes with classes ("target", "other") in every stacked frame)."""
    from jaxsal.game_objects import ObjectBoxes

    obs = np.random.default_rng(seed).integers(0, 256, (n, 84, 84, 4)).astype(np.uint8)
    b = np.zeros((n, 4, 3, 4), np.int16)
    lab = np.full((n, 4, 3), -1, np.int8)
    b[:, :, 0], b[:, :, 1] = BOX, OTHER
    lab[:, :, :2] = (0, 1)
    return obs, ObjectBoxes(b, lab, ("target", "other"))
