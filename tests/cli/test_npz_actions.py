"""--target q_action from a plain .npz buffer: its `actions` array (one integer per frame stack)
is what gets explained; a missing, short, negative or out-of-range array is one clear error,
exit 2, nothing written."""
import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from jaxsal.io import open_source
from tests._support.cli_support import frames, make_agent_files

ACTIONS = np.array([2, 0, 1, 1, 2, 0, 0, 1, 2])


@pytest.fixture(scope="module")
def card(tmp_path_factory):
    return make_agent_files(tmp_path_factory.mktemp("agent"), num_actions=3)


def _explain(card, inp, out, target="q_action"):
    return main(["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(inp),
                 "--out", str(out), "--quiet", "--target", target, "--chunk", "4"])


def test_q_action_uses_the_npz_actions(tmp_path, card):
    import jaxsal_agents

    x = frames(9, seed=4)
    np.savez_compressed(tmp_path / "buf.npz", obs=x, actions=ACTIONS)
    assert _explain(card, tmp_path / "buf.npz", tmp_path / "out") == 0
    agent = jaxsal_agents.load(str(card))
    want = jaxsal.explain(agent.apply_fn, agent.params, x, method="standin_grad", target="q_action", actions=ACTIONS)
    np.testing.assert_allclose(np.asarray(jaxsal.load_maps(tmp_path / "out", "standin_grad")), np.asarray(want),
                               rtol=0, atol=1e-5 * float(np.abs(want).max()))
    np.testing.assert_array_equal(jaxsal.load_outputs(tmp_path / "out")["action"], ACTIONS)
    greedy = jaxsal.explain(agent.apply_fn, agent.params, x, method="standin_grad")
    assert not np.allclose(np.asarray(want), np.asarray(greedy))   # the buffer's actions, not the argmax


def test_q_action_with_limit_explains_the_first_frames_actions(tmp_path, card):
    """--limit 6 (chunks 4 + 2) explains frames 0..5 with actions 0..5: each chunk's actions are those of its
    own frames, the last chunk's cut at the limit like its frames."""
    import jaxsal_agents

    x = frames(9, seed=4)
    np.savez(tmp_path / "buf.npz", obs=x, actions=ACTIONS)
    assert main(["explain", "--agent", str(card), "--methods", "standin_grad", "--input", str(tmp_path / "buf.npz"),
                 "--out", str(tmp_path / "out"), "--quiet", "--target", "q_action", "--chunk", "4",
                 "--limit", "6"]) == 0
    agent = jaxsal_agents.load(str(card))
    want = jaxsal.explain(agent.apply_fn, agent.params, x[:6], method="standin_grad", target="q_action",
                          actions=ACTIONS[:6])
    np.testing.assert_allclose(np.asarray(jaxsal.load_maps(tmp_path / "out", "standin_grad")), np.asarray(want),
                               rtol=0, atol=1e-5 * float(np.abs(want).max()))
    o = jaxsal.load_outputs(tmp_path / "out")
    np.testing.assert_array_equal(o["action"], ACTIONS[:6])
    np.testing.assert_array_equal(o["index"], np.arange(6))

def test_npz_shards_with_actions_concatenate(tmp_path):
    d = tmp_path / "shards"
    d.mkdir()
    x = frames(9, seed=4)
    np.savez(d / "a.npz", obs=x[:5], actions=ACTIONS[:5])
    np.savez(d / "b.npz", obs=x[5:], actions=ACTIONS[5:])
    src = open_source(d)
    np.testing.assert_array_equal(src.actions(3, 8), ACTIONS[3:8])
    assert not hasattr(open_source(_save(tmp_path / "plain.npz", obs=x)), "actions")


def _save(path, **arrays):
    np.savez(path, **arrays)
    return path


BAD = {
    "no actions": ({}, "np.savez(path, obs=frames, actions=actions)"),
    "too short": ({"actions": ACTIONS[:8]}, "actions.shape == (9,)"),
    "floats": ({"actions": ACTIONS.astype(np.float32)}, "not integers"),
    "negative": ({"actions": ACTIONS - 1}, "negative action"),
    "out of range": ({"actions": ACTIONS + 1}, "has 3 actions"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_npz_actions_one_error_nothing_written(tmp_path, card, capsys, case):
    extra, fragment = BAD[case]
    inp = _save(tmp_path / "buf.npz", obs=frames(9, seed=4), **extra)
    capsys.readouterr()
    assert _explain(card, inp, tmp_path / "out") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("jaxsal: error:") and fragment in err[0], err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("chunk_*"))


def test_actions_are_ignored_by_other_targets(tmp_path, card):
    inp = _save(tmp_path / "buf.npz", obs=frames(9, seed=4), actions=ACTIONS[:3])   # e.g. something else
    assert _explain(card, inp, tmp_path / "out", target="q_chosen") == 0
