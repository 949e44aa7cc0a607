"""Runner of the counterfactual study (registration.md): one game per call, resumable per episode.

    python -m experiments.counterfactual.run --game breakout           # the registered run (hours)
    python -m experiments.counterfactual.run --game breakout --analyse # only the registered analysis

Episode e is a full game of the shipped agent on ale-py with EnvPool's preprocessing
(`jaxsal_agents.ale.AleAtariEnv`, seed `plan.episode_seed(e)`: its no-op start and the
exploration draws), epsilon-greedy with `plan.EPSILON`. Its eligible steps (observations made of
four plain steps, the emulator state cloneable before the oldest) are known once it ends; the
registered states are `plan.STATES_PER_EPISODE` of them spread evenly. Then, on those states: the
removal effects of every object class, every registered move of the moved object through the
RAM (`jaxsal_agents.interventions`), its Q change, and per method the maps of the original and of
every kept moved stack (the original state's action), their object shares and whether their mass
follows the object.

What a later session on a fresh machine needs is committed, small, in `progress/<game>/`:
`run.json` (the settings; another run's folder is refused), `play/epNNN.npz` (seed, actions,
hashes: written as soon as the game is played; a resume replays the actions and checks the
hashes) and `epNNN.npz` (the episode's results, a few KB). Nothing heavy is kept: frames and
maps live in memory for one episode; outside the repository, `plan.CACHE` holds only JAX's
persistent compile cache, so a resumed session on the same machine skips most compiling.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from experiments.counterfactual import plan as P


class ProgressMismatch(RuntimeError):
    """A progress folder or record made under other settings than this run's."""


class ReplayMismatch(RuntimeError):
    """Replaying an episode's recorded actions did not give its recorded trajectory."""


# ------------------------------------------------------------------ playing
def play_episode(game: str, seed: int, epsilon: float, max_steps: int, policy=None, actions=None,
                 keep: np.ndarray | None = None) -> dict:
    """One full game (or `max_steps` steps) on AleAtariEnv(seed). policy: obs -> greedy action
    (epsilon-greedy on top, exploration from default_rng(seed)); actions: replay these instead (the
    exploration draws are made all the same). keep: steps whose Moments to return. Returns the
    actions, the eligible steps, the trajectory hash (every observation and action), length,
    return, and the Moments at `keep`."""
    from jaxsal_agents.ale import AleAtariEnv
    from jaxsal_agents.interventions import Moment

    env = AleAtariEnv(game, 1, train=False, seed=seed, frame_stack=P.FRAME_STACK, noop_max=P.NOOP_MAX,
                      max_episode_steps=max_steps)
    ale = env.emulators()[0]
    rng = np.random.default_rng(seed)
    keep = set() if keep is None else {int(k) for k in keep}
    obs = env.reset()[0]
    traj, taken, eligible, moments, history = hashlib.sha256(), [], [], [], []
    ret, explored, t, done = 0.0, 0, 0, False
    while not done and t < max_steps:
        if actions is not None and t >= len(actions):
            break
        a = int(policy(obs)) if actions is None else int(actions[t])
        if rng.random() < epsilon:
            r = int(rng.integers(env.num_actions))
            a, explored = (r if actions is None else a), explored + 1
        plain = not env.resets_next()[0]
        state, lives = (ale.cloneState(), ale.lives()) if plain else (None, None)
        traj.update(np.ascontiguousarray(obs).tobytes() + a.to_bytes(2, "little"))
        taken.append(a)
        obs, reward, d, _ = env.step([a])
        obs = obs[0]
        ret, done = ret + float(reward[0]), bool(d[0])
        history = (history + [(state, a, lives)])[-P.FRAME_STACK:] if plain else []
        if len(history) == P.FRAME_STACK and not env.resets_next()[0]:
            eligible.append(t)
            if t in keep:
                moments.append(Moment(game, history[0][0], np.array([h[1] for h in history], np.int32),
                                      obs.copy(), env.rams()[0].copy(), history[0][2]))
        t += 1
    traj.update(np.ascontiguousarray(obs).tobytes())
    return {"actions": np.asarray(taken, np.uint8), "eligible": np.asarray(eligible, np.int32),
            "trajectory_sha256": traj.hexdigest(), "length": t, "return": ret, "truncated": not done,
            "random_actions": explored, "seed": seed, "moments": moments}


def spread(n: int, k: int) -> np.ndarray:
    """k indices spread evenly over range(n) (round(linspace(0, n - 1, k))); all n when n <= k."""
    return np.arange(n) if n <= k else np.round(np.linspace(0, n - 1, k)).astype(int)


# ------------------------------------------------------------------ measuring one episode
def measure_episode(agent, game: str, moments, methods, moves, batch_size: int | None = None) -> dict:
    """The registered measurements on one episode's Moments (module doc), as small arrays."""
    import jax
    import jaxsal
    from jaxsal.metrics import displacement_effects, map_follows, object_attribution, object_effects
    from jaxsal.game_objects import boxes_from_ram
    from jaxsal_agents.interventions import STATUSES, displace

    obj = P.MOVED[game]
    obs = np.stack([m.obs for m in moments])
    boxes = boxes_from_ram(game, np.stack([m.rams for m in moments]))
    s, j_n = len(moments), len(moves)
    rem = object_effects(agent.apply_fn, agent.params, obs, boxes, target=P.TARGET, **P.REMOVAL)
    rem2 = object_effects(agent.apply_fn, agent.params, obs, boxes, target=P.TARGET, **P.REMOVAL_SECONDARY)
    acts = np.asarray(rem.actions)
    statuses = list(STATUSES)
    status = np.zeros((s, j_n), np.int8)
    disp = np.full((s, j_n), np.nan, np.float32)
    moved_obs, moved_rams, pair = [], [], []
    for j, (dx, dy) in enumerate(moves):
        res = displace(moments, obj, dx, dy, keep=P.KEEP)
        status[:, j] = [statuses.index(x) for x in res.status]
        k = np.flatnonzero(res.kept)
        if len(k):
            eff = displacement_effects(agent.apply_fn, agent.params, res.base_obs[k], res.obs[k], target=P.TARGET,
                                       actions=acts[k])
            disp[k, j] = np.asarray(eff.effect)
            moved_obs.append(res.obs[k])
            moved_rams.append(np.stack([res.items[i].rams for i in k]))
            pair += [(int(i), j) for i in k]
    x = np.concatenate([obs] + moved_obs)
    given = np.concatenate([acts] + [acts[[i for i, _ in pair]]]) if pair else acts
    maps = jaxsal.explain(agent.apply_fn, agent.params, x, method=list(methods), target=P.TARGET, actions=given,
                          batch_size=batch_size, key=jax.random.PRNGKey(P.METHOD_KEY))
    m_n, c_n = len(methods), len(boxes.classes)
    share = np.full((m_n, s, c_n), np.nan, np.float32)
    shift = np.full((m_n, s, j_n), np.nan, np.float32)
    if pair:
        idx = np.array([i for i, _ in pair])
        moved_boxes = boxes_from_ram(game, np.concatenate(moved_rams))
    for mi, name in enumerate(methods):
        v = np.asarray(jax.device_get(maps[name]), np.float32)
        sh = object_attribution(v[:s], boxes)
        share[mi] = np.asarray(sh.absolute if P.SHARE == "absolute" else sh.positive)
        if pair:
            fol = map_follows(v[idx], v[s:], boxes[idx], moved_boxes, obj, P.SHARE)
            shift[mi, idx, [j for _, j in pair]] = np.where(fol.valid, fol.shift, np.nan)
    ok = lambda e: np.asarray(e.present) & ~(np.nan_to_num(np.asarray(e.overlap), nan=1.0) >= 1.0)
    return {"methods": np.array(methods), "classes": np.array(boxes.classes), "moved": np.array(obj),
            "moves": np.asarray(moves, np.int16), "statuses": np.array(statuses),
            "share": share, "chance": np.asarray(sh.chance, np.float32), "present": np.asarray(sh.present),
            "removal": np.asarray(rem.effect, np.float32), "removal_ok": ok(rem),
            "removal_flips": np.asarray(rem.flips), "removal_newest": np.asarray(rem2.effect, np.float32),
            "removal_newest_ok": ok(rem2), "status": status, "disp": disp, "shift": shift,
            "actions_explained": acts.astype(np.int16)}


# ------------------------------------------------------------------ the progress folder
def _save(path: Path, **arrays) -> None:
    """Compressed npz written to a temporary file, then renamed: a killed run leaves no half file."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as f:
        np.savez_compressed(f, **arrays)
    os.replace(tmp, path)


def _load(path: Path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def settings(game: str, agent, methods, episodes: int, states_per_episode: int, epsilon: float, max_steps: int,
             moves) -> dict:
    """What every record depends on; run.json holds it, and a run with other settings is refused."""
    from experiments.common.hashing import sha256_tree

    return {"game": game, "agent": agent.name, "agent_sha256": sha256_tree(agent.params), "methods": list(methods),
            "episodes": int(episodes), "states_per_episode": int(states_per_episode), "epsilon": float(epsilon),
            "max_episode_steps": int(max_steps), "moves": [list(map(int, m)) for m in moves],
            "moved": P.MOVED[game], "seed_base": P.SEED_BASE, "removal": P.REMOVAL, "share": P.SHARE,
            "target": P.TARGET, "keep": list(P.KEEP)}


def open_progress(root: Path, run: dict) -> str:
    """Create root/run.json, or check that it holds `run`; returns the run key (sha256 of run)."""
    key = hashlib.sha256(json.dumps(run, sort_keys=True).encode()).hexdigest()
    f = root / "run.json"
    if f.exists():
        old = json.loads(f.read_text())
        if old != json.loads(json.dumps(run)):
            diff = {k: (old.get(k), v) for k, v in run.items() if old.get(k) != v}
            raise ProgressMismatch(f"{root} holds a run with other settings {diff} (recorded, now): rerun with the "
                                   "recorded settings, or pass --progress with an empty folder")
    else:
        root.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(run, indent=1, sort_keys=True) + "\n")
    return key


def run_game(game: str, methods=None, episodes: int = P.EPISODES, states_per_episode: int = P.STATES_PER_EPISODE,
             epsilon: float = P.EPSILON, max_steps: int = P.MAX_EPISODE_STEPS, moves=None, progress: Path | None = None,
             max_new: int | None = None, seed_of=P.episode_seed, log=print, agent=None) -> list[int]:
    """Play and measure every registered episode of `game` not yet in `progress`; `max_new` caps how
    many new episodes this call finishes (a session's share). Returns the finished episode ids."""
    import jaxsal
    import jaxsal_agents
    from jaxsal_agents.interventions import greedy

    check_args(game, episodes, states_per_episode, epsilon, max_steps)
    agent = agent or jaxsal_agents.load(P.AGENTS[game])
    methods = list(jaxsal.methods() if methods is None else methods)
    unknown = [m for m in methods if m not in jaxsal.methods()]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; registered: {jaxsal.methods()}")
    moves = [tuple(m) for m in (P.MOVES[game] if moves is None else moves)]
    root = Path(progress or P.PROGRESS / game)
    run = settings(game, agent, methods, episodes, states_per_episode, epsilon, max_steps, moves)
    key = open_progress(root, run)
    policy, done, new = None, [], 0
    e = 0
    while e < episodes or _states(root, e) < episodes * states_per_episode:
        out = root / f"ep{e:03d}.npz"
        if out.exists():
            if str(_load(out)["run_key"]) != key:
                raise ProgressMismatch(f"{out} belongs to another run; remove it or use another --progress")
            done.append(e)
            e += 1
            continue
        if max_new is not None and new >= max_new:
            break
        t0 = time.perf_counter()
        pf = root / "play" / f"ep{e:03d}.npz"
        if pf.exists():
            rec = _load(pf)
            if str(rec["run_key"]) != key:
                raise ProgressMismatch(f"{pf} belongs to another run; remove it or use another --progress")
            log(f"[{game}] episode {e}: replaying its recorded actions")
        else:
            policy = policy or greedy(agent)
            log(f"[{game}] episode {e}: playing (seed {seed_of(e)})")
            ep = play_episode(game, seed_of(e), epsilon, max_steps, policy=policy)
            steps = ep["eligible"][spread(len(ep["eligible"]), states_per_episode)]
            rec = {"run_key": np.array(key), "seed": np.array(ep["seed"]), "actions": ep["actions"],
                   "steps": steps.astype(np.int32), "trajectory_sha256": np.array(ep["trajectory_sha256"]),
                   **{k: np.array(ep[k]) for k in ("length", "return", "truncated", "random_actions")},
                   "eligible": np.array(len(ep["eligible"]))}
            _save(pf, **rec)
        ep = play_episode(game, int(rec["seed"]), epsilon, max_steps, actions=rec["actions"], keep=rec["steps"])
        if ep["trajectory_sha256"] != str(rec["trajectory_sha256"]) or len(ep["moments"]) != len(rec["steps"]):
            raise ReplayMismatch(f"replaying episode {e}'s recorded actions ({pf}) does not give its recorded "
                                 "trajectory: this emulator build differs; run where the replay matches")
        t1 = time.perf_counter()
        res = measure_episode(agent, game, ep["moments"], methods, moves)
        res.update({k: rec[k] for k in ("seed", "steps", "length", "return", "truncated", "random_actions")})
        _save(out, run_key=np.array(key), **res,
              seconds=np.array([t1 - t0, time.perf_counter() - t1], np.float32))
        log(f"[{game}] episode {e}: {len(ep['moments'])} states, length {ep['length']}, return {ep['return']:.0f}, "
            f"{time.perf_counter() - t0:.0f} s")
        done.append(e)
        new += 1
        e += 1
    return done


def _states(root: Path, upto: int) -> int:
    """States in the finished episodes before `upto`."""
    return sum(len(_load(f)["steps"]) for f in sorted(root.glob("ep*.npz"))[:upto])


def check_args(game, episodes, states_per_episode, epsilon, max_steps) -> None:
    """Refuse settings the study cannot run, with the fix in one line."""
    if game not in P.GAMES:
        raise ValueError(f"no counterfactual study for {game!r}: games with RAM interventions and a shipped "
                         f"agent: {', '.join(P.GAMES)}")
    for name, v in (("episodes", episodes), ("states per episode", states_per_episode), ("max steps", max_steps)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")


def record_provenance(folder: Path) -> None:
    """Append this start's host, CPU, versions, load and git commit (experiments.common.machine) to
    folder/provenance.json: one entry per start or resumption of the run."""
    from experiments.common.machine import provenance

    f = folder / "provenance.json"
    entries = json.loads(f.read_text()) if f.exists() else []
    folder.mkdir(parents=True, exist_ok=True)
    f.write_text(json.dumps(entries + [provenance()], indent=1) + "\n")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.counterfactual.run", description=__doc__.split("\n")[0])
    p.add_argument("--game", required=True, help=f"one of {', '.join(P.GAMES)}")
    p.add_argument("--progress", default=None, help="progress folder (default experiments/counterfactual/progress/GAME)")
    p.add_argument("--max-new-episodes", type=int, default=None, help="stop after finishing this many episodes")
    p.add_argument("--analyse", action="store_true", help="only write results/GAME/summary.json and summary.md")
    a = p.parse_args(argv)
    if a.game not in P.GAMES:
        p.error(f"no counterfactual study for {a.game!r}: choose one of {', '.join(P.GAMES)}")
    if a.max_new_episodes is not None and a.max_new_episodes < 1:
        p.error("--max-new-episodes must be a positive integer")
    if not a.analyse:
        import jaxsal

        jaxsal.cpu.use_fast_kernels()
        import jax

        jax.config.update("jax_compilation_cache_dir", str(P.CACHE.expanduser() / "jax_compile"))
        record_provenance(Path(a.progress) if a.progress else P.PROGRESS / a.game)
        try:
            run_game(a.game, progress=a.progress, max_new=a.max_new_episodes)
        except (ProgressMismatch, ReplayMismatch, ValueError) as e:
            print(f"counterfactual: error: {e}", file=sys.stderr)
            return 2
    folder = Path(a.progress) if a.progress else P.PROGRESS / a.game
    from experiments.counterfactual import analysis

    finished = len(analysis.load_episodes(folder))
    if finished >= P.EPISODES:
        analysis.write_game(a.game, folder)
        print(f"{a.game}: wrote {P.RESULTS / a.game / 'summary.json'}")
    else:
        print(f"{a.game}: {finished} of {P.EPISODES} episodes finished in {folder}; the analysis waits for all "
              f"(rerun to resume, then commit {folder})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
