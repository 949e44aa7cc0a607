"""Crafted and damaged agents, through every way an agent enters jaxsal: the loaders' checkpoint files
(CleanRL JAX, flax msgpack, torch state_dicts, SBX), `--agent FILE.py:FUNCTION`, agent cards and their
parameter files. Each is one clear error naming the file, what is wrong and the fix (exit 2 through the
command line, nothing written), never a traceback, a MemoryError or an agent that computes something else.
Each case says what it did before."""
from __future__ import annotations

import json
import os

import flax.serialization
import jax
import msgpack
import numpy as np
import pytest

from jaxsal.loaders import LoaderError, flax_msgpack, load_file
from tests._support import foreign_agents as F


@pytest.fixture(scope="module")
def dqn(tmp_path_factory):
    """CleanRL's dqn_atari_jax QNetwork, its params as a numpy state dict, and its .cleanrl_model file."""
    q = F.QNetwork(action_dim=4)
    params = jax.tree.map(np.asarray, flax.serialization.to_state_dict(q.init(jax.random.PRNGKey(1),
                                                                              F.atari_nchw(1))))
    path = tmp_path_factory.mktemp("dqn") / "good.cleanrl_model"
    path.write_bytes(flax.serialization.msgpack_serialize(params))
    return q, params, path


def _msgpack(tree) -> bytes:
    """`tree` as flax writes it (arrays as msgpack extensions), without flax's tree_map, which would refuse the
    crafted trees below (names that are not all strings)."""
    return msgpack.packb(tree, default=flax.serialization._msgpack_ext_pack, strict_types=True)


def _kernel(params, value):
    """A copy of the params with Dense_1's kernel replaced."""
    return {"params": {**params["params"], "Dense_1": {**params["params"]["Dense_1"], "kernel": value}}}


def test_crafted_cleanrl_and_flax_parameter_trees(tmp_path, dqn):
    """A float128 kernel (before: "internal error TypeError: Error interpreting argument to stage as a JAX value"),
    a float64 kernel holding 1e300 (before: loaded, and explained as inf/NaN maps with exit 0: JAX computes in
    float32), and a bytes name beside the string ones (before: "internal error ValueError: Comparator raised
    exception while sorting pytree dictionary keys"): one LoaderError naming the file, through load_file and
    flax_msgpack."""
    q, params, _ = dqn
    kernel = params["params"]["Dense_1"]["kernel"]
    big = kernel.astype(np.float64)
    big[0, 0] = 1e300
    mixed = {"params": {**params["params"], b"Dense_2": {"kernel": np.zeros(3, np.float32)}}}
    cases = {"float128": (_kernel(params, kernel.astype(np.longdouble)), r"Dense_1.*kernel.* dtype float128, which "
                                                                         "JAX cannot compute in"),
             "float64 1e300": (_kernel(params, big), r"Dense_1.*kernel.* beyond float32's range.*earlier checkpoint"),
             "bytes name": (mixed, "names are not all strings")}
    for name, (tree, says) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.cleanrl_model"
        path.write_bytes(_msgpack(tree))
        for load in (load_file, lambda p: flax_msgpack(p, q, (4, 84, 84), layout="NCHW")):
            with pytest.raises(LoaderError, match=says) as e:
                load(path)
            assert str(path) in str(e.value) and "\n" not in str(e.value), name
    path = tmp_path / "float64.cleanrl_model"  # a float64 kernel of ordinary values still loads
    path.write_bytes(_msgpack(_kernel(params, kernel.astype(np.float64))))
    assert load_file(path).num_actions == 4


@pytest.mark.parametrize("kw,says", [
    (dict(obs_shape=(4, -84, 84)), "obs_shape must be the shape of one observation"),          # a JAX TypeError
    (dict(obs_shape=(4, 10 ** 30, 84)), r"got \(4, 10{30}, 84\)"),                               # an MLIR TypeError
    (dict(obs_shape=(4, float("nan"), 84)), "obs_shape must be"),                                # a JAX TypeError
    (dict(obs_shape="84,84,4"), "got 84,84,4"),                                                  # a JAX TypeError
    (dict(obs_shape=()), "obs_shape must be"),                                                   # a ValueError
    (dict(obs_shape=(4, 10 ** 6, 10 ** 6)), "at most 2\\*\\*31-1 values"),                         # 16 TB of zeros
    (dict(layout="CHW"), "layout must be one of"),                                               # declared, unchecked
    (dict(pixels="float"), "pixels must be \"uint8\"")])                                        # declared, ignored
def test_flax_msgpack_arguments(dqn, kw, says):
    """What flax_msgpack builds its template from and declares: before, each failed inside JAX (or tried to
    allocate 16 TB of zeros) with a traceback, or was taken as given."""
    q, _, path = dqn
    with pytest.raises(LoaderError, match=says):
        flax_msgpack(path, q, **{"obs_shape": (4, 84, 84), "layout": "NCHW", **kw})
    assert flax_msgpack(path, q, (4, 84, 84), layout="NCHW", pixels="uint8").num_actions == 4


def test_an_agent_file_that_is_a_pipe_or_a_link_to_nothing_says_so(tmp_path, dqn):
    """A FIFO and a symbolic link looping on itself both said "does not exist" (the FIFO does)."""
    os.mkfifo(tmp_path / "pipe.cleanrl_model")
    (tmp_path / "loop.cleanrl_model").symlink_to(tmp_path / "loop.cleanrl_model")
    for name, says in {"pipe": "is not a regular file", "loop": "is a symbolic link to nothing"}.items():
        with pytest.raises(LoaderError, match=f"{name}.cleanrl_model {says}.*give the checkpoint file itself"):
            load_file(tmp_path / f"{name}.cleanrl_model")


def test_an_agent_file_whose_name_holds_a_newline(tmp_path, dqn, capsys):
    """The agent is named after its file: "two\\nlines.cleanrl_model" explained as agent "two", "lines" on the next
    line of the job's messages. Refused in one line naming the file, before any job."""
    from jaxsal.cli import main

    path = tmp_path / "two\nlines.cleanrl_model"
    path.write_bytes(dqn[2].read_bytes())
    assert main(["agents", "--layers", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"jaxsal: error: --agent {tmp_path}/two\\nlines.cleanrl_model: agent name 'two\\nlines' holds "
                   "'\\n' (a line break or another character that is not printed); give the agent a name of printed "
                   "characters on one line (the function's name, its card's \"name\", or its file's)")


# --------------------------------------------------------------------------- torch state_dicts (optional torch)
def _torch_bytes(obj) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _zip(path, members: dict):
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def _quantized(torch, w):
    import warnings

    with warnings.catch_warnings():  # torch deprecates its quantized dtypes (they still load, weights-only)
        warnings.simplefilter("ignore")
        return torch.quantize_per_tensor(w, 0.01, 0, torch.qint8)


def test_crafted_torch_state_dicts(tmp_path):
    """Integer or bool weights (before: cast to float and loaded, exit 0: an integer export explained as if
    trained so), a quantized weight (before: "internal error RuntimeError: Creation of quantized tensor requires
    quantized dtype"), names that are not strings (before: "internal error TypeError: sequence item 0: expected str
    instance"), a head of 0 actions or a conv1 of 0 input channels (before: "internal error ZeroDivisionError"):
    one LoaderError naming the file."""
    torch = pytest.importorskip("torch")
    sd = F.torch_modules(4)["cleanrl_dqn"].state_dict()
    cases = {
        "int64 head": ({**sd, "network.9.weight": (sd["network.9.weight"] * 100).to(torch.int64)},
                       r"\['q'\]\['kernel'\] has dtype int\d+, not floating point"),
        "bool head": ({**sd, "network.9.weight": sd["network.9.weight"] > 0}, "has dtype bool, not floating point"),
        "quantized head": ({**sd, "network.9.weight": _quantized(torch, sd["network.9.weight"])},
                           "tensor 'network.9.weight' is quantized, not a dense real tensor"),
        "int names": ({0: torch.zeros(3), 1: torch.zeros(2)}, r"expected a state_dict \(name -> tensor\)"),
        "zero actions": ({**sd, "network.9.weight": torch.zeros(0, 512), "network.9.bias": torch.zeros(0)},
                         "a network of 0 actions on 4 input channels; the file is corrupt"),
        "zero channels": ({**sd, "network.0.weight": torch.zeros(32, 0, 8, 8)}, "of 4 actions on 0 input channels"),
    }
    for name, (state, says) in cases.items():
        path = tmp_path / f"{name.replace(' ', '_')}.pth"
        path.write_bytes(_torch_bytes(state))
        with pytest.raises(LoaderError, match=says) as e:
            load_file(path)
        assert str(path) in str(e.value) and "\n" not in str(e.value), name
    path = tmp_path / "unused_int.pth"  # an integer tensor the network does not use still loads
    path.write_bytes(_torch_bytes({**sd, "steps": torch.tensor(7)}))
    assert load_file(path).num_actions == 4


def test_a_damaged_torch_file_is_said_to_be_damaged(tmp_path):
    """A cut-off .pth, a storage of the wrong size, an SB3 .zip without its policy.pth or with a cut-off one: before,
    each said "not a torch state_dict of tensors and plain containers (RuntimeError) ... load the checkpoint where it
    was made and save only its state_dict", a fix for a file holding other objects, not for a damaged one. A file
    naming a function torch blocks (os.system) still gets that refusal, naming the function, and nothing runs."""
    import pickle
    import zipfile

    torch = pytest.importorskip("torch")
    good = _torch_bytes(F.torch_modules(4)["cleanrl_dqn"].state_dict())
    (tmp_path / "cut.pth").write_bytes(good[:len(good) // 2])
    small = tmp_path / "small.pth"
    small.write_bytes(_torch_bytes({"w": torch.arange(8.0)}))
    with zipfile.ZipFile(small) as z:
        members = {n: z.read(n) for n in z.namelist()}
    storage = next(n for n in members if "/data/" in n)
    _zip(tmp_path / "short_storage.pth", {**members, storage: bytes(8)})
    sb3 = '{"policy_class": {"__module__": "stable_baselines3.dqn.policies"}}'
    _zip(tmp_path / "no_policy.zip", {"data": sb3})
    _zip(tmp_path / "cut_policy.zip", {"data": sb3, "policy.pth": good[:5000]})

    class System:
        def __reduce__(self):
            return os.system, (f"touch {tmp_path / 'ran'}",)

    pkl = next(n for n in members if n.endswith("data.pkl"))
    _zip(tmp_path / "system.pth", {**members, pkl: pickle.dumps({"w": System()}, protocol=2)})
    damaged = "torch cannot read it as a checkpoint .*the file is corrupt or crafted.*get it again"
    for name, says in {"cut.pth": damaged, "short_storage.pth": damaged, "cut_policy.zip": damaged,
                       "no_policy.zip": "a Stable-Baselines3 .zip without its policy.pth.*save the model again",
                       "system.pth": r"not a torch state_dict .*\(unsupported GLOBAL posix.system whose module posix "
                                     r"is blocked\).*weights_only=True"}.items():
        with pytest.raises(LoaderError, match=says) as e:
            load_file(tmp_path / name)
        msg = str(e.value)
        assert str(tmp_path / name) in msg and "\n" not in msg and "False" not in msg and "trust" not in msg, name
    assert not (tmp_path / "ran").exists()


def test_a_cleanrl_ppo_save_whose_env_id_is_no_string(tmp_path):
    """The card records the run's env_id; bytes or an array there (a crafted `vars(args)`) went into the card as they
    were, and `jaxsal explain` failed writing its manifest: "internal error TypeError: Object of type bytes is not
    JSON serializable". Only a string is taken."""
    import json

    x = F.atari_nchw(1)
    net, actor, critic = F.Network(), F.Actor(action_dim=4), F.Critic()
    pn = net.init(jax.random.PRNGKey(0), x)
    h = net.apply(pn, x)
    pa, pc = actor.init(jax.random.PRNGKey(1), h), critic.init(jax.random.PRNGKey(2), h)
    for name, env_id in {"bytes": b"\xff\xfe", "array": np.arange(3), "str": "Breakout-v5"}.items():
        path = tmp_path / f"{name}.cleanrl_model"
        path.write_bytes(flax.serialization.to_bytes([{"env_id": env_id}, [pn, pa, pc]]))
        card = load_file(path).card
        assert json.loads(json.dumps(card))["env_id"] == (env_id if name == "str" else None), name


# --------------------------------------------------------------------------- --agent FILE.py:FUNCTION
SPEC_AGENTS = '''
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        return nn.Dense(3)(x.reshape((x.shape[0], -1)).astype(jnp.float32) / 255.0)


NET = Net()
PARAMS = NET.init(jax.random.PRNGKey(0), jnp.zeros((1, 10, 10, 4)))


def _agent(**declared):
    return types.SimpleNamespace(apply_fn=NET.apply, params=PARAMS, **declared)


def actions_word(): return _agent(num_actions="four")
def actions_fraction(): return _agent(num_actions=2.7)
def actions_zero(): return _agent(num_actions=0)
def actions_negative(): return _agent(num_actions=-1)
def actions_nan(): return _agent(num_actions=float("nan"))
def actions_bool(): return _agent(num_actions=True)
def actions_card_huge(): return _agent(card={"num_actions": 10 ** 30})
def actions_other(): return _agent(num_actions=7)
def card_text(): return _agent(card="abc")
def card_set(): return _agent(card={"tags": {1, 2}})
def card_mixed_keys(): return _agent(card={1: "x", "a": 2})
def card_nan(): return _agent(card={"epsilon": float("nan")})
def card_shape_number(): return _agent(card={"obs_shape": 5})
def card_shape_letters(): return _agent(card={"obs_shape": "abc"})
def card_shape_negative(): return _agent(card={"obs_shape": [10, -10, 4]})
def card_game_number(): return _agent(card={"game": 5})
def pixels_float(): return _agent(pixels="float")
def card_numpy(): return _agent(num_actions=np.int64(3), card={"num_actions": np.int64(3), "obs_shape": np.array([10, 10, 4])})
def nan_params(): return NET.apply, jax.tree.map(lambda a: a.at[0].set(jnp.nan), PARAMS)
def exits(): raise SystemExit(3)
def name_newline(): return _agent(name="two\\nlines")
def name_blank(): return _agent(name="   ")
def card_name_escape(): return _agent(card={"name": "a\\x1b[31mred"})
'''


@pytest.fixture(scope="module")
def spec_agents(tmp_path_factory):
    d = tmp_path_factory.mktemp("spec_agents")
    (d / "agents.py").write_text(SPEC_AGENTS)
    (d / "script.py").write_text("import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('--lr')\n"
                                 "args = parser.parse_args(['--steps', '5'])\n\ndef load():\n    pass\n")
    np.save(d / "frames.npy", (np.random.default_rng(0).random((2, 10, 10, 4)) < 0.2).astype(np.uint8) * 200)
    return d


def test_what_a_function_agent_declares_is_checked(spec_agents):
    """num_actions, card and pixels as FUNCTION() declares them. Before: "four", NaN or inf an internal ValueError or
    OverflowError; 2.7 taken as 2, 0 as undeclared, -1, True and 10**30 as they were; a name (the function's or its
    card's) holding a newline or an escape character split or coloured every line naming the agent, and one of only
    spaces named nothing; a card "abc" or a list an
    internal ValueError/TypeError; a set or keys of mixed types in the card an internal TypeError writing the
    manifest; an obs_shape of 5 an internal TypeError (of "abc", a shape of letters); a game of 5 loaded; pixels
    "float" ignored, so the frames went unchecked. Params holding NaN: explained as NaN maps with exit 0. A function,
    or the module it is in, calling sys.exit: the SystemExit ended jaxsal (argparse's usage in place of an error)."""
    from jaxsal.agent_spec import AgentSpecError, load_function_spec

    cases = {"actions_word": "num_actions must be an integer >= 1, got 'four'",
             "actions_fraction": "num_actions must be an integer >= 1, got 2.7",
             "actions_zero": "num_actions must be an integer >= 1, got 0",
             "actions_negative": "got -1", "actions_nan": "got nan", "actions_bool": "got True",
             "actions_card_huge": r"num_actions must be at most 2\*\*31-1",
             "card_text": "card must be a dict", "card_set": r"card cannot be stored as JSON \(a set\)",
             "card_mixed_keys": "card cannot be stored as JSON",
             "card_nan": r"card cannot be stored as JSON \(Out of range float values",
             "card_shape_number": "card obs_shape must be the shape of one observation.*got 5",
             "card_shape_letters": 'got "abc"', "card_shape_negative": r"got \[10, -10, 4\]",
             "card_game_number": "card game must be a game name", "pixels_float": "pixels must be \"uint8\"",
             "nan_params": r"params\['params'\]\['Dense_0'\]\['\w+'\] holds NaN or infinite values",
             "exits": r"exits\(\) called sys.exit\(3\); make it return the agent",
             "name_newline": r"agent name 'two\\nlines' holds '\\n' .*give the agent a name of printed characters",
             "name_blank": "agent name '   ' is only whitespace", "card_name_escape": r"agent name 'a\\x1b\[31mred' holds"}
    for fname, says in cases.items():
        spec = f"{spec_agents / 'agents.py'}:{fname}"
        with pytest.raises(AgentSpecError, match=says) as e:
            load_function_spec(spec)
        assert str(e.value).startswith(f"--agent {spec}: ") and "\n" not in str(e.value), fname
    with pytest.raises(AgentSpecError, match=r"importing .*script.py called sys.exit\(2\) .*if __name__ == "):
        load_function_spec(f"{spec_agents / 'script.py'}:load")


def test_function_agents_through_the_command_line(spec_agents, tmp_path, capsys):
    """A card of numpy numbers (np.int64 from env.action_space.n, an array obs_shape) is stored as JSON numbers
    (before: "internal error TypeError: Object of type int64 is not JSON serializable" writing the manifest); a
    declared num_actions the model does not have is an error (before: explained, exit 0, the declared count used to
    check the buffer's actions)."""
    import jaxsal
    from jaxsal.cli import main

    def explain(fname, out):
        return main(["explain", "--agent", f"{spec_agents / 'agents.py'}:{fname}", "--input",
                     str(spec_agents / "frames.npy"), "--methods", "gradient", "--quiet", "--out", str(out)])

    assert explain("card_numpy", tmp_path / "numpy") == 0
    card = json.loads((tmp_path / "numpy" / "manifest.json").read_text())["agent_card"]
    assert card == {"num_actions": 3, "obs_shape": [10, 10, 4]}
    assert np.isfinite(np.asarray(jaxsal.load_maps(tmp_path / "numpy", "gradient"))).all()
    capsys.readouterr()
    assert explain("actions_other", tmp_path / "other") == 2
    err = capsys.readouterr().err.strip()
    assert err == ("jaxsal: error: agent 'actions_other' declares 7 actions but its model outputs 3: correct its "
                   "num_actions (or its card's)")
    assert not (tmp_path / "other").exists()


def test_a_declared_action_count_is_checked_by_the_library_too(spec_agents, tmp_path):
    """An agent declaring 7 actions on a model of 3 (load_function_spec, as `--agent` loads it) was refused by the
    command line alone: jaxsal.explain and jaxsal.io.run_job explained it without a word, and the job's manifest
    recorded the 7. The one check now runs in the library's model check: refused by both, run_job before anything is
    written; an agent declaring the 3 it outputs is explained."""
    import jaxsal
    from jaxsal.agent_spec import load_function_spec
    from jaxsal.io import MethodSpec, open_source, run_job

    frames = np.load(spec_agents / "frames.npy")
    agent = load_function_spec(f"{spec_agents / 'agents.py'}:actions_other")
    says = r"^the agent declares 7 actions but its model outputs 3: correct its num_actions \(or its card's\)$"
    with pytest.raises(jaxsal.SaliencyInputError, match=says):
        jaxsal.explain(agent.apply_fn, agent.params, frames, method="gradient")
    with pytest.raises(jaxsal.SaliencyInputError, match=says):
        run_job(agent.apply_fn, agent.params, open_source(spec_agents / "frames.npy"), tmp_path / "job",
                [MethodSpec("gradient", "gradient", {})], quiet=True, agent={"name": agent.name, "card": agent.card})
    assert not (tmp_path / "job").exists()
    good = load_function_spec(f"{spec_agents / 'agents.py'}:card_numpy")
    assert good.num_actions == 3 and jaxsal.explain(good.apply_fn, good.params, frames, method="gradient").shape == (
        2, 10, 10)
