"""Saliency snapshots during training: maps on a fixed probe set every K updates.

    snaps = SaliencySnapshots(probe_states(env, 16), "runs/x/snapshots", every=10, num_frames=4)
    jaxsal_agents.train.train(cfg, callback=snaps)        # or train_ppo.train(cfg, callback=snaps)
    render_strips(snaps.out_dir, "strips.png", returns_csv="runs/x/returns.csv")

Each snapshot computes Grad-CAM, G1Grad-CAM, G2Grad-CAM, Guided Backprop and the vanilla
gradient in one shared forward/backward (jaxsal.explain with a method list), plus per-frame
gradient x input, gradient and Guided Backprop maps for the per-stacked-frame attribution
shares (jaxsal.metrics.frames); `newest_share`/`age_centroid` come from the first of them.
Gradient x input counts attribution where each frame has content; plain gradients also
spread mass over empty pixels, where the random initial filters dominate for a long time. Each snapshot is saved as `step_XXXXXXXXX.npz` (arrays only), and one
row per snapshot goes to `stats.csv`.
With ground-truth objects (`probe_objects`, a jaxsal.game_objects.ObjectBoxes of the probe set;
`for_run` records them for games with a RAM table: Pong, Breakout, Ms. Pac-Man, Space
Invaders, Frostbite) every snapshot also stores each method's object shares
(jaxsal.metrics.object_attribution) and the row gets `object_share_<class>` (absolute share
of the first of `object_methods`, mean over the probes showing the class) next to
`object_chance_<class>`: the curve shows when the agent starts looking at the ball.
With `tensorboard=True` (or a log directory) the maps, the stats row and the return curve
also go to TensorBoard event files (agents.snapshot_board; `pip install 'jaxsal[tensorboard]'`).
Agents whose CNN runs on each frame separately (SplitAttentionDQN) get CAM maps too (summed
over frames); their per-frame CAM maps (N, H, W, T) can drive the shares:
`frame_methods=("g1gradcam", ...)`.
"""
from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

import jaxsal
from jaxsal.metrics.frames import age_centroid, frame_shares, newest_share

from .snapshot_board import probe_image

METHODS = ("gradcam", "g1gradcam", "g2gradcam", "guided_backprop", "gradient")
FRAME_METHODS = ("grad_x_input", "gradient", "guided_backprop")  # the first one drives newest_share


def probe_states(env, n: int = 16, steps: int = 64, seed: int = 0) -> np.ndarray:
    """A fixed probe set: `n` observations from a uniformly random policy, taken at evenly
    spaced steps of `steps` (across all envs), so probes cover early and later game states."""
    rng = np.random.default_rng(seed)
    obs, seen = env.reset(), []
    for _ in range(steps):
        seen.append(obs)
        obs = env.step(rng.integers(0, env.num_actions, size=obs.shape[0]))[0]
    flat = np.concatenate(seen, 0)
    return np.ascontiguousarray(flat[_probe_index(flat.shape[0], n)])


def _probe_index(total: int, n: int) -> np.ndarray:
    return np.linspace(0, total - 1, n).round().astype(int)


def probe_states_with_objects(game: str, n: int = 16, steps: int = 64, seed: int = 0, num_envs: int = 8):
    """`probe_states` played on ale-py (EnvPool's preprocessing, jaxsal_agents.ale) so that the RAM is
    known: (probe (n, 84, 84, 4) uint8, jaxsal.game_objects.ObjectBoxes of the probes)."""
    from .ale import AleAtariEnv, Recording
    from jaxsal.game_objects import boxes_from_ram

    rec = Recording(AleAtariEnv(game, num_envs, train=False, seed=seed))
    probe = probe_states(rec, n, steps, seed)
    rams = np.concatenate(rec.rams[:steps], 0)          # same time-major order as probe_states
    return probe, boxes_from_ram(game, rams[_probe_index(rams.shape[0], n)])


class SaliencySnapshots:
    """Training callback: every `every` updates, maps of `methods` on `probe` (+ frame shares)."""

    def __init__(self, probe, out_dir, every: int = 10, methods=METHODS, num_frames: int | None = None,
                 frame_methods=FRAME_METHODS, layer: str | None = None, save_maps: bool = True,
                 at_start: bool = True, target="q_chosen", probe_objects=None, object_methods=("gradient",),
                 tensorboard=None):
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"every must be a positive int (updates between snapshots), got {every!r}")
        self.probe = np.asarray(probe)
        self.out_dir = Path(out_dir)
        self.every, self.methods, self.layer = every, tuple(methods), layer
        self.num_frames, self.frame_methods = num_frames, tuple(frame_methods) if num_frames else ()
        self.save_maps, self.at_start, self.target = save_maps, at_start, target
        self.objects, self.object_methods = probe_objects, tuple(object_methods)
        if probe_objects is not None:
            if len(probe_objects) != len(self.probe):
                raise ValueError(f"probe_objects has {len(probe_objects)} states, the probe {len(self.probe)}")
            missing = [m for m in self.object_methods if m not in self.methods]
            if missing or not self.object_methods:
                raise ValueError(f"object_methods {self.object_methods} must be a non-empty subset of methods "
                                 f"{self.methods}")
        self.rows: list[dict] = self._earlier_rows()   # a resumed run keeps its earlier rows
        self.out_dir.mkdir(parents=True, exist_ok=True)
        np.save(self.out_dir / "probe.npy", self.probe, allow_pickle=False)
        (self.out_dir / "meta.json").write_text(json.dumps(
            {"every": every, "methods": list(self.methods), "num_frames": num_frames,
             "frame_methods": list(self.frame_methods), "layer": layer,
             "target": target if isinstance(target, str) else repr(target),
             "object_classes": list(probe_objects.classes) if probe_objects is not None else None,
             "object_methods": list(self.object_methods) if probe_objects is not None else None}))
        if probe_objects is not None:
            probe_objects.save(self.out_dir / "probe_objects.npz")
        self.board = None   # tensorboard=True: events in OUT_DIR/tensorboard; a path: there
        if tensorboard:
            from .snapshot_board import SnapshotBoard
            log_dir = self.out_dir / "tensorboard" if tensorboard is True else Path(tensorboard)
            self.board = SnapshotBoard(log_dir, num_frames=num_frames)

    def __call__(self, *, step, update, params, apply_fn, returns=None, **_):
        if self.board is not None:
            self.board.returns(step, returns)     # the return curve, every update
        first = self.at_start and not self.rows   # the first call records the start of training
        if update % self.every and not first:
            return None
        return self.record(step, update, params, apply_fn, returns)

    def record(self, step, update, params, apply_fn, returns=None) -> dict:
        """Compute and save one snapshot now; returns its stats row."""
        maps = jaxsal.explain(apply_fn, params, self.probe, method=list(self.methods), layer=self.layer,
                              target=self.target)
        arrays = {m: np.asarray(v, np.float32) for m, v in maps.items()}
        row = {"step": int(step), "update": int(update),
               "return_mean": float(np.mean(returns[-20:])) if returns else float("nan")}
        if self.num_frames:
            cam = any(m in jaxsal.cam_methods() for m in self.frame_methods)   # per-frame CAM needs a
            pf = jaxsal.explain(apply_fn, params, self.probe, method=list(self.frame_methods),
                                per_frame=True, target=self.target,      # time-distributed trunk
                                layer=self.layer if cam else None)
            shares = np.stack([frame_shares(pf[m], self.num_frames) for m in self.frame_methods])
            arrays["frame_shares"] = shares.astype(np.float32)   # (methods, N, k)
            row["newest_share"] = float(newest_share(shares[0]).mean())
            row["age_centroid"] = float(age_centroid(shares[0]).mean())
            for j, s in enumerate(shares[0].mean(axis=0)):
                row[f"share_{j}"] = float(s)
            for m, s in zip(self.frame_methods[1:], shares[1:]):
                row[f"newest_share_{m}"] = float(newest_share(s).mean())
        if self.objects is not None:
            row.update(self._object_stats(arrays, maps))
        if self.save_maps:
            np.savez_compressed(self.out_dir / f"step_{int(step):09d}.npz", **arrays)
        # a run resumed from an older checkpoint redoes steps: their new row replaces the old one
        self.rows = [r for r in self.rows if int(r["step"]) < int(step)] + [row]
        self._write_csv()
        if self.board is not None:
            self.board.snapshot(step, row, {m: arrays[m] for m in self.methods}, self.probe)
        return row

    def close(self) -> None:
        """Flush and close the TensorBoard event file (the snapshots themselves are already on disk)."""
        if self.board is not None:
            self.board.close()

    def _object_stats(self, arrays, maps) -> dict:
        """Object shares of every method into `arrays` (methods, N, C); row stats of the first
        of `object_methods` (absolute share, mean over probes showing the class)."""
        from jaxsal.metrics import object_attribution

        res = {m: object_attribution(maps[m], self.objects) for m in self.methods}
        arrays["object_shares_positive"] = np.stack([np.asarray(res[m].positive) for m in self.methods])
        arrays["object_shares_absolute"] = np.stack([np.asarray(res[m].absolute) for m in self.methods])
        row = {}
        for c, v in res[self.object_methods[0]].mean().items():
            row[f"object_share_{c}"] = v["absolute"]
            row[f"object_chance_{c}"] = v["chance"]
        return row

    def _earlier_rows(self) -> list[dict]:
        """Rows of stats.csv left by an interrupted run in out_dir (numbers parsed), else []."""
        f = self.out_dir / "stats.csv"
        if not f.exists():
            return []
        with open(f, newline="") as fh:
            return [{k: (int(v) if k in ("step", "update") else float(v)) for k, v in r.items()}
                    for r in csv.DictReader(fh)]

    def _write_csv(self):
        keys = list(dict.fromkeys(k for r in self.rows for k in r))   # rows of a resumed older run may lack some
        with open(self.out_dir / "stats.csv", "w", newline="") as f:
            w = csv.DictWriter(f, keys, restval="nan")
            w.writeheader()
            w.writerows(self.rows)


def load_snapshots(out_dir):
    """[(step, {name: array})] of a snapshot folder, in step order."""
    out = []
    for p in sorted(Path(out_dir).glob("step_*.npz")):
        with np.load(p, allow_pickle=False) as z:
            out.append((int(p.stem.split("_")[1]), {k: z[k] for k in z.files}))
    return out


def read_returns(returns_csv):
    """(steps, returns) arrays of a training run's returns.csv."""
    steps, rets = [], []
    with open(returns_csv) as f:
        for r in csv.DictReader(f):
            steps.append(int(r["step"]))
            rets.append(float(r["return"]))
    return np.asarray(steps), np.asarray(rets)


def render_strips(out_dir, out_png, returns_csv=None, state: int = 0, max_cols: int = 8,
                  title: str | None = None):
    """Figure: return curve (left) next to a strip of maps per method over training (right)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    snaps = load_snapshots(out_dir)
    if not snaps:
        raise FileNotFoundError(f"no snapshots in {out_dir}")
    pick = np.unique(np.linspace(0, len(snaps) - 1, min(max_cols, len(snaps))).round().astype(int))
    methods = [m for m in METHODS if m in snaps[0][1]]
    probe = np.load(Path(out_dir) / "probe.npy", allow_pickle=False)
    meta_path = Path(out_dir) / "meta.json"
    k = json.loads(meta_path.read_text()).get("num_frames") if meta_path.exists() else None
    rows, cols = len(methods) + 1, len(pick)
    fig = plt.figure(figsize=(4 + 1.4 * cols, 1.4 * rows))
    gs = fig.add_gridspec(rows, cols + 3)
    ax = fig.add_subplot(gs[:, :3])
    if returns_csv is not None and Path(returns_csv).exists():
        s, r = read_returns(returns_csv)
        if s.size:
            ax.plot(s, r, ".", alpha=0.2, ms=2)
            w = max(1, min(20, s.size // 5))
            ax.plot(s[w - 1:], np.convolve(r, np.ones(w) / w, "valid"), "-")
    for i in pick:
        ax.axvline(snaps[i][0], color="grey", lw=0.5)
    ax.set_xlabel("env step")
    ax.set_ylabel("return")
    ax.set_title(title or "return")
    a = fig.add_subplot(gs[0, 3])
    a.imshow(probe_image(probe[state], k), cmap="gray")
    a.set_title("probe", fontsize=7)
    a.axis("off")
    for c, i in enumerate(pick):
        step, arr = snaps[i]
        for r, m in enumerate(methods):
            a = fig.add_subplot(gs[r + 1, c + 3])
            a.imshow(arr[m][state], cmap="inferno")
            a.set_xticks([])
            a.set_yticks([])
            if c == 0:
                a.set_ylabel(m, fontsize=7)
            if r == 0:
                a.set_title(f"{step}", fontsize=7)
    fig.tight_layout()
    fig.savefig(out_png, dpi=90)
    plt.close(fig)
    return out_png


def for_run(game: str, run_dir, every: int, seed: int = 0, n_probes: int = 16,
            target="q_chosen", tensorboard=None) -> SaliencySnapshots:
    """The callback behind the trainers' `--snapshot-every K` flag: probes from a separate
    evaluation env of `game`, snapshots in RUN_DIR/snapshots (per-frame shares for Atari's
    4-frame grey stacks; MinAtar frames are not stacked).
    Games with an object table (jaxsal.game_objects) take their probes from ale-py with the same
    preprocessing, so the snapshots also record object shares. `tensorboard` as in
    SaliencySnapshots (the trainers' `--tensorboard`: RUN_DIR/snapshots/tensorboard)."""
    from .envs import check_game, is_minatar, make_env
    from jaxsal.game_objects import TABLES

    if check_game(game) in TABLES:
        probe, boxes = probe_states_with_objects(check_game(game), n_probes, seed=seed + 10_000)
        return SaliencySnapshots(probe, Path(run_dir) / "snapshots", every=every, num_frames=probe.shape[-1],
                                 target=target, probe_objects=boxes, tensorboard=tensorboard)
    env = make_env(game, 8, train=False, seed=seed + 10_000)
    return SaliencySnapshots(probe_states(env, n_probes, seed=seed), Path(run_dir) / "snapshots",
                             every=every, num_frames=None if is_minatar(game) else env.obs_shape[-1],
                             target=target, tensorboard=tensorboard)


def main(argv=None):
    """python -m jaxsal_agents.snapshots RUN_DIR [--out strips.png]: render a run's snapshot strips."""
    import argparse

    p = argparse.ArgumentParser(description=main.__doc__)
    p.add_argument("run_dir")
    p.add_argument("--out", default=None)
    p.add_argument("--state", type=int, default=0, help="which probe state to show")
    a = p.parse_args(argv)
    out = a.out or str(Path(a.run_dir) / "snapshots" / "strips.png")
    render_strips(Path(a.run_dir) / "snapshots", out, Path(a.run_dir) / "returns.csv", state=a.state)
    print(out)


if __name__ == "__main__":
    main()
