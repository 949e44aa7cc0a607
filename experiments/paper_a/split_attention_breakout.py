"""Paper A's split-attention agent trained on Atari Breakout under PQN, with saliency snapshots.

EnvPool Breakout gives single 84x84 grey frames (`frame_stack=1`); `jaxsal_agents.framestack` stacks
them on the host into (84, 84, 10) stacks, oldest frame first, which is the layout
`SplitAttentionDQN` reads (one channel per frame, its shared Nature CNN runs on each).
Every `--snapshot-every` updates `SaliencySnapshots` computes Grad-CAM, G1Grad-CAM,
G2Grad-CAM, Guided Backprop and the gradient on a fixed probe set (the CAM methods compute
one map per (state, frame) on this time-distributed trunk and keep the frame sum), plus
per-frame shares. Resumable: rerun the same command and the trainer continues from its
checkpoint in RUN_DIR/ckpt. At the end the strips (maps over training next to the return
curve) are drawn to RUN_DIR/strips.png.

    python -m experiments.paper_a.split_attention_breakout --time-limit 900 --run-dir runs/split-attention-breakout

Paper A's sizes are the defaults (10 frames, LSTM 512). `--lstm-features`, `--num-envs`,
`--rollout` exist to make CPU runs and tests small; anything shrunk is printed and written
to RUN_DIR/experiment.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from jaxsal_agents.framestack import make_stacked_env
from jaxsal_agents.networks import SplitAttentionDQN
from jaxsal_agents.snapshots import METHODS, SaliencySnapshots, probe_states, render_strips
from jaxsal_agents.train import PQNConfig, train

PAPER_A = {"frames": 10, "lstm_features": 512}


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", default="runs/split-attention-breakout")
    p.add_argument("--time-limit", type=float, default=900.0, help="seconds of training (0: none)")
    p.add_argument("--steps", type=int, default=200_000,
                   help="nominal PQN budget (env steps): sets epsilon decay and lr schedule")
    p.add_argument("--frames", type=int, default=PAPER_A["frames"])
    p.add_argument("--lstm-features", type=int, default=PAPER_A["lstm_features"])
    p.add_argument("--num-envs", type=int, default=8)
    p.add_argument("--rollout", type=int, default=16)
    p.add_argument("--minibatches", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--snapshot-every", type=int, default=4, help="updates between snapshots")
    p.add_argument("--probes", type=int, default=8, help="probe states")
    p.add_argument("--probe-steps", type=int, default=64, help="random-policy steps to draw probes from")
    p.add_argument("--layer", default=None, help="CAM layer (default: jaxsal's choice, the last conv)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-every", type=int, default=4)
    return p.parse_args(argv)


def env_fn(frames):
    def make(game, num_envs, train=True, seed=0):
        return make_stacked_env(game, num_envs, train=train, seed=seed, num_frames=frames)
    return make


def snapshot_callback(a, run_dir: Path, make) -> SaliencySnapshots:
    """Snapshots in RUN_DIR/snapshots; a resumed run keeps its probe set (and its stats rows)."""
    out = run_dir / "snapshots"
    if (out / "probe.npy").exists():
        probe = np.load(out / "probe.npy", allow_pickle=False)
    else:
        probe = probe_states(make("breakout", 8, train=False, seed=a.seed + 10_000), a.probes,
                             steps=a.probe_steps, seed=a.seed)
    return SaliencySnapshots(probe, out, every=a.snapshot_every, methods=METHODS,
                             num_frames=a.frames, layer=a.layer)


def main(argv=None):
    a = parse(argv)
    run_dir = Path(a.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    shrunk = {k: getattr(a, k) for k, v in PAPER_A.items() if getattr(a, k) != v}
    if shrunk:
        print(f"NOTE: smaller than Paper A's agent: {shrunk} (Paper A: {PAPER_A})", flush=True)
    (run_dir / "experiment.json").write_text(json.dumps({**vars(a), "shrunk_vs_paper_a": shrunk}, indent=1))

    make = env_fn(a.frames)
    cfg = PQNConfig(game="breakout", arch="split_attention", steps=a.steps, num_envs=a.num_envs,
                    rollout=a.rollout, minibatches=a.minibatches, epochs=a.epochs, seed=a.seed,
                    run_dir=str(run_dir), ckpt_every=a.ckpt_every, time_limit=a.time_limit)
    snaps = snapshot_callback(a, run_dir, make)
    num_actions = make("breakout", 1, train=False, seed=a.seed).num_actions
    model = SplitAttentionDQN(num_actions, frames=a.frames, lstm_features=a.lstm_features)

    t0 = time.time()
    out = train(cfg, log=lambda m: print(m, flush=True), callback=snaps, env_fn=make, model=model)
    wall = time.time() - t0
    rets = out["returns"]
    title = f"split-attention Breakout, {out['step']} steps" + (f" (shrunk: {shrunk})" if shrunk else "")
    png = render_strips(run_dir / "snapshots", run_dir / "strips.png", run_dir / "returns.csv",
                        title=title)
    summary = {"step": int(out["step"]), "wall_s_this_call": round(wall, 1),
               "games_finished_this_call": len(rets),
               "return_mean_this_call": float(np.mean(rets)) if rets else None,
               "snapshots": len(snaps.rows), "strips": str(png)}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary), flush=True)
    return summary


if __name__ == "__main__":
    sys.exit(main() and 0)
