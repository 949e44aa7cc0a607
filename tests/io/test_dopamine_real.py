"""Replay directories written by Dopamine's own OutOfGraphReplayBuffer give exactly the states
Dopamine serves: the indices its is_valid_transition accepts, oldest first, each byte-identical
to get_observation_stack(index), with the buffer index (load_outputs "index") and the action.

The fast tests read tests/data/dopamine_replay (written by dopamine-rl 4.1.2, see
tests/_support/dopamine_buffers.py); the slow ones drive live Dopamine (`pip install '.[dopamine]'`)."""
import time

import numpy as np
import pytest

import jaxsal
from jaxsal.cli import main
from jaxsal.errors import SaliencyInputError
from jaxsal.io import open_source
from tests._support.dopamine_buffers import FIXTURE, FIXTURE_BUFFERS, fixture_expected

AGENT_PY = '''
import flax.linen as nn
import jax
import jax.numpy as jnp


class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
        x = nn.relu(nn.Conv(8, (3, 3))(x.astype(jnp.float32) / 255.0))
        return nn.Dense(3)(x.reshape((x.shape[0], -1)))


def load():
    net = Net()
    return net.apply, net.init(jax.random.PRNGKey(0), jnp.zeros((1, 10, 10, 4)))
'''


def _want(name: str) -> dict:
    """What Dopamine serves from every checkpoint of fixture buffer `name`, K ascending."""
    e = fixture_expected()
    ks = sorted(FIXTURE_BUFFERS[name][2])
    want = {key: np.concatenate([e[f"{name}_{k}_{key}"] for k in ks]) for key in ("index", "states", "actions")}
    want["checkpoint"] = np.concatenate([np.full(len(e[f"{name}_{k}_index"]), k) for k in ks])
    return want


def _read_chunked(src, size):
    return np.concatenate([src.read(a, min(len(src), a + size)) for a in range(0, len(src), size)])


def _check_source(src, want):
    assert len(src) == len(want["index"]) and src.shape[1:] == want["states"].shape[1:]
    for size in (len(src), 7, 1):
        got = _read_chunked(src, size)
        assert got.dtype == np.uint8 and got.tobytes() == want["states"].tobytes(), size
    ids = src.row_ids(0, len(src))
    np.testing.assert_array_equal(ids["index"], want["index"])
    np.testing.assert_array_equal(ids["checkpoint"], want["checkpoint"])
    np.testing.assert_array_equal(src.actions(0, len(src)), want["actions"])


@pytest.mark.parametrize("name", list(FIXTURE_BUFFERS))
def test_dopamine_written_buffers_give_exactly_dopamines_valid_states(name):
    _check_source(open_source(FIXTURE / name), _want(name))


def _explain(inp, out, agent_file, *extra):
    return main(["explain", "--agent", f"{agent_file}:load", "--methods", "gradient", "--input", str(inp),
                 "--out", str(out), "--quiet", "--target", "q_action", "--chunk", "16", *extra])


def _check_job(out, want, agent_file):
    """load_outputs joins the maps with the buffer: index, checkpoint, the buffer's actions."""
    from jaxsal.agent_spec import load_function_spec

    o = jaxsal.load_outputs(out)
    np.testing.assert_array_equal(o["index"], want["index"])
    np.testing.assert_array_equal(o["checkpoint"], want["checkpoint"])
    np.testing.assert_array_equal(o["action"], want["actions"])
    np.testing.assert_array_equal(o["frame"], np.arange(len(want["index"])))
    agent = load_function_spec(f"{agent_file}:load")
    ref = jaxsal.explain(agent.apply_fn, agent.params, want["states"], method="gradient", target="q_action",
                         actions=want["actions"])
    np.testing.assert_allclose(np.asarray(jaxsal.load_maps(out, "gradient")), np.asarray(ref), rtol=0,
                               atol=1e-5 * float(np.abs(ref).max()))


def test_cli_job_on_a_dopamine_directory_stores_the_buffer_index(tmp_path):
    agent_file = tmp_path / "agent.py"
    agent_file.write_text(AGENT_PY)
    want = _want("dqn")  # checkpoint 1 before the buffer filled, checkpoint 2 after it wrapped twice
    assert _explain(FIXTURE / "dqn", tmp_path / "out", agent_file) == 0
    _check_job(tmp_path / "out", want, agent_file)
    # a resumed job keeps every row's index: drop two chunks' maps and outputs, rerun
    for p in [*sorted((tmp_path / "out" / "gradient").glob("chunk_*.npy"))[1:3],
              *sorted((tmp_path / "out" / "_outputs").glob("chunk_*.npz"))[2:4]]:
        p.unlink()
    assert _explain(FIXTURE / "dqn", tmp_path / "out", agent_file) == 0
    _check_job(tmp_path / "out", want, agent_file)
    # --limit: the first states, still with their buffer indices
    assert _explain(FIXTURE / "dqn", tmp_path / "lim", agent_file, "--limit", "40") == 0
    np.testing.assert_array_equal(jaxsal.load_outputs(tmp_path / "lim")["index"], want["index"][:40])


def _copy(src, dst, drop=()):
    dst.mkdir(parents=True)
    for p in src.iterdir():
        if p.name not in drop:
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


@pytest.mark.parametrize("missing", ["add_count_ckpt.2.gz", "invalid_range_ckpt.2.gz"])
def test_directory_without_counters_is_refused_before_anything_is_written(tmp_path, capsys, missing):
    d = _copy(FIXTURE / "dqn", tmp_path / "dop", drop=(missing,))
    with pytest.raises(SaliencyInputError, match=missing.replace(".", r"\.")):
        open_source(d)
    (tmp_path / "agent.py").write_text(AGENT_PY)
    capsys.readouterr()
    assert _explain(d, tmp_path / "out", tmp_path / "agent.py") == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and err[0].startswith("jaxsal: error:") and missing in err[0], err
    assert "OutOfGraphReplayBuffer.save" in err[0] and ".npy/.npz" in err[0]
    assert not (tmp_path / "out").exists()


def _gz_save(path, arr):
    import gzip

    with open(path, "wb") as f, gzip.GzipFile(fileobj=f, mode="wb") as out:
        np.save(out, arr, allow_pickle=False)


def test_counters_of_another_checkpoint_or_stack_size_are_refused(tmp_path):
    d = _copy(FIXTURE / "dqn", tmp_path / "other")
    (d / "invalid_range_ckpt.2.gz").write_bytes((d / "invalid_range_ckpt.1.gz").read_bytes())
    with pytest.raises(SaliencyInputError, match="invalid_range_ckpt.2.gz holds .* add_count 157"):
        open_source(d)
    d = _copy(FIXTURE / "dqn", tmp_path / "stack8")  # what a stack_size=8 buffer writes (horizon 1)
    _gz_save(d / "invalid_range_ckpt.2.gz", np.array([(37 - 1 + j) % 60 for j in range(9)]))
    with pytest.raises(SaliencyInputError, match="stacking 8 frames"):
        open_source(d)


def _pickle_case(tmp_path, name, payload: bytes):
    import gzip

    d = _copy(FIXTURE / "rainbow", tmp_path / name)
    with gzip.open(d / "episode_end_indices_ckpt.7.gz", "wb") as f:
        f.write(payload)
    return d


def test_episode_ends_are_read_without_unpickling(tmp_path):
    import os
    import pickle

    want = _want("rainbow")
    import gzip

    from jaxsal.io.pickled import read_int_set

    ends = read_int_set(gzip.decompress((FIXTURE / "rainbow" / "episode_end_indices_ckpt.7.gz").read_bytes()), 50)
    assert ends  # the fixture has time-outs and terminals
    # the same set as other Pythons and numpys write it: protocols 2..5, numpy or Python ints
    for proto in (2, 3, 4, 5):
        for as_np in (True, False):
            s = {np.int64(i) for i in ends} if as_np else set(ends)
            payload = pickle.dumps(s, protocol=proto)
            if proto < 4 and as_np:  # as numpy 1 names the scalar constructor
                payload = payload.replace(b"numpy._core.multiarray", b"numpy.core.multiarray")
            d = _pickle_case(tmp_path, f"p{proto}{as_np}", payload)
            np.testing.assert_array_equal(open_source(d).row_ids(0, len(want["index"]))["index"], want["index"])
    # a pickle that would run code is refused, and nothing runs
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    d = _pickle_case(tmp_path, "evil", pickle.dumps({1, 2, Evil()}))
    with pytest.raises(SaliencyInputError, match="not the set of episode-end indices.*names (posix|os).system"):
        open_source(d)
    assert not marker.exists()
    d = _pickle_case(tmp_path, "floats", pickle.dumps({1.5, 2.0}))
    with pytest.raises(SaliencyInputError, match="BINFLOAT"):
        open_source(d)
    d = _pickle_case(tmp_path, "outside", pickle.dumps({3, 50}))
    with pytest.raises(SaliencyInputError, match="episode end 50 outside the buffer"):
        open_source(d)


def test_checkpoint_without_episode_ends_is_read_as_dopamine_loads_it(tmp_path):
    """Older Dopamine wrote no episode_end_indices; its load then knows no time-outs: nor does jaxsal."""
    d = _copy(FIXTURE / "rainbow", tmp_path / "old", drop=("episode_end_indices_ckpt.7.gz",))
    src = open_source(d)
    want = _want("rainbow")
    assert set(want["index"]) < set(src.row_ids(0, len(src))["index"])  # the time-out states come back


# --------------------------------------------------------------------------- live Dopamine (slow)
LAYOUTS = {  # name: (capacity, update horizon, [(episode length, end), ...] per save)
    "partial": (200, 1, [[(30, "terminal"), (1, "terminal"), (25, "timeout"), (40, None)]]),
    "just_full": (103, 1, [[(20, "terminal"), (20, "terminal"), (20, "terminal"), (31, None)]]),  # 103 adds
    "wrapped_once": (100, 1, [[(37, "terminal"), (2, "terminal"), (50, "timeout"), (44, "terminal"),
                               (9, None)]]),
    "wrapped_many": (64, 3, [[(5, "terminal"), (1, "terminal"), (30, "timeout"), (70, "terminal"),
                              (3, "timeout"), (90, "terminal"), (12, None)]]),
    "saves_while_growing": (150, 1, [[(40, "terminal"), (30, None)], [(20, "timeout"), (60, "terminal")],
                                     [(100, "terminal"), (33, "timeout"), (5, None)]]),
    "horizon_5": (80, 5, [[(14, "terminal"), (6, "timeout"), (2, "timeout"), (60, "terminal"), (11, None)]]),
}


def _live(layout, d, obs_shape=(10, 10), seed=0):
    """Buffers filled and saved by Dopamine; returns what Dopamine serves per checkpoint."""
    from tests._support.dopamine_buffers import add_episodes, make_buffer, served

    capacity, horizon, saves = layout
    buf = make_buffer(capacity, horizon, obs_shape)
    rng, step, served_at = np.random.default_rng(seed), 0, []
    d.mkdir(parents=True, exist_ok=True)
    for k, episodes in enumerate(saves):
        step += add_episodes(buf, episodes, rng, step0=step)
        buf.save(str(d), k)
        served_at.append(served(buf))
    return {"index": np.concatenate([s["index"] for s in served_at]),
            "states": np.concatenate([s["states"] for s in served_at]),
            "actions": np.concatenate([s["actions"] for s in served_at]),
            "checkpoint": np.concatenate([np.full(len(s["index"]), k) for k, s in enumerate(served_at)])}


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_live_dopamine_buffers_give_exactly_dopamines_valid_states(tmp_path, layout):
    pytest.importorskip("dopamine")
    want = _live(LAYOUTS[layout], tmp_path / "dop")
    _check_source(open_source(tmp_path / "dop"), want)


@pytest.mark.slow
def test_live_dopamine_atari_buffer_and_cli_job(tmp_path):
    """The buffer of issue 29: 84x84 frames, capacity 1,000, 1,569 adds, 21 terminals, one time-out."""
    pytest.importorskip("dopamine")
    episodes = [(60, "terminal")] * 10 + [(45, "timeout")] + [(60, "terminal")] * 11 + [(195, None)]
    t = time.perf_counter()
    want = _live((1000, 1, [episodes]), tmp_path / "dop", obs_shape=(84, 84))
    src = open_source(tmp_path / "dop")
    assert src.parts[0].add_count == 1569 and len(want["index"]) == len(src)
    _check_source(src, want)
    print(f"issue-29 buffer: {len(src)} states served = Dopamine's {len(want['index'])} valid "
          f"({time.perf_counter() - t:.1f}s)")
    # the whole CLI job on a live buffer of the small agent's frame size
    want = _live(LAYOUTS["wrapped_many"], tmp_path / "small")
    (tmp_path / "agent.py").write_text(AGENT_PY)
    assert _explain(tmp_path / "small", tmp_path / "out", tmp_path / "agent.py") == 0
    _check_job(tmp_path / "out", want, tmp_path / "agent.py")


@pytest.mark.slow
def test_committed_fixture_is_what_dopamine_writes_and_serves(tmp_path):
    """tests/data/dopamine_replay: Dopamine's load of each checkpoint serves expected.npz, and
    regenerating it with this Dopamine gives the same states."""
    pytest.importorskip("dopamine")
    from tests._support.dopamine_buffers import make_buffer, served, write_fixture

    e = fixture_expected()
    for name, (capacity, horizon, parts) in FIXTURE_BUFFERS.items():
        for k in parts:
            buf = make_buffer(capacity, horizon)
            buf.load(str(FIXTURE / name), k)
            for key, v in served(buf).items():
                np.testing.assert_array_equal(v, e[f"{name}_{k}_{key}"], err_msg=f"{name} {k} {key}")
    fresh = write_fixture(tmp_path)
    assert sorted(fresh) == sorted(e)
    for key in e:
        np.testing.assert_array_equal(fresh[key], e[key], err_msg=key)
