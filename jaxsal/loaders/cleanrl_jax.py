"""CleanRL's JAX Atari agents from their `.cleanrl_model` files (flax msgpack, no pickle).

`dqn_atari_jax.py` saves `flax.serialization.to_bytes(q_state.params)`; the PPO envpool JAX
agents save `to_bytes([vars(args), [network_params, actor_params, critic_params]])`.
"""
from __future__ import annotations

from pathlib import Path

import flax.serialization
import jax
import jax.numpy as jnp

from jaxsal.agent_spec import DeclaredFn, LoadedAgent
from jaxsal.checks import ModelFails, output_shape
from jaxsal.loaders.nets import CleanRLActor, CleanRLCritic, CleanRLNetwork, CleanRLQNetwork
from jaxsal.loaders.errors import LoaderError, check_params, read_bytes


def _restore(path) -> dict:
    data = read_bytes(path)
    try:
        tree = flax.serialization.msgpack_restore(data)
    except Exception as e:  # msgpack raises several types on garbage
        raise LoaderError(f"{path}: not a flax msgpack file ({type(e).__name__})") from None
    if not isinstance(tree, dict):
        raise LoaderError(f"{path}: expected a flax parameter tree, got {type(tree).__name__}")
    return tree


def _as_jnp(tree):
    return jax.tree.map(jnp.asarray, tree)


def _init_shapes(module, shape):
    """The parameter shapes of `module` on one input of `shape` (abstract: nothing is computed)."""
    return jax.eval_shape(module.init, jax.random.PRNGKey(0), jax.ShapeDtypeStruct((1,) + shape, jnp.float32))


def _dense_out(p, name: str, path) -> int:
    try:
        n = int(p[name]["kernel"].shape[-1])
    except (KeyError, TypeError, AttributeError, IndexError):
        raise LoaderError(f"{path}: no {name} kernel where CleanRL's network has one; is this a "
                          "dqn_atari_jax / ppo_atari_envpool_xla_jax model?") from None
    if n < 1:
        raise LoaderError(f"{path}: its {name} kernel gives {n} actions; the file is corrupt, get it again "
                          "from where it was made")
    return n


def is_ppo_tree(tree: dict) -> bool:
    return set(tree) == {"0", "1"} and isinstance(tree["1"], dict) and set(tree["1"]) == {"0", "1", "2"}


def cleanrl_dqn(path, name: str | None = None) -> LoadedAgent:
    """A CleanRL `dqn_atari_jax.py` agent from its `.cleanrl_model` file (read as flax msgpack,
    never unpickled).

    The agent maps (N, 4, 84, 84) uint8 frames (NCHW, declared on its `apply_fn`) to Q-values
    (N, A).

    Args:
        path (str | os.PathLike): the `.cleanrl_model` file.
        name (str | None): the agent's name; None: the file's stem.

    Returns:
        jaxsal.agent_spec.LoadedAgent: `apply_fn`, `params`, `layout` "NCHW", `num_actions`,
            `pixels` "uint8" and a `card` naming the source file.

    Raises:
        jaxsal.loaders.LoaderError: (a `jaxsal.SaliencyInputError`) the file is missing or
            unreadable, is not flax msgpack, or its parameters do not fit CleanRL's Q-network on
            (4, 84, 84) frames (names, shapes, floating point) or hold NaN or infinite values.
    """
    tree = _restore(path)
    if "params" not in tree:
        raise LoaderError(f"{path}: no 'params' entry; CleanRL's dqn_atari_jax saves "
                          "to_bytes(q_state.params) = {{'params': ...}}")
    n = _dense_out(tree["params"], "Dense_1", path)
    model = CleanRLQNetwork(action_dim=n)
    check_params(path, tree, _init_shapes(model, (4, 84, 84)), "CleanRL's dqn_atari_jax QNetwork")
    params = _as_jnp(tree)
    _check_apply(model.apply, params, path)
    return LoadedAgent(name=name or Path(path).stem, apply_fn=DeclaredFn(model.apply, "NCHW", "uint8"),
                       params=params, layout="NCHW", num_actions=n, pixels="uint8",
                       card={"source": "cleanrl dqn_atari_jax", "file": str(path), "num_actions": n})


def cleanrl_ppo(path, name: str | None = None) -> LoadedAgent:
    """A CleanRL `ppo_atari_envpool_xla_jax` agent from its `.cleanrl_model` file (flax msgpack
    of `[vars(args), [network, actor, critic]]`, never unpickled).

    The agent maps (N, 4, 84, 84) uint8 frames (NCHW) to `{"logits": (N, A), "value": (N,)}`.

    Args:
        path (str | os.PathLike): the `.cleanrl_model` file.
        name (str | None): the agent's name; None: the file's stem.

    Returns:
        jaxsal.agent_spec.LoadedAgent: `apply_fn`, `params` ({"network", "actor", "critic"}),
            `layout` "NCHW", `num_actions`, `pixels` "uint8" and a `card` with the run's env_id.

    Raises:
        jaxsal.loaders.LoaderError: (a `jaxsal.SaliencyInputError`) the file is missing or
            unreadable, is not flax msgpack, is not CleanRL's PPO save, or its parameters do not fit
            the network (names, shapes, floating point) or hold NaN or infinite values.
    """
    tree = _restore(path)
    if not is_ppo_tree(tree):
        raise LoaderError(f"{path}: expected CleanRL's PPO save [vars(args), [network, actor, critic]]")
    net, actor, critic = (tree["1"][k] for k in ("0", "1", "2"))
    n = _dense_out(actor.get("params", {}) if isinstance(actor, dict) else {}, "Dense_0", path)
    network, act, crit = CleanRLNetwork(), CleanRLActor(action_dim=n), CleanRLCritic()
    check_params(path, {"network": net, "actor": actor, "critic": critic},
                 {"network": _init_shapes(network, (4, 84, 84)), "actor": _init_shapes(act, (512,)),
                  "critic": _init_shapes(crit, (512,))}, "CleanRL's ppo_atari_envpool_xla_jax network")
    net, actor, critic = _as_jnp(net), _as_jnp(actor), _as_jnp(critic)

    def apply_fn(params, x):
        hidden = network.apply(params["network"], x)
        return {"logits": act.apply(params["actor"], hidden), "value": crit.apply(params["critic"], hidden)[:, 0]}

    params = {"network": net, "actor": actor, "critic": critic}
    _check_apply(apply_fn, params, path)
    args = tree["0"] if isinstance(tree["0"], dict) else {}
    env_id = args.get("env_id") if isinstance(args.get("env_id"), str) else None  # the card is stored as JSON
    return LoadedAgent(name=name or Path(path).stem, apply_fn=DeclaredFn(apply_fn, "NCHW", "uint8"),
                       params=params, layout="NCHW", num_actions=n, pixels="uint8",
                       card={"source": "cleanrl ppo_atari_envpool_xla_jax", "file": str(path), "num_actions": n,
                             "env_id": env_id})


def cleanrl_model(path, name: str | None = None) -> LoadedAgent:
    """Either CleanRL JAX Atari save (DQN or PPO), told apart by its parameter tree's structure.

    Args:
        path (str | os.PathLike): the `.cleanrl_model` file.
        name (str | None): the agent's name; None: the file's stem.

    Returns:
        jaxsal.agent_spec.LoadedAgent: as `cleanrl_dqn` or `cleanrl_ppo` returns it.

    Raises:
        jaxsal.loaders.LoaderError: (a `jaxsal.SaliencyInputError`) on the files `cleanrl_dqn` and
            `cleanrl_ppo` refuse.
    """
    return cleanrl_ppo(path, name) if is_ppo_tree(_restore(path)) else cleanrl_dqn(path, name)


def _check_apply(apply_fn, params, path):
    try:
        output_shape(apply_fn, params, (1, 4, 84, 84), layout="NCHW")
    except ModelFails as e:
        raise LoaderError(f"{path}: parameters do not fit CleanRL's Nature CNN on (4, 84, 84) frames "
                          f"({e.error})") from None
