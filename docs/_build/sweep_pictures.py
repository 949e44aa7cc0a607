"""Draw the sweeps guide's two pictures (`docs/images/sweep/curves.png`, `grid.png`) from a real run.

Trains a small MinAtar Breakout PQN agent (jaxsal_agents.train, CPU, a minute or two), saving its
parameters and card as `step_N.msgpack` / `step_N.json` (N zero-padded, so that the glob's sorted
order, the grid's rows, is training order) at five points of training (untrained to
trained); records 16 states the shipped MinAtar Breakout agent plays; sweeps three methods over the
checkpoints with the insertion and deletion metrics (`jaxsal sweep`); and renders the sweep
(`jaxsal render`), copying its curves.png and grid.png into docs/images/sweep/. The checkpoints
(400 KB each) stay in the work folder.

    python docs/_build/sweep_pictures.py                     # the committed pictures
    python docs/_build/sweep_pictures.py --work DIR --out DIR  # elsewhere
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "images" / "sweep"
GAME = "minatar-breakout"
STEPS, NUM_ENVS, ROLLOUT = 40960, 64, 16     # 40 updates of 1024 env steps
SAVE_AT = (0, 5, 10, 20, 40)                 # updates after which a checkpoint is saved (0: untrained)

CONFIG = """\
# the checkpoints of one training run, on states the trained agent plays
agents = ["runs/pqn/*.msgpack"]
inputs = ["buffer.npy"]
metrics = ["insertion", "deletion"]

[methods]
gradient = {}
gradcam = {}
occlusion = { patch = 2, stride = 1 }
"""


def train_checkpoints(work: Path) -> list[Path]:
    """Train the agent; save its params and card at the updates of SAVE_AT."""
    from jaxsal_agents.checkpoint import export_params
    from jaxsal_agents.train import PQNConfig, train

    ckpts = work / "runs" / "pqn"
    ckpts.mkdir(parents=True, exist_ok=True)
    card = {k: v for k, v in json.loads((ROOT / "agents" / "shipped" / f"{GAME}.json").read_text()).items()
            if k in ("game", "arch", "layer_norm", "num_actions", "obs_shape", "algorithm")}
    cfg = PQNConfig(game=GAME, steps=STEPS, num_envs=NUM_ENVS, rollout=ROLLOUT, ckpt_every=1000,
                    eps_decay_frac=0.2, lr=1e-3, run_dir=str(work / "train"))

    def save(step, update, params, **_):
        if update in SAVE_AT:
            export_params(ckpts / f"step_{step:06d}.msgpack", params)
            (ckpts / f"step_{step:06d}.json").write_text(json.dumps(
                {**card, "name": f"pqn-step_{step}", "env_steps_trained": step}, indent=1))

    from jaxsal_agents import build_model
    model = build_model(GAME, card["arch"], card["num_actions"], layer_norm=card["layer_norm"])
    import jax
    save(0, 0, model.init(jax.random.PRNGKey(cfg.seed), np.zeros((1, *card["obs_shape"]), np.float32)))
    out = train(cfg, log=print, callback=save)
    print(f"trained {out['step']} env steps; mean return of the last 50 episodes {np.mean(out['returns'][-50:]):.2f}")
    return sorted(ckpts.glob("*.msgpack"))


def record_states(work: Path, n: int = 16):
    import jaxsal_agents
    obs = jaxsal_agents.collect(jaxsal_agents.load(GAME), steps=n, seed=3).obs
    np.save(work / "buffer.npy", np.asarray(obs))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--work", default="runs/sweep-pictures", help="folder for the run, its checkpoints and the sweep")
    p.add_argument("--out", default=str(OUT), help="where curves.png and grid.png go")
    args = p.parse_args(argv)
    from jaxsal.cli import main as jaxsal

    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    if not list((work / "runs" / "pqn").glob("*.msgpack")):
        train_checkpoints(work)
    record_states(work)
    (work / "sweep.toml").write_text(CONFIG)
    assert jaxsal(["sweep", str(work / "sweep.toml"), "--out", str(work / "sweep")]) == 0
    assert jaxsal(["render", str(work / "sweep"), "--scale", "12"]) == 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("curves.png", "grid.png"):
        shutil.copy(work / "sweep" / "gallery" / name, out / name)
        print(f"wrote {out / name} ({(out / name).stat().st_size // 1024} KB)")


if __name__ == "__main__":
    main()
