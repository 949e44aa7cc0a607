"""sha256 of arrays and of pytrees of arrays (an agent's weights): the keys under which the
studies' resumable progress is kept, so that progress from other data is never mixed in."""
from __future__ import annotations

import hashlib

import numpy as np


def sha256_array(a) -> str:
    """sha256 of an array's dtype, shape and bytes."""
    a = np.ascontiguousarray(a)
    h = hashlib.sha256(f"{a.dtype.str}{a.shape}".encode())
    h.update(a.tobytes())
    return h.hexdigest()


def sha256_tree(tree) -> str:
    """sha256 of a pytree of arrays (the agent's weights): its structure and every leaf."""
    import jax

    leaves, treedef = jax.tree.flatten(tree)
    h = hashlib.sha256(str(treedef).encode())
    for x in leaves:
        h.update(sha256_array(np.asarray(x)).encode())
    return h.hexdigest()
