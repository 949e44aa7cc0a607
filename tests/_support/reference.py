"""Recorded maps: one writer and one comparison for the reference files in tests/data.

A reference module (engine_reference, perturbation_reference) gives `cases()`, name -> a thunk
that computes one case's maps; `write_reference` records them (run when a change is meant to
alter the maps), `check` compares a case computed now with the record."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

import jax
import numpy as np


def flat(name: str, out) -> dict:
    """A case's output as named arrays: a method list's dict by method, tuples by position
    (flattened: lime's (maps, (coef, segments)))."""
    if isinstance(out, dict):
        return {f"{name}/{k}": np.asarray(v) for k, v in out.items()}
    leaves = jax.tree.leaves(out)
    if len(leaves) == 1:
        return {name: np.asarray(leaves[0])}
    return {f"{name}/{i}": np.asarray(v) for i, v in enumerate(leaves)}


def write_reference(path: Path, cases: dict[str, Callable]) -> None:
    """Compute every case and record its arrays in the .npz file `path`."""
    arrays = {}
    for name, thunk in cases.items():
        arrays.update(flat(name, thunk()))
    np.savez_compressed(path, **arrays)
    print(f"{len(arrays)} arrays -> {path}")


def load(path: Path) -> dict:
    """The recorded arrays of a reference file."""
    with np.load(path) as f:
        return dict(f)


def check(name: str, got, recorded: dict, atol: float = 0.0) -> None:
    """The case `name` computed now (`got`) has the recorded arrays, to float32 rounding: rtol 1e-5
    and 1e-6 of the largest value, plus `atol` (for scores that are differences of O(1) outputs)."""
    got = flat(name, got)
    want = {k: v for k, v in recorded.items() if k == name or k.startswith(name + "/")}
    assert sorted(got) == sorted(want), name
    for k, w in want.items():
        assert np.abs(w).max() > 0, f"{k}: all-zero maps test nothing"
        np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=atol + 1e-6 * float(np.abs(w).max()), err_msg=k)
