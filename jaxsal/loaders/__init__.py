"""Loaders for agents trained elsewhere: CleanRL JAX `.cleanrl_model`, Flax msgpack params
(PureJaxRL-style), CleanRL/SB3 Nature-CNN torch state_dicts (optional torch), SBX DQN/PPO
`.zip` models (read without unpickling). Each returns a
`jaxsal.agent_spec.LoadedAgent` (apply_fn, params, layout, num_actions, card).

    agent = jaxsal.loaders.load_file("runs/x/dqn_atari_jax.cleanrl_model")
    maps = jaxsal.explain(agent.apply_fn, agent.params, obs_nchw, method="gradcam")
"""
from __future__ import annotations

from pathlib import Path

from jaxsal.loaders.cleanrl_jax import cleanrl_dqn, cleanrl_model, cleanrl_ppo
from jaxsal.loaders.errors import LoaderError, read_bytes
from jaxsal.loaders.flax_params import flax_msgpack
from jaxsal.loaders.sbx import is_sbx_zip, sbx_model
from jaxsal.loaders.torch_nature import torch_nature


def sb3_zip(path, name: str | None = None):
    """A Stable-Baselines `.zip`: SBX (JAX; its `data` names an sbx policy class) or SB3 (torch)."""
    if is_sbx_zip(read_bytes(path), path):
        return sbx_model(path, name=name)
    return torch_nature(path, name=name)


FILE_SUFFIXES = {".cleanrl_model": cleanrl_model, ".pth": torch_nature, ".pt": torch_nature,
                 ".zip": sb3_zip}


def load_file(path, name: str | None = None):
    """An agent from a checkpoint file, by suffix: .cleanrl_model (CleanRL JAX DQN or PPO),
    .pth/.pt (CleanRL torch state_dict), .zip (Stable-Baselines3 or SBX model)."""
    suffix = Path(path).suffix
    if suffix not in FILE_SUFFIXES:
        raise LoaderError(f"{path}: unknown agent file type {suffix!r}; known: {', '.join(FILE_SUFFIXES)}")
    return FILE_SUFFIXES[suffix](path, name=name)


__all__ = ["LoaderError", "cleanrl_dqn", "cleanrl_model", "cleanrl_ppo", "flax_msgpack", "load_file",
           "sb3_zip", "sbx_model", "torch_nature"]
