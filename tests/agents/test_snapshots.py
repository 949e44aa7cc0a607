"""jaxsal_agents.snapshots: saliency snapshots on a probe set as a training callback."""
import csv

import jax
import numpy as np
import pytest

import jaxsal
from jaxsal_agents.framestack import FrameStackEnv
from jaxsal.metrics import frame_shares
from jaxsal_agents.snapshots import (METHODS, SaliencySnapshots, load_snapshots, probe_states, read_returns,
                              render_strips)
from tests._support.snapshot_training import RandomGridEnv, env_fn, pqn_config


def test_probe_states_fixed_and_spread(probe_setup):
    env, probe, *_ = probe_setup
    again = probe_states(env_fn(seed=1), 6, steps=10)
    np.testing.assert_array_equal(probe, again)
    assert probe.shape == (6, 10, 10, 12)
    assert len({p.tobytes() for p in probe}) > 1


def test_snapshots_every_k_updates_with_maps_and_frame_shares(probe_setup, tmp_path):
    env, probe, model, params = probe_setup
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
    assert arr["frame_shares"].shape == (3, 6, 4)
    np.testing.assert_allclose(arr["frame_shares"].sum(-1), 1.0, rtol=1e-5)
    # the saved maps are exactly what jaxsal.explain gives for the same params and probes (the
    # snapshot makes this very call: one program, so bit for bit)
    ref = jaxsal.explain(model.apply, params, probe, method=list(METHODS))
    for m in METHODS:
        np.testing.assert_array_equal(arr[m], np.asarray(ref[m], np.float32))
    row = snaps.rows[0]
    assert row["return_mean"] == 2.0
    assert row["newest_share"] == pytest.approx(arr["frame_shares"][0, :, -1].mean(), rel=1e-5)
    gxi = jaxsal.explain(model.apply, params, probe, method="grad_x_input", per_frame=True)
    want = frame_shares(gxi, 4)     # of maps from another program: a share near 0, to 1e-5 of the largest
    np.testing.assert_allclose(arr["frame_shares"][0], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    with open(tmp_path / "snaps" / "stats.csv") as f:
        assert len(list(csv.DictReader(f))) == 3
    png = render_strips(tmp_path / "snaps", tmp_path / "strip.png")
    assert (tmp_path / "strip.png").stat().st_size > 1000 and png == tmp_path / "strip.png"


def test_bad_every_is_clear(probe_setup, tmp_path):
    with pytest.raises(ValueError, match="every must be a positive int"):
        SaliencySnapshots(probe_setup[1], tmp_path, every=0)


@pytest.mark.slow  # trains PQN; the snapshot hook itself is checked without training above
def test_callback_in_pqn_training_records_at_the_right_updates(probe_setup, tmp_path):
    from jaxsal_agents.train import train
    env, probe, model, _ = probe_setup
    snaps = SaliencySnapshots(probe, tmp_path / "with" / "snapshots", every=2, num_frames=4)
    out = train(pqn_config(tmp_path, "with"), log=lambda m: None, callback=snaps, env_fn=env_fn, model=model)
    assert [r["update"] for r in snaps.rows] == [1, 2, 4, 6]
    assert [r["step"] for r in snaps.rows] == [16, 32, 64, 96]
    last = load_snapshots(tmp_path / "with" / "snapshots")[-1][1]
    ref = np.asarray(jaxsal.explain(model.apply, out["params"], probe, method="gradcam"))  # the final params
    # the snapshot's method list is another program than gradcam alone
    np.testing.assert_allclose(last["gradcam"], ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())
    s, r = read_returns(tmp_path / "with" / "returns.csv")
    assert s.shape == r.shape and s.size > 0


@pytest.mark.slow
def test_callback_changes_nothing_in_training(probe_setup, tmp_path):
    """jaxsal_agents.train.train with the snapshot callback gives bit-identical params to no callback."""
    from jaxsal_agents.train import train
    env, probe, model, _ = probe_setup
    snaps = SaliencySnapshots(probe, tmp_path / "with" / "snapshots", every=2, num_frames=4)
    a = train(pqn_config(tmp_path, "with"), log=lambda m: None, callback=snaps, env_fn=env_fn, model=model)
    b = train(pqn_config(tmp_path, "without"), log=lambda m: None, env_fn=env_fn, model=model)
    for x, y in zip(jax.tree.leaves(a["params"]), jax.tree.leaves(b["params"])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


class AtariLikeEnv(RandomGridEnv):
    """Fake single-frame 84x84 grey env, so a 4-frame FrameStackEnv gives Atari-shaped stacks."""
    obs_shape = (84, 84, 1)

    def _obs(self):
        return (self.rng.random((self.n,) + self.obs_shape) < 0.05).astype(np.float32) * 255


@pytest.mark.slow
def test_snapshots_on_the_split_attention_agent_in_pqn_training(tmp_path):
    """Paper A's split-attention agent trains under PQN with the snapshot callback; its shared
    per-frame trunk runs the CNN on N*T frames, so the CAM maps are computed per (state, frame):
    the snapshot keeps their frame sum (N, H, W) and the per-frame G1Grad-CAM maps give shares."""
    from jaxsal_agents.networks import SplitAttentionDQN
    from jaxsal_agents.train import PQNConfig, train

    def atari_env_fn(game="fake", num_envs=2, train=True, seed=0):
        return FrameStackEnv(AtariLikeEnv(num_envs, seed), num_frames=4)

    probe = probe_states(atari_env_fn(seed=3), 2, steps=4)
    model = SplitAttentionDQN(3, frames=4, lstm_features=8)
    snaps = SaliencySnapshots(probe, tmp_path / "sa" / "snapshots", every=1, num_frames=4,
                              frame_methods=("grad_x_input", "g1gradcam"), layer="conv2")
    cfg = PQNConfig(game="breakout", steps=2 * 4 * 2, num_envs=2, rollout=4, minibatches=1, epochs=1,
                    run_dir=str(tmp_path / "sa"), ckpt_every=1000)
    out = train(cfg, log=lambda m: None, callback=snaps, env_fn=atari_env_fn, model=model)
    assert [r["update"] for r in snaps.rows] == [1, 2]
    last = load_snapshots(tmp_path / "sa" / "snapshots")[-1][1]
    for m in METHODS:
        assert last[m].shape == (2, 84, 84) and np.all(np.isfinite(last[m]))
    assert last["frame_shares"].shape == (2, 2, 4)
    np.testing.assert_allclose(last["frame_shares"].sum(-1), 1.0, rtol=1e-5)
    ref = jaxsal.explain(model.apply, out["params"], probe, method=["gradcam", "g1gradcam"],
                         layer="conv2", per_frame=True)                      # the final params
    want = np.asarray(ref["gradcam"]).sum(-1)     # the snapshot's frame sum is another program's
    np.testing.assert_allclose(last["gradcam"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    want = frame_shares(ref["g1gradcam"], 4)
    np.testing.assert_allclose(last["frame_shares"][1], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    # every stacked frame reaches the Q-values through the shared trunk: no slot has zero share
    assert np.all(last["frame_shares"] > 0)


def test_resumed_run_keeps_earlier_rows_and_replaces_redone_steps(probe_setup, tmp_path):
    """Killed after step 300 but resumed from the checkpoint at step 200: stats.csv keeps
    100 and 200, and the redone step 300 replaces its old row instead of duplicating it."""
    env, probe, model, params = probe_setup
    first = SaliencySnapshots(probe, tmp_path / "s", every=1, num_frames=4)
    for upd in (1, 2, 3):
        first(step=upd * 100, update=upd, params=params, apply_fn=model.apply, returns=[float(upd)])
    resumed = SaliencySnapshots(probe, tmp_path / "s", every=1, num_frames=4)
    assert [r["step"] for r in resumed.rows] == [100, 200, 300]
    for upd in (3, 4):
        resumed(step=upd * 100, update=upd, params=params, apply_fn=model.apply, returns=[9.0])
    with open(tmp_path / "s" / "stats.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [100, 200, 300, 400]
    assert [float(r["return_mean"]) for r in rows] == [1.0, 2.0, 9.0, 9.0]


@pytest.mark.slow  # end to end, 3-10 s: the slow stage (CI runs it)
def test_snapshots_record_object_shares_for_games_with_a_table(tmp_path):
    pytest.importorskip("ale_py")
    import jaxsal_agents
    from jaxsal_agents.snapshots import probe_states_with_objects

    probe, boxes = probe_states_with_objects("pong", 4, steps=6, num_envs=2)
    assert probe.shape == (4, 84, 84, 4) and len(boxes) == 4 and boxes.classes == ("ball", "player", "enemy")
    agent = jaxsal_agents.load("pong")
    snaps = SaliencySnapshots(probe, tmp_path, every=1, num_frames=4, probe_objects=boxes)
    row = snaps.record(0, 0, agent.params, agent.apply_fn)
    for c in ("ball", "player", "enemy"):
        assert f"object_share_{c}" in row and f"object_chance_{c}" in row
    assert 0.0 <= row["object_share_player"] <= 1.0      # the player's paddle is always on screen
    assert 0.0 < row["object_chance_player"] < 0.05
    (_, arr), = load_snapshots(tmp_path)
    assert arr["object_shares_absolute"].shape == (len(METHODS), 4, 3)
    with pytest.raises(ValueError, match="object_methods"):
        SaliencySnapshots(probe, tmp_path / "x", probe_objects=boxes, object_methods=("rise",))
