"""Provenance of saliency outputs: a stable checksum of the explained model's params."""
from __future__ import annotations

import hashlib

import jax
import numpy as np


def params_checksum(params) -> str:
    """A stable checksum of a params tree, as the output manifests record the explained model's.

    The sha256 of every leaf's path and float32 bytes, in tree order: the same parameters give
    the same checksum in any process, on any backend.

    Args:
        params (PyTree): the model's parameters (any leaves convertible to float32 arrays).

    Returns:
        str: the 64-character hex digest.
    """
    h = hashlib.sha256()
    for k, v in jax.tree_util.tree_flatten_with_path(params)[0]:
        h.update(jax.tree_util.keystr(k).encode())
        h.update(np.ascontiguousarray(np.asarray(v, np.float32)).tobytes())
    return h.hexdigest()
