"""Training speed: jaxsal_agents.train (PQN, JAX) against a CleanRL-style PyTorch PQN, same settings.

    python -m experiments.benchmarks.train_speed                 # ~6 min on 2 cores; needs the bench extra
    python -m experiments.benchmarks.train_speed --quick         # a few updates per side (checks the script)
    python -m experiments.benchmarks.train_speed --report        # rewrite speed.md from speed.json and the cards

Each side trains Breakout from scratch in its own fresh process, in the order A B A B, so a
drift of the machine shows as a difference between the two runs of one side. Reported: env
steps/s after the first (compiling) update, the share of wall time in acting, env stepping and
the update, the trainer's FLOP/s (XLA's cost analysis of the compiled act and update) against
the float32 matmul peak measured in the same run, and the machine and its load. Writes
experiments/results/training/speed.{json,md}. Run it on a quiet machine: no other work.

The reference must run torch's CPU build: a CUDA build's CPU convolutions can run several times slower (an
earlier run of this benchmark timed torch 2.14.1+cu130 on the CPU), which flatters jaxsal several
times over. The script records torch's version and build with every result and refuses a CUDA
build unless --allow-cuda-build-on-cpu, and then the results say so in bold.

Returns per CPU-hour: each shipped PQN agent trained with these settings, its 30-game return
over the CPU-hours its env steps cost at each side's measured speed (2 cores). Derived, not
timed: the agents trained on shared cores, and the reference was not trained to the end; it
runs the same algorithm with the same settings, so its return per env step is taken as equal.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from experiments.benchmarks.peers.torch_build import CUDA_ON_CPU, build_note, refuse_cuda_on_cpu
from experiments.common.paths import ROOT, RESULTS

OUT = RESULTS / "training"
SETTINGS = {"game": "breakout", "num_envs": 32, "rollout": 32, "minibatches": 8, "epochs": 2}
RANDOM_RETURN = {"pong": -20.7, "breakout": 1.7, "mspacman": 307.3, "spaceinvaders": 148.0, "frostbite": 65.2}
"""Random-policy returns (Mnih et al. 2015; ../shared/spec/agents.md): what a CPU-hour's gain is measured from."""


def jaxsal_child(updates: int) -> dict:
    """Run jaxsal_agents.train for `updates` updates in a temporary run directory."""
    import jaxsal.cpu
    jaxsal.cpu.use_fast_kernels()
    import jax
    import jax.numpy as jnp

    from jaxsal_agents.train import PQNConfig, make_act, make_optimizer, make_update, train
    from jaxsal_agents.zoo import build_model

    s = SETTINGS
    batch = s["num_envs"] * s["rollout"]
    with tempfile.TemporaryDirectory() as tmp:
        cfg = PQNConfig(game=s["game"], num_envs=s["num_envs"], rollout=s["rollout"],
                        minibatches=s["minibatches"], epochs=s["epochs"], steps=updates * batch,
                        run_dir=tmp, ckpt_every=10 ** 9)
        out = train(cfg, log=lambda m: None)
    # FLOPs of one act call and one update, as XLA counts them on the compiled programs
    model = build_model(s["game"], "dqn", 4)
    tx = make_optimizer(cfg)
    params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, 84, 84, 4)))
    obs = jnp.zeros((s["num_envs"], 84, 84, 4), jnp.uint8)
    roll = lambda dt, *shape: jnp.zeros((s["rollout"], s["num_envs"]) + shape, dt)  # noqa: E731
    act_cost = make_act(model).lower(params, obs, jax.random.PRNGKey(0), 0.1).compile().cost_analysis()
    upd_cost = make_update(model, tx, cfg).lower(
        params, None, tx.init(params), jax.random.PRNGKey(0), roll(jnp.uint8, 84, 84, 4), roll(jnp.int32),
        roll(jnp.float32), roll(jnp.float32), roll(jnp.float32), roll(jnp.int32), obs).compile().cost_analysis()
    first = lambda c: c[0] if isinstance(c, (list, tuple)) else c  # noqa: E731
    flops_per_step = (first(act_cost)["flops"] * s["rollout"] + first(upd_cost)["flops"]) / batch
    res = dict(out["steady"], flops_per_step=float(flops_per_step))
    res["gflops_per_s"] = res["steps_per_s"] * flops_per_step / 1e9
    res["jax"], res["xla_flags"] = jax.__version__, os.environ.get("XLA_FLAGS", "")
    return res


def torch_child(updates: int) -> dict:
    import torch

    from experiments.benchmarks.peers.cleanrl_pqn import run
    s = SETTINGS
    res = run(s["game"], num_envs=s["num_envs"], num_steps=s["rollout"], minibatches=s["minibatches"],
              epochs=s["epochs"], updates=updates)
    return dict(res, torch_cuda=torch.version.cuda, torch_build=build_note(torch.version.cuda))


def torch_build() -> dict:
    """torch's version and build, asked of a fresh process (the parent keeps torch out of its own)."""
    code = "import json, torch; print(json.dumps([torch.__version__, torch.version.cuda]))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"torch does not import (the reference needs the bench extra):\n{r.stderr[-2000:]}")
    version, cuda = json.loads(r.stdout.strip().splitlines()[-1])
    return {"torch": version, "torch_cuda": cuda, "torch_build": build_note(cuda)}


def check_torch_build(info: dict, allow_cuda_build: bool):
    """Refuse to time a CUDA build of torch on the CPU unless asked to (then every table says so)."""
    refuse_cuda_on_cpu(info["torch"], info["torch_cuda"], allow_cuda_build)


def matmul_peak() -> float:
    """Best float32 GFLOP/s of a 1024^3 matmul under XLA (with the trainer's kernels)."""
    import jaxsal.cpu
    jaxsal.cpu.use_fast_kernels()
    import jax
    import jax.numpy as jnp

    a = jnp.ones((1024, 1024), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    f(a).block_until_ready()
    best = 1e9
    for _ in range(20):
        t = time.perf_counter()
        f(a).block_until_ready()
        best = min(best, time.perf_counter() - t)
    return 2 * 1024 ** 3 / best / 1e9


def child(side: str, updates: int) -> dict:
    cmd = [sys.executable, "-m", "experiments.benchmarks.train_speed", "--child", side, "--updates", str(updates)]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    if r.returncode:
        raise SystemExit(f"{side} child failed:\n{r.stderr[-3000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def machine() -> dict:
    import platform
    info = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
            "cpu_count": os.cpu_count(), "load_avg_1_5_15": list(os.getloadavg())}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return info


def shipped_pqn_runs() -> list[dict]:
    """Shipped agents trained by jaxsal_agents.train with SETTINGS' batch layout: name, env steps, return."""
    from jaxsal_agents.zoo import SHIPPED_DIR, available

    out = []
    for name in available():
        card = json.loads((SHIPPED_DIR / f"{name}.json").read_text())
        cmd = card.get("trained_with", "")
        flags = dict(re.findall(r"--([a-z-]+) (\S+)", cmd))
        same = all(flags.get(k.replace("_", "-")) == str(v) for k, v in SETTINGS.items() if k != "game")
        if ".train " not in cmd or not same or name.startswith("minatar"):
            continue
        out.append({"name": name, "game": card["game"], "env_steps": card["env_steps_trained"],
                    "return": card["eval"]["mean_return"], "warm_start": "--init-from" in cmd})
    return out


def returns_per_cpu_hour(res: dict, runs: list[dict]) -> list[str]:
    """Markdown rows: (return - random) / CPU-hours at each side's measured env steps/s, all cores busy."""
    s, cores = res["summary"], res["machine"]["cpu_count"]
    rows = ["| agent | env steps | 30-game return | random | CPU-hours, jaxsal | gain per CPU-hour, jaxsal | "
            "CPU-hours, reference | gain per CPU-hour, reference |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in runs:
        h = {side: r["env_steps"] / s[f"{side}_steps_per_s"] / 3600 * cores for side in ("jaxsal", "torch")}
        gain = r["return"] - RANDOM_RETURN[r["game"]]
        note = " (warm start: steps include the earlier run's)" if r["warm_start"] else ""
        rows.append(f"| `{r['name']}`{note} | {r['env_steps']:,} | {r['return']:.1f} | {RANDOM_RETURN[r['game']]} | "
                    f"{h['jaxsal']:.2f} | {gain / h['jaxsal']:.1f} | {h['torch']:.2f} | {gain / h['torch']:.1f} |")
    return rows


def markdown(res: dict) -> str:
    m = res["machine"]
    build = m.get("torch_build", "build not recorded")
    tv = str(m.get("torch") or res.get("summary", {}).get("torch", ""))
    warn = [f"**Warning: {CUDA_ON_CPU}.**", ""] if (m.get("torch_cuda") or "+cu" in tv) else []
    # the benchmark keeps the cores busy itself; above 1.5 runnable tasks per core other work competed,
    # and torch's thread pool slows down far more than XLA's when oversubscribed
    if max(m["load_avg_1_5_15"][0], (res.get("load_end") or [0])[0]) > 1.5 * m["cpu_count"]:
        warn += ["**Warning: the machine was busy (load average above 1.5 per core), so the ratio is unreliable "
                 "(an oversubscribed torch thread pool slows down far more than XLA's); rerun on a quiet machine.**", ""]
    rows = ["| run | side | env steps/s | act | env | update | GFLOP/s | % of matmul peak |",
            "|---|---|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(res["runs"]):
        sh = r["share"]
        gf = f"{r['gflops_per_s']:.0f}" if "gflops_per_s" in r else "-"
        pk = f"{100 * r['gflops_per_s'] / res['matmul_peak_gflops']:.0f}%" if "gflops_per_s" in r else "-"
        rows.append(f"| {i + 1} | {r['side']} | {r['steps_per_s']:.0f} | {sh['act']:.0%} | {sh['env']:.0%} | "
                    f"{sh['update']:.0%} | {gf} | {pk} |")
    s = res["summary"]
    return "\n".join([
        f"# Training speed ({m['date_utc']})", "", *warn,
        f"PQN on EnvPool Breakout, {SETTINGS['num_envs']} envs x {SETTINGS['rollout']} steps per update, "
        f"{SETTINGS['minibatches']} minibatches, {SETTINGS['epochs']} epochs, Nature CNN with LayerNorm; "
        f"{res['updates']} updates per run, timed after the first. jaxsal: `jaxsal_agents.train` (XLA:CPU, YNNPACK kernels). "
        f"Reference: `experiments/benchmarks/peers/cleanrl_pqn.py`, CleanRL's pqn_atari_envpool.py structure in "
        f"PyTorch ({s.get('torch', '?')}, {build}, 2 threads). Machine: {m.get('cpu', '?')}, {m['cpu_count']} cores, "
        f"load average at start {m['load_avg_1_5_15']}, at end {res['load_end']}. "
        f"Float32 matmul peak measured in the same run: {res['matmul_peak_gflops']:.0f} GFLOP/s (1024^3, XLA).", "",
        *rows, "",
        f"Mean: jaxsal {s['jaxsal_steps_per_s']:.0f} env steps/s, reference {s['torch_steps_per_s']:.0f} "
        f"({s['ratio']:.2f}x); {s['flops_per_step'] / 1e6:.0f} MFLOP per env step (XLA's count: acting + update).", "",
        "## Returns per CPU-hour", "",
        f"Shipped PQN agents trained with these settings: the 30-game return's gain over a random policy "
        f"(Mnih et al. 2015) per CPU-hour, the CPU-hours being what their env steps "
        f"cost at each side's mean speed above ({m['cpu_count']} cores busy). Derived, not timed: the agents "
        "trained on shared cores, the speed is Breakout's (env stepping is about a fifth of the time, so other "
        "games differ a little), and the reference was not trained to the end: it runs the same algorithm with the "
        "same settings, so its return per env step is taken as equal and the ratio is the speed ratio.", "",
        *returns_per_cpu_hour(res, shipped_pqn_runs()), ""])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--updates", type=int, default=40)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--child", choices=["jaxsal", "torch"])
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--report", action="store_true", help="rewrite speed.md from speed.json (no timing)")
    p.add_argument("--allow-cuda-build-on-cpu", action="store_true",
                   help="time a CUDA build of torch anyway (refused otherwise: its CPU convolutions can run several times "
                        "slower than the CPU build's), with the results flagged")
    a = p.parse_args(argv)
    if a.report:
        md = markdown(json.loads((Path(a.out) / "speed.json").read_text()))
        (Path(a.out) / "speed.md").write_text(md)
        print(md)
        return
    if a.child:
        print(json.dumps((jaxsal_child if a.child == "jaxsal" else torch_child)(a.updates)))
        return
    updates = 4 if a.quick else a.updates
    tb = torch_build()
    check_torch_build(tb, a.allow_cuda_build_on_cpu)
    res = {"machine": dict(machine(), **tb), "settings": SETTINGS, "updates": updates, "runs": []}
    res["matmul_peak_gflops"] = matmul_peak()
    for side in ("jaxsal", "torch", "jaxsal", "torch"):
        r = dict(child(side, updates), side=side)
        print(f"{side}: {r['steps_per_s']:.0f} env steps/s", flush=True)
        res["runs"].append(r)
    res["load_end"] = list(os.getloadavg())
    j = [r for r in res["runs"] if r["side"] == "jaxsal"]
    t = [r for r in res["runs"] if r["side"] == "torch"]
    js, ts = sum(r["steps_per_s"] for r in j) / len(j), sum(r["steps_per_s"] for r in t) / len(t)
    res["summary"] = {"jaxsal_steps_per_s": js, "torch_steps_per_s": ts, "ratio": js / ts,
                      "flops_per_step": j[0]["flops_per_step"], "torch": t[0].get("torch")}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    name = "speed_quick" if a.quick else "speed"
    (out / f"{name}.json").write_text(json.dumps(res, indent=1))
    (out / f"{name}.md").write_text(markdown(res))
    print(markdown(res))


if __name__ == "__main__":
    main()
