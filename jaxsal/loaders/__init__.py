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
    """A Stable-Baselines `.zip` model: SBX (JAX; its `data` names an sbx policy class) or SB3
    (torch), told apart without unpickling.

    Args:
        path (str | os.PathLike): the model `.zip`.
        name (str | None): the agent's name; None: the file's stem.

    Returns:
        jaxsal.agent_spec.LoadedAgent: as `sbx_model` or `torch_nature` returns it.

    Raises:
        jaxsal.loaders.LoaderError: (a `jaxsal.SaliencyInputError`) on the files `sbx_model` and
            `torch_nature` refuse.
    """
    if is_sbx_zip(read_bytes(path), path):
        return sbx_model(path, name=name)
    return torch_nature(path, name=name)


FILE_SUFFIXES = {".cleanrl_model": cleanrl_model, ".pth": torch_nature, ".pt": torch_nature,
                 ".zip": sb3_zip}


def load_file(path, name: str | None = None):
    """An agent from a checkpoint file, the loader chosen by the file's suffix.

    `.cleanrl_model`: CleanRL JAX DQN or PPO (`cleanrl_model`); `.pth`/`.pt`: a CleanRL or SB3
    torch state_dict (`torch_nature`); `.zip`: a Stable-Baselines3 or SBX model (`sb3_zip`).

    Args:
        path (str | os.PathLike): the checkpoint file.
        name (str | None): the agent's name; None: the file's stem.

    Returns:
        jaxsal.agent_spec.LoadedAgent: the agent, as the chosen loader returns it.

    Raises:
        jaxsal.loaders.LoaderError: (a `jaxsal.SaliencyInputError`) an unknown suffix, or a file the
            chosen loader refuses.
    """
    suffix = Path(path).suffix
    if suffix not in FILE_SUFFIXES:
        raise LoaderError(f"{path}: unknown agent file type {suffix!r}; known: {', '.join(FILE_SUFFIXES)}")
    return FILE_SUFFIXES[suffix](path, name=name)


__all__ = ["LoaderError", "cleanrl_dqn", "cleanrl_model", "cleanrl_ppo", "flax_msgpack", "load_file",
           "sb3_zip", "sbx_model", "torch_nature"]
