"""TensorBoard logging for saliency snapshots: the maps next to the return curve.

    snaps = SaliencySnapshots(probe, "runs/x/snapshots", every=10, tensorboard=True)
    # tensorboard --logdir runs/x      (events in runs/x/snapshots/tensorboard)

`SnapshotBoard` writes, per snapshot at its env step: one image per method (`maps/<method>`: the
first probe states side by side, each map's absolute value scaled to its own maximum, inferno
colours over the grey probe frame), the probe frames once (`maps/probe`), and every statistic
of the snapshot's stats row as a scalar (`snapshots/<name>`: frame shares, object shares, ...).
Every update it also writes the mean of the last 20 returns (`train/return_mean`), so the
learning curve sits in the same dashboard. The event files are TensorBoard's own format,
written by tensorboardX (no TensorFlow or torch); it is an optional dependency:
`pip install 'jaxsal[tensorboard]'`.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

INSTALL = "pip install 'jaxsal[tensorboard]' (or pip install tensorboardX)"
SKIP = ("step", "update", "return_mean")   # axes of the row, and the return logged every update


def _summary_writer():
    try:
        from tensorboardX import SummaryWriter
    except ImportError as e:
        raise ImportError(f"TensorBoard logging of saliency snapshots needs tensorboardX, which is not "
                          f"installed ({e}): {INSTALL}; or leave tensorboard off") from None
    return SummaryWriter


class SnapshotBoard:
    """Writes snapshot maps (images) and statistics (scalars) to TensorBoard event files in `log_dir`.

    `states`: how many probe states each image shows side by side; `min_tile`: small frames
    (MinAtar's 10x10) are enlarged by an integer factor to at least this many pixels.
    """

    def __init__(self, log_dir, num_frames: int | None = None, states: int = 4, min_tile: int = 64):
        writer = _summary_writer()       # a missing package fails here, before training starts
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.num_frames, self.states, self.min_tile = num_frames, states, min_tile
        self._w = writer(str(self.log_dir), flush_secs=30)
        self._probe_written = False

    def returns(self, step: int, returns) -> None:
        """The training curve: mean of the last 20 finished episodes, when there are any."""
        if returns:
            self._w.add_scalar("train/return_mean", float(np.mean(returns[-20:])), int(step))

    def snapshot(self, step: int, row: dict, maps: dict, probe: np.ndarray) -> None:
        """One snapshot: `maps` {method: (N, H, W)} on the probe set (N, H, W, C), `row` its stats."""
        step = int(step)
        frames = self._frames(probe)
        if not self._probe_written:
            self._w.add_image("maps/probe", self._strip([np.stack([f] * 3, -1) for f in frames]), step,
                              dataformats="HWC")
            self._probe_written = True
        for name, m in maps.items():
            tiles = [_overlay(f, x) for f, x in zip(frames, np.asarray(m)[: self.states])]
            self._w.add_image(f"maps/{name}", self._strip(tiles), step, dataformats="HWC")
        for k, v in row.items():
            if k not in SKIP and isinstance(v, (int, float)) and math.isfinite(v):
                self._w.add_scalar(f"snapshots/{k}", float(v), step)
        self._w.flush()            # a killed run keeps every snapshot written so far

    def close(self) -> None:
        self._w.close()

    def _frames(self, probe) -> list:
        out = []
        for obs in np.asarray(probe)[: self.states]:
            g = probe_image(obs, self.num_frames)
            lo, hi = float(g.min()), float(g.max())
            out.append((g - lo) / (hi - lo) if hi > lo else np.zeros_like(g))
        return out

    def _strip(self, tiles) -> np.ndarray:
        """Tiles (H, W, 3) in [0, 1] side by side, enlarged to `min_tile`, 2-pixel white gaps; uint8."""
        k = max(1, -(-self.min_tile // tiles[0].shape[0]))
        big = [np.kron(t, np.ones((k, k, 1))) for t in tiles]
        gap = np.ones((big[0].shape[0], 2, 3))
        row = np.concatenate([x for t in big for x in (t, gap)][:-1], axis=1)
        return (np.clip(row, 0, 1) * 255).round().astype(np.uint8)


def probe_image(obs, num_frames: int | None = None):
    """One probe observation (H, W, C) as a 2-D image of its newest frame: the last C/k
    channels of a frame-major stack, weighted by channel index so objects differ in shade."""
    obs = np.asarray(obs, np.float32)
    c = obs.shape[-1] // (num_frames or 1)
    newest = obs[..., -c:]
    return newest[..., 0] if c == 1 else (newest * np.arange(1, c + 1)).max(-1)


def _overlay(frame: np.ndarray, m: np.ndarray) -> np.ndarray:
    """|m| scaled to its maximum, inferno colours blended over the grey frame (H, W, 3) in [0, 1]."""
    from matplotlib import colormaps

    a = np.abs(np.asarray(m, np.float64))
    a = a / a.max() if a.max() > 0 else a
    heat = colormaps["inferno"](a)[..., :3]
    return 0.35 * frame[..., None] + 0.65 * heat
