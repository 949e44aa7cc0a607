"""How many model rows go to one device call: `plan` sizes the chunks of states and the groups of
a state's inner loop (noise samples, path steps, perturbations) from the caller's batch_size, and
`check_batch_size` is the one check of that argument."""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import numpy as np

from jaxsal.errors import SaliencyInputError

BUCKET_BASE = 4
"""Chunk sizes below the full chunk are powers of 4: at most 4x padding for a small batch,
and at most four compiled programs below 64 states (a compile costs ~2 s, 64 rows ~40 ms)."""


def check_batch_size(batch_size) -> int | None:
    """batch_size as an int, or None (the caller's default): a positive integer, never a bool or
    a float."""
    if batch_size is None:
        return None
    if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise SaliencyInputError(f"batch_size must be a positive int (model rows per device call), "
                                 f"e.g. batch_size=256, got {batch_size!r}")
    return int(batch_size)


WORK = {"backward": 64, "forward": 512, "forward_normalised": 128}
"""Rows per CPU device by kind of work (see default_rows)."""


def default_rows(work: str = "backward") -> int:
    """Model rows per compiled call when the caller gives no batch_size.

    work="backward" (gradients, CAMs, the incremental perturbation methods): XLA:CPU runs the
    Nature-CNN ~2x faster per row at 32-64 rows than at 256-1024 (cache-sized working set;
    measured on the 2-core dev VM: gradient 577 vs 301 maps/s, occlusion 6.2 vs 2.8).
    work="forward" (full forward passes of perturbed inputs: RISE, LIME, Score-CAM): 512 rows,
    1.2-1.7x faster than 64 on the same VM (RISE 8.1 vs 4.8 maps/s, LIME 3.8 vs 3.2,
    interleaved); "forward_normalised", the same for a model that normalises its conv
    activations (LayerNorm, GroupNorm: whole-tensor memory passes outside the fused convs): 128
    rows (4 Breakout states, the shipped PQN agent: RISE 167 vs 194 ms per map at 512, LIME
    felzenszwalb 189 vs 209). Accelerators want large batches either way.
    """
    if work not in WORK:
        raise ValueError(f"work must be one of {sorted(WORK)}, got {work!r}")
    per_device = WORK[work] if jax.default_backend() == "cpu" else 4096
    return per_device * jax.local_device_count()


def rows(batch_size, work: str = "backward") -> int:
    """Model rows per device call: the checked batch_size, else `default_rows(work)`."""
    batch_size = check_batch_size(batch_size)
    return default_rows(work) if batch_size is None else batch_size


def bucket(n: int, cap: int) -> int:
    """The smallest of 1, 4, 16, ... (below cap) or cap itself that holds n states (n <= cap)."""
    b = 1
    while b < n and b * BUCKET_BASE < cap:
        b *= BUCKET_BASE
    return b if b >= n else cap


def device_multiple(k: int) -> int:
    """k rounded up to a multiple of the local device count (a chunk's batch axis is sharded)."""
    ndev = jax.local_device_count()
    return -(-k // ndev) * ndev


class Plan(NamedTuple):
    """states: states per chunk; group: inner items (samples, steps, perturbations) per group;
    groups: groups per state (the last one padded up to `group` items)."""
    states: int
    group: int
    groups: int


def plan(n: int, batch_size, rows_per_state: int = 1, total: int = 1, *, balanced: bool = False) -> Plan:
    """Sizes of a call of n states, each `rows_per_state` model rows per inner item and `total`
    inner items, so that one device call holds at most batch_size rows (None: everything at once).

    A group holds as many items as fit in batch_size rows (at least 1, at most total); with
    `balanced` the groups are made as equal as possible (fewer padded rows; the perturbation
    methods', whose scores are per item), else all but the last are full (the combinators', whose
    sums over a group are the maps: keeping the groups keeps their bits). A chunk holds as many
    states as fit with one group each (at least 1), a bucket size (`bucket`) for a call smaller
    than one chunk, a multiple of the device count.
    """
    batch_size = check_batch_size(batch_size)
    per_item, total = max(1, rows_per_state), max(1, total)
    group = total if batch_size is None else max(1, min(total, batch_size // per_item))
    groups = math.ceil(total / group)
    if balanced:
        group = math.ceil(total / groups)
    states = max(1, n) if batch_size is None else max(1, batch_size // (group * per_item))
    if n < states:
        states = bucket(n, states)
    return Plan(device_multiple(states), group, groups)
