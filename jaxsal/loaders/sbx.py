"""SBX (the JAX Stable-Baselines, PyPI `sbx-rl`) DQN and PPO `.zip` models as Flax agents, unpickled never.

An SBX `.zip` holds a JSON `data` file whose `policy` entry is a cloudpickle (base64) of the
whole policy: flax modules, train states with the params, optimizer state, jitted functions.
`pickle.loads` of it would run whatever code the file names, so it is read with
`jaxsal.io.pickled` instead (opcodes walked as bounded data, nothing imported or called):
the policy class, the networks' settings (units, activation by name, NatureCNN or not) and
the params arrays. The networks are rebuilt here with SBX's module names, so the params tree
and every layer name (`NatureCNN_0/Conv_2`, `Dense_1`) are SBX's; the rebuilt params tree is
checked against the file's. sbx itself is not needed to load.

DQN (MlpPolicy, CnnPolicy): apply_fn(params, obs) -> Q-values (N, A). PPO with a Discrete
action space (MlpPolicy, CnnPolicy): -> {"logits": (N, A), "value": (N,)}. CnnPolicy models
take SB3's channel-first uint8 frames (N, C, H, W) and scale by 1/255 inside, as SBX does.
Anything else (SAC, TQC, continuous PPO, custom policy classes, activations outside a short
list) is refused with one error naming the loader route `--agent file.py:load`.
"""
from __future__ import annotations

import base64
import binascii
import io
import json
import zipfile
from pathlib import Path
from typing import Callable, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp

from jaxsal.agent_spec import DeclaredFn, LoadedAgent
from jaxsal.io.pickled import (Call, Global, PickleFormatError, PickleLimitError, describe, parse, to_dtype,
                               tree_to_arrays)
from jaxsal.errors import brief
from jaxsal.loaders.errors import LoaderError, check_params, read_bytes, read_zip_member

ACTIVATIONS: dict[str, Callable] = {
    "relu": jax.nn.relu, "tanh": jnp.tanh, "elu": jax.nn.elu, "gelu": jax.nn.gelu,
    "silu": jax.nn.silu, "swish": jax.nn.silu, "sigmoid": jax.nn.sigmoid,
    "leaky_relu": jax.nn.leaky_relu, "softplus": jax.nn.softplus, "relu6": jax.nn.relu6,
    "selu": jax.nn.selu, "celu": jax.nn.celu,
}
POLICIES = {("sbx.dqn.policies", "DQNPolicy"): "dqn", ("sbx.dqn.policies", "CNNPolicy"): "dqn",
            ("sbx.ppo.policies", "PPOPolicy"): "ppo", ("sbx.ppo.policies", "CnnPolicy"): "ppo"}
DATA_MAX = 512 << 20  # bytes of an SB3/SBX zip's JSON `data` (a large CNN policy with optimizer state: ~50 MB)
CRAFTED = ("the file is corrupt or crafted: get it again from where it was made, and do not unpickle it "
           "(sbx's load would run what it holds)")
ROUTE = ("load it with sbx in Python and give jaxsal a loader instead: --agent file.py:load, whose load() "
         "returns (apply_fn, params), e.g. (model.policy.qf.apply, model.policy.qf_state.params)")


class Flatten(nn.Module):
    """SBX's Flatten (a module, so the layer names match SBX's)."""

    @nn.compact
    def __call__(self, x):
        return x.reshape((x.shape[0], -1))


class NatureCNN(nn.Module):
    """SBX's NatureCNN: channel-first frames, / 255 inside, 3 convs and a dense layer."""
    n_features: int = 512
    activation_fn: Callable = jax.nn.relu

    @nn.compact
    def __call__(self, x):
        x = jnp.transpose(x, (0, 2, 3, 1)).astype(jnp.float32) / 255.0
        x = self.activation_fn(nn.Conv(32, (8, 8), strides=(4, 4), padding="VALID")(x))
        x = self.activation_fn(nn.Conv(64, (4, 4), strides=(2, 2), padding="VALID")(x))
        x = self.activation_fn(nn.Conv(64, (3, 3), strides=(1, 1), padding="VALID")(x))
        x = x.reshape((x.shape[0], -1))
        return self.activation_fn(nn.Dense(self.n_features)(x))


class QNetwork(nn.Module):
    """SBX DQN MlpPolicy network."""
    n_actions: int
    n_units: int = 256
    activation_fn: Callable = jax.nn.relu

    @nn.compact
    def __call__(self, x):
        x = Flatten()(x)
        x = self.activation_fn(nn.Dense(self.n_units)(x))
        x = self.activation_fn(nn.Dense(self.n_units)(x))
        return nn.Dense(self.n_actions)(x)


class CnnQNetwork(nn.Module):
    """SBX DQN CnnPolicy network."""
    n_actions: int
    n_units: int = 512
    activation_fn: Callable = jax.nn.relu

    @nn.compact
    def __call__(self, x):
        return nn.Dense(self.n_actions)(NatureCNN(self.n_units, self.activation_fn)(x))


class Mlp(nn.Module):
    """SBX PPO Actor (outputs = action logits) or Critic (outputs = 1), optional NatureCNN."""
    net_arch: Sequence[int]
    outputs: int
    activation_fn: Callable = jnp.tanh
    cnn_features: int | None = None

    @nn.compact
    def __call__(self, x):
        if self.cnn_features is not None:
            x = NatureCNN(self.cnn_features, self.activation_fn)(x)
        x = Flatten()(x)
        for n in self.net_arch:
            x = self.activation_fn(nn.Dense(n)(x))
        return nn.Dense(self.outputs)(x)


class ActorCritic(nn.Module):
    """SBX PPO's separate actor and critic as one apply: {"logits": (N, A), "value": (N,)}."""
    actor: Mlp
    critic: Mlp

    def __call__(self, x):
        return {"logits": self.actor(x), "value": self.critic(x)[:, 0]}


def _data_json(z: zipfile.ZipFile, path):
    """The JSON `data` member of an SB3-format zip, its size checked before it is read. Data that
    is not JSON (or nests too deep to parse) is refused here: neither SB3 nor SBX could load it."""
    raw = read_zip_member(z, "data", path, DATA_MAX)
    try:
        return json.loads(raw)
    except RecursionError:
        why = "its `data` member nests deeper than JSON can be parsed"
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        why = f"its `data` member is not JSON ({type(e).__name__} at byte {getattr(e, 'pos', '?')})"
    raise LoaderError(f"{path}: an SB3/SBX-format zip, but {why}: {CRAFTED}")


def is_sbx_zip(data: bytes, path="model.zip") -> bool:
    """An SB3-format zip whose `data` names an SBX policy class (read as JSON only)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            if "data" not in z.namelist():
                return False
            meta = _data_json(z, path)
    except LoaderError:
        raise
    except (zipfile.BadZipFile, ValueError, KeyError, RecursionError):
        return False
    cls = meta.get("policy_class") if isinstance(meta, dict) else None
    module = cls.get("__module__") if isinstance(cls, dict) else None
    return isinstance(module, str) and module.startswith("sbx.")


def _fail(path, why):
    return LoaderError(f"{path}: SBX model not loadable without unpickling ({why[:300]}); {ROUTE}")


def _int(v, what: str, path, hi: int = 1 << 24) -> int:
    """A size the saved settings give (units, actions, features): an int in [1, hi]."""
    if type(v) is not int or not 1 <= v <= hi:
        raise _fail(path, f"{what} is {describe(v)}, not an integer in [1, {hi}]")
    return v


def _state(node, what, path) -> dict:
    if not isinstance(node, Call) or not isinstance(node.state, dict):
        raise _fail(path, f"no {what} in the saved policy")
    return node.state


def _activation(node, path) -> Callable:
    """jax.nn function of a pickled activation: a custom_jvp (relu) or a jitted function, named."""
    name, module = None, ""
    if isinstance(node, Call) and isinstance(node.state, dict):
        st = node.state
        if node.of("jax._src.custom_derivatives", "custom_jvp"):
            name, module = st.get("__name__"), st.get("__module__", "")
        elif node.of("jaxlib._jax", "PjitFunction") or node.of("jaxlib.xla_extension", "PjitFunction"):
            name = st.get("function_name")
            fun = st.get("fun")
            # cloudpickle's function state: (__dict__, {"__module__": ..., "__name__": ...})
            parts = fun.state if isinstance(fun, Call) and isinstance(fun.state, tuple) else ()
            module = next((d["__module__"] for d in parts if isinstance(d, dict)
                           and "__module__" in d), "")
    elif isinstance(node, Global):
        name, module = node.name, node.module
    if not (isinstance(module, str) and (module.startswith("jax.") or module.startswith("flax."))
            and type(name) is str and name in ACTIVATIONS):
        raise _fail(path, f"activation {describe(node if name is None else name)} is not one of {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


def _cnn(st, path) -> bool:
    fe = st.get("features_extractor")
    if fe is None:
        return False
    if isinstance(fe, Global) and fe.is_("sbx.common.jax_layers", "NatureCNN"):
        return True
    raise _fail(path, f"features extractor {describe(fe)} is not SBX's NatureCNN")


def _params(train_state, path):
    st = _state(train_state, "train state", path)
    try:
        return jax.tree.map(jnp.asarray, tree_to_arrays(st["params"]))
    except (KeyError, PickleFormatError, RecursionError) as e:
        raise _fail(path, f"params: {type(e).__name__}: {str(e)[:200]}") from None


def _net_arch(v, path) -> tuple:
    """PPO's hidden layer sizes: a short list of sizes (each layer is one Dense of the params tree)."""
    if not isinstance(v, (list, tuple)) or len(v) > 64:
        raise _fail(path, f"net_arch is {describe(v)}, not a list of at most 64 layer sizes")
    return tuple(_int(u, "a net_arch layer size", path) for u in v)


def _obs_space(policy_state, path):
    space = policy_state.get("observation_space")
    st = space.state if isinstance(space, Call) else None
    if not (isinstance(space, Call) and space.of("gymnasium.spaces.box", "Box") and isinstance(st, dict)):
        raise _fail(path, "observation space is not a gymnasium Box")
    shape = st.get("_shape")
    if not (isinstance(shape, tuple) and 1 <= len(shape) <= 4 and all(type(d) is int for d in shape)):
        raise _fail(path, "observation space has no shape")
    for d in shape:
        _int(d, "an observation dimension", path, 1 << 16)
    try:  # gymnasium saves every Box's dtype: one jaxsal cannot read is refused, never taken as float32
        dtype = to_dtype(st.get("dtype"))
    except PickleFormatError as e:
        raise _fail(path, f"observation space dtype: {e}") from None
    return tuple(shape), dtype


def read_policy(data: bytes, path="model.zip"):
    """(kind "dqn"/"ppo", flax module, params, obs shape, obs dtype) of an SBX zip's bytes."""
    try:
        return _read_policy(data, path)
    except LoaderError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, RecursionError, OverflowError) as e:  # malformed
        raise _fail(path, brief(e)) from None


def _read_policy(data: bytes, path):
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            meta = _data_json(z, path)
        raw = base64.b64decode(meta["policy"][":serialized:"], validate=True)
    except LoaderError:
        raise
    except (zipfile.BadZipFile, KeyError, TypeError, ValueError, binascii.Error, RecursionError) as e:
        raise _fail(path, brief(e)) from None
    try:
        root = parse(raw)
    except PickleLimitError as e:
        raise LoaderError(f"{path}: the saved policy cannot be read safely ({e}): {CRAFTED}") from None
    except PickleFormatError as e:
        raise _fail(path, str(e)) from None
    if not (isinstance(root, Call) and isinstance(root.func, Global)
            and (root.func.module, root.func.name) in POLICIES):
        what = describe(root.func) if isinstance(root, Call) else describe(root)
        raise _fail(path, f"policy class {what} is not SBX's DQN or PPO policy")
    kind = POLICIES[root.func.module, root.func.name]
    pst = _state(root, "policy state", path)
    shape, dtype = _obs_space(pst, path)
    if kind == "dqn":
        qf = pst.get("qf")
        st = _state(qf, "Q-network", path)
        if not (qf.of("sbx.dqn.policies", "QNetwork", "CnnQNetwork")):
            raise _fail(path, f"Q-network {describe(qf.func)} is not SBX's QNetwork/CnnQNetwork")
        cls = CnnQNetwork if qf.of("sbx.dqn.policies", "CnnQNetwork") else QNetwork
        module = cls(_int(st["n_actions"], "n_actions", path), _int(st["n_units"], "n_units", path),
                     _activation(st.get("activation_fn"), path))
        params = _params(pst.get("qf_state"), path)
    else:
        actor, vf = pst.get("actor"), pst.get("vf")
        ast, vst = _state(actor, "actor", path), _state(vf, "critic", path)
        if not (actor.of("sbx.ppo.policies", "Actor") and vf.of("sbx.ppo.policies", "Critic")):
            raise _fail(path, f"actor/critic {describe(actor.func)}/{describe(vf.func)} are not SBX's Actor/Critic")
        n = ast.get("num_discrete_choices")
        if not isinstance(n, int) or isinstance(n, bool):
            raise _fail(path, "only PPO with a Discrete action space is supported (continuous, "
                              "MultiDiscrete and MultiBinary are not)")
        mk = lambda st, out: Mlp(_net_arch(st["net_arch"], path), out,  # noqa: E731
                                 _activation(st.get("activation_fn"), path),
                                 _int(st["features_dim"], "features_dim", path) if _cnn(st, path) else None)
        module = ActorCritic(mk(ast, _int(ast["action_dim"], "action_dim", path)), mk(vst, 1))
        pa, pv = _params(pst.get("actor_state"), path), _params(pst.get("vf_state"), path)
        params = {"params": {"actor": pa["params"], "critic": pv["params"]}}
    # abstract: a saved observation space of 4 x 65536 x 65536 would otherwise be 64 GiB of zeros, before any check
    expected = jax.eval_shape(module.init, jax.random.PRNGKey(0), jax.ShapeDtypeStruct((1,) + shape, dtype))
    same = jax.tree.structure(expected) == jax.tree.structure(params) and all(
        e.shape == p.shape for e, p in zip(jax.tree.leaves(expected), jax.tree.leaves(params)))
    if not same:
        raise _fail(path, "its params do not match SBX's network of the saved settings")
    # floating point and finite, as every loader's: NaN weights would give NaN maps without a word
    check_params(path, params, expected, f"SBX's {kind.upper()} network of the saved settings")
    return kind, module, params, shape, dtype


def sbx_model(path, name: str | None = None) -> LoadedAgent:
    """An SBX (JAX Stable-Baselines) DQN or discrete PPO `.zip` as a Flax agent, read without
    unpickling and without sbx installed.

    DQN gives Q-values (N, A); PPO gives `{"logits": (N, A), "value": (N,)}`. CnnPolicy agents
    take SB3's channel-first uint8 frames (N, C, H, W), MlpPolicy agents their observation
    vectors or arrays as saved (the module docstring says how the file is read).

    Args:
        path (str | os.PathLike): the SBX model `.zip`.
        name (str | None): the agent's name; None: the file's stem.

    Returns:
        jaxsal.agent_spec.LoadedAgent: `apply_fn`, `params` (SBX's own tree and layer names),
            `layout` ("NCHW" for CnnPolicy, else "NHWC"), `num_actions`, `pixels` ("uint8"
            for CnnPolicy) and a `card` with the observation shape and dtype.

    Raises:
        jaxsal.loaders.LoaderError: (a `jaxsal.SaliencyInputError`) the file is missing, unreadable,
            corrupt or crafted, or holds a policy jaxsal does not rebuild (SAC, TQC, continuous PPO,
            custom classes or activations); the message names the `--agent file.py:load` route.
    """
    kind, module, params, shape, dtype = read_policy(read_bytes(path), path)
    image = isinstance(module, CnnQNetwork) or (isinstance(module, ActorCritic)
                                                 and module.actor.cnn_features is not None)
    layout, pixels = ("NCHW", "uint8") if image else ("NHWC", None)
    out = module.apply
    num_actions = module.n_actions if kind == "dqn" else module.actor.outputs
    return LoadedAgent(name=name or Path(path).stem, apply_fn=DeclaredFn(out, layout, pixels),
                       params=params, layout=layout, num_actions=num_actions, pixels=pixels,
                       card={"source": f"sbx {kind} (.zip, read without unpickling)", "file": str(path),
                             "num_actions": num_actions, "obs_shape": list(shape),
                             "obs_dtype": str(dtype)})
