"""Checkpoints: resumable orbax training state, and small msgpack parameter exports (no pickle)."""
from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import serialization

from .errors import AgentLoadError


def _complete_steps(ckpt_dir: Path) -> list[Path]:
    if not ckpt_dir.exists():
        return []
    return sorted(p for p in ckpt_dir.iterdir() if p.is_dir() and p.name.isdigit())


def save_train_state(ckpt_dir, state: dict, keep: int = 2) -> Path:
    """Save {params, opt_state, key, step, update} with orbax (atomic); keep the newest `keep`."""
    import orbax.checkpoint as ocp

    ckpt_dir = Path(ckpt_dir).absolute()
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    state = dict(state, step=np.int64(state["step"]), update=np.int64(state["update"]))
    path = ckpt_dir / f"{int(state['update']):09d}"
    if path.exists():
        shutil.rmtree(path)
    with ocp.StandardCheckpointer() as ckptr:
        ckptr.save(path, state)
        ckptr.wait_until_finished()
    for old in _complete_steps(ckpt_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def restore_train_state(ckpt_dir, template: dict) -> dict:
    """Restore the newest checkpoint in ckpt_dir into template's structure; template if none."""
    import orbax.checkpoint as ocp

    steps = _complete_steps(Path(ckpt_dir).absolute())
    if not steps:
        return template
    template = dict(template, step=np.int64(template["step"]), update=np.int64(template["update"]))
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), template)
    try:
        with ocp.StandardCheckpointer() as ckptr:
            state = ckptr.restore(steps[-1], abstract)
    except Exception as e:  # orbax raises many types; one clear message
        raise AgentLoadError(f"cannot restore training checkpoint {steps[-1]}: {e}. "
                             "Delete it (or the run directory) to start afresh.") from None
    return dict(state, step=int(state["step"]), update=int(state["update"]))


def export_params(path, params, dtype=np.float16) -> str:
    """Write params as one msgpack file (float16 by default); returns its sha256."""
    arrays = jax.tree.map(lambda x: np.asarray(x, dtype), serialization.to_state_dict(params))
    data = serialization.msgpack_serialize(arrays)
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)
    return hashlib.sha256(data).hexdigest()


def load_params(path, template):
    """Read a msgpack parameter file and check it against template's tree (shapes), as float32."""
    from jaxsal.checks import first_nonfinite_leaf, named_leaves

    path = Path(path)
    if not path.exists():
        raise AgentLoadError(f"parameter file {path} does not exist")
    if path.is_dir():
        raise AgentLoadError(f"parameter file {path} is a directory; give the .msgpack file")
    try:
        raw = serialization.msgpack_restore(path.read_bytes())
    except Exception as e:
        raise AgentLoadError(f"parameter file {path} is corrupt or not a msgpack export "
                             f"({type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''})") from None
    got = {k: np.asarray(v) for k, v in named_leaves(raw, lambda e: AgentLoadError(
        f"parameter file {path} is corrupt or not a msgpack export (its names are not all strings: "
        f"{type(e).__name__}); export it again (jaxsal_agents.checkpoint.export_params)")).items()}
    got_paths = {k: v.shape for k, v in got.items()}
    want_paths = {k: tuple(v.shape) for k, v in named_leaves(serialization.to_state_dict(template)).items()}
    if got_paths != want_paths:
        missing = sorted(set(want_paths) - set(got_paths))[:3]
        extra = sorted(set(got_paths) - set(want_paths))[:3]
        wrong = sorted(k for k in set(want_paths) & set(got_paths) if want_paths[k] != got_paths[k])[:3]
        raise AgentLoadError(
            f"parameter file {path} does not match the model: missing {missing}, unexpected {extra}, "
            f"wrong shape {[(k, got_paths[k], want_paths[k]) for k in wrong]}. "
            "Was it exported from a different architecture or game (action count)?")
    for k, v in got.items():  # the cast below would drop an imaginary part
        if not (jnp.issubdtype(v.dtype, jnp.floating) or jnp.issubdtype(v.dtype, jnp.integer)):
            raise AgentLoadError(f"parameter file {path}: {k} has dtype {v.dtype}, not real numbers; the file is "
                                 "corrupt, export it again (jaxsal_agents.checkpoint.export_params)")
    k = first_nonfinite_leaf(got.items())
    if k is not None:
        raise AgentLoadError(f"parameter file {path}: {k} holds NaN or infinite values (the training diverged or "
                             "the file is corrupt): export an earlier checkpoint of the run")
    raw = jax.tree.map(lambda x: np.asarray(x, np.float32), raw)
    return serialization.from_state_dict(template, raw)


def params_checksum(params) -> str:
    """Stable sha256 of a params tree (for provenance in output metadata): jaxsal's own."""
    from jaxsal import params_checksum as checksum
    return checksum(params)
