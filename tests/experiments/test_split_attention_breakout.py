"""experiments.paper_a.split_attention_breakout end to end on real EnvPool Breakout, tiny config:
trains the split-attention agent under PQN, takes snapshots, draws the strips; on resume the
probe set and earlier snapshot rows are kept."""
import csv
import json

import numpy as np
import pytest

pytest.importorskip("envpool")

from jaxsal_agents.snapshots import METHODS, load_snapshots  # noqa: E402
from experiments.paper_a.split_attention_breakout import main, parse, snapshot_callback  # noqa: E402

pytestmark = pytest.mark.slow  # trains an agent

TINY = ["--frames", "3", "--lstm-features", "4", "--num-envs", "2", "--rollout", "2",
        "--minibatches", "1", "--probes", "2", "--probe-steps", "3", "--snapshot-every", "1",
        "--ckpt-every", "100", "--time-limit", "0"]


@pytest.mark.slow  # ~60 CPU s: tracing the split-attention agent's LSTMs for training and snapshots
def test_main_trains_snapshots_and_draws_strips_and_keeps_snapshots_on_resume(tmp_path):
    run = tmp_path / "run"
    first = main(TINY + ["--steps", "8", "--run-dir", str(run)])          # 2 updates of 2x2 steps
    assert first["step"] == 8 and first["snapshots"] == 2
    snaps = load_snapshots(run / "snapshots")
    assert [s for s, _ in snaps] == [4, 8]
    probe = np.load(run / "snapshots" / "probe.npy")
    assert probe.shape == (2, 84, 84, 3)                                   # frames stacked as channels
    for m in METHODS:
        assert snaps[-1][1][m].shape == (2, 84, 84) and np.all(np.isfinite(snaps[-1][1][m]))
    shares = snaps[-1][1]["frame_shares"]
    np.testing.assert_allclose(shares.sum(-1), 1.0, rtol=1e-5)
    assert json.loads((run / "experiment.json").read_text())["shrunk_vs_paper_a"] == {
        "frames": 3, "lstm_features": 4}

    png = (run / "strips.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000
    assert (run / "ckpt").exists()

    # resume path (no retraining here, to stay fast): the saved probe set and stats rows are kept
    args = parse(TINY + ["--run-dir", str(run)])
    snaps = snapshot_callback(args, run, lambda *a, **k: pytest.fail("must not draw new probes"))
    assert np.array_equal(snaps.probe, probe)
    assert [int(r["update"]) for r in snaps.rows] == [1, 2]
    with open(run / "snapshots" / "stats.csv") as f:                      # not overwritten
        assert [int(r["update"]) for r in csv.DictReader(f)] == [1, 2]
