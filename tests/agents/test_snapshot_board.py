"""agents.snapshot_board: saliency snapshots written to TensorBoard event files, read back here
with an independent reader (TFRecord framing, masked CRC-32C, the Event protobuf)."""
import importlib.util
import io
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxsal_agents.snapshots import SaliencySnapshots, load_snapshots
from tests._support.snapshot_training import env_fn, pqn_config

pytestmark = pytest.mark.skipif(importlib.util.find_spec("tensorboardX") is None, reason="needs tensorboardX")
# (found, not imported: its import takes ~1.2 s in every xdist worker that only collects this file)


def _crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _crc32c_table()


def _masked_crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_events(log_dir):
    """{tag: [(step, value)]} for scalars and {tag: [(step, (H, W, C) uint8)]} for images."""
    from PIL import Image
    from tensorboardX.proto.event_pb2 import Event

    scalars, images = {}, {}
    files = sorted(Path(log_dir).glob("events.out.tfevents.*"))
    assert files, f"no event file in {log_dir}"
    for f in files:
        data, i = f.read_bytes(), 0
        while i < len(data):
            header = data[i:i + 8]
            (n,), (hcrc,) = struct.unpack("<Q", header), struct.unpack("<I", data[i + 8:i + 12])
            body = data[i + 12:i + 12 + n]
            (bcrc,) = struct.unpack("<I", data[i + 12 + n:i + 16 + n])
            assert hcrc == _masked_crc32c(header) and bcrc == _masked_crc32c(body), f"bad record in {f}"
            i += 16 + n
            ev = Event.FromString(body)
            for v in ev.summary.value:
                if v.HasField("image"):
                    img = np.asarray(Image.open(io.BytesIO(v.image.encoded_image_string)))
                    assert img.shape == (v.image.height, v.image.width, v.image.colorspace)
                    images.setdefault(v.tag, []).append((ev.step, img))
                elif v.HasField("simple_value"):
                    scalars.setdefault(v.tag, []).append((ev.step, v.simple_value))
    return scalars, images


def test_snapshots_go_to_tensorboard_with_their_steps(probe_setup, tmp_path):
    env, probe, model, params = probe_setup        # 6 probes of 10x10x12 (a 4-frame stack of 3 channels)
    snaps = SaliencySnapshots(probe, tmp_path / "snaps", every=2, num_frames=4, tensorboard=True)
    for upd in range(1, 6):
        snaps(step=upd * 100, update=upd, params=params, apply_fn=model.apply, returns=[1.0, float(upd)])
    snaps.close()
    scalars, images = read_events(tmp_path / "snaps" / "tensorboard")
    assert [s for s, _ in scalars["train/return_mean"]] == [100, 200, 300, 400, 500]   # every update
    np.testing.assert_allclose([v for _, v in scalars["train/return_mean"]], [1.0, 1.5, 2.0, 2.5, 3.0])
    rows = {r["step"]: r for r in snaps.rows}
    assert sorted(rows) == [100, 200, 400]                                           # start, every 2
    for key in ("newest_share", "age_centroid", "share_0", "share_3", "newest_share_gradient"):
        got = scalars[f"snapshots/{key}"]
        assert [s for s, _ in got] == [100, 200, 400], key
        np.testing.assert_allclose([v for _, v in got], [rows[s][key] for s in (100, 200, 400)], rtol=1e-6)
    for m in snaps.methods:
        assert [s for s, _ in images[f"maps/{m}"]] == [100, 200, 400], m
        img = images[f"maps/{m}"][0][1]
        # 4 probe states side by side, 10 px enlarged 7x to 70, 2 px gaps
        assert img.shape == (70, 4 * 70 + 3 * 2, 3) and img.dtype == np.uint8 and img.std() > 0
    assert [s for s, _ in images["maps/probe"]] == [100]                              # once
    # the picture is the stored map of that step: inferno(|m| / max |m|) blended 0.65 over the probe frame
    from matplotlib import colormaps
    last = load_snapshots(tmp_path / "snaps")[-1][1]["gradient"][0]
    tile = images["maps/gradient"][-1][1][:70:7, :70:7].astype(float) / 255
    frame = images["maps/probe"][0][1][:70:7, :70:7].astype(float) / 255
    heat = colormaps["inferno"](np.abs(last) / np.abs(last).max())[..., :3]
    np.testing.assert_allclose((tile - 0.35 * frame) / 0.65, heat, atol=0.01)


@pytest.mark.slow  # end to end, 3-10 s: the slow stage (CI runs it)
def test_tensorboard_in_pqn_training_at_the_snapshot_steps(probe_setup, tmp_path):
    from jaxsal_agents.train import train
    env, probe, model, _ = probe_setup
    log_dir = tmp_path / "tb"                                  # a log directory of one's own
    snaps = SaliencySnapshots(probe, tmp_path / "with" / "snapshots", every=2, num_frames=4, tensorboard=log_dir)
    train(pqn_config(tmp_path, "with"), log=lambda m: None, callback=snaps, env_fn=env_fn, model=model)
    snaps.close()
    scalars, images = read_events(log_dir)
    assert [s for s, _ in images["maps/gradcam"]] == [16, 32, 64, 96]
    assert [s for s, _ in scalars["snapshots/newest_share"]] == [16, 32, 64, 96]
    assert not (tmp_path / "with" / "snapshots" / "tensorboard").exists()


def test_missing_tensorboardx_names_the_extra(probe_setup, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboardX", None)     # import tensorboardX raises ImportError
    with pytest.raises(ImportError, match=r"jaxsal\[tensorboard\]"):
        SaliencySnapshots(probe_setup[1], tmp_path / "s", every=1, tensorboard=True)
    snaps = SaliencySnapshots(probe_setup[1], tmp_path / "s", every=1)   # off by default: no tensorboardX needed
    assert snaps.board is None


def test_trainer_flags(tmp_path):
    from jaxsal_agents.train import PQNConfig, parse_config, snapshot_callback

    cfg, snap = parse_config(PQNConfig, ["--run-dir", str(tmp_path), "--snapshot-every", "3", "--tensorboard"], "")
    assert snap == {"every": 3, "tensorboard": True}
    cfg, snap = parse_config(PQNConfig, ["--run-dir", str(tmp_path)], "")
    assert snap == {"every": 0, "tensorboard": False} and snapshot_callback(cfg, snap) is None
    with pytest.raises(SystemExit) as e:       # TensorBoard without snapshots: a usage error naming the fix
        parse_config(PQNConfig, ["--tensorboard"], "")
    assert e.value.code == 2
