"""Loaders for agents trained elsewhere: the same outputs as the original networks on the same
frames (to 1e-5), and the same maps through the CLI as through jaxsal.explain."""
import io
import re
import sys
import zipfile

import flax.serialization
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from jaxsal.backprop.layers import layer_calls
from jaxsal.loaders import LoaderError, cleanrl_dqn, cleanrl_ppo, flax_msgpack, load_file
from tests._support import foreign_agents as F

A = 4


def _close(a, b, tol=1e-5):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=tol * max(1.0, float(np.abs(b).max())))


@pytest.fixture(scope="module")
def frames():
    return F.atari_nchw(6, seed=3)


@pytest.fixture(scope="module")
def dqn_file(tmp_path_factory, frames):
    q = F.QNetwork(action_dim=A)
    params = q.init(jax.random.PRNGKey(1), frames)
    path = tmp_path_factory.mktemp("cleanrl") / "dqn_atari_jax.cleanrl_model"
    path.write_bytes(flax.serialization.to_bytes(params))  # as dqn_atari_jax.py saves q_state.params
    return path, q, params


def test_cleanrl_dqn_same_q_values(dqn_file, frames):
    path, q, params = dqn_file
    agent = cleanrl_dqn(path)
    assert agent.layout == "NCHW" and agent.num_actions == A and agent.pixels == "uint8"
    _close(agent.apply_fn(agent.params, frames), q.apply(params, frames))
    # the layer names are CleanRL's own
    names = [c.name for c in layer_calls(agent.apply_fn, agent.params, frames[:1])]
    assert "Conv_2" in names


def test_cleanrl_ppo_same_logits_and_value(tmp_path, frames):
    net, actor, critic = F.Network(), F.Actor(action_dim=A), F.Critic()
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(2), 3)
    np_ = net.init(k1, frames)
    h = net.apply(np_, frames)
    ap, cp = actor.init(k2, h), critic.init(k3, h)
    path = tmp_path / "ppo_atari_envpool_xla_jax.cleanrl_model"
    args = {"env_id": "Breakout-v5", "seed": 1, "learning_rate": 2.5e-4, "target_kl": None}
    path.write_bytes(flax.serialization.to_bytes([args, [np_, ap, cp]]))  # as the PPO script saves
    agent = load_file(path)
    out = agent.apply_fn(agent.params, frames)
    _close(out["logits"], actor.apply(ap, h))
    _close(out["value"], critic.apply(cp, h)[:, 0])
    assert agent.card["env_id"] == "Breakout-v5"
    maps = jaxsal.explain(agent.apply_fn, agent.params, frames, method="gradcam", target="policy_logit")
    assert maps.shape == (6, 84, 84) and np.isfinite(np.asarray(maps)).all()


def test_flax_msgpack_purejaxrl_style(tmp_path):
    module = F.PureJaxRLActorCritic(action_dim=3)
    x = (np.random.default_rng(0).random((5, 10, 10, 4)) < 0.3).astype(np.float32)
    params = module.init(jax.random.PRNGKey(4), x)
    (tmp_path / "p.msgpack").write_bytes(flax.serialization.to_bytes(params))
    (tmp_path / "inner.msgpack").write_bytes(flax.serialization.to_bytes(params["params"]))
    pi, v = module.apply(params, x)
    for name in ("p.msgpack", "inner.msgpack"):
        agent = flax_msgpack(tmp_path / name, module, (10, 10, 4))
        out = agent.apply_fn(agent.params, x)
        _close(out["logits"], pi.logits)
        _close(out["value"], v)
        assert agent.num_actions == 3
    other = F.PureJaxRLActorCritic(action_dim=5)
    with pytest.raises(LoaderError, match="shape"):
        flax_msgpack(tmp_path / "p.msgpack", other, (10, 10, 4))


def test_bad_files_are_one_clear_error(tmp_path):
    (tmp_path / "junk.cleanrl_model").write_bytes(b"\x00not msgpack at all")
    with pytest.raises(LoaderError, match="msgpack"):
        load_file(tmp_path / "junk.cleanrl_model")
    with pytest.raises(LoaderError, match="does not exist"):
        load_file(tmp_path / "missing.cleanrl_model")
    with pytest.raises(LoaderError, match="unknown agent file type"):
        load_file(tmp_path / "x.h5")


@pytest.mark.parametrize("suffix", [".zip", ".pth", ".pt", ".cleanrl_model"])
def test_an_empty_or_directory_agent_file_says_so(tmp_path, suffix):
    """An empty file (a cut-off copy) said "is a torch checkpoint: install torch" or "not a flax msgpack
    file"; a directory said "does not exist"."""
    (tmp_path / f"empty{suffix}").touch()
    with pytest.raises(LoaderError, match=r"is empty \(0 bytes\).*get it again"):
        load_file(tmp_path / f"empty{suffix}")
    (tmp_path / f"folder{suffix}").mkdir()
    with pytest.raises(LoaderError, match="is a directory, give the checkpoint file"):
        load_file(tmp_path / f"folder{suffix}")



def _with(tree, path, value):
    """A copy of the msgpack state dict `tree` with the leaf at `path` (keys) set to `value`."""
    tree = jax.tree.map(np.asarray, flax.serialization.to_state_dict(tree))
    node = tree
    for k in path[:-1]:
        node = node[k]
    node[path[-1]] = value
    return tree


def test_crafted_cleanrl_and_flax_params_are_one_clear_error(tmp_path, dqn_file):
    """Leaves of the wrong kind, NaN, an extra layer or a zero-action head: a LoaderError naming the
    file and the parameter, never a TypeError/IndexError, and never an agent that drops a layer."""
    path, q, params = dqn_file
    kernel = np.asarray(params["params"]["Dense_1"]["kernel"])
    cases = {"a string leaf": (("params", "Dense_1", "bias"), "abc", "not an array"),
             "an int scalar leaf": (("params", "Dense_1", "kernel"), 5, "no Dense_1 kernel"),
             "NaN weights": (("params", "Dense_1", "kernel"), np.full_like(kernel, np.nan), "NaN"),
             "integer weights": (("params", "Dense_1", "kernel"), kernel.astype(np.int32), "not floating point"),
             "a complex kernel": (("params", "Dense_1", "kernel"), kernel.astype(np.complex64), "real numbers"),
             "an extra layer": (("params", "Dense_2"), {"kernel": np.zeros((4, 4), np.float32)}, "Dense_2"),
             "zero actions": (("params", "Dense_1", "kernel"), kernel[:, :0], "0 actions")}
    for name, (where, value, says) in cases.items():
        bad = tmp_path / f"{name.replace(' ', '_')}.cleanrl_model"
        bad.write_bytes(flax.serialization.msgpack_serialize(_with(params, where, value)))
        with pytest.raises(LoaderError, match=says) as e:
            load_file(bad)
        assert str(bad) in str(e.value), name
    ppo = tmp_path / "actor_array.cleanrl_model"
    ppo.write_bytes(flax.serialization.to_bytes([{}, [{}, np.zeros(3), {}]]))
    with pytest.raises(LoaderError, match="Dense_0 kernel"):
        load_file(ppo)
    module = F.PureJaxRLActorCritic(action_dim=3)
    good = module.init(jax.random.PRNGKey(4), np.zeros((1, 10, 10, 4), np.float32))
    for name, data, says in [("list", [1, 2], "got list"),
                             ("extra", _with(good, ("params", "Extra"), {"k": np.zeros(3, np.float32)}), "Extra")]:
        (tmp_path / f"{name}.msgpack").write_bytes(flax.serialization.msgpack_serialize(data))
        with pytest.raises(LoaderError, match=says):
            flax_msgpack(tmp_path / f"{name}.msgpack", module, (10, 10, 4))

def _fake_sbx(monkeypatch):
    """Stand-ins for the classes an SBX policy pickle names (sbx's policies, gymnasium's Box, a train state, a
    jax activation and sbx's NatureCNN), registered under those modules' names so that pickle writes them as it
    writes sbx's (the loader never imports them): (classes by name, the relu activation)."""
    import types

    class State:
        def __init__(self, **state):
            self.__dict__.update(state)

        def __reduce__(self):
            return type(self), (), self.__dict__

    class Relu:
        def __reduce__(self):
            return "relu"

    def module(name, **attrs):
        m = types.ModuleType(name)
        for k, v in attrs.items():
            if isinstance(v, type):
                v.__module__, v.__qualname__ = name, k
            setattr(m, k, v)
        monkeypatch.setitem(sys.modules, name, m)

    names = ("DQNPolicy", "QNetwork", "CnnQNetwork", "PPOPolicy", "Actor", "Critic", "Box", "TrainState")
    cls = {k: type(k, (State,), {}) for k in names}
    cls["NatureCNN"] = type("NatureCNN", (), {})  # pickled by reference, as the features extractor class
    relu = Relu()
    module("jax._fake_nn", relu=relu)  # a jax function, pickled by name
    Relu.__module__ = "jax._fake_nn"
    for parent in ("sbx", "sbx.dqn", "sbx.ppo", "sbx.common", "gymnasium", "gymnasium.spaces", "flax_fake"):
        module(parent)  # pickle imports each
    module("sbx.dqn.policies", **{k: cls[k] for k in ("DQNPolicy", "QNetwork", "CnnQNetwork")})
    module("sbx.ppo.policies", **{k: cls[k] for k in ("PPOPolicy", "Actor", "Critic")})
    module("sbx.common.jax_layers", NatureCNN=cls["NatureCNN"])
    module("gymnasium.spaces.box", Box=cls["Box"])
    module("flax_fake.train_state", TrainState=cls["TrainState"])
    return cls, relu


def _sbx_zip(path, policy, policy_module: str):
    """`policy` pickled into an SB3-format .zip's `data` as SBX saves it."""
    import base64
    import json
    import pickle

    data = {"policy_class": {"__module__": policy_module},
            "policy": {":serialized:": base64.b64encode(pickle.dumps(policy, protocol=4)).decode()}}
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("data", json.dumps(data))
    return path


def _sbx_dqn_zip(path, params, monkeypatch, n_units: int = 8, cnn: bool = False, n_actions: int = 2,
                 dtype=None):
    """An SBX DQN .zip with these params: MlpPolicy on 4-vectors, or (cnn) CnnPolicy on (4, 84, 84) uint8 frames,
    pickled as sbx pickles it, without sbx installed. `dtype`: the observation space's saved dtype instead (a
    string: pickled as that object; "none": no dtype saved)."""
    cls, relu = _fake_sbx(monkeypatch)
    shape, default = ((4, 84, 84), np.uint8) if cnn else ((4,), np.float32)
    dtype = np.dtype(default) if dtype is None else dtype if isinstance(dtype, str) else np.dtype(dtype)
    space = cls["Box"](_shape=shape, **({} if dtype == "none" else {"dtype": dtype}))
    qf = cls["CnnQNetwork" if cnn else "QNetwork"](n_actions=n_actions, n_units=n_units, activation_fn=relu)
    policy = cls["DQNPolicy"](observation_space=space, qf=qf, qf_state=cls["TrainState"](params=params))
    return _sbx_zip(path, policy, "sbx.dqn.policies")

def test_crafted_sbx_params_are_one_clear_error(tmp_path, monkeypatch):
    """NaN weights or an integer kernel in an SBX zip: checked like every other loader's params (before, the
    agent loaded and explained NaN maps without a word)."""
    from jaxsal.loaders.sbx import QNetwork

    params = jax.tree.map(np.array, QNetwork(2, 8).init(jax.random.PRNGKey(0), jnp.zeros((1, 4))))
    agent = load_file(_sbx_dqn_zip(tmp_path / "good.zip", params, monkeypatch))
    assert agent.num_actions == 2 and np.isfinite(np.asarray(agent.apply_fn(agent.params, np.ones((1, 4))))).all()
    kernel = params["params"]["Dense_2"]["kernel"]
    nan = kernel.copy()
    nan[0, 0] = np.nan
    for name, value, says in [("nan", nan, "Dense_2.*kernel.* holds NaN or infinite values"),
                              ("int", kernel.astype(np.int32), "Dense_2.*kernel.* not floating point")]:
        bad = _sbx_dqn_zip(tmp_path / f"{name}.zip", _with(params, ("params", "Dense_2", "kernel"), value),
                           monkeypatch)
        with pytest.raises(LoaderError, match=says) as e:
            load_file(bad)
        assert str(bad) in str(e.value) and "\n" not in str(e.value), name


def test_an_sbx_observation_dtype_is_kept_or_refused_never_replaced(tmp_path, monkeypatch):
    """The saved observation space's dtype: one jaxsal reads (uint8, float32, float64, ...) is the card's obs_dtype;
    one it cannot (complex64, float128, a string where numpy's dtype goes, none at all) is one error naming the file
    and the route. Before, every unreadable dtype was silently taken as float32."""
    from jaxsal.loaders.sbx import QNetwork

    params = jax.tree.map(np.array, QNetwork(2, 8).init(jax.random.PRNGKey(0), jnp.zeros((1, 4))))
    for dtype in (np.uint8, np.float64):
        agent = load_file(_sbx_dqn_zip(tmp_path / f"{np.dtype(dtype)}.zip", params, monkeypatch, dtype=dtype))
        assert agent.card["obs_dtype"] == str(np.dtype(dtype))
    for name, dtype in [("complex64", np.complex64), ("float128", np.longdouble), ("text", "float32"),
                        ("none", "none")]:
        bad = _sbx_dqn_zip(tmp_path / f"{name}.zip", params, monkeypatch, dtype=dtype)
        with pytest.raises(LoaderError, match=r"observation space .*dtype.*--agent file\.py:load") as e:
            load_file(bad)
        assert str(bad) in str(e.value) and "\n" not in str(e.value), name


def _dense(p, x):
    return x @ np.asarray(p["kernel"], np.float64) + np.asarray(p["bias"], np.float64)


def _conv_nhwc(x, p, stride):
    return jax.lax.conv_general_dilated(jnp.asarray(x, jnp.float32), jnp.asarray(p["kernel"]), (stride, stride),
                                        "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                                        precision="highest") + jnp.asarray(p["bias"])


def test_sbx_cnn_policy_scales_frames_as_sbx_does(tmp_path, frames, monkeypatch):
    """An SBX DQN CnnPolicy takes SB3's channel-first uint8 frames and divides by 255 inside its NatureCNN: the
    loaded agent's Q-values equal SBX's network written out here from the params (transpose to channel-last,
    / 255, three VALID convs, a channel-last flatten, two dense layers)."""
    from jaxsal.loaders.sbx import CnnQNetwork

    params = jax.tree.map(np.array, CnnQNetwork(3, 16).init(jax.random.PRNGKey(5), jnp.zeros((1, 4, 84, 84))))
    agent = load_file(_sbx_dqn_zip(tmp_path / "cnn.zip", params, monkeypatch, n_units=16, cnn=True, n_actions=3))
    assert agent.layout == "NCHW" and agent.pixels == "uint8" and agent.num_actions == 3
    p = params["params"]
    h = frames.transpose(0, 2, 3, 1).astype(np.float32) / 255.0
    for name, stride in (("Conv_0", 4), ("Conv_1", 2), ("Conv_2", 1)):
        h = jax.nn.relu(_conv_nhwc(h, p["NatureCNN_0"][name], stride))
    h = np.maximum(_dense(p["NatureCNN_0"]["Dense_0"], np.asarray(h).reshape(len(frames), -1)), 0)
    _close(agent.apply_fn(agent.params, frames), _dense(p["Dense_0"], h))


def test_sbx_ppo_actor_and_critic_params_drive_their_own_heads(tmp_path, monkeypatch):
    """An SBX PPO policy saves its actor's and its critic's params in two train states: the logits come from the
    actor's, the value from the critic's (each an MLP of the saved net_arch, written out here)."""
    from jaxsal.loaders.sbx import Mlp

    cls, relu = _fake_sbx(monkeypatch)
    x = np.random.default_rng(0).normal(size=(5, 4)).astype(np.float32)
    actor_p, critic_p = (jax.tree.map(np.array, Mlp((8,), out, jax.nn.relu).init(jax.random.PRNGKey(k), x))
                         for k, out in ((1, 3), (2, 1)))
    box = cls["Box"](_shape=(4,), dtype=np.dtype(np.float32))
    policy = cls["PPOPolicy"](
        observation_space=box,
        actor=cls["Actor"](net_arch=[8], num_discrete_choices=3, action_dim=3, activation_fn=relu),
        vf=cls["Critic"](net_arch=[8], activation_fn=relu),
        actor_state=cls["TrainState"](params=actor_p), vf_state=cls["TrainState"](params=critic_p))
    agent = load_file(_sbx_zip(tmp_path / "ppo.zip", policy, "sbx.ppo.policies"))
    assert agent.num_actions == 3
    out = agent.apply_fn(agent.params, x)

    def mlp(p):
        return _dense(p["params"]["Dense_1"], np.maximum(_dense(p["params"]["Dense_0"], x), 0))

    _close(out["logits"], mlp(actor_p))
    _close(out["value"], mlp(critic_p)[:, 0])


def _torch_reference(sd, trunk, heads, x):
    """A Nature CNN as torch computes it, from the state_dict's own arrays: channel-first activations, OIHW
    kernels, a (C, H, W) flatten, y = x W^T + b, frames / 255 first."""
    h = jnp.asarray(x, jnp.float32) / 255.0
    for prefix, stride in zip(trunk[:3], (4, 2, 1)):
        h = jax.lax.conv_general_dilated(h, jnp.asarray(sd[f"{prefix}.weight"]), (stride, stride), "VALID",
                                         dimension_numbers=("NCHW", "OIHW", "NCHW"), precision="highest")
        h = jax.nn.relu(h + jnp.asarray(sd[f"{prefix}.bias"])[None, :, None, None])
    h = np.asarray(h, np.float64).reshape(len(x), -1)

    def linear(prefix, v):
        return v @ sd[f"{prefix}.weight"].T.astype(np.float64) + sd[f"{prefix}.bias"]

    h = np.maximum(linear(trunk[3], h), 0)
    return [linear(prefix, h) for prefix in heads]


@pytest.mark.parametrize("fmt", ["cleanrl dqn_atari", "cleanrl ppo_atari", "sb3 dqn", "sb3 actor-critic"])
def test_torch_state_dicts_convert_with_torchs_conventions_without_torch(frames, fmt):
    """The conversion itself, with torch absent (test_torch_state_dicts_same_outputs needs it): a state_dict of
    arrays under each format's names gives the outputs of torch's own conventions computed from the same arrays
    (OIHW kernels, a (C, H, W) flatten, input / 255), so a transpose or flatten of the wrong order is caught."""
    from jaxsal.loaders.torch_nature import FORMATS, convert

    rng = np.random.default_rng(7)
    trunk, head = FORMATS[fmt]
    shapes = dict(zip(trunk, [(32, 4, 8, 8), (64, 32, 4, 4), (64, 64, 3, 3), (512, 3136)]))
    heads = [head[1]] if head[0] == "q" else list(head[1:])
    shapes.update(zip(heads, [(A, 512), (1, 512)]))
    sd = {}
    for prefix, shape in shapes.items():
        bound = 1 / np.sqrt(np.prod(shape[1:]))  # torch's default initialisation range
        sd[f"{prefix}.weight"] = rng.uniform(-bound, bound, shape).astype(np.float32)
        sd[f"{prefix}.bias"] = rng.uniform(-bound, bound, shape[0]).astype(np.float32)
    module, params, got_fmt = convert(sd)
    assert got_fmt == fmt
    out = module.apply(params, frames)
    want = _torch_reference(sd, trunk, heads, frames)
    if head[0] == "q":
        _close(out, want[0])
    else:
        _close(out["logits"], want[0])
        _close(out["value"], want[1][:, 0])

AGENT_PY = '''
import jaxsal.loaders

def load():
    return jaxsal.loaders.cleanrl_dqn({path!r})

def pair():
    a = jaxsal.loaders.cleanrl_dqn({path!r})
    return a.apply_fn.fn, a.params
'''


@pytest.mark.slow  # 3-8 s (a subprocess, a game or a whole job): the slow stage, which CI runs
def test_cli_own_agent_same_maps_as_explain(tmp_path, dqn_file, frames):
    """--agent FILE.cleanrl_model, --agent file.py:FUNCTION and a tuple-returning FUNCTION with
    --layout all give jaxsal.explain's maps; the buffer may be in either layout."""
    path, q, params = dqn_file
    agent = cleanrl_dqn(path)
    want = {m: np.asarray(jaxsal.explain(agent.apply_fn, agent.params, frames, method=m))
            for m in ("gradcam", "gradient")}
    np.save(tmp_path / "nchw.npy", frames)
    np.save(tmp_path / "nhwc.npy", frames.transpose(0, 2, 3, 1))
    (tmp_path / "my_agent.py").write_text(AGENT_PY.format(path=str(path)))
    runs = {"file": (str(path), "nchw.npy", []), "func": (f"{tmp_path}/my_agent.py:load", "nhwc.npy", []),
            "tuple": (f"{tmp_path}/my_agent.py:pair", "nchw.npy", ["--layout", "NCHW"])}
    for name, (spec, inp, extra) in runs.items():
        out = tmp_path / f"out_{name}"
        code = main(["explain", "--agent", spec, "--methods", "gradcam,gradient", "--input", str(tmp_path / inp),
                     "--out", str(out), "--quiet", "--chunk", "4", *extra])
        assert code == 0, name
        for m, w in want.items():
            _close(np.asarray(jaxsal.load_maps(out, m)), w, 1e-4)
        o = jaxsal.load_outputs(out)
        qv = np.asarray(q.apply(params, frames))
        _close(o["q"], qv)
        np.testing.assert_array_equal(o["action"], qv.argmax(-1))
    man = jaxsal.io.read_manifest(tmp_path / "out_file")
    assert man["resolved"]["gradcam"]["options"]["layer"] == "Conv_2"
    assert man["config"]["layout"] == "NCHW"


# --------------------------------------------------------------------------- torch (optional)
def _torch_save(sd, path, zipped=False):
    import torch

    buf = io.BytesIO()
    torch.save(sd, buf)
    if zipped:  # a Stable-Baselines3 model archive
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("data", "{}")
            z.writestr("policy.pth", buf.getvalue())
    else:
        path.write_bytes(buf.getvalue())


@pytest.mark.parametrize("kind,suffix", [("cleanrl_dqn", ".pth"), ("cleanrl_ppo", ".pth"),
                                         ("sb3_dqn", ".zip"), ("sb3_ppo", ".zip")])
def test_torch_state_dicts_same_outputs(tmp_path, frames, kind, suffix):
    torch = pytest.importorskip("torch")
    module = F.torch_modules(A)[kind]
    path = tmp_path / f"{kind}{suffix}"
    _torch_save(module.state_dict(), path, zipped=suffix == ".zip")
    agent = load_file(path)
    assert agent.layout == "NCHW"
    with torch.no_grad():
        ref = module(torch.as_tensor(frames).float())
    out = agent.apply_fn(agent.params, frames)
    if isinstance(ref, tuple):
        _close(out["logits"], ref[0].numpy())
        _close(out["value"], ref[1].numpy())
    else:
        _close(out, ref.numpy())
    # same maps through the CLI as through jaxsal.explain
    np.save(tmp_path / "buf.npy", frames)
    assert main(["explain", "--agent", str(path), "--methods", "gradient", "--input", str(tmp_path / "buf.npy"),
                 "--out", str(tmp_path / "out"), "--quiet"]) == 0
    _close(np.asarray(jaxsal.load_maps(tmp_path / "out", "gradient")),
           np.asarray(jaxsal.explain(agent.apply_fn, agent.params, frames, method="gradient")), 1e-4)


class _NotATensor:
    pass


def test_torch_files_are_never_unpickled(tmp_path):
    torch = pytest.importorskip("torch")
    buf = io.BytesIO()
    torch.save({"network.0.weight": _NotATensor()}, buf)
    (tmp_path / "evil.pth").write_bytes(buf.getvalue())
    with pytest.raises(LoaderError, match="weights_only") as e:
        load_file(tmp_path / "evil.pth")
    assert "weights_only=False" not in str(e.value) and "\n" not in str(e.value)


TORCH_REFUSAL = (  # what torch 2.6+ raises for a checkpoint holding a class (its advice must never reach users)
    "Weights only load failed. This file can still be loaded, to do so you have two options, do those steps only "
    "if you trust the source of the checkpoint. \n\t(1) In PyTorch 2.6, we changed the default value of the "
    "`weights_only` argument in `torch.load` from `False` to `True`. Re-running `torch.load` with `weights_only` "
    "set to `False` will likely succeed, but it can result in arbitrary code execution. Do it only if you got the "
    "file from a trusted source.\n\t(2) Alternatively, to load with `weights_only=True` please check the "
    "recommended steps in the following error message.\n\tWeightsUnpickler error: Unsupported global: GLOBAL "
    "__main__._NotATensor was not an allowed global by default. Please use `torch.serialization.add_safe_globals("
    "[__main__._NotATensor])` or the `torch.serialization.safe_globals([__main__._NotATensor])` context manager to "
    "allowlist this global if you trust this class/function.")


@pytest.mark.parametrize("version,ok", [("2.1.0", False), ("2.5.1", False), ("2.9.1+cpu", False),
                                        ("2.10.0a0+git1234", False), ("2.10.0.dev20251201", False), ("1.13.1", False),
                                        ("2.10.0", True), ("2.10.1+cu128", True), ("2.13.0", True), ("3.0.0", True)])
def test_torch_before_2_10_is_refused_with_the_fix(version, ok):
    from jaxsal.loaders.torch_nature import check_torch_version

    if ok:
        check_torch_version(version)
    else:
        with pytest.raises(LoaderError, match=rf"torch {re.escape(version)} is installed.*pip install 'torch>=2.10'"):
            check_torch_version(version)


def _fake_torch(monkeypatch, version, load):
    import types

    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__=version, load=load))


def test_an_old_torch_never_reads_the_file(tmp_path, monkeypatch):
    """The version is checked at load time, before torch.load sees the checkpoint."""
    calls = []
    _fake_torch(monkeypatch, "2.5.1", lambda *a, **k: calls.append(a))
    (tmp_path / "m.pth").write_bytes(b"PK")
    with pytest.raises(LoaderError, match=r"torch 2\.5\.1 is installed.*CVE-2025-32434.*pip install 'torch>=2\.10'"):
        load_file(tmp_path / "m.pth")
    assert calls == []


def test_torch_refusals_never_advise_weights_only_false(tmp_path, monkeypatch):
    import pickle

    def load(*a, **k):
        assert k.get("weights_only") is True
        raise pickle.UnpicklingError(TORCH_REFUSAL)
    _fake_torch(monkeypatch, "2.13.0", load)
    (tmp_path / "evil.pth").write_bytes(b"not a zip")
    with pytest.raises(LoaderError) as e:
        load_file(tmp_path / "evil.pth")
    msg = str(e.value)
    assert "\n" not in msg and "Unsupported global: GLOBAL __main__._NotATensor" in msg
    assert "False" not in msg and "safe_globals" not in msg and "trust" not in msg
    assert "state_dict" in msg and "weights_only=True" in msg


def test_crafted_torch_state_dicts_are_one_clear_error(tmp_path):
    """A weight of another shape (the network would fail deep in JAX later), a head with one axis too
    many, a complex, sparse or NaN tensor: a LoaderError naming the file, before any agent is made."""
    torch = pytest.importorskip("torch")
    sd = F.torch_modules(A)["cleanrl_dqn"].state_dict()
    cases = {"conv2 kernel": ("network.2.weight", torch.zeros(64, 32, 3, 3), r"conv2.*\(4, 4, 32, 64\)"),
             "head 3d": ("network.9.weight", torch.zeros(A, 512, 1), "not 2-dimensional"),
             "conv1 3d": ("network.0.weight", torch.zeros(32, 4, 8), "not 4-dimensional"),
             "complex": ("network.9.weight", torch.zeros(A, 512, dtype=torch.complex64), "complex"),
             "sparse": ("network.9.bias", torch.zeros(A).to_sparse(), "sparse"),
             "nan": ("network.0.weight", torch.full((32, 4, 8, 8), float("nan")), "NaN")}
    for name, (key, value, says) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.pth"
        _torch_save({**sd, key: value}, path)
        with pytest.raises(LoaderError, match=says) as e:
            load_file(path)
        assert str(path) in str(e.value), name
