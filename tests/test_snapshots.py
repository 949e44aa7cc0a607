"""agents.snapshots: saliency snapshots on a probe set as a training callback."""
import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jaxsal
from agents.framestack import make_stacked_env
from agents.networks import MinAtarDQN
from agents.snapshots import (METHODS, SaliencySnapshots, load_snapshots, probe_states, read_returns,
                              render_strips)


@pytest.fixture(scope="module")
def setup():
    env = make_stacked_env("minatar-breakout", 4, seed=1, num_frames=4, drop_trail=True)
    probe = probe_states(env, 6, steps=10)
    model = MinAtarDQN(env.num_actions, env.obs_shape[-1])
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1,) + env.obs_shape))
    return env, probe, model, params


def test_probe_states_fixed_and_spread(setup):
    env, probe, *_ = setup
    again = probe_states(make_stacked_env("minatar-breakout", 4, seed=1, num_frames=4, drop_trail=True), 6,
                         steps=10)
    np.testing.assert_array_equal(probe, again)
    assert probe.shape == (6, 10, 10, 12)
    assert len({p.tobytes() for p in probe}) > 1


def test_snapshots_every_k_updates_with_maps_and_frame_shares(setup, tmp_path):
    env, probe, model, params = setup
    snaps = SaliencySnapshots(probe, tmp_path / "snaps", every=4, num_frames=4)
    for upd in range(1, 10):
        snaps(step=upd * 100, update=upd, params=params, apply_fn=model.apply, returns=[1.0, 3.0])
    assert [r["update"] for r in snaps.rows] == [1, 4, 8]          # start, then every 4
    loaded = load_snapshots(tmp_path / "snaps")
    assert [s for s, _ in loaded] == [100, 400, 800]
    arr = loaded[0][1]
    assert set(METHODS) | {"frame_shares"} == set(arr)
    for m in METHODS:
        assert arr[m].shape == (6, 10, 10) and np.all(np.isfinite(arr[m]))
    assert arr["frame_shares"].shape == (2, 6, 4)
    np.testing.assert_allclose(arr["frame_shares"].sum(-1), 1.0, rtol=1e-5)
    # the saved maps are exactly what jaxsal.explain gives for the same params and probes
    ref = jaxsal.explain(model.apply, params, probe, method=list(METHODS))
    for m in METHODS:
        np.testing.assert_allclose(arr[m], np.asarray(ref[m]), rtol=1e-5, atol=1e-7)
    row = snaps.rows[0]
    assert row["return_mean"] == 2.0
    assert row["newest_share"] == pytest.approx(arr["frame_shares"][..., -1].mean(), rel=1e-5)
    with open(tmp_path / "snaps" / "stats.csv") as f:
        assert len(list(csv.DictReader(f))) == 3
    png = render_strips(tmp_path / "snaps", tmp_path / "strip.png")
    assert (tmp_path / "strip.png").stat().st_size > 1000 and png == tmp_path / "strip.png"


def test_bad_every_is_clear(setup, tmp_path):
    with pytest.raises(ValueError, match="every must be a positive int"):
        SaliencySnapshots(setup[1], tmp_path, every=0)


def test_callback_in_pqn_training_changes_nothing_but_records(setup, tmp_path):
    """agents.train.train with the snapshot callback gives bit-identical params to no callback."""
    from agents.train import PQNConfig, train
    env, probe, model, _ = setup

    def env_fn(game, n, train=True, seed=0):
        return make_stacked_env(game, n, train=train, seed=seed, num_frames=4, drop_trail=True)

    def cfg(d):
        return PQNConfig(game="minatar-breakout", steps=4 * 4 * 6, num_envs=4, rollout=4, minibatches=2,
                         epochs=1, run_dir=str(tmp_path / d), ckpt_every=1000)
    snaps = SaliencySnapshots(probe, tmp_path / "with" / "snapshots", every=2, num_frames=4)
    a = train(cfg("with"), log=lambda m: None, callback=snaps, env_fn=env_fn, model=model)
    b = train(cfg("without"), log=lambda m: None, env_fn=env_fn, model=model)
    for x, y in zip(jax.tree.leaves(a["params"]), jax.tree.leaves(b["params"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert [r["update"] for r in snaps.rows] == [1, 2, 4, 6]
    assert [r["step"] for r in snaps.rows] == [16, 32, 64, 96]
    s, r = read_returns(tmp_path / "with" / "returns.csv")
    assert s.shape == r.shape
