"""Paper B re-run on many episodes and randomisation draws (issue 42, item 2): the runner of
experiments/paper_b/rerun_registration.md. One game per call, resumable, per-state results
with episode ids; the registered analysis is experiments/paper_b/rerun_analysis.py.

    python -m experiments.paper_b.rerun --game mspacman              # the registered size (hours)
    python -m experiments.paper_b.rerun --game mspacman --analyse    # only re-run the analysis
    python -m experiments.paper_b.rerun --estimate                   # hours per game from timing.csv

States: EPISODES independent full games of the agent (episode e: env seed env_seed(seed, e),
EnvPool's 0-29 no-op start drawn by that seed, epsilon-greedy actions with EPSILON from a
generator seeded by the same number), STATES // EPISODES states per episode spread evenly
over the whole game (`spread_steps`). The sanity check runs on SANITY_STATES // EPISODES of
each episode's states (spread evenly over them) x DRAWS randomisation draws. Every piece of
work (an episode, a method's maps, its fidelity, one sanity draw) is cached under --cache as
its own .npz written atomically, so a run stopped anywhere resumes where it stopped. The cache
is large (the frames and maps); what outlives the machine is the progress folder
(--progress, by default --out/<game>/progress/, `paper_b_rerun_progress`): the episodes as
seeds and actions, each method's finished results, written as they finish and restored at
the start (episodes by an exact, hash-checked replay), so a session on a fresh machine only
computes what no earlier session finished. Outputs go to --out/<game>/ once every piece is done.
"""
from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.hashing import sha256_array, sha256_tree
from experiments.common.machine import git_state, provenance
from experiments.common.paths import RESULTS
from experiments.paper_b import run as PB
from experiments.paper_b import rerun_analysis as A
from experiments.paper_b import rerun_progress as P
from experiments.paper_b import rerun_summary
from experiments.paper_b.rerun_progress import load_npz, save_npz
from jaxsal.metrics import sanity_check
from jaxsal.metrics.sanity import _layer_names, group_norms

OUT = RESULTS / "paper_b_rerun"
CACHE = Path("~/jaxsal-runs/paper_b_rerun")
EPISODES, STATES, SANITY_STATES, DRAWS = 20, 1000, 200, 10
BATCH_SIZE = 1020   # rows per forward pass of the fidelity curves (the maps run at the library's defaults)
EPSILON = 0.01                 # the shipped agents' final training epsilon
MAX_EPISODE_STEPS = 27_000     # 108,000 frames, EnvPool's and the cards' evaluation cap
SEED = 0
DECIMALS = 5                   # the outputs' precision: the progress folder keeps the results at it
SETTINGS = [(mode, sub, score) for mode in PB.MODES for sub, score in PB.SETTINGS]
HOG_FIX = "8c14aeac"           # the HOG similarity fix (rerun_deviations.md, deviation 4)
UNRECORDED = "unrecorded"      # the host (or commit) of a piece recorded before it was


def env_seed(seed: int, episode: int) -> int:
    """The env (and exploration) seed of episode `episode`: 1000 (seed + 1) + episode, away from
    the committed study's seed 0."""
    return 1000 * (seed + 1) + episode


def spread(n: int, k: int) -> np.ndarray:
    """k indices spread evenly over range(n) (round(linspace(0, n - 1, k))); all n when n <= k."""
    if n <= k:
        return np.arange(n)
    return np.round(np.linspace(0, n - 1, k)).astype(int)


def spread_steps(length: int, k: int) -> np.ndarray:
    """The steps an episode of `length` steps contributes: s = the smallest power of two that
    leaves at most 2k multiples of s in [0, length); of those multiples, the k at `spread`."""
    if length <= k:
        return np.arange(length)
    s = 1
    while (length - 1) // s + 1 > 2 * k:
        s *= 2
    kept = np.arange(0, length, s)
    return kept[spread(len(kept), k)]


class SpreadBuffer:
    """Streams an episode and keeps at most 2k + 1 observations, ending with exactly the states at
    `spread_steps(length, k)` (the episode's length is not known while it is played)."""

    def __init__(self, k: int):
        self.k, self.stride, self.steps, self.obs = k, 1, [], []

    def add(self, t: int, obs) -> None:
        if t % self.stride:
            return
        self.steps.append(t)
        self.obs.append(np.asarray(obs))
        if len(self.steps) > 2 * self.k:
            self.stride *= 2
            keep = [i for i, s in enumerate(self.steps) if s % self.stride == 0]
            self.steps = [self.steps[i] for i in keep]
            self.obs = [self.obs[i] for i in keep]

    def result(self) -> tuple[np.ndarray, np.ndarray]:
        pick = spread(len(self.steps), self.k)
        return np.asarray(self.steps)[pick], np.stack([self.obs[i] for i in pick])


def play_episode(agent, game: str, seed: int, k: int, epsilon: float = EPSILON,
                 max_steps: int = MAX_EPISODE_STEPS, make_env=None, actions=None) -> dict:
    """One full game (or `max_steps` steps) with epsilon-greedy actions; k states spread over it.
    actions: replay these recorded actions instead of asking the agent (the exploration draws are
    still made, so a consistent record reproduces the same game, hashes included)."""
    from jaxsal_agents.envs import make_env as _make
    env = (make_env or _make)(game, 1, train=False, seed=seed)
    rng = np.random.default_rng(seed)
    policy = None if actions is not None else jax.jit(agent.apply_fn)
    buf, traj, taken = SpreadBuffer(k), hashlib.sha256(), []
    obs, ret, t, explored, done = env.reset(), 0.0, 0, 0, False
    while not done and t < max_steps:
        if actions is not None and t >= len(actions):
            break                   # the record ends early: the length check refuses the replay
        buf.add(t, obs[0])
        if actions is None:
            a = int(jnp.argmax(_q(policy(agent.params, jnp.asarray(obs)))[0]))
        else:
            a = int(actions[t])
        if rng.random() < epsilon:
            a, explored = int(rng.integers(env.num_actions)), explored + 1
        traj.update(np.ascontiguousarray(obs).tobytes() + a.to_bytes(2, "little"))
        taken.append(a)
        obs, reward, d, _ = env.step(np.array([a]))
        ret += float(reward[0])
        done, t = bool(d[0]), t + 1
    steps, states = buf.result()
    return {"obs": states, "steps": steps, "length": t, "return": ret, "truncated": not done,
            "random_actions": explored, "env_seed": seed, "trajectory_sha256": traj.hexdigest(),
            "actions": np.asarray(taken, np.int32)}


def _q(out):
    return out["q"] if isinstance(out, dict) else out


# ------------------------------------------------------------------ cache
def collect_states(agent, game, args, cache: Path, log=print, progress: P.Progress | None = None) -> dict:
    """Every registered episode, cached one file each (a recorded one replayed from `progress`,
    a new one recorded there); the states in study order: each episode's sanity states first
    (episode by episode), then the rest, so the sanity states are a prefix (maps of a prefix of
    the states are the prefix of the maps)."""
    k, k_s = args.states // args.episodes, args.sanity_states // args.episodes
    progress = progress or P.Progress(None, {})
    eps, e = [], 0
    while e < args.episodes or sum(len(x["steps"]) for x in eps) < args.states:
        f = cache / "episodes" / f"ep{e:03d}.npz"
        if not f.exists():
            if progress.has_episode(e):
                log(f"[{game}] episode {e}: replaying its recorded actions")
                r = progress.replay_episode(e, lambda seed, actions: play_episode(
                    None, game, seed, k, args.epsilon, args.max_episode_steps, actions=actions))
            else:
                log(f"[{game}] episode {e} (seed {env_seed(args.seed, e)})")
                r = play_episode(agent, game, env_seed(args.seed, e), k, args.epsilon, args.max_episode_steps)
            save_npz(f, **{key: np.asarray(v) for key, v in r.items()})
        eps.append(load_npz(f))
        if "actions" not in eps[-1] and progress.root is not None:
            raise P.ProgressMismatch(f"{f} was cached without its actions, so it cannot be recorded for another "
                                     f"machine; start from an empty --cache (or pass --no-progress)")
        if progress.has_episode(e):
            progress.check_episode(e, eps[-1])      # a cache from another run is refused, not mixed
        else:
            progress.save_episode(e, eps[-1])
        e += 1
    hashes = [str(x["trajectory_sha256"]) for x in eps]
    order_s, order_r = [], []
    for i, x in enumerate(eps):
        s_idx = set(spread(len(x["steps"]), k_s).tolist())
        for j in range(len(x["steps"])):
            (order_s if j in s_idx else order_r).append((i, j))
    order = order_s + order_r
    return {"obs": np.stack([eps[i]["obs"][j] for i, j in order]),
            "episode": np.array([i for i, _ in order]), "step": np.array([int(eps[i]["steps"][j]) for i, j in order]),
            "n_sanity": len(order_s), "episodes": eps, "distinct_episodes": len(set(hashes))}


def method_dir(cache: Path, label: str, mkey: str) -> Path:
    """The method's cache folder, named by its key: pieces made under other settings (batch size,
    layers, options...) are never picked up, here or in the progress folder."""
    return cache / "methods" / f"{label}_{mkey[:12]}"


def method_maps(d: Path, label, agent, obs, method, opts, key, log=print):
    """The method's maps of all states (cached), with their timing in timing.npz beside them."""
    f = d / "maps.npz"
    if f.exists():
        return load_npz(f)["maps"]
    log(f"[{label}] maps on {len(obs)} states")
    load = os.getloadavg()[0]
    maps, first, per_map = PB.time_maps(agent, obs, method, opts, key)
    if not (d / "timing.npz").exists():     # the first computation's timing is the one reported
        save_npz(d / "timing.npz", first_call_s=round(first, 3), ms_per_map=round(1000 * per_map, 3),
                 load_avg_1min=round(load, 2))
    save_npz(f, maps=np.asarray(maps, np.float32))
    return np.asarray(maps, np.float32)


def method_timing(d: Path) -> dict:
    z = load_npz(d / "timing.npz")
    return {k: float(z[k]) for k in ("first_call_s", "ms_per_map", "load_avg_1min")}


def method_done(d: Path, draws) -> bool:
    """Whether every result of the method (timing, fidelity, each sanity draw) is in the cache."""
    return all((d / f"{n}.npz").exists() for n in ["timing", "fidelity"] + [f"sanity_d{i:02d}" for i in range(draws)])


def method_fidelity(d: Path, label, agent, obs, maps, key, batch_size) -> dict:
    """{(mode, substrate, score): (aucs (N,), mean curve)}; the random substrate is the same draw
    for every method (PB.fidelity's key)."""
    f = d / "fidelity.npz"
    if not f.exists():
        fid = PB.fidelity(agent, obs, {label: maps}, key, batch_size)
        save_npz(f, **{f"auc/{'/'.join(s)}": v[label][0] for s, v in fid.items()},
                 **{f"curve/{'/'.join(s)}": v[label][1] for s, v in fid.items()})
    z = load_npz(f)
    return {tuple(k.split("/")[1:]): (z[k], z["curve/" + k[4:]]) for k in z if k.startswith("auc/")}


def method_sanity(d: Path, label, agent, obs, maps, method, opts, key, draws, layers, log=print,
                  saved=lambda: None) -> dict:
    """{draw: {group: {metric: (n_sanity,)}}} of the randomisation draws `draws`. The missing ones
    are computed by one `sanity_check(draws=...)` (the draws then share the layers each cascade
    step leaves trained), each saved as its own piece; `saved()` runs after it (the progress commit)."""
    missing = [k for k in draws if not (d / f"sanity_d{k:02d}.npz").exists()]
    for todo in ([missing] if missing else []):
        log(f"[{label}] sanity check on {len(obs)} states, draw{'s' if len(todo) > 1 else ''} "
            f"{', '.join(map(str, todo))}")
        r = sanity_check(agent.model, agent.params, obs, method=method, layers=layers, key=key, draws=todo,
                         metrics=PB.METRICS, original=maps, **opts)
        for k in todo:
            save_npz(d / f"sanity_d{k:02d}.npz", **{f"{g}/{m}": np.asarray(v) for g, res in r[k].items()
                                                     for m, v in res.items()})
        saved()
    out = {}
    for k in draws:
        per = out.setdefault(k, {})
        for name, v in load_npz(d / f"sanity_d{k:02d}.npz").items():
            g, m = name.split("/")
            per.setdefault(g, {})[m] = v
    return out


def pieces_to_recheck(makers: dict, current: str | None, draws: int) -> list[int]:
    """The sanity draws to recompute under this run's commit (registration, amendment 1): for each
    commit other than `current` that made some of the method's sanity draws and that no recheck
    covers yet, its lowest draw. A recheck covers the commit of the draw it recomputed and its own."""
    commit = lambda piece: (makers.get(piece) or {}).get("git_commit")  # noqa: E731
    rechecked = [d for d in range(draws) if f"recheck_d{d:02d}" in makers]
    covered = {current} | {commit(f"sanity_d{d:02d}") for d in rechecked} | {commit(f"recheck_d{d:02d}") for d in rechecked}
    todo = {}
    for d in range(draws):
        c = commit(f"sanity_d{d:02d}")
        if c is not None and c not in covered:
            todo.setdefault(c, d)
    return sorted(todo.values())


# ------------------------------------------------------------------ hosts and the HOG fix
def host_record() -> dict:
    """The host a piece is computed on, recorded beside its commit (rerun_deviations.md, deviation 5:
    the CPU and the core count move maps in their last bits): the CPU model, os.cpu_count(), the
    CPUs this process may use (sched affinity), XLA_FLAGS (None: unset), jax and jaxlib."""
    cpu = None
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = None
    import jaxlib
    return {"cpu": cpu or platform.processor() or platform.machine() or None, "cpu_count": os.cpu_count(),
            "cpu_affinity": usable, "xla_flags": os.environ.get("XLA_FLAGS"), "jax": jax.__version__,
            "jaxlib": getattr(jaxlib, "__version__", None)}


def host_name(host: dict | None) -> str:
    """A recorded host as one line; UNRECORDED for a piece recorded without one."""
    if not host:
        return UNRECORDED
    flags = "XLA_FLAGS unset" if host.get("xla_flags") is None else f"XLA_FLAGS={json.dumps(host['xla_flags'])}"
    return (f"{host.get('cpu')}, {host.get('cpu_count')} CPUs ({host.get('cpu_affinity')} usable), {flags}, "
            f"jax {host.get('jax')}, jaxlib {host.get('jaxlib')}")


def host_warnings(makers: dict, current: dict | None) -> list[str]:
    """One line per recorded host other than this run's (`current`) among the pieces in `makers`
    ({label: {piece: made_by}}), naming both; pieces without a recorded host are not compared."""
    now, other = host_name(current), {}
    for label, pieces in makers.items():
        for m in pieces.values():
            h = host_name((m or {}).get("host"))
            if h not in (UNRECORDED, now):
                by = other.setdefault(h, {})
                by[label] = by.get(label, 0) + 1
    return [f"warning: {sum(by.values())} recorded piece(s) ({', '.join(f'{m} x{n}' for m, n in by.items())}) were "
            f"computed on host [{h}], and this run's host is [{now}]; their values can differ from this host's in "
            f"the last digits (rerun_deviations.md, deviation 5)" for h, by in other.items()]


_CONTAINS: dict = {}


def contains_commit(commit: str | None, ancestor: str = HOG_FIX) -> bool | None:
    """Whether `commit` contains `ancestor` (git merge-base --is-ancestor in this checkout): True or
    False, None where git does not know either commit (or there is no git, or no commit)."""
    if not commit or not re.fullmatch(r"[0-9a-fA-F]{4,40}", str(commit)):
        return None
    if (ancestor, commit) not in _CONTAINS:
        try:
            rc = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "merge-base", "--is-ancestor",
                                 ancestor, str(commit)], capture_output=True, timeout=60).returncode
        except (OSError, subprocess.SubprocessError):
            rc = None
        _CONTAINS[(ancestor, commit)] = {0: True, 1: False}.get(rc)
    return _CONTAINS[(ancestor, commit)]


def full_commit(commit: str) -> str:
    """`commit` as git's full hash where git knows it, else as given."""
    try:
        out = subprocess.run(["git", "-C", str(Path(__file__).resolve().parent), "rev-parse", "--verify", "--quiet",
                              f"{commit}^{{commit}}"], capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        out = ""
    return out or commit


def reporting_meta(makers: dict, fix: str = HOG_FIX) -> dict:
    """meta.json's keys on where the pieces were computed, from `makers` ({label: {piece: made_by}}):
    piece_hosts / recheck_hosts ({label: {host: pieces}}, like piece_commits; UNRECORDED for pieces
    recorded before hosts were), and deviation 4's flag: hog_before_fix ({label: {"sanity_draws":
    the draws whose HOG was computed under a commit without `fix`, "of": the draws recorded,
    "recheck_draws": the same for the rechecks}}), hog_unknown_commits ({commit: pieces} of sanity
    draws and rechecks whose commit git does not know here (UNRECORDED: none recorded), counted as
    before the fix)."""
    hosts, recheck_hosts, hog, unknown = {}, {}, {}, {}
    for label, pieces in makers.items():
        before = {"sanity": [], "recheck": []}
        n = 0
        for piece, m in pieces.items():
            kind = "recheck" if piece.startswith("recheck") else "piece"
            by = (recheck_hosts if kind == "recheck" else hosts).setdefault(label, {})
            h = host_name((m or {}).get("host"))
            by[h] = by.get(h, 0) + 1
            if not piece.startswith(("sanity_d", "recheck_d")):
                continue
            n += piece.startswith("sanity_d")
            commit = (m or {}).get("git_commit")
            has = contains_commit(commit, fix)
            if has is None:
                c = str(commit) if commit else UNRECORDED
                unknown[c] = unknown.get(c, 0) + 1
            if not has:
                before["sanity" if piece.startswith("sanity_d") else "recheck"].append(int(piece[-2:]))
        hog[label] = {"sanity_draws": sorted(before["sanity"]), "of": n, "recheck_draws": sorted(before["recheck"])}
    return {"piece_hosts": hosts, "recheck_hosts": recheck_hosts, "hog_fix_commit": full_commit(fix),
            "hog_before_fix": hog, "hog_unknown_commits": unknown}


def with_reporting(meta: dict, reporting: dict) -> dict:
    """meta with `reporting`'s keys placed after piece_commits (replacing earlier ones), the rest as is."""
    out = {}
    for k, v in meta.items():
        if k in reporting:
            continue
        out[k] = v
        if k == "piece_commits":
            out.update(reporting)
    return out if "piece_commits" in meta else {**out, **reporting}


def refresh_reporting(game_dir: Path, progress_root: Path | None, log=print) -> bool:
    """The analyse-only mode's update of meta.json: its reporting keys (`reporting_meta`) from the
    pieces recorded in the progress folder, read without the states or maps; every other key kept
    byte for byte. Refused (ProgressMismatch) where the folder's pieces are not those meta.json's
    piece_commits counts. Returns whether meta.json changed."""
    f = Path(game_dir) / "meta.json"
    meta = json.loads(f.read_text())
    commits = meta.get("piece_commits") or {}
    if progress_root is None or not (Path(progress_root) / "run.json").exists() or not commits:
        log(f"[{meta.get('game')}] no progress folder (or no recorded pieces): meta.json's hosts and HOG flag "
            f"are left as they are")
        return False
    recorded = P.recorded_makers(Path(progress_root))
    makers = {label: recorded.get(label, {}) for label in commits}
    got = {}
    for label, pieces in makers.items():
        made = [m.get("git_commit") for p, m in pieces.items() if not p.startswith("recheck")]
        got[label] = {c: made.count(c) for c in dict.fromkeys(made)}
    if json.loads(json.dumps(got)) != commits:
        raise P.ProgressMismatch(f"the progress folder {progress_root} does not hold the pieces {f} counts "
                                 f"(piece_commits); run the game without --analyse to write its outputs again")
    text = json.dumps(with_reporting(meta, reporting_meta(makers)), indent=1)
    if text == f.read_text():
        return False
    f.write_text(text)
    return True


def method_rechecks(d: Path, label, agent, obs, method, opts, key, layers, makers: dict, current, draws,
                    log=print) -> list[dict]:
    """Recompute, under this commit and from the states alone (the original maps too), each sanity
    draw `pieces_to_recheck` names, as recheck_dXX.npz beside the recorded draw, and compare every
    value at the outputs' precision. One row per recheck (all of the method's, this run's and earlier)."""
    for draw in pieces_to_recheck(makers, current, draws):
        made = makers.get(f"sanity_d{draw:02d}", {}).get("git_commit")
        log(f"[{label}] recheck of sanity draw {draw} (recorded under {str(made)[:8]}) on {len(obs)} states")
        r = sanity_check(agent.model, agent.params, obs, method=method, layers=layers, key=key, draw=draw,
                         metrics=PB.METRICS, **opts)
        save_npz(d / f"recheck_d{draw:02d}.npz", **{f"{g}/{m}": np.asarray(v) for g, res in r.items() for m, v in res.items()})
    rows = []
    for f in sorted(d.glob("recheck_d*.npz")):
        draw = int(f.stem[-2:])
        new, old = load_npz(f), load_npz(d / f"sanity_d{draw:02d}.npz")
        diff = np.concatenate([np.abs(np.round(np.asarray(new[k], np.float64), DECIMALS)
                                      - np.round(np.asarray(old[k], np.float64), DECIMALS)).ravel() for k in old])
        rows.append({"method": label, "draw": draw,
                     "recorded_commit": makers.get(f"sanity_d{draw:02d}", {}).get("git_commit") or current,
                     "recheck_commit": makers.get(f.stem, {}).get("git_commit") or current,
                     "values": int(diff.size), "differing": int((diff > 0).sum()),
                     "max_abs_diff": round(float(diff.max(initial=0.0)), DECIMALS)})
    return rows


# ------------------------------------------------------------------ one game
def run_game(game: str, args, log=print) -> Path:
    agent, agent_name, card = PB.load_agent(game, args.agent_file)
    cache = Path(args.cache).expanduser() / game / (
        f"{agent.name}_e{args.episodes}_n{args.states}_k{args.sanity_states}_eps{args.epsilon}"
        f"_max{args.max_episode_steps}_seed{args.seed}")
    progress = open_progress(game, agent, args, log)
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / "provenance.jsonl", "a") as f:     # one line per start or resume
        f.write(json.dumps({**provenance(), "command": " ".join(sys.argv)}) + "\n")
    key = jax.random.PRNGKey(args.seed)
    st = collect_states(agent, game, args, cache, log, progress)
    obs, n_s = st["obs"], st["n_sanity"]
    known = _layer_names(agent.params)
    layers = group_norms(agent.params, [l for l in PB.LAYERS if l in known])
    chosen = [m for m in PB.METHODS if not args.methods or m[0] in args.methods]
    base = {"run": progress.run_key, "decimals": DECIMALS, "states_sha256": sha256_array(obs), "n_sanity": int(n_s),
            "batch_size": args.batch_size, "modes": PB.MODES, "settings": PB.SETTINGS,
            "layers": [list(g) if isinstance(g, tuple) else g for g in layers], "metrics": PB.METRICS}
    timing, failed, aucs, curves, sanity, rechecks, piece_commits, makers = [], {}, {}, {}, {}, [], {}, {}
    current = json.loads(progress.made_by).get("git_commit")
    recorded = {label: progress.piece_makers(label, P.key_of({**base, "label": label, "method": method,
                                                              "options": opts}))
                for label, method, opts, _ in chosen + [("random", "uniform", {"key_fold": 7}, None)]}
    for line in host_warnings(recorded, json.loads(progress.made_by).get("host")):
        log(f"[{game}] {line}")
    for label, method, opts, _ in chosen:
        fields = {**base, "label": label, "method": method, "options": opts}
        mkey = P.key_of(fields)
        mdir = method_dir(cache, label, mkey)
        try:
            if progress.restore_method(label, mkey, mdir):
                log(f"[{label}] restored from the progress folder")
            maps = None if method_done(mdir, args.draws) else method_maps(
                mdir, label, agent, obs, method, opts, key, log)
            for s, (a, c) in method_fidelity(mdir, label, agent, obs, maps, key, args.batch_size).items():
                aucs.setdefault(s, {})[label], curves.setdefault(s, {})[label] = a, c
            progress.save_method(label, mkey, fields, mdir)
            sanity[label] = method_sanity(mdir, label, agent, obs[:n_s], None if maps is None else maps[:n_s],
                                          method, opts, key, range(args.draws), layers, log,
                                          saved=lambda: progress.save_method(label, mkey, fields, mdir))
            rechecks += method_rechecks(mdir, label, agent, obs[:n_s], method, opts, key, layers,
                                        progress.piece_makers(label, mkey), current, args.draws, log)
            progress.save_method(label, mkey, fields, mdir)
            makers[label] = progress.piece_makers(label, mkey)
            made = [m.get("git_commit") for p, m in makers[label].items() if not p.startswith("recheck")]
            piece_commits[label] = {c: made.count(c) for c in dict.fromkeys(made)}
        except Exception as e:   # one broken method must not lose the others' results
            failed[label] = f"{type(e).__name__}: {e}"
            log(f"[{game}] {label} FAILED: {failed[label]}")
            continue
        timing.append({"method": label, "states_timed": min(4, len(obs)), **method_timing(mdir)})
    fields = {**base, "label": "random", "method": "uniform", "options": {"key_fold": 7}}
    mkey = P.key_of(fields)
    mdir = method_dir(cache, "random", mkey)
    progress.restore_method("random", mkey, mdir)
    rnd = np.asarray(jax.random.uniform(jax.random.fold_in(key, 7), obs.shape[:3]))
    for s, (a, c) in method_fidelity(mdir, "random", agent, obs, rnd, key, args.batch_size).items():
        aucs.setdefault(s, {})["random"], curves.setdefault(s, {})["random"] = a, c
    progress.save_method("random", mkey, fields, mdir)
    out = Path(args.out) / game
    out.mkdir(parents=True, exist_ok=True)
    write_outputs(out, game, agent_name, card, args, st, aucs, curves, sanity, timing, failed, layers,
                  [m[0] for m in chosen], cache, rechecks, piece_commits, makers)
    analyse(out, Path(args.out))
    log(f"[{game}] wrote {out}")
    return out


def analyse(game_dir: Path, root: Path) -> None:
    """The registered analysis of one game; when it writes the committed results, the pages that
    quote them follow (rerun_summary)."""
    A.write_analysis(game_dir, root)
    if Path(root).resolve() == A.OUT.resolve():
        rerun_summary.update()


def open_progress(game, agent, args, log=print) -> P.Progress:
    """The game's progress folder (--progress, by default --out/<game>/progress; off with
    --no-progress) for this run's settings; a folder recorded under other settings is refused."""
    root = None if args.progress == "" else Path(args.progress or Path(args.out) / game / "progress")
    run = {"game": game, "agent": agent.name, "agent_sha256": sha256_tree(agent.params),
           "episodes": args.episodes, "states": args.states, "sanity_states": args.sanity_states,
           "epsilon": args.epsilon, "max_episode_steps": args.max_episode_steps, "seed": args.seed}
    made_by = {**git_state(), "jax": jax.__version__, "backend": jax.default_backend(), "host": host_record()}
    return P.Progress(root, run, made_by, log, DECIMALS)


def write_outputs(out, game, agent_name, card, args, st, aucs, curves, sanity, timing, failed, layers, methods,
                  cache, rechecks=(), piece_commits=None, makers=None):
    ep, step, n_s = st["episode"], st["step"], st["n_sanity"]
    PB.write_csv(out / "states.csv", [{"state": i, "episode": int(e), "step": int(s), "sanity": i < n_s}
                                      for i, (e, s) in enumerate(zip(ep, step))])
    eps = st["episodes"]
    PB.write_csv(out / "episodes.csv", [
        {"episode": i, "env_seed": int(x["env_seed"]), "length": int(x["length"]), "return": float(x["return"]),
         "truncated": bool(x["truncated"]), "random_actions": int(x["random_actions"]),
         "states": len(x["steps"]), "trajectory_sha256": str(x["trajectory_sha256"])} for i, x in enumerate(eps)])
    PB.write_csv(out / "auc_per_state.csv.gz", [
        {"mode": s[0], "substrate": s[1], "score": s[2], "method": m, "state": i, "episode": int(ep[i]),
         "auc": round(float(v), DECIMALS)} for s, res in aucs.items() for m, a in res.items() for i, v in enumerate(a)])
    PB.write_csv(out / "curves.csv", [
        {"mode": s[0], "substrate": s[1], "score": s[2], "method": m, "step": t, "mean": round(float(v), DECIMALS)}
        for s, res in curves.items() for m, c in res.items() for t, v in enumerate(c)])
    rows = []
    for m, by_draw in sanity.items():
        for d, res in by_draw.items():
            for g in res:
                rows.extend({"method": m, "randomised": g, "draw": d, "state": i, "episode": int(ep[i]),
                             **{k: round(float(res[g][k][i]), DECIMALS) for k in PB.METRICS}} for i in range(n_s))
    if rows:
        PB.write_csv(out / "sanity_per_state.csv.gz", rows)
    if timing:
        PB.write_csv(out / "timing.csv", timing)
    if rechecks:
        PB.write_csv(out / "rechecks.csv", list(rechecks))
    sessions = [json.loads(line) for line in (cache / "provenance.jsonl").read_text().splitlines() if line]
    meta = {"game": game, "agent": agent_name, "agent_return": card.get("eval", {}).get("mean_return"),
            "agent_return_ci95": card.get("eval", {}).get("ci95"),
            "agent_frames_trained": card.get("frames_trained"), "layer_norm": bool(card.get("layer_norm", False)),
            "agents": 1, "states": int(len(ep)), "sanity_states": int(n_s), "sanity_draws": int(args.draws),
            "episodes": len(eps), "resampling_unit": "episode", "sanity_resampling_unit": "draw x episode",
            "states_per_episode": args.states // args.episodes,
            "sanity_states_per_episode": args.sanity_states // args.episodes,
            "episode_of_state": [int(e) for e in ep], "step_of_state": [int(s) for s in step],
            "episode_returns": [float(x["return"]) for x in eps], "episode_lengths": [int(x["length"]) for x in eps],
            "episode_env_seeds": [int(x["env_seed"]) for x in eps],
            "episodes_truncated": int(sum(bool(x["truncated"]) for x in eps)),
            "distinct_episodes": int(st["distinct_episodes"]), "epsilon": args.epsilon, "noop_max": 30,
            "max_episode_steps": args.max_episode_steps, "seed": args.seed, "methods": methods,
            "failed_methods": failed, "piece_commits": piece_commits or {}, "rechecks": list(rechecks),
            "layers_randomised": [list(g) if isinstance(g, tuple) else g for g in layers],
            "registration": "experiments/paper_b/rerun_registration.md", "provenance": sessions[-1],
            "sessions": sessions, "command": " ".join(sys.argv)}
    if makers and any(makers.values()):
        meta = with_reporting(meta, reporting_meta(makers))
    (out / "meta.json").write_text(json.dumps(meta, indent=1))


# ------------------------------------------------------------------ cost
def estimate(timing_csv: Path, states=STATES, sanity_states=SANITY_STATES, draws=DRAWS, layers=5,
             old=(1000, 200, 3)) -> dict:
    """Hours of map computation per game from a committed timing.csv (steady ms per map of each
    method): (states + draws x layers x sanity_states) maps per method; `old` is the committed
    study's (states, sanity states, draws), for comparison."""
    rows = PB.read_csv(timing_csv)
    ms = sum(float(r["ms_per_map"]) for r in rows)
    maps = lambda n, k, d: n + d * layers * k
    return {"ms_per_map_all_methods": ms, "hours_maps": maps(states, sanity_states, draws) * ms / 3.6e6,
            "hours_sanity": draws * layers * sanity_states * ms / 3.6e6,
            "hours_maps_old": maps(*old) * ms / 3.6e6, "hours_sanity_old": old[2] * layers * old[1] * ms / 3.6e6}


COST = Path(__file__).resolve().parents[1] / "results" / "paper_b_cost" / "paper_b_cost.json"


def measured_cost(path: Path = COST) -> str | None:
    """The per-game hours the last cost comparison measured (experiments.paper_b.cost: the sanity check
    timed as the study runs it, draws together), as one line; None where there is no such result."""
    try:
        res = json.loads(Path(path).read_text())
        h, c = res["hours_per_game"], res["commits"]
    except (OSError, ValueError, KeyError):
        return None
    return (f"as measured at {str(c['after'])[:8]} (experiments/results/paper_b_cost, {res.get('states', '?')} Breakout "
            f"states, the sanity check timed as the study runs it): {h['after']:.2f} h per game, "
            f"{h['before']:.2f} h at {str(c['before'])[:8]}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--game", choices=PB.GAMES + ("minatar-breakout",),
                   help="one game per call (minatar-breakout: a seconds-long smoke run, not part of the study)")
    p.add_argument("--episodes", type=int, default=EPISODES)
    p.add_argument("--states", type=int, default=STATES)
    p.add_argument("--sanity-states", type=int, default=SANITY_STATES)
    p.add_argument("--draws", type=int, default=DRAWS)
    p.add_argument("--epsilon", type=float, default=EPSILON)
    p.add_argument("--max-episode-steps", type=int, default=MAX_EPISODE_STEPS)
    p.add_argument("--methods", nargs="*", default=None, help=f"subset of {[m[0] for m in PB.METHODS]}")
    p.add_argument("--agent-file", default=None)
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE)
    p.add_argument("--seed", type=int, default=SEED)
    p.add_argument("--cache", default=str(CACHE), help="where the resumable pieces live (outside the repo)")
    p.add_argument("--out", default=str(OUT))
    p.add_argument("--progress", default=None,
                   help="the committed progress folder, restored at the start and written as pieces finish "
                        "(default: --out/<game>/progress)")
    p.add_argument("--no-progress", dest="progress", action="store_const", const="",
                   help="neither restore nor record progress (the cache alone)")
    p.add_argument("--analyse", action="store_true",
                   help="only re-run the registered analysis on --out/<game> (meta.json's hosts and HOG flag "
                        "refreshed from the progress folder; no map is computed)")
    p.add_argument("--estimate", action="store_true", help="print hours per game from the committed timing")
    a = p.parse_args(argv)
    if a.estimate:
        print("at the committed study's speed (its timing.csv; a sanity map priced as a map):")
        for g in PB.GAMES:
            e = estimate(PB.OUT / g / "timing.csv", a.states, a.sanity_states, a.draws)
            print(f"  {g}: maps {e['hours_maps']:.2f} h (sanity {e['hours_sanity']:.2f} h); committed study "
                  f"{e['hours_maps_old']:.2f} h (sanity {e['hours_sanity_old']:.2f} h)")
        measured = measured_cost()
        if measured:
            print(measured)
        return
    if not a.game:
        p.error("--game is required (one game per call)")
    if min(a.episodes, a.states, a.sanity_states, a.draws, a.max_episode_steps) < 1:
        p.error("--episodes, --states, --sanity-states, --draws and --max-episode-steps must be >= 1")
    if a.states < a.episodes or a.sanity_states < a.episodes or a.sanity_states > a.states:
        p.error("need --episodes <= --sanity-states <= --states (each episode gives states and sanity states)")
    if not 0.0 <= a.epsilon <= 1.0:
        p.error("--epsilon must be in [0, 1]")
    if a.methods:
        unknown = set(a.methods) - {m[0] for m in PB.METHODS}
        if unknown:
            p.error(f"unknown method labels {sorted(unknown)}; choose from {[m[0] for m in PB.METHODS]}")
    if a.analyse:
        game_dir = Path(a.out) / a.game
        try:
            refresh_reporting(game_dir, None if a.progress == "" else Path(a.progress or game_dir / "progress"))
        except P.ProgressMismatch as e:
            sys.exit(f"paper_b_rerun: {e}")
        analyse(game_dir, Path(a.out))
        return
    try:
        run_game(a.game, a, log=lambda s: print(s, flush=True))
    except (P.ProgressMismatch, P.ReplayMismatch) as e:
        sys.exit(f"paper_b_rerun: {e}")


if __name__ == "__main__":
    main()
