"""Turn a training run into a shipped agent: evaluate, export float16 msgpack, write the JSON card.

    python -m jaxsal_agents.export --run-dir runs/breakout --name breakout --out-dir my_agents

The card records game, algorithm, frames trained, mean ± std return over full games, the
evaluation protocol and the command that trained it; the training curve (PNG + CSV) goes
beside it, or into --curves-dir (agents/train_shipped.sh: the repository's
experiments/results/training/). Nothing is written outside the folders given.
"""
from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import numpy as np

from .checkpoint import export_params, restore_train_state
from .envs import MINATAR_GAMES, make_env
from .train import PQNConfig, initial_state, make_optimizer
from .evaluate import evaluate_agent
from .weights import refresh_manifest
from .zoo import SHIPPED_DIR, build_model


def plot_curve(csv_path: Path, png_path: Path, title: str):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = list(csv.DictReader(open(csv_path)))
    if not rows:
        return
    step = np.array([float(r["step"]) for r in rows])
    ret = np.array([float(r["return"]) for r in rows])
    k = max(1, len(ret) // 50)
    smooth = np.convolve(ret, np.ones(k) / k, mode="valid")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(step, ret, ".", alpha=0.25, ms=3, label="episode return")
    ax.plot(step[k - 1:], smooth, lw=2, label=f"moving mean ({k})")
    ax.set_xlabel("env steps (all envs)")
    ax.set_ylabel("full-game return")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    png_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


def algorithm_name(cfg: PQNConfig) -> str:
    """How the card names the training algorithm."""
    name = "PQN (parallel Q-learning, Q(lambda), LayerNorm)"
    if cfg.target_every:
        name += f", Double-DQN target with a target network (synced every {cfg.target_every} updates)"
    return name + (", dueling head" if cfg.arch == "dueling" else "")


def export_run(run_dir, name: str, out_dir, episodes: int = 30, epsilon: float = 0.0, curves_dir=None) -> dict:
    """Evaluate a training run's float16-rounded params and write <name>.msgpack + <name>.json into out_dir."""
    run_dir = Path(run_dir)
    cfg = json.loads((run_dir / "config.json").read_text())
    probe_env = make_env(cfg["game"], 1, train=False)
    model = build_model(cfg["game"], cfg["arch"], probe_env.num_actions, layer_norm=cfg["layer_norm"])
    pqn = PQNConfig(**cfg)
    template = initial_state(pqn, model, make_optimizer(pqn), probe_env.obs_shape)
    state = restore_train_state(run_dir / "ckpt", template)
    if not state["update"]:
        raise SystemExit(f"no checkpoint in {run_dir / 'ckpt'}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    sha = export_params(out_dir / f"{name}.msgpack", state["params"])
    # Evaluate the exported (float16-rounded) weights: what users get is what is measured.
    card = {"name": name, "game": cfg["game"], "arch": cfg["arch"], "layer_norm": cfg["layer_norm"],
            "num_actions": probe_env.num_actions, "obs_shape": list(probe_env.obs_shape)}
    (out_dir / f"{name}.json").write_text(json.dumps(card))
    from .zoo import load
    agent = load(str(out_dir / f"{name}.json"))
    result = evaluate_agent(agent, episodes=episodes, epsilon=epsilon)
    frames_per_step = 1 if cfg["game"] in MINATAR_GAMES else 4
    flags = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in cfg.items()
                     if k not in ("time_limit",) and v != "")
    card.update({
        "algorithm": algorithm_name(pqn),
        "env_steps_trained": int(state["step"]),
        "frames_trained": int(state["step"]) * frames_per_step,
        "planned_env_steps": cfg["steps"],
        "eval": result,
        "trained_with": f"python -m jaxsal_agents.train {flags}",
        "params_sha256": sha, "dtype": "float16",
    })
    return write_card(card, out_dir, run_dir, f"{name}: training returns", curves_dir)


def write_card(card: dict, out_dir, run_dir: Path, curve_title: str, curves_dir=None) -> dict:
    """Write the card beside its params and the run's return curve (PNG + CSV) beside the card or
    into `curves_dir`; the card's `training_curve` names the PNG: its file name when beside the
    card, else the path as given (agents/train_shipped.sh gives a repository-relative one)."""
    name = card["name"]
    curves = Path(out_dir) if curves_dir is None else Path(curves_dir)
    card = dict(card)
    card.pop("training_curve", None)
    if (run_dir / "returns.csv").exists():
        curves.mkdir(parents=True, exist_ok=True)
        plot_curve(run_dir / "returns.csv", curves / f"{name}.png", curve_title)
        (curves / f"{name}.csv").write_bytes((run_dir / "returns.csv").read_bytes())
        card["training_curve"] = f"{name}.png" if curves_dir is None else (curves / f"{name}.png").as_posix()
    (Path(out_dir) / f"{name}.json").write_text(json.dumps(card, indent=1))
    refresh_manifest(out_dir)  # exported into agents/shipped: the manifest lists the new weights
    return card


def _ci(e: dict) -> str:
    return f"{e['ci95'][0]:.1f} to {e['ci95'][1]:.1f}" if "ci95" in e else "no CI: old card"


def cards_markdown() -> str:
    """A Markdown table of the shipped agents' cards (for the README)."""
    from .zoo import available

    rows = ["| name | game | network | algorithm | frames trained | return: mean ± std (95% CI), games |",
            "| --- | --- | --- | --- | ---: | ---: |"]
    for name in available():
        c = json.loads((SHIPPED_DIR / f"{name}.json").read_text())
        e = c["eval"]
        rows.append(f"| `{name}` | {c['game']} | {c['arch']} | {c['algorithm']} | {c['frames_trained']:,} | "
                    f"{e['mean_return']:.1f} ± {e['std_return']:.1f} ({_ci(e)}), {e['episodes']} |")
    return "\n".join(rows)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir")
    p.add_argument("--name")
    p.add_argument("--table", action="store_true", help="print the shipped agents as a Markdown table")
    p.add_argument("--episodes", type=int, default=30)
    p.add_argument("--epsilon", type=float, default=0.0)
    p.add_argument("--out-dir", help="where the .msgpack and card go (required with --run-dir)")
    p.add_argument("--curves-dir", default=None,
                   help="where the training curve goes (default: beside the card)")
    a = p.parse_args(argv)
    import jaxsal.cpu
    jaxsal.cpu.use_fast_kernels()
    if a.table:
        print(cards_markdown())
        return
    if not (a.run_dir and a.name and a.out_dir):
        p.error("--run-dir, --name and --out-dir are required (or --table)")
    card = export_run(a.run_dir, a.name, a.out_dir, a.episodes, a.epsilon, curves_dir=a.curves_dir)
    print(f"{card['name']}: {card['eval']['mean_return']:.1f} ± {card['eval']['std_return']:.1f} "
          f"over {card['eval']['episodes']} games after {card['frames_trained']} frames")


if __name__ == "__main__":
    sys.exit(main())
