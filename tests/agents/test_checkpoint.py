"""Checkpoints: parameter export round-trip, corrupt and mismatched files, shipped agents."""
import json

import jax
import numpy as np
import pytest

import jaxsal_agents
from jaxsal_agents.checkpoint import export_params, load_params, restore_train_state, save_train_state
from jaxsal_agents.zoo import build_model


def _params(num_actions=4):
    model = build_model("breakout", "dqn", num_actions)
    return model, model.init(jax.random.PRNGKey(0), np.zeros((1, 84, 84, 4), np.uint8))


@pytest.mark.slow
def test_export_round_trip_float16(tmp_path):
    model, params = _params()
    export_params(tmp_path / "p.msgpack", params)
    loaded = load_params(tmp_path / "p.msgpack", params)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(loaded)):
        assert b.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-4)


def test_corrupt_file_is_clear_error(tmp_path):
    _, params = _params()
    bad = tmp_path / "bad.msgpack"
    bad.write_bytes(b"\x00not msgpack at all" * 10)
    with pytest.raises(jaxsal_agents.AgentLoadError, match="corrupt"):
        load_params(bad, params)
    with pytest.raises(jaxsal_agents.AgentLoadError, match="does not exist"):
        load_params(tmp_path / "missing.msgpack", params)


def test_a_crafted_parameter_file_is_clear_error(tmp_path):
    """A bytes name beside the string ones (before: "internal error ValueError: Comparator raised exception while
    sorting pytree dictionary keys") and a directory (before: "corrupt or not a msgpack export ([Errno 21] ...)")."""
    import msgpack
    from flax import serialization

    _, params = _params()
    tree = jax.tree.map(np.asarray, serialization.to_state_dict(params))
    tree["params"][b"extra"] = {"kernel": np.zeros(3, np.float32)}
    bad = tmp_path / "names.msgpack"
    bad.write_bytes(msgpack.packb(tree, default=serialization._msgpack_ext_pack, strict_types=True))
    with pytest.raises(jaxsal_agents.AgentLoadError, match="names.msgpack is corrupt .*names are not all strings"):
        load_params(bad, params)
    (tmp_path / "folder.msgpack").mkdir()
    with pytest.raises(jaxsal_agents.AgentLoadError, match="folder.msgpack is a directory; give the .msgpack file"):
        load_params(tmp_path / "folder.msgpack", params)


def test_mismatched_checkpoint_is_clear_error(tmp_path):
    _, params6 = _params(6)
    _, params4 = _params(4)
    export_params(tmp_path / "p6.msgpack", params6)
    with pytest.raises(jaxsal_agents.AgentLoadError, match="does not match the model.*wrong shape"):
        load_params(tmp_path / "p6.msgpack", params4)



@pytest.mark.parametrize("change,says", [
    (lambda c: [c], "is a JSON list"),
    (lambda c: {k: v for k, v in c.items() if k != "obs_shape"}, "has no 'obs_shape'"),
    (lambda c: dict(c, num_actions="3"), "num_actions is \"3\""),
    (lambda c: dict(c, num_actions=10 ** 9), "num_actions is 1000000000"),
    (lambda c: dict(c, obs_shape=[100000, 100000, 4]), "obs_shape is"),
    (lambda c: dict(c, obs_shape=[10.5, 10, 4]), "obs_shape is"),
    (lambda c: dict(c, game=3), "game is 3"),
    (lambda c: dict(c, layer_norm="no"), "layer_norm is"),
    (lambda c: dict(c, pixels="float"), "pixels is"),
    (lambda c: dict(c, obs_shape=[84, 84, 4]), r"obs_shape \[84, 84, 4\] does not fit its minatar-breakout network")])
def test_a_crafted_card_is_one_clear_error_before_anything_is_built(tmp_path, change, says):
    """A card with a missing or mistyped field: an AgentLoadError naming the card and the field, never a
    KeyError, a JAX shape error or an out-of-memory allocation of a huge network."""
    from tests._support.cli_support import make_agent_files

    card = make_agent_files(tmp_path)
    card.write_text(json.dumps(change(json.loads(card.read_text()))))
    with pytest.raises(jaxsal_agents.AgentLoadError, match=says) as e:
        jaxsal_agents.load(str(card))
    assert str(card) in str(e.value)


@pytest.mark.parametrize("make,says", [
    (lambda card: card.write_bytes(b'\xff\xfe{"game": 1}'), "is not valid JSON"),   # UTF-16 or binary bytes
    (lambda card: (card.unlink(), card.mkdir()), "cannot read agent card"),
    (lambda card: card.write_text("[" * 100_000), "nests deeper than JSON can be parsed"),
    (lambda card: card.unlink(), "does not exist; give the path of the agent's .json card")])
def test_a_card_that_is_no_text_file_is_one_clear_error(tmp_path, capsys, make, says):
    """A card that is not UTF-8 (an internal UnicodeDecodeError before) or is a directory (an OSError whose line
    advised resuming the job), nested 10^5 deep (an internal RecursionError before) or missing (before: "unknown
    agent", listing the shipped agents): an AgentLoadError naming the card, and one line from `jaxsal explain`,
    exit 2."""
    from jaxsal.cli import main
    from tests._support.cli_support import frames, make_agent_files

    card = make_agent_files(tmp_path)
    make(card)
    with pytest.raises(jaxsal_agents.AgentLoadError, match=says) as e:
        jaxsal_agents.load(str(card))
    assert str(card) in str(e.value)
    np.save(tmp_path / "in.npy", frames(2))
    capsys.readouterr()
    assert main(["explain", "--agent", str(card), "--methods", "gradient", "--input", str(tmp_path / "in.npy"),
                 "--out", str(tmp_path / "out"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and says in err and "resume" not in err and not (tmp_path / "out").exists(), err


@pytest.mark.parametrize("value,says", [(np.nan, "NaN or infinite"), (1j, "complex64")])
def test_nan_or_complex_weights_are_one_clear_error(tmp_path, value, says):
    """Weights the float32 cast would silently turn into NaN maps or drop the imaginary part of."""
    from flax import serialization

    _, params = _params()
    tree = jax.tree.map(np.asarray, serialization.to_state_dict(params))
    tree["params"]["q"]["bias"] = (tree["params"]["q"]["bias"] + value).astype(np.complex64 if value == 1j
                                                                              else np.float32)
    (tmp_path / "p.msgpack").write_bytes(serialization.msgpack_serialize(tree))
    with pytest.raises(jaxsal_agents.AgentLoadError, match=says):
        load_params(tmp_path / "p.msgpack", params)

def test_train_state_round_trip(tmp_path):
    _, params = _params()
    state = {"params": params, "opt_state": {"m": np.ones(3)}, "key": jax.random.PRNGKey(7),
             "step": 1234, "update": 5}
    save_train_state(tmp_path / "ckpt", state)
    fresh = {"params": jax.tree.map(np.zeros_like, params), "opt_state": {"m": np.zeros(3)},
             "key": jax.random.PRNGKey(0), "step": 0, "update": 0}
    got = restore_train_state(tmp_path / "ckpt", fresh)
    assert got["step"] == 1234 and got["update"] == 5
    np.testing.assert_array_equal(got["key"], jax.random.PRNGKey(7))
    np.testing.assert_array_equal(got["params"]["params"]["q"]["bias"], params["params"]["q"]["bias"])


def test_restore_takes_the_newest_of_the_kept_checkpoints_past_update_9(tmp_path):
    """Checkpoints of updates 8, 9 and 10 (two kept): the resume starts at update 10, not at an older one
    (update 9 sorts before 10 only as a number)."""
    _, params = _params()
    for upd in (8, 9, 10):
        save_train_state(tmp_path / "ckpt", {"params": params, "key": jax.random.PRNGKey(upd), "step": 100 * upd,
                                             "update": upd}, keep=2)
    assert len(list((tmp_path / "ckpt").iterdir())) == 2
    got = restore_train_state(tmp_path / "ckpt", {"params": params, "key": jax.random.PRNGKey(0), "step": 0, "update": 0})
    assert (got["update"], got["step"]) == (10, 1000)
    np.testing.assert_array_equal(got["key"], jax.random.PRNGKey(10))


def test_unknown_agent_name_lists_shipped():
    with pytest.raises(jaxsal_agents.AgentLoadError, match="unknown agent 'nope'"):
        jaxsal_agents.load("nope")


@pytest.mark.slow
@pytest.mark.parametrize("name", jaxsal_agents.available())
def test_every_shipped_agent_loads_and_acts(name):
    agent = jaxsal_agents.load(name)
    card = agent.card
    for key in ("game", "arch", "num_actions", "obs_shape", "frames_trained", "eval", "trained_with"):
        assert key in card, key
    assert card["eval"]["episodes"] >= 10
    obs = np.zeros((2,) + tuple(card["obs_shape"]), np.uint8)
    out = agent.apply_fn(agent.params, obs)
    q = out["q"] if isinstance(out, dict) else out
    assert q.shape == (2, card["num_actions"])
    # model.init gives params of the same structure and shapes (traced only: an eager init of the
    # split-attention agent's LSTMs takes ~17 s)
    init = jax.eval_shape(agent.model.init, jax.random.PRNGKey(0), obs)
    assert jax.tree.structure(init) == jax.tree.structure(agent.params)
    assert [a.shape for a in jax.tree.leaves(init)] == [np.shape(a) for a in jax.tree.leaves(agent.params)]
    if card["arch"] == "dqn" and not card["game"].startswith("minatar"):
        assert list(agent.params["params"])[:1] == ["conv1"]
        assert {"conv1", "conv2", "conv3", "fc1", "q"} <= set(agent.params["params"])


def test_required_agents_are_shipped():
    names = set(jaxsal_agents.available())
    required = {"breakout", "pong", "breakout-dddqn", "minatar-breakout", "minatar-spaceinvaders",
                "minatar-asterix", "minatar-freeway"} | set(RETURN_GOALS)
    assert required <= names, required - names


# the agents issue's goals (protocol: greedy, full games, 30 games; the card's 30-game mean)
RETURN_GOALS = {"pong": 15, "breakout": 50, "mspacman": 1500, "spaceinvaders": 500, "frostbite": 250,
                "breakout-dddqn": 50, "breakout-split-attention": 10}


@pytest.mark.parametrize("name", sorted(RETURN_GOALS))
def test_shipped_cards_meet_the_return_goals(name):
    """A re-export that plays worse than the goal cannot land silently."""
    import json

    ev = json.loads((jaxsal_agents.zoo.SHIPPED_DIR / f"{name}.json").read_text())["eval"]
    assert ev["episodes"] >= 30 and ev["epsilon"] == 0.0 and "FIRE pressed" in ev["protocol"]
    assert ev["mean_return"] >= RETURN_GOALS[name], (name, ev["mean_return"])


def test_write_card_names_where_the_curve_went(tmp_path):
    """The curve goes beside the card, or into the curves folder given (train_shipped.sh gives the
    repository's experiments/results/training), and the card names it; nothing else is written."""
    import json

    from jaxsal_agents import export

    run = tmp_path / "run"
    run.mkdir()
    (run / "returns.csv").write_text("step,return,wall_s\n100,1.0,1.0\n200,3.0,2.0\n")
    out = tmp_path / "out"
    out.mkdir()
    card = export.write_card({"name": "a", "training_curve": "stale.png"}, out, run, "a")
    assert card["training_curve"] == "a.png" and (out / "a.png").exists() and (out / "a.csv").exists()
    assert json.loads((out / "a.json").read_text())["training_curve"] == "a.png"

    shipped, curves = tmp_path / "shipped", tmp_path / "curves"
    shipped.mkdir()
    card = export.write_card({"name": "b"}, shipped, run, "b", curves_dir=curves)
    assert card["training_curve"] == (curves / "b.png").as_posix() and (curves / "b.png").exists()
    assert not (shipped / "b.png").exists()
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == sorted(
        ["returns.csv", "a.png", "a.csv", "a.json", "b.png", "b.csv", "b.json"])

    card = export.write_card({"name": "c"}, out, tmp_path / "no-run", "c")   # no curve: no field
    assert "training_curve" not in card


@pytest.mark.parametrize("game,arch,frames_per_step", [
    ("minatar-breakout", "dqn", 1),
    pytest.param("breakout", "dueling", 4, marks=pytest.mark.slow)])   # 5-8 s: a Nature CNN exported
def test_export_run_counts_frames_and_names_the_algorithm_on_the_card(tmp_path, monkeypatch, game, arch,
                                                                      frames_per_step):
    """A run's card: a MinAtar env step is one frame, an Atari one four (frame skip 4); the algorithm names the
    target network and, only for a dueling arch, the dueling head. The evaluation is stubbed (test_evaluate.py)."""
    import dataclasses

    from jaxsal_agents import export
    from jaxsal_agents.envs import make_env
    from jaxsal_agents.train import PQNConfig, initial_state, make_optimizer

    monkeypatch.setattr(export, "evaluate_agent", lambda agent, **kw: {"mean_return": 1.0, "episodes": 2})
    run = tmp_path / "run"
    cfg = PQNConfig(game=game, arch=arch, target_every=3, run_dir=str(run))
    run.mkdir()
    (run / "config.json").write_text(json.dumps(dataclasses.asdict(cfg)))
    env = make_env(game, 1, train=False)
    state = initial_state(cfg, build_model(game, arch, env.num_actions), make_optimizer(cfg), env.obs_shape)
    save_train_state(run / "ckpt", dict(state, step=1000, update=2))
    card = export.export_run(run, "x", tmp_path / "out", episodes=2)
    assert card["env_steps_trained"] == 1000 and card["frames_trained"] == 1000 * frames_per_step
    assert "synced every 3 updates" in card["algorithm"]
    assert ("dueling head" in card["algorithm"]) == (arch == "dueling")
    assert json.loads((tmp_path / "out" / "x.json").read_text())["frames_trained"] == card["frames_trained"]
