"""Errors that came late or did not name the fix (issue 43): each is now one line, exit 2, before
anything is written, and says what to do."""
import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from jaxsal.io import store
from tests._support.cli_support import frames, make_agent_files

AGENTS = '''
import functools

import jax
import jax.numpy as jnp
from tests._support import foreign_agents as F


def load_nchw():   # CleanRL's QNetwork: channel-first input, layout not declared
    q = F.QNetwork(action_dim=4)
    return q.apply, q.init(jax.random.PRNGKey(0), F.atari_nchw(1))


def _ppo(params, x, twice=False):   # CleanRL PPO: three parameter trees, trunk -> actor and critic
    net, actor, critic = F.Network(), F.Actor(action_dim=4), F.Critic()
    h = net.apply(params["network"], x)
    return {"logits": actor.apply(params["actor"], h),
            "value": critic.apply(params["critic"], net.apply(params["network"], x) if twice else h)[:, 0]}


def _ppo_params():
    x = jnp.zeros((1, 4, 84, 84))
    k1, k2, k3 = jax.random.split(jax.random.PRNGKey(1), 3)
    pn = F.Network().init(k1, x)
    h = F.Network().apply(pn, x)
    return {"network": pn, "actor": F.Actor(action_dim=4).init(k2, h), "critic": F.Critic().init(k3, h)}


def load_ppo():
    return {"apply_fn": _ppo, "params": _ppo_params(), "layout": "NCHW"}


def load_ppo_twice():
    return {"apply_fn": functools.partial(_ppo, twice=True), "params": _ppo_params(), "layout": "NCHW"}


def broken():
    raise RuntimeError("the checkpoint is not where load() looks")
'''


@pytest.fixture(scope="module")
def agents(tmp_path_factory):
    d = tmp_path_factory.mktemp("agents")
    (d / "agents.py").write_text(AGENTS)
    return d / "agents.py"


def _one_line(capsys):
    err = capsys.readouterr().err.strip()
    assert err.startswith("jaxsal: error: ") and "\n" not in err and "Traceback" not in err, err
    return err


def test_layers_of_a_channel_first_agent_without_layout(agents, capsys):
    assert main(["agents", "--layers", f"{agents}:load_nchw"]) == 2
    err = _one_line(capsys)
    assert "takes channel-first frames" in err and "add --layout NCHW" in err and "internal" not in err
    assert main(["agents", "--layers", f"{agents}:load_nchw", "--layout", "NCHW"]) == 0
    assert "Conv_2" in capsys.readouterr().out


def _dict_agent(agents, name):
    """as_agent takes objects with apply_fn/params: the spec files above return dicts, wrapped here."""
    import importlib.util
    import types

    spec = importlib.util.spec_from_file_location("_agents", agents)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return types.SimpleNamespace(**getattr(module, name)())


def test_the_layer_list_names_layers_as_layer_takes_them(agents, tmp_path, capsys):
    """Dense_0 of Network, Actor and Critic: listed with the prefix a user must type, each accepted."""
    wrapper = tmp_path / "wrap.py"
    wrapper.write_text("import types, importlib.util\n"
                       f"spec = importlib.util.spec_from_file_location('a', {str(agents)!r})\n"
                       "m = importlib.util.module_from_spec(spec)\nspec.loader.exec_module(m)\n"
                       "def load():\n    return types.SimpleNamespace(**m.load_ppo())\n")
    assert main(["agents", "--layers", f"{wrapper}:load"]) == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()[1:]
    names = [line.split()[0] for line in lines]
    for want in ("Network/Dense_0", "Actor/Dense_0", "Critic/Dense_0", "Conv_2"):
        assert want in names, lines
    assert "Dense_0" not in names
    assert "default layer" in lines[names.index("Conv_2")]
    from jaxsal.backprop.layers import layer_shape

    agent = _dict_agent(agents, "load_ppo")
    x = np.zeros((1, 4, 84, 84), np.float32)
    for name in names:  # every listed name is one the model's layers answer to
        assert layer_shape(agent.apply_fn, agent.params, x, name) is not None


def test_a_trunk_run_twice_names_the_fix(agents):
    agent = _dict_agent(agents, "load_ppo_twice")
    x = np.zeros((2, 4, 84, 84), np.float32)
    for layer in (None, "Network/Conv_2", "Conv_2"):
        with pytest.raises(jaxsal.SaliencyInputError,
                           match=r"is called 2 times in one forward pass.*compute it once in apply_fn"):
            jaxsal.explain(agent.apply_fn, agent.params, x, method="gradcam", target="policy_logit", layer=layer,
                           layout="NCHW")


def test_a_full_disk_names_the_disk_and_the_fix(tmp_path, capsys, monkeypatch):
    """numpy reports a short write as "N requested and M written": said as the full disk it is."""
    card = make_agent_files(tmp_path / "agent")
    np.save(tmp_path / "x.npy", frames(6))
    real, writes = np.save, []

    def short(f, a, **k):
        writes.append(1)
        if len(writes) > 2:
            f.write(b"\x93NUMPY")
            raise OSError("225792 requested and 53216 written")
        real(f, a, **k)
    monkeypatch.setattr(store.np, "save", short)
    out = tmp_path / "o"
    assert main(["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(tmp_path / "x.npy"),
                 "--out", str(out), "--quiet", "--chunk", "2"]) == 2
    err = _one_line(capsys)
    assert "requested and" not in err and "no space left on the disk mounted at /" in err, err
    assert f"({out / 'standin_grad'})" in err and "free some space there or choose another --out" in err
    assert "rerun the same command to resume" in err  # right here: the finished chunks are kept
    assert not list(out.rglob(".*.tmp"))


def test_render_on_a_read_only_folder_does_not_advise_resuming(tmp_path, capsys, read_only):
    card = make_agent_files(tmp_path / "agent")
    np.save(tmp_path / "x.npy", frames(4))
    out = tmp_path / "o"
    assert main(["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(tmp_path / "x.npy"),
                 "--out", str(out), "--quiet"]) == 0
    read_only(out)
    capsys.readouterr()
    assert main(["render", str(out), "--video", "none", "--quiet"]) == 2
    err = _one_line(capsys)
    assert "Read-only file system" in err and "writable --out" in err and "resume" not in err, err


@pytest.mark.parametrize("function,words", [("broken", ["broken() failed", "RuntimeError", "not where load() looks"]),
                                            ("nosuch", ["has no function 'nosuch'", "load_ppo"])])
def test_a_sweep_loads_function_agents_before_any_cell(agents, tmp_path, capsys, function, words):
    np.save(tmp_path / "buf.npy", frames(4))
    (tmp_path / "sweep.toml").write_text(f'agents = ["{agents}:{function}"]\ninputs = ["buf.npy"]\n'
                                         "[methods]\ngradient = {}\n")
    assert main(["sweep", str(tmp_path / "sweep.toml"), "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = _one_line(capsys)
    assert "agents[0]" in err and all(w in err for w in words), err
    assert not (tmp_path / "out").exists()
