"""jaxsal against Captum / pytorch-grad-cam / plain torch on the same Nature-CNN weights.

    python -m experiments.benchmarks.against_peers            # batches 64, 256, 1024
    python -m experiments.benchmarks.against_peers --quick    # batches 4, 16, 2 rounds: a check that it runs
    python -m experiments.benchmarks.against_peers --render R.json --docs docs/benchmarks.md   # tables again

Needs torch's CPU build on a CPU (a CUDA build's CPU convolutions can run several times slower; the benchmark refuses
one unless --allow-cuda-build-on-cpu, and then flags every table), Captum and pytorch-grad-cam. First
compares both sides' maps where the methods are defined the same (Pearson correlation per map, the minimum
over states recorded; nothing is refused below a threshold), then times each side in a process of its own, alternating call by call on
the same states, so neither side's thread pool stalls the other's; the ratio jaxsal/peer is taken per
round and reported as its median and range. jaxsal runs at its library defaults, no opt-ins: `import
jaxsal` turns on XLA:CPU's YNNPACK kernels, the gradient and CAM methods rewrite strided convs' input
gradient as space-to-depth matmuls, local perturbations recompute only the conv windows they touch.
Then peak memory per method and side (fresh processes, `experiments.benchmarks.peak_memory`) and
jaxsal's gradient maps/s at N = 1k, 10k, 100k. Writes experiments/results/against_peers.{json,md,png};
the host, load, commit and both frameworks' versions and builds are recorded in the json. Where torch
sees a GPU the peers run on it (`--torch-device`), with bigger forwards for the hand-written ones and
the peak GPU memory of both sides beside the peak RSS.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxsal  # before any JAX computation: turns on XLA:CPU's YNNPACK kernels (library default)
from experiments.benchmarks.peers.torch_build import CUDA_ON_CPU, build_note, refuse_cuda_on_cpu
from experiments.common.paths import RESULTS

# the goals of the performance work (issue 45): jaxsal/peer maps/s at every batch
GOALS = {"gradient": 1.5, "guided_backprop": 1.5, "integrated_gradients": 2.0, "gradcam": 1.2,
         "gradcam_pp": 1.2, "occlusion": 5.0, "noise_sensitivity": 3.0, "rise": 1.0}


def nature_forward_flops(num_actions: int = 6) -> int:
    """Multiply-adds x 2 of one Nature-CNN forward pass on an 84x84x4 frame stack."""
    macs = 20 * 20 * 32 * (8 * 8 * 4) + 9 * 9 * 64 * (4 * 4 * 32) + 7 * 7 * 64 * (3 * 3 * 64) \
        + 3136 * 512 + 512 * num_actions
    return 2 * macs


# forward-pass equivalents per map on the peer's (plain, full) algorithm: an input gradient is
# a forward plus a backward to the input (~2 forwards of work: weight gradients are not needed)
def forward_equivalents(family: str) -> float:
    return {"gradient": 3.0, "guided_backprop": 3.0, "integrated_gradients": 1 + 32 * 3.0,
            "gradcam": 3.0, "gradcam_pp": 3.0, "occlusion": 1 + 42 * 42,
            "noise_sensitivity": 1 + 28 * 28, "rise": 1 + 1000}[family]


ROWS_PER_STATE = {"integrated_gradients": 32, "occlusion": 42 * 42, "noise_sensitivity": 28 * 28, "rise": 1000}
"""Model rows one state needs in each family (steps, patches, masks): the batch_size that makes
one call one program, with no loop whose trip count XLA's cost analysis would not multiply."""


def jaxsal_mflop_per_map(apply_fn, params, family: str, kw: dict) -> float:
    """The MFLOP jaxsal really computes per map (XLA's cost analysis of the call compiled as one
    program under jit, all its rows in one chunk and one group): the roofline's numerator, which
    credits jaxsal with no work it skips (the incremental windows, the forward the greedy action
    shares with the backward) and no work the peer's algorithm does."""
    n = 1 if family in PERTURBATION else 8
    fn, kw = jaxsal_fn(apply_fn, kw)
    rows = n * ROWS_PER_STATE.get(family, 1)
    call = jax.jit(lambda p, o: jaxsal.explain(fn, p, o, batch_size=rows, **kw))
    cost = call.lower(params, jnp.asarray(_obs(n, 0))).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return float(cost["flops"]) / n / 1e6


PERTURBATION = ("occlusion", "noise_sensitivity", "rise")
PEER_ROWS = 128
"""Rows per torch forward for the hand-written peers on CPU (best of 64-4096 measured here)."""
PEER_ROWS_GPU = 4096
"""... and on a GPU, where small forwards leave it idle."""


PEAK_SHAPES = ((2048, 2048, 2048), (4096, 1024, 4096), (20736, 576, 64), (102400, 512, 32))
"""(m, k, n) of the float32 matmuls whose best rate is the measured peak: square ones and the
Nature-CNN's conv2/conv3 as matmuls at batch 256."""


def matmul_peak(shapes=PEAK_SHAPES, rounds: int = 7) -> dict:
    """The float32 matmul peak measured here (jnp.dot under jit, jaxsal's XLA flags, all cores):
    the best shape's median FLOP/s over `rounds` calls, and every shape's."""
    rates = {}
    for m, k, n in shapes:
        a = jax.random.normal(jax.random.PRNGKey(0), (m, k), jnp.float32)
        b = jax.random.normal(jax.random.PRNGKey(1), (k, n), jnp.float32)
        f = jax.jit(jnp.dot)
        f(a, b).block_until_ready()
        ts = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            f(a, b).block_until_ready()
            ts.append(time.perf_counter() - t0)
        rates[f"{m}x{k}x{n}"] = 2 * m * k * n / float(np.median(ts))
    return {"flops": max(rates.values()), "per_shape": rates}


def torch_device(name: str = "auto") -> str:
    """'cuda' when asked for, or for 'auto' when torch sees a GPU; else 'cpu'."""
    import torch
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--torch-device cuda: torch sees no GPU here (use auto or cpu)")
    return name


def peer_rows(device: str) -> int:
    return PEER_ROWS_GPU if device == "cuda" else PEER_ROWS


def sync(device: str):
    """Wait for the GPU's queued torch work (timings of CUDA calls are otherwise launch times)."""
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


def jaxsal_fn(apply_fn, kw: dict):
    """(apply_fn as the case runs it, explain kwargs): the plain apply_fn and the case's
    method options, everything else at jaxsal's defaults."""
    return apply_fn, dict(kw)


def build(num_actions: int = 6, seed: int = 0, device: str = "cpu"):
    """Flax NatureDQN (random init) and the torch copy with identical weights (on `device`)."""
    from jaxsal_agents.networks import NatureDQN
    from experiments.benchmarks.peers.torch_nature import from_flax
    m = NatureDQN(num_actions)
    params = m.init(jax.random.PRNGKey(seed), np.zeros((1, 84, 84, 4), np.uint8))
    return m.apply, params, from_flax(params).to(device)


def noise_masks(h=84, w=84, radius=3.0, stride=3, blur_sigma=3.0):
    """The masks and blur matrices jaxsal's noise_sensitivity uses (Paper B: r 3, stride 3)."""
    from jaxsal.perturbation import _disk as D
    ys, xs = D.centres(h, stride), D.centres(w, stride)
    gy, gx = len(ys), len(xs)
    bh, bw = D.blur_matrix(h, radius), D.blur_matrix(w, radius)
    idx = jnp.arange(gy * gx)
    masks = jax.vmap(lambda i: D.disk_mask((i // gx) * stride, (i % gx) * stride, (h, w),
                                           radius=radius, shape="gaussian", bh=bh, bw=bw))(idx)
    return (np.asarray(masks), np.asarray(D.blur_matrix(h, blur_sigma)),
            np.asarray(D.blur_matrix(w, blur_sigma)), (gy, gx))


def cases(torch_model, rise_key, device: str = "cpu"):
    """name -> (family, jaxsal explain kwargs, peer fn(x), peer label, agreement spec).

    agreement spec: (extra jaxsal kwargs, peer fn for the check) comparing what both define
    the same, or None."""
    import torch
    from experiments.benchmarks.peers import methods as P
    from jaxsal.perturbation.rise import rise_masks
    nm, bh, bw, grid = noise_masks()
    nm_t, bh_t, bw_t = (torch.from_numpy(np.array(a)).to(device) for a in (nm, bh, bw))
    rmasks = torch.from_numpy(np.array(rise_masks(rise_key, 1000, (84, 84)))).to(device)
    rows = peer_rows(device)
    pgc = "pytorch-grad-cam (the library)" if P.pytorch_grad_cam_available() else \
        "torch hooks as pytorch-grad-cam (the library does not import here)"
    tm = torch_model
    occ = functools.partial(P.occlusion, tm, patch=2, stride=2)
    # torch's best chunk on CPU: 64-256 rows per forward ran ~2.3x faster than 1,000-4,096 (RISE)
    noise = functools.partial(P.noise_sensitivity, tm, masks=nm_t, bh=bh_t, bw=bw_t, grid_shape=grid,
                              chunk=rows)
    return {
        "gradient": ("gradient", dict(method="gradient"), functools.partial(P.gradient, tm),
                     "captum Saliency", ({}, None)),
        "guided_backprop": ("guided_backprop", dict(method="guided_backprop"),
                            functools.partial(P.guided_backprop, tm), "captum GuidedBackprop", ({}, None)),
        "integrated_gradients (32 steps)": (
            "integrated_gradients", dict(method="integrated_gradients", steps=32),
            functools.partial(P.integrated_gradients, tm, steps=32),
            "captum IntegratedGradients (riemann_right)", ({}, None)),
        "gradcam conv3 (captum)": ("gradcam", dict(method="gradcam", layer="conv3"),
                                   functools.partial(P.gradcam_captum, tm), "captum LayerGradCam",
                                   ({}, None)),
        "gradcam conv3": ("gradcam", dict(method="gradcam", layer="conv3"),
                          functools.partial(P.gradcam, tm), pgc, ({}, None)),
        "gradcam_pp conv3": ("gradcam_pp", dict(method="gradcam_pp", layer="conv3"),
                             functools.partial(P.gradcam_pp, tm), pgc, ({}, None)),
        "occlusion (2x2, stride 2)": (
            "occlusion", dict(method="occlusion", patch=2, stride=2), occ,
            "captum Occlusion (perturbations_per_eval=256)",
            (dict(score="drop", return_grid=True), functools.partial(occ, return_grid=True))),
        "noise_sensitivity (r 3, stride 3)": (
            "noise_sensitivity", dict(method="noise_sensitivity", radius=3.0, stride=3), noise,
            "batched torch (written here)", (dict(return_grid=True), functools.partial(noise, return_grid=True))),
        "rise (1000 masks)": (
            "rise", dict(method="rise", n_masks=1000, key=rise_key),
            functools.partial(P.rise, tm, masks=rmasks, chunk=rows), "batched torch (written here)",
            ({}, None)),
    }


def _obs(n: int, seed: int):
    return np.random.default_rng(seed).integers(0, 256, (n, 84, 84, 4), dtype=np.uint8)


def correlation(a, b) -> float:
    """Min over states of the Pearson correlation of the flattened maps (1.0 if both constant)."""
    a = np.asarray(a, np.float64).reshape(len(a), -1)
    b = np.asarray(b, np.float64).reshape(len(b), -1)
    out = []
    for u, v in zip(a, b):
        u, v = u - u.mean(), v - v.mean()
        den = np.sqrt((u * u).sum() * (v * v).sum())
        out.append(1.0 if den == 0 and np.allclose(u, v) else float((u * v).sum() / den) if den else 0.0)
    return min(out)


def agreement(apply_fn, params, name, case, n_states: int = 4, device: str = "cpu") -> dict:
    from experiments.benchmarks.peers.torch_nature import to_nchw
    family, kw, peer, label, (extra, peer_check) = case
    obs = _obs(n_states, 100)
    fn, kw = jaxsal_fn(apply_fn, kw)
    a = np.asarray(jaxsal.explain(fn, params, obs, **{**kw, **extra}))
    b = (peer_check or peer)(to_nchw(obs, device)).detach().cpu().numpy()
    # the plain path: XLA's conv gradients, every IG step / SmoothGrad sample whole (no affine-prefix
    # split) and, for local perturbations, no incremental windows
    no_inc = {"incremental": False} if family in ("occlusion", "noise_sensitivity") else \
        {} if family == "rise" else {"fast_conv": False, **(
            {"fast_prefix": False} if family in ("integrated_gradients", "smoothgrad") else {})}
    plain = np.asarray(jaxsal.explain(apply_fn, params, obs, **{**kw, **extra, **no_inc}))
    return {"corr_vs_peer": correlation(a, b), "corr_fast_vs_plain": correlation(a, plain),
            "max_abs_fast_vs_plain": float(np.abs(a - plain).max()), "compared": (
                "score grid" if extra.get("return_grid") else "map") + (
                " (drop score)" if extra.get("score") == "drop" else ""),
            "states": n_states}


def _block(out):
    jax.tree.map(lambda t: t.block_until_ready() if hasattr(t, "block_until_ready") else t, out)


REPLY = "@@against_peers "
"""Prefix of a worker's reply lines on stdout (anything else it prints is passed over)."""


def worker(side: str, device: str, torch_threads: int):
    """One side of the timing in a process of its own, driven by JSON lines on stdin:
    {"case", "n", "seed"} builds the case on n states and calls it once (compile / warm-up),
    {"time": true} times one more call; each reply is a line REPLY + {"t": seconds}."""
    import torch
    from experiments.benchmarks.peers.torch_nature import to_nchw
    torch.set_num_threads(torch_threads if side == "peer" else 1)
    apply_fn, params, tmodel = build(device=device)
    table = cases(tmodel, jax.random.PRNGKey(0), device)
    call = None
    for line in sys.stdin:
        msg = json.loads(line)
        if msg.get("quit"):
            return
        if "case" in msg:
            family, kw, peer, label, _ = table[msg["case"]]
            obs = _obs(msg["n"], msg["seed"])
            if side == "jaxsal":
                fn, kw = jaxsal_fn(apply_fn, kw)
                call = functools.partial(lambda o, f, k: _block(jaxsal.explain(f, params, o, **k)), obs, fn, kw)
            else:
                x = to_nchw(obs, device)
                call = functools.partial(lambda x, f: (f(x), sync(device)), x, peer)
        times = []
        for _ in range(max(1, int(msg.get("burst", 1)))):
            t = time.perf_counter()
            call()
            times.append(time.perf_counter() - t)
        # a burst: the calls after the first, which find the thread pools awake (a batch job's chunks)
        print(REPLY + json.dumps({"t": times[0] if len(times) == 1 else float(np.median(times[1:]))}), flush=True)


class Side:
    """A running worker process of one side."""

    def __init__(self, side: str, device: str, torch_threads: int):
        self.side = side
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "experiments.benchmarks.against_peers", "--worker", side,
             "--torch-device", device, "--torch-threads", str(torch_threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def ask(self, **msg) -> float:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY):])["t"]
        raise RuntimeError(f"the {self.side} worker stopped (exit code {self.proc.wait()}); its error is above")

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.write(json.dumps({"quit": True}) + "\n")
            self.proc.stdin.flush()
            self.proc.wait(timeout=60)


BURST = 4
"""Calls per side and round in the back-to-back timing: the median of the last BURST - 1 counts."""

PAUSE_S = 0.2
"""Idle time between one side's call and the other's (a finished thread pool's spinning ends)."""


def bench_pair(sides: dict, name: str, family: str, batch: int, budget: float, repeats: int, probe: int = 8):
    """Both sides timed on the same states, each in its own process, alternating call by call
    (which side goes first alternates by round); the budget caps the states timed. Both sides
    get host uint8 frames: jaxsal's call includes its transfer to the device; the peer's tensor
    is put on its device before the clock starts (what a torch user holds)."""
    J, T = sides["jaxsal"], sides["peer"]
    p = min(min(probe, 2) if family in PERTURBATION else probe, batch)
    first = J.ask(case=name, n=p, seed=1)           # compiles
    T.ask(case=name, n=p, seed=1)                   # warms torch/captum up
    pj, pt = J.ask(time=True) / p, T.ask(time=True) / p
    per_call = budget / (2 * repeats)
    n = batch if max(pj, pt) * batch <= per_call else max(p, int(per_call / max(pj, pt)))
    n = min(n, batch)
    J.ask(case=name, n=n, seed=2)                   # this shape's compile / warm-up
    T.ask(case=name, n=n, seed=2)
    tj, tt = [], []
    for r in range(repeats):
        for side in ((J, T) if r % 2 == 0 else (T, J)):
            time.sleep(PAUSE_S)
            (tj if side is J else tt).append(side.ask(time=True))
    ratios = [b / a for a, b in zip(tj, tt)]        # jaxsal maps/s over the peer's, per round
    warm = {}
    if family not in PERTURBATION:                  # back-to-back calls: the pools awake, as in a batch job
        wj, wt = [], []
        for r in range(repeats):
            for side in ((J, T) if r % 2 == 0 else (T, J)):
                time.sleep(PAUSE_S)
                (wj if side is J else wt).append(side.ask(time=True, burst=BURST))
        wr = [b / a for a, b in zip(wj, wt)]
        warm = {"jaxsal_warm_maps_per_s": n / float(np.median(wj)), "peer_warm_maps_per_s": n / float(np.median(wt)),
                "ratio_warm": float(np.median(wr)), "ratio_warm_min": min(wr), "ratio_warm_max": max(wr)}
    return {"batch": batch, "measured_states": n, "repeats": repeats, **warm,
            "jaxsal_maps_per_s": n / float(np.median(tj)), "peer_maps_per_s": n / float(np.median(tt)),
            "jaxsal_best_maps_per_s": n / min(tj), "peer_best_maps_per_s": n / min(tt),
            "ratio": float(np.median(ratios)), "ratio_min": min(ratios), "ratio_max": max(ratios),
            "ratio_best": min(tt) / min(tj), "jaxsal_first_call_s": first, "load_avg_1": os.getloadavg()[0]}


def run_child(args: list, timeout: float) -> dict | list:
    """Run experiments.benchmarks.peak_memory in a fresh interpreter and parse its JSON output (an error dict if it fails)."""
    try:
        p = subprocess.run([sys.executable, "-m", "experiments.benchmarks.peak_memory", *map(str, args)],
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1][:300]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def scaling(sizes, timeout: float = 1200) -> list:
    """jaxsal vanilla-gradient maps/s and peak RSS at growing N, streamed in a fresh process."""
    rows = run_child(["--scaling", *sizes], timeout)
    return rows if isinstance(rows, list) else [rows]


def memory(names, table, timeout: float = 300, device: str = "cpu") -> dict:
    """Peak RSS (and on a GPU peak device memory) per case and side, each in a fresh process
    (gradient family on 256 states, perturbation methods on 2: their memory is set by the
    chunk, not by N)."""
    res = {}
    for name in names:
        n = 2 if table[name][0] in PERTURBATION else 256
        res[name] = {side: run_child(["--case", name, "--side", side, "--n", n, "--torch-device", device],
                                     timeout) for side in ("jaxsal", "peer")}
        j, p = res[name]["jaxsal"], res[name]["peer"]
        print(f"memory {name:36s} n={n}: jaxsal peak {j.get('peak_rss_mb', -1):.0f} MB "
              f"(+{j.get('extra_mb', -1):.0f}), peer peak {p.get('peak_rss_mb', -1):.0f} MB "
              f"(+{p.get('extra_mb', -1):.0f})", flush=True)
    return res


def machine(torch_threads: int, device: str = "cpu") -> dict:
    from experiments.common.machine import machine_info
    info = machine_info()
    import torch
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["torch_build"] = torch_build_note(device)
    info["torch_threads"] = torch.get_num_threads()
    info["torch_interop_threads"] = torch.get_num_interop_threads()
    info["torch_device"] = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    from experiments.benchmarks.peers import methods as P
    try:
        import captum
        info["captum"] = captum.__version__
    except Exception as e:  # noqa: BLE001
        info["captum"] = f"does not import: {type(e).__name__}: {str(e)[:120]}"
    info["pytorch_grad_cam"] = P.pytorch_grad_cam_status()
    info["jaxsal_threads"] = "XLA:CPU default (one Eigen pool over all cores)"
    return info


def torch_build_note(device: str) -> str:
    """'CPU build', 'CUDA x.y build' or, for a CUDA build timed on the CPU, the warning."""
    import torch
    return build_note(torch.version.cuda, on_cpu=device == "cpu")


def check_torch_build(device: str, allow_cuda_build: bool):
    """Refuse to time a CUDA build of torch on the CPU (the peers would look several times slower
    than they are) unless asked to, in which case every table says so."""
    import torch
    if device == "cpu":
        refuse_cuda_on_cpu(torch.__version__, torch.version.cuda, allow_cuda_build)


def load_note(res: dict) -> str:
    """How busy the machine was. The benchmark itself keeps every core busy (load ~ cores); above
    1.5 runnable tasks per core something else competes and the ratios are unreliable (torch's
    thread pool suffers far more than XLA's from oversubscription: an earlier run at load 8 on
    2 cores overstated jaxsal's ratios up to 12x)."""
    info = res["machine"]
    start, end = info.get("load_avg_1_5_15") or [float("nan")], res.get("load_avg_end") or [float("nan")]
    busy = max(start[0], end[0]) > 1.5 * info["cpu_count"]
    msg = f"Load average (1 min) {start[0]:.1f} at start, {end[0]:.1f} at end: "
    if busy:
        return msg + ("**the machine was busy, so these ratios are unreliable** (oversubscribed "
                      "torch thread pools slow down far more than XLA's); rerun on a quiet machine.")
    how = ("each side in its own process, alternating call by call on the same states." if "rounds" in res
           else "both sides interleaved on the same states in one process.")
    return msg + "no other work competed (the benchmark itself keeps the cores busy); " + how


def build_warning(info: dict) -> list:
    """A bold line for the tables when the peers ran on a CUDA build of torch on the CPU."""
    cuda_on_cpu = CUDA_ON_CPU in info.get("torch_build", "") or (
        "+cu" in info.get("torch", "") and info.get("torch_device", "cpu") == "cpu")
    return [f"**Warning: {CUDA_ON_CPU}.**", ""] if cuda_on_cpu else []


def write(res: dict, out: Path):
    out.mkdir(parents=True, exist_ok=True)
    (out / "against_peers.json").write_text(json.dumps(res, indent=2))
    info = res["machine"]
    L = [f"# jaxsal vs Captum / pytorch-grad-cam / torch ({info['backend']}, {info['date_utc']})", "",
         f"Nature-CNN DQN (6 actions, random init), identical weights in flax and torch, random uint8 "
         f"(N, 84, 84, 4) states. Machine: {info.get('cpu', '?')}, {info['cpu_count']} cores; "
         f"{load_note(res)} "
         f"jax {info['jax']}, flax {info.get('flax')}, torch {info['torch']} "
         f"({info.get('torch_build', 'build not recorded')}) on {info.get('torch_device', 'cpu')} "
         f"({info['torch_threads']} intra-op / {info['torch_interop_threads']} inter-op threads), "
         f"captum {info.get('captum')}, pytorch-grad-cam {info.get('pytorch_grad_cam')}, Python "
         f"{info['python']}. jaxsal side: `jaxsal.explain(apply_fn, ...)` at its defaults "
         f"(XLA:CPU threads: {info['jaxsal_threads']}; XLA_FLAGS `{info.get('xla_flags') or '(none)'}`).", "",
         *build_warning(info), "## Agreement (before timing)", "",
         "Pearson correlation per state, minimum over states; `fast vs plain`: jaxsal's fast path "
         "against its own plain lax.conv path.", "",
         "| method | peer | compared | corr vs peer | corr fast vs plain | max abs fast-plain |",
         "|---|---|---|---|---|---|"]
    for name, a in res["agreement"].items():
        if "error" in a:
            L.append(f"| {name} | {res['peers'][name]} | - | error: {a['error']} | | |")
            continue
        L.append(f"| {name} | {res['peers'][name]} | {a['compared']} | {a['corr_vs_peer']:.6f} | "
                 f"{a['corr_fast_vs_plain']:.6f} | {a['max_abs_fast_vs_plain']:.2e} |")
    L += ["", "## Maps/s (median of rounds; ratio = jaxsal / peer, per round)", "",
          "Each side runs in its own process; a round times one call of each, alternating which goes "
          "first. `ratio` is the median over rounds of the per-round ratio, `range` its spread. "
          "`measured` < batch: the call was timed on fewer states to fit the time budget "
          f"(both sides on the same states). {_goals_line(res)} " + (
              "MFLOP/map: what jaxsal computes per map (XLA's cost analysis of the call compiled as one "
              "program); % peak: jaxsal's achieved FLOP/s (maps/s x MFLOP/map) over the "
              if res.get("jaxsal_mflop_per_map") else
              "MFLOP/map: the plain algorithm's forward-pass equivalents x "
              f"{res['forward_flops'] / 1e6:.1f} MFLOP per forward (the peer's work, not jaxsal's); % peak: "
              "maps/s x MFLOP/map over the ") +
          f"machine peak {res['peak_flops'] / 1e9:.0f} GFLOP/s ({res['peak_note']}).", "",
          "| method | peer | batch | measured | jaxsal maps/s | peer maps/s | ratio | range | ratio (best) | "
          "goal | MFLOP/map | jaxsal % peak | jaxsal first call s |",
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, rows in res["timing"].items():
        fam = res["families"][name]
        for r in rows:
            if "error" in r:
                L.append(f"| {name} | {res['peers'][name]} | {r['batch']} | - | error: {r['error']} "
                         f"| | | | | | | | |")
                continue
            goal = GOALS[fam]
            measured = (res.get("jaxsal_mflop_per_map") or {}).get(name)
            flops = measured * 1e6 if measured else forward_equivalents(fam) * res["forward_flops"]
            met = " met" if r["ratio"] >= goal else " **not met**"
            L.append(f"| {name} | {res['peers'][name]} | {r['batch']} | {r['measured_states']} | "
                     f"{r['jaxsal_maps_per_s']:.1f} | {r['peer_maps_per_s']:.1f} | {r['ratio']:.2f} | "
                     f"{_range(r)} | {r['ratio_best']:.2f} | {goal}{met} | {flops / 1e6:.0f} | "
                     f"{100 * r['jaxsal_maps_per_s'] * flops / res['peak_flops']:.1f} | "
                     f"{r.get('jaxsal_first_call_s', float('nan')):.2f} |")
    warm = [(name, r) for name, rows in res["timing"].items() for r in rows if "ratio_warm" in r]
    if warm:
        L += ["", "## Back-to-back calls (thread pools awake)", "",
              f"The table above times one call after {PAUSE_S} s idle on each side, so each call first wakes "
              f"its framework's worker threads, as a single call in a notebook does. Here each side makes "
              f"{BURST} calls in a row per round and the last {BURST - 1} count (median), as a batch job's "
              "chunks run; the goals are judged on the table above.", "",
              "| method | batch | jaxsal maps/s | peer maps/s | ratio | range |", "|---|---|---|---|---|---|"]
        for name, r in warm:
            L.append(f"| {name} | {r['batch']} | {r['jaxsal_warm_maps_per_s']:.1f} | {r['peer_warm_maps_per_s']:.1f} | "
                     f"{r['ratio_warm']:.2f} | {r['ratio_warm_min']:.2f}-{r['ratio_warm_max']:.2f} |")
    if res.get("memory"):
        L += ["", "## Peak memory (fresh process per case and side)", "",
              "Peak RSS (VmHWM) of a fresh process that builds the model and explains N random "
              "states once (includes the framework runtime and jaxsal's compilation); `extra` = peak "
              "minus the RSS just before the call's inputs were built. On a GPU also the peak device "
              "memory in use (jax: the allocator's peak_bytes_in_use; torch: max_memory_allocated).", "",
              "| method | N | jaxsal peak MB | jaxsal extra MB | peer peak MB | peer extra MB | "
              "jaxsal device peak MB | peer device peak MB |",
              "|---|---|---|---|---|---|---|---|"]
        for name, m in res["memory"].items():
            j, p = m["jaxsal"], m["peer"]
            cell = lambda d, k: f"{d[k]:.0f}" if k in d else d.get("error", "-")  # noqa: E731
            L.append(f"| {name} | {j.get('n', p.get('n', '-'))} | {cell(j, 'peak_rss_mb')} | "
                     f"{cell(j, 'extra_mb')} | {cell(p, 'peak_rss_mb')} | {cell(p, 'extra_mb')} | "
                     f"{cell(j, 'device_peak_mb')} | {cell(p, 'device_peak_mb')} |")
    if res.get("scaling"):
        L += ["", "## jaxsal vanilla gradient at growing N (streamed, 1,024 states per call, "
              "plain apply_fn, default chunks; fresh process)", "",
              "| N | maps/s | seconds | peak RSS MB |", "|---|---|---|---|"]
        L += [f"| {r['n']} | {r['maps_per_s']:.0f} | {r['seconds']:.1f} | {r['peak_rss_mb']:.0f} |"
              if "n" in r else f"| error: {r.get('error')} | | | |" for r in res["scaling"]]
    if res.get("notes"):
        L += ["", "## Notes", ""] + [f"- {n}" for n in res["notes"]]
    (out / "against_peers.md").write_text("\n".join(L) + "\n")
    (out / "against_peers_README_section.md").write_text(readme_section(res))
    plot(res, out / "against_peers.png")


def _goals_line(res: dict) -> str:
    """How many timed cells meet their family's goal (`goal` column), and which do not."""
    cells = [(name, r) for name, rows in res["timing"].items() for r in rows if "error" not in r]
    below = [f"{name} at {r['batch']} ({r['ratio']:.2f})" for name, r in cells
             if r["ratio"] < GOALS[res["families"][name]]]
    return (f"Each family's goal (`goal` column) applies at every batch: {len(cells) - len(below)} of {len(cells)} "
            "cells meet it" + (f"; not met: {', '.join(below)}." if below else "."))


def _range(r: dict) -> str:
    return f"{r['ratio_min']:.2f}-{r['ratio_max']:.2f}" if "ratio_min" in r else "not recorded"


DOCS_BEGIN = "<!-- against_peers table: generated by `python -m experiments.benchmarks.against_peers --render RESULTS.json --docs docs/benchmarks.md` -->"
DOCS_END = "<!-- end of the generated table -->"


def docs_table(res: dict, source: str) -> str:
    """The docs page's table: per method, jaxsal / peer at each batch (median over rounds, with its
    range) against the goal, with the machine, load and torch build it ran with."""
    info, batches = res["machine"], res["batches"]
    L = [f"Measured {info['date_utc'][:10]} on {info.get('cpu', '?')} ({info['cpu_count']} cores), jax "
         f"{info['jax']}, torch {info['torch']} ({info.get('torch_build', 'build not recorded')}, "
         f"{info['torch_threads']} threads), Captum {info.get('captum')}, pytorch-grad-cam "
         f"{info.get('pytorch_grad_cam')}. {load_note(res)} Results: `{source}`.", "", *build_warning(info),
         "| method | peer | " + " | ".join(f"batch {b}" for b in batches) + " | goal |",
         "|---|---|" + "---:|" * len(batches) + "---:|"]
    for name, rows in res["timing"].items():
        by = {r["batch"]: r for r in rows}
        goal = GOALS[res["families"][name]]
        cells = []
        for b in batches:
            r = by.get(b)
            if r is None or "error" in r:
                cells.append("error" if r else "-")
                continue
            mark = "" if r["ratio"] >= goal else " (below)"
            cells.append(f"{r['ratio']:.2f}" + (f" ({_range(r)})" if "ratio_min" in r else "") + mark)
        L.append(f"| {name} | {res['peers'][name]} | " + " | ".join(cells) + f" | {goal} |")
    ranged = all("ratio_min" in r for rows in res["timing"].values() for r in rows if "error" not in r)
    L += ["", "Each cell: jaxsal's maps/s over the peer's, the median over rounds of the per-round ratio" + (
          ", with its range over rounds in brackets" if ranged else " (this run recorded no per-round range)")
          + "; \"(below)\" marks a cell under the goal."]
    fewer = _fewer_states(res)
    if fewer:
        L += ["", "Timed on fewer states than the batch, to fit the time budget (both sides on the same states; "
              "states timed at batch " + " / ".join(str(b) for b in batches) + "): " + "; ".join(fewer) + "."]
    return "\n".join(L)


def _fewer_states(res: dict) -> list[str]:
    """'method a / b / c' for each method with a batch timed on fewer states than the batch."""
    out = []
    for name, rows in res["timing"].items():
        by = {r["batch"]: r for r in rows if "error" not in r}
        got = [by[b].get("measured_states", b) if b in by else None for b in res["batches"]]
        if any(g is not None and g < b for g, b in zip(got, res["batches"])):
            out.append(f"{name} " + " / ".join("-" if g is None else str(g) for g in got))
    return out


def render_docs(res: dict, page: Path, source: str) -> str:
    """`page`'s text with the block between DOCS_BEGIN and DOCS_END replaced by docs_table(res)."""
    from experiments.common.docs import replace_block
    return replace_block(page, DOCS_BEGIN, DOCS_END, docs_table(res, source))


def readme_section(res: dict) -> str:
    """The README's summary: ratio jaxsal/peer at batch 256 per method against its family's goal."""
    info = res["machine"]
    L = ["## Speed against Captum and pytorch-grad-cam", "",
         f"`python -m experiments.benchmarks.throughput --against captum` (needs `pip install 'jaxsal[bench]'`) "
         f"builds the Nature-CNN DQN in flax and torch with identical weights, compares the maps "
         f"(Pearson correlation per state, the minimum in the `corr` column), then times "
         f"both sides interleaved. jaxsal runs with XLA:CPU's YNNPACK kernels "
         f"(turned on by `import jaxsal`; XLA_FLAGS `{info.get('xla_flags') or '(none)'}`), all "
         f"at library defaults with no opt-ins: the gradient and CAM methods run strided convs' "
         f"input gradient as space-to-depth matmuls (a rule on the traced function, tested equal "
         f"to the plain path); occlusion and noise sensitivity recompute only the conv windows "
         f"a patch touches (tested equal to the plain path). Peer RISE / noise sensitivity: {PEER_ROWS} rows "
         f"per torch forward (its fastest here). Peak memory: peak RSS of a fresh process per method "
         f"and side (256 states; perturbation methods 2). Measured {info['date_utc'][:10]} on "
         f"{info.get('cpu', '?')} ({info['cpu_count']} cores). {load_note(res)} "
         f"jax {info['jax']}, torch {info['torch']} "
         f"({info['torch_threads']} threads), captum {info.get('captum')}. Full table at every batch timed, and "
         f"plot: `experiments/results/against_peers.{{md,png,json}}`.", "",
         "| method | peer | corr | jaxsal maps/s | peer maps/s | ratio @256 | goal | "
         "peak MB jaxsal / peer |",
         "|---|---|---|---|---|---|---|---|"]
    for name, rows in res["timing"].items():
        r = next((r for r in rows if r.get("batch") == 256 and "error" not in r), None)
        a = res["agreement"].get(name, {})
        corr = f"{a['corr_vs_peer']:.4f}" if "corr_vs_peer" in a else "-"
        goal = GOALS[res["families"][name]]
        mem = res.get("memory", {}).get(name, {})
        mem = "{} / {}".format(*(f"{mem[k]['peak_rss_mb']:.0f}" if "peak_rss_mb" in mem.get(k, {})
                                 else "-" for k in ("jaxsal", "peer")))
        if r is None:
            L.append(f"| {name} | {res['peers'][name]} | {corr} | - | - | - | {goal} | {mem} |")
            continue
        met = "met" if r["ratio"] >= goal else "not met"
        L.append(f"| {name} | {res['peers'][name]} | {corr} | {r['jaxsal_maps_per_s']:.1f} | "
                 f"{r['peer_maps_per_s']:.1f} | {r['ratio']:.2f} | {goal} ({met}) | {mem} |")
    if res.get("summary_notes"):
        L += [""] + [f"- {n}" for n in res["summary_notes"]]
    return "\n".join(L) + "\n"


def plot(res: dict, path: Path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(res["timing"])
    batches = sorted({r["batch"] for rows in res["timing"].values() for r in rows if "error" not in r})
    if not names or not batches:
        return
    fig, axes = plt.subplots(1, 2, figsize=(14, 0.5 * len(names) + 2.5))
    y = np.arange(len(names))
    h = 0.8 / max(1, len(batches))
    for k, b in enumerate(batches):
        rat, mj, mp = [], [], []
        for n in names:
            r = next((r for r in res["timing"][n] if r["batch"] == b and "error" not in r), None)
            rat.append(r["ratio"] if r else np.nan)
            mj.append(r["jaxsal_maps_per_s"] if r else np.nan)
            mp.append(r["peer_maps_per_s"] if r else np.nan)
        axes[0].barh(y + k * h, mj, h, label=f"jaxsal, batch {b}")
        axes[0].scatter(mp, y + k * h, marker="|", s=120, color="k",
                        label="peer" if k == 0 else None)
        axes[1].barh(y + k * h, rat, h, label=f"batch {b}")
    for n_i, n in enumerate(names):
        axes[1].plot([GOALS[res["families"][n]]] * 2, [n_i - 0.1, n_i + 0.9], "r--", lw=1)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("maps/s (bars jaxsal, | peer)")
    axes[1].axvline(1.0, color="grey", lw=1)
    axes[1].set_xlabel("ratio jaxsal / peer (red dashes: goal)")
    for ax in axes:
        ax.set_yticks(y + 0.4 - h / 2)
        ax.set_yticklabels(names)
        ax.legend(fontsize=7)
    fig.suptitle(f"jaxsal vs peers, {res['machine'].get('cpu', '')}, {res['machine']['date_utc']}",
                 fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="batches 4 and 16, 2 rounds, a small budget (a check that it runs)")
    ap.add_argument("--batches", type=int, nargs="*", default=None)
    ap.add_argument("--methods", nargs="*", default=None, help="case names (default: all)")
    ap.add_argument("--budget", type=float, default=None,
                    help="seconds of timed calls per case and batch (both sides, all repeats)")
    ap.add_argument("--repeats", type=int, default=None, help="rounds per case and batch (default 5; quick 2)")
    ap.add_argument("--allow-cuda-build-on-cpu", action="store_true",
                    help="time a CUDA build of torch on the CPU anyway (refused otherwise: it runs the peers "
                         "several times slower than torch's CPU build); every table is flagged")
    ap.add_argument("--worker", choices=["jaxsal", "peer"], help=argparse.SUPPRESS)
    ap.add_argument("--docs", type=Path, default=None,
                    help="with --render: also regenerate this docs page's table (docs/benchmarks.md)")
    ap.add_argument("--torch-threads", type=int, default=2)
    ap.add_argument("--torch-device", choices=["auto", "cpu", "cuda"], default="auto",
                    help="where the torch peers run (auto: the GPU when torch sees one)")
    ap.add_argument("--scaling", type=int, nargs="*", default=None,
                    help="also time jaxsal's gradient at these N (default 1000 10000 100000; "
                         "quick: 1000; none: skip)")
    ap.add_argument("--no-memory", action="store_true", help="skip the peak-memory children")
    ap.add_argument("--memory-only", action="store_true",
                    help="only add the peak-memory children to the results already under --out "
                         "(a time-boxed run can time first and measure memory last)")
    ap.add_argument("--xla-defaults", action="store_true",
                    help="check that XLA:CPU runs its default kernels on the jaxsal side (set "
                         "JAXSAL_FAST_CPU=0 in the environment: `import jaxsal` reads it)")
    ap.add_argument("--peak-gflops", type=float, default=None,
                    help="machine peak FP32 GFLOP/s for the %% peak column (default: measured, the best "
                         "float32 matmul of PEAK_SHAPES here)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--against", default="captum", help=argparse.SUPPRESS)
    ap.add_argument("--render", type=Path, default=None,
                    help="only re-render .md/.png/README section from this results .json")
    ap.add_argument("--agreement-from", type=Path, default=None,
                    help="reuse the agreement table of an earlier results .json (same seed/model)")
    args = ap.parse_args(argv)
    if args.worker:
        return worker(args.worker, args.torch_device, args.torch_threads)
    if args.render:
        res = json.loads(args.render.read_text())
        write(res, args.out)
        if args.docs:
            args.docs.write_text(render_docs(res, args.docs, args.render.as_posix()))
        return res
    try:
        import torch
    except ImportError:
        raise SystemExit("the peer benchmark needs the bench extra: pip install 'jaxsal[bench]'")
    torch.set_num_threads(args.torch_threads)
    from experiments.benchmarks.peers import methods as P
    if args.xla_defaults and "ynn_fusion_type" in os.environ.get("XLA_FLAGS", ""):
        raise SystemExit("--xla-defaults: `import jaxsal` already turned on the YNNPACK kernels; "
                         "run with JAXSAL_FAST_CPU=0 in the environment instead")
    batches = args.batches or ([4, 16] if args.quick else [64, 256, 1024])
    budget = args.budget or (2.0 if args.quick else 30.0)
    repeats = args.repeats or (2 if args.quick else 5)
    device = torch_device(args.torch_device)
    check_torch_build(device, args.allow_cuda_build_on_cpu)
    apply_fn, params, tmodel = build(device=device)
    table = cases(tmodel, jax.random.PRNGKey(0), device)
    names = args.methods or list(table)
    cores = os.cpu_count() or 1
    measured = None if args.peak_gflops else matmul_peak()
    peak = args.peak_gflops * 1e9 if args.peak_gflops else measured["flops"]
    res = {"machine": machine(args.torch_threads, device), "batches": batches, "budget_s": budget,
           "rounds": repeats, "commit": _commit(),
           "forward_flops": nature_forward_flops(6), "peak_flops": peak,
           "peak_note": "given (--peak-gflops)" if args.peak_gflops else
           f"measured: the best float32 jnp.dot of {', '.join(measured['per_shape'])} (m x k x n) on "
           f"{cores} cores, median of 7 calls",
           "peak_per_shape": None if measured is None else measured["per_shape"],
           "peers": {n: table[n][3] for n in names}, "families": {n: table[n][0] for n in names},
           "agreement": {}, "timing": {}, "notes": [
               "jaxsal runs at its library defaults with the plain apply_fn: strided convs' "
               "input gradient as space-to-depth matmuls in the gradient and CAM methods (conv1/"
               "conv2), incremental conv windows for local perturbations, XLA:CPU's YNNPACK "
               "kernels (turned on by `import jaxsal`; JAXSAL_FAST_CPU=0 in the environment "
               "turns them off). The agreement table's `fast vs plain` compares with "
               "fast_conv=False and incremental=False.",
               f"Peer noise sensitivity and RISE run {peer_rows(device)} rows per torch forward "
               f"on {device}" + (": measured on the 2-core CPU, 64-256 rows ran RISE ~2.3x and noise "
                                 "sensitivity ~1.4x faster than 1,000-4,096." if device == "cpu" else
                                 " (small forwards leave a GPU idle)."),
               *([P.TORCHVISION_STAND_IN] if "stand-in" in P.pytorch_grad_cam_status() else []),
               "Grad-CAM/Grad-CAM++ peers min-max scale each map (pytorch-grad-cam's output); "
               "jaxsal returns ReLU(sum_k w_k A^k) upsampled, so the comparison is by correlation.",
               "Occlusion is compared on the per-patch drop grid t(x) - t(x') (Captum's definition); "
               "timed with jaxsal's default score 1 - Q_a(x'), same cost. Noise sensitivity is "
               "compared on the score grid; the torch side uses jaxsal's masks and blur matrices."]}
    out = args.out
    if args.memory_only:
        res = json.loads((out / "against_peers.json").read_text())
        names = args.methods or list(res["timing"])
        res["memory"] = {**res.get("memory", {}), **memory(names, table, device=device)}
        res["load_avg_end"] = list(os.getloadavg())
        write(res, out)
        return res
    prev = json.loads(args.agreement_from.read_text())["agreement"] if args.agreement_from else {}
    for name in names:
        if name in prev and "error" not in prev[name]:
            res["agreement"][name] = prev[name]
            continue
        try:
            res["agreement"][name] = a = agreement(apply_fn, params, name, table[name], device=device)
            print(f"agree {name:36s} corr vs peer {a['corr_vs_peer']:.6f}  fast vs plain "
                  f"{a['corr_fast_vs_plain']:.6f}", flush=True)
        except Exception as e:  # noqa: BLE001 (recorded, the benchmark goes on)
            res["agreement"][name] = {"error": f"{type(e).__name__}: {e}"[:300]}
            print(f"agree {name}: {res['agreement'][name]['error']}", flush=True)
    res["jaxsal_mflop_per_map"] = {}
    for name in names:
        try:
            res["jaxsal_mflop_per_map"][name] = jaxsal_mflop_per_map(apply_fn, params, table[name][0], table[name][1])
        except Exception as e:  # noqa: BLE001 (the table falls back to the peer algorithm's count)
            print(f"flops {name}: {type(e).__name__}: {e}"[:300], flush=True)
    write(res, out)
    sides = {s: Side(s, device, args.torch_threads) for s in ("jaxsal", "peer")}
    try:
        _time_all(res, names, table, sides, batches, budget, repeats, out)
    finally:
        for side in sides.values():
            side.close()
    if not args.no_memory:
        res["memory"] = memory(names, table, device=device)
        res["load_avg_end"] = list(os.getloadavg())
        write(res, out)
    sizes = args.scaling if args.scaling is not None else (
        [] if args.quick else [1000, 10000, 100000])
    if sizes:
        res["scaling"] = scaling(sizes)
        res["load_avg_end"] = list(os.getloadavg())
        write(res, out)
    print(f"wrote {out}/against_peers.json, .md, .png")
    return res


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).parent).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def _time_all(res, names, table, sides, batches, budget, repeats, out):
    for name in names:
        rows = []
        for b in batches:
            try:
                r = bench_pair(sides, name, table[name][0], b, budget, repeats)
                print(f"{name:36s} batch {b:5d} ({r['measured_states']:4d} timed): jaxsal "
                      f"{r['jaxsal_maps_per_s']:9.1f}  peer {r['peer_maps_per_s']:9.1f} maps/s  "
                      f"ratio {r['ratio']:.2f}", flush=True)
            except Exception as e:  # noqa: BLE001
                r = {"batch": b, "error": f"{type(e).__name__}: {e}"[:300]}
                print(f"{name} batch {b}: {r['error']}", flush=True)
            rows.append(r)
        res["timing"][name] = rows
        res["load_avg_end"] = list(os.getloadavg())
        write(res, out)


if __name__ == "__main__":
    main()
