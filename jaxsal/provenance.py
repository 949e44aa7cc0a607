"""Provenance of saliency outputs: a stable checksum of the explained model's params."""
from __future__ import annotations

import hashlib

import jax
import numpy as np


def params_checksum(params) -> str:
    """Stable sha256 of a params tree: every leaf's path and float32 bytes, in tree order."""
    h = hashlib.sha256()
    for k, v in jax.tree_util.tree_flatten_with_path(params)[0]:
        h.update(jax.tree_util.keystr(k).encode())
        h.update(np.ascontiguousarray(np.asarray(v, np.float32)).tobytes())
    return h.hexdigest()
