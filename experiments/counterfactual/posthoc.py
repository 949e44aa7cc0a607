"""Post-hoc checks behind the results README's explanations (not registered: exploratory, read as such).

    python -m experiments.counterfactual.posthoc --game breakout      # results/breakout/posthoc.json, ~5 CPU min
    python -m experiments.counterfactual.posthoc --game pong --part maps --part zero_maps   # results/pong/posthoc.json
    python -m experiments.counterfactual.posthoc --game spaceinvaders --part maps --part zero_maps --part statuses
    python -m experiments.counterfactual.posthoc --game breakout --part reclassified   # a few CPU min per game, resumes

1. `heights`: replays every finished episode's recorded actions (the trajectory hash is checked) to read
   the ball's position at each registered state from the RAM, then asks, per episode across the states
   the displacement statistic uses, how the moved object's share and the mean |Q change| of its kept moves
   go with the ball's height and vertical direction (Spearman, and the share-|Q change| correlation with
   both partialled out on ranks); means and standard errors over episodes.
2. `maps`: on one episode's states and kept moves, recomputes the maps of a few methods and splits
   `map_follows`' shift into its four shares, says where the input is exactly zero, and reads the
   occlusion and noise-sensitivity maps' sign and floor (the map's smallest value over its range);
   occlusion with `score="drop"` is computed beside the registered default. The recomputed shifts are checked against the recorded ones.
3. `statuses`: re-runs every registered move of every finished episode (emulator only, no maps; each status is
   checked against the recorded one) and says, per move and status, where the moved object's RAM position
   was, which other classes changed in the `side_effects` moves, and from which stacked frame on the
   `diverged` ones left their course.
4. `reclassified`: re-classifies every registered move of every finished episode with the current
   `jaxsal_agents.interventions` (emulator only, no maps), lists the moves whose status differs from the
   recorded one, and where a kept move is among them recomputes the registered statistics, tests and stories
   (`analysis.analyse`, `report.counts`) with the recorded statuses replaced by the current ones: a
   sensitivity check of the registered results to a later classification, not a registered result.
   Per-episode statuses are cached under `plan.CACHE` (keyed by the classifying code), so a rerun resumes.
"""
from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

from experiments.counterfactual import analysis as A
from experiments.counterfactual import plan as P
from experiments.counterfactual import run as R

PORTED = ("occlusion", "noise_sensitivity", "sarfa", "rise", "lime", "scorecam")   # moved onto the engine after the run
RECLASSIFIED_CACHE = P.CACHE.expanduser() / "reclassified"   # `reclassified`'s per-episode statuses, by code
MAP_METHODS = ("grad_x_input", "integrated_gradients", "occlusion", "noise_sensitivity", "gradient", "deconvnet")


def _moments(game: str, e: int):
    """Episode e's registered states as Moments, replayed from its recorded actions (hash checked)."""
    rec = R._load(P.PROGRESS / game / "play" / f"ep{e:03d}.npz")
    ep = R.play_episode(game, int(rec["seed"]), P.EPSILON, P.MAX_EPISODE_STEPS, actions=rec["actions"],
                        keep=rec["steps"])
    if ep["trajectory_sha256"] != str(rec["trajectory_sha256"]):
        raise R.ReplayMismatch(f"episode {e}'s replay does not give its recorded trajectory")
    return ep["moments"]


def _ranks_partial(a, b, covs):
    """Pearson correlation of rank(a) and rank(b) after regressing both on the covariates' ranks."""
    from scipy.stats import rankdata

    x = np.column_stack([np.ones(len(a))] + [rankdata(c) for c in covs])
    res = [v - x @ np.linalg.lstsq(x, v, rcond=None)[0] for v in (rankdata(a), rankdata(b))]
    if min(r.std() for r in res) < 1e-9:
        return np.nan
    return float(np.corrcoef(*res)[0, 1])


def _mean_se(v) -> dict:
    """Mean and standard error of the finite per-episode values, and how many there were."""
    v = np.asarray([x for x in v if np.isfinite(x)])
    return {"mean": float(v.mean()), "se": float(v.std(ddof=1) / np.sqrt(v.size)), "episodes": int(v.size)}


def heights(game: str = "breakout") -> dict:
    """Ball height (raw-screen y of the newest frame, larger = lower) and vertical motion over the stack
    against the moved object's share and the mean |Q change|, per episode (module doc, 1)."""
    from scipy.stats import spearmanr

    d = A.stack(A.load_episodes(P.PROGRESS / game))
    status = np.asarray(d["statuses"] + ["(no state)"])[d["status"]]
    kept = np.isin(status, P.KEEP)
    mag = np.where(kept, np.abs(d["disp"]), np.nan)
    with np.errstate(invalid="ignore"):
        dq = np.nansum(np.nan_to_num(mag), 2) / np.isfinite(mag).sum(2)
    c = d["classes"].index(d["moved"])
    ok = d["present"][..., c] & np.isfinite(dq)
    y, vy = np.zeros(ok.shape), np.zeros(ok.shape)
    for e in range(ok.shape[0]):
        rams = np.stack([m.rams for m in _moments(game, e)])
        y[e] = rams[:, -1, -1, 101].astype(int) + 9
        vy[e] = rams[:, -1, -1, 101].astype(int) - rams[:, 0, 0, 101].astype(int)

    def per_episode(fn):
        return _mean_se([fn(e, ok[e]) for e in range(ok.shape[0]) if ok[e].sum() >= 5])

    out = {"states": int(ok.sum()),
           "dq_vs_height": per_episode(lambda e, m: spearmanr(dq[e][m], y[e][m])[0]),
           "dq_vs_downward": per_episode(lambda e, m: spearmanr(dq[e][m], vy[e][m])[0]), "methods": {}}
    for i, name in enumerate(d["methods"]):
        s = d["share"][i][..., c]
        f = lambda e, m: m & np.isfinite(s[e])
        out["methods"][name] = {
            "share_vs_height": per_episode(lambda e, m: spearmanr(s[e][f(e, m)], y[e][f(e, m)])[0]),
            "share_vs_downward": per_episode(lambda e, m: spearmanr(s[e][f(e, m)], vy[e][f(e, m)])[0]),
            "other_shares_vs_height": {k: per_episode(lambda e, m: spearmanr(d["share"][i][..., ci][e][m], y[e][m])[0])
                                       for ci, k in enumerate(d["classes"]) if ci != c},
            "share_vs_dq": per_episode(lambda e, m: spearmanr(s[e][f(e, m)], dq[e][f(e, m)])[0]),
            "share_vs_dq_given_height_direction": per_episode(
                lambda e, m: _ranks_partial(s[e][f(e, m)], dq[e][f(e, m)], [y[e][f(e, m)], vy[e][f(e, m)]]))}
    return out


def maps(game: str = "breakout", episode: int = 0, methods=MAP_METHODS) -> dict:
    """The four shares of `map_follows`' shift, where the input is zero, and the perturbation maps' sign
    and floor, on one episode's kept moves (module doc, 2)."""
    import jax
    import jax.numpy as jnp

    import jaxsal
    import jaxsal_agents
    from jaxsal.metrics import map_follows
    from jaxsal.metrics.displacement import _class_masks
    from jaxsal.game_objects import boxes_from_ram
    from jaxsal_agents.interventions import displace

    agent = jaxsal_agents.load(P.AGENTS[game])
    moments = _moments(game, episode)
    recorded = R._load(P.PROGRESS / game / f"ep{episode:03d}.npz")
    obs = np.stack([m.obs for m in moments])
    boxes = boxes_from_ram(game, np.stack([m.rams for m in moments]))
    q = agent.apply_fn(agent.params, jnp.asarray(obs))
    q = np.asarray(q["q"] if isinstance(q, dict) else q)
    acts = q.argmax(1)
    if not np.array_equal(acts, recorded["actions_explained"]):
        raise RuntimeError("the recomputed greedy actions differ from the recorded ones")
    moved, rams, idx, jdx = [], [], [], []
    for j, (dx, dy) in enumerate(P.MOVES[game]):
        res = displace(moments, P.MOVED[game], dx, dy, keep=P.KEEP)
        k = np.flatnonzero(res.kept)
        moved.append(res.obs[k])
        rams.append(np.stack([res.items[i].rams for i in k]))
        idx += k.tolist()
        jdx += [j] * len(k)
    idx, jdx = np.asarray(idx), np.asarray(jdx)
    mboxes = boxes_from_ram(game, np.concatenate(rams))
    x = np.concatenate([obs] + moved)
    given = np.concatenate([acts, acts[idx]])
    key = jax.random.PRNGKey(P.METHOD_KEY)
    got = jaxsal.explain(agent.apply_fn, agent.params, x, method=list(methods), target=P.TARGET, actions=given, key=key)
    got["occlusion, score=drop"] = jaxsal.explain(agent.apply_fn, agent.params, x, method="occlusion", target=P.TARGET,
                                                 actions=given, score="drop")
    s, obj = len(moments), P.MOVED[game]
    old = _class_masks(boxes[idx], obj, len(idx), 84, 84).any(1)
    new = _class_masks(mboxes, obj, len(idx), 84, 84).any(1)
    x0, x1 = x[idx].astype(float).sum(-1), x[s:].astype(float).sum(-1)
    zero = [bool((x0[i][new[i] & ~old[i]] == 0).all() and (x1[i][old[i] & ~new[i]] == 0).all())
            for i in range(len(idx))]
    out = {"episode": episode, "states": s, "kept_moves": int(len(idx)),
           "q_chosen": {"min": float(q.max(1).min()), "median": float(np.median(q.max(1))),
                        "max": float(q.max(1).max())},
           "input_zero_on_both_places": int(sum(zero)), "methods": {}}
    names = [str(m) for m in recorded["methods"]]
    for name, v in got.items():
        v = np.asarray(v, np.float64)
        f = map_follows(v[idx], v[s:], boxes[idx], mboxes, obj, P.SHARE)
        row = {"follow_rate": float(f.follows[f.valid].mean()), "valid": int(f.valid.sum()),
               "orig_on_new_zero": int((f.orig_on_new == 0).sum()),
               "moved_on_old_zero": int((f.moved_on_old == 0).sum()),
               "median_lost_terms_over_kept_terms": float(np.median((f.orig_on_new + f.moved_on_old)
                                                                    / (f.moved_on_new + f.orig_on_old))),
               "states_with_map_all_negative": int((v[:s].max((1, 2)) < 0).sum()),
               "map_min": float(v[:s].min()), "map_max": float(v[:s].max())}
        if name in names:
            rec = recorded["shift"][names.index(name)][idx, jdx]
            ok = np.isfinite(rec)
            diff = np.abs(np.where(f.valid, f.shift, np.nan)[ok] - rec[ok])
            row["max_abs_diff_to_recorded_shift"] = float(diff.max())
        if name == "occlusion":
            row["median_per_state_of_map_median_minus_one_minus_q"] = float(np.median(
                np.median(v[:s].reshape(s, -1), 1) - (1 - q.max(1))))
            row["largest_q_drop_of_a_patch_median_over_states"] = float(np.median(v[:s].max((1, 2)) - (1 - q.max(1))))
        if name in ("occlusion", "noise_sensitivity"):
            row["floor_over_range"] = float(np.median(v[:s].min((1, 2)) / (v[:s].max((1, 2)) - v[:s].min((1, 2)))))
        out["methods"][name] = row
    return out


def statuses(game: str = "spaceinvaders") -> dict:
    """Per registered move and status: the moved object's first RAM position (min, median, max), the
    classes that changed with it (`side_effects`, "+stray" when other pixels did too) and the stacked frame
    from which a `diverged` move left its course (module doc, 3)."""
    from collections import Counter

    from jaxsal_agents.interventions import MOVABLE, displace

    byte = next(iter(MOVABLE[game][P.MOVED[game]].values()))
    pos, side, first = {}, Counter(), Counter()
    for e in range(len(A.load_episodes(P.PROGRESS / game))):
        moments = _moments(game, e)
        rec = R._load(P.PROGRESS / game / f"ep{e:03d}.npz")
        for j, (dx, dy) in enumerate(P.MOVES[game]):
            for i, it in enumerate(displace(moments, P.MOVED[game], dx, dy, keep=P.KEEP).items):
                if it.status != str(rec["statuses"][rec["status"][i, j]]):
                    raise R.ReplayMismatch(f"episode {e}, state {i}, move {j}: status {it.status} is not the recorded one")
                move = f"{dx:+d},{dy:+d}"
                pos.setdefault(move, {}).setdefault(it.status, []).append(int(moments[i].rams[0, 0, byte]))
                if it.status == "side_effects":
                    side[f"{move} {'+'.join(it.others_changed) or '-'}{' +stray' if it.stray_pixels else ''}"] += 1
                if it.status == "diverged":
                    first[f"{move} frame {int(np.argwhere((it.expected != it.achieved).any(-1))[0][0])}"] += 1
    return {"ram_byte": int(byte),
            "position_at_edit": {m: {s: {"n": len(v), "min": min(v), "median": float(np.median(v)), "max": max(v)}
                                     for s, v in sorted(d.items())} for m, d in pos.items()},
            "side_effects_changed": dict(sorted(side.items())), "diverged_from_frame": dict(sorted(first.items()))}


def zero_maps(game: str = "breakout") -> dict:
    """Per method with states whose map has no mass: how many, and the removal and displacement estimates
    as registered and with those states counted (module doc, 3)."""
    d = A.stack(A.load_episodes(P.PROGRESS / game))
    status = np.asarray(d["statuses"] + ["(no state)"])[d["status"]]
    kept = np.isin(status, P.KEEP)
    c = d["classes"].index(d["moved"])
    ok = d["removal_ok"] & d["present"]
    out = {}
    for i, m in enumerate(d["methods"]):
        share = d["share"][i]
        empty = ~np.isfinite(share).any(-1) & d["real"]
        if not empty.any():
            continue
        const = np.where(np.isnan(share), 1.0 / share.shape[-1], share)
        row = {"states": int(empty.sum())}
        for name, sh in (("registered", share), ("counted", const)):
            row[f"removal_{name}"] = A.cluster_ci(A.removal_values(sh, d["chance"], d["removal"], ok)[0])["mean"]
        for name, sh in (("registered", share[..., c]), ("counted", np.nan_to_num(share[..., c]))):
            v = A.displacement_values(sh, d["chance"][..., c], d["disp"], kept, d["present"][..., c])[0]
            row[f"displacement_{name}"] = A.cluster_ci(v)["mean"]
        out[m] = row
    return out


def _classifier_sha256() -> str:
    """sha256 of the code that classifies a move: jaxsal_agents.interventions and jaxsal.game_objects."""
    import jaxsal_agents.interventions as I

    import jaxsal.game_objects as G

    h = hashlib.sha256()
    files = [Path(I.__file__)] + sorted(Path(G.__file__).parent.glob("*.py"))     # the package's modules
    for f in files:
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()


def _statuses_now(game: str, e: int, cache: Path | None) -> dict:
    """Episode e's registered moves as the current interventions code classifies them: {"status",
    "detail"}, each (S, J) lists of str (recorded moves' order); read from / written to `cache` if given."""
    from jaxsal_agents.interventions import displace

    f = None if cache is None else cache / game / f"ep{e:03d}.json"
    if f is not None and f.exists():
        return json.loads(f.read_text())
    rec = R._load(P.PROGRESS / game / f"ep{e:03d}.npz")
    moments = _moments(game, e)
    if len(moments) != len(rec["status"]):
        raise R.ReplayMismatch(f"episode {e}: the replay gives {len(moments)} states, the record {len(rec['status'])}")
    cols = [displace(moments, str(rec["moved"]), int(dx), int(dy), keep=P.KEEP).items for dx, dy in rec["moves"]]
    out = {"status": [[c[i].status for c in cols] for i in range(len(moments))],
           "detail": [[c[i].detail for c in cols] for i in range(len(moments))]}
    if f is not None:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(json.dumps(out) + "\n")
    return out


def restatus(episodes: list[dict], now: list[dict]) -> list[dict]:
    """The episode records with their `status` indices replaced by the status names in `now` ((S, J) per
    episode), in each record's own list of status names; a name that list lacks is an error."""
    out = []
    for e, (ep, st) in enumerate(zip(episodes, now, strict=True)):
        names = [str(n) for n in ep["statuses"]]
        st = np.asarray(st, dtype=str)
        if st.shape != ep["status"].shape:
            raise ValueError(f"episode {e}: {st.shape} statuses for a record of shape {ep['status'].shape}")
        unknown = sorted(set(map(str, st.flat)) - set(names))
        if unknown:
            raise ValueError(f"episode {e}: statuses {unknown} are not in the record's list {names}")
        out.append({**ep, "status": np.vectorize(names.index, otypes=[ep["status"].dtype])(st)})
    return out


def _tests_row(r: dict) -> dict:
    """One method's registered tests, readings and story, as posthoc.json keeps them."""
    keys = ("mean", "low", "high", "p", "p_holm", "episodes")
    return {"story": r["story"], "readings": r["readings"],
            "tests": {s: {k: r["tests"][s][k] for k in keys} for s in P.STATS},
            "parts": {k: r["parts"][k] for k in ("displacement_rho_method", "displacement_rho_area", "follow_rate")}}


def reclassified(game: str = "breakout", cache: Path | None = RECLASSIFIED_CACHE) -> dict:
    """The registered moves whose status the current interventions code gives differently from the record,
    and, if kept moves are among them, the registered statistics recomputed without them (module doc, 4)."""
    from collections import Counter

    from experiments.counterfactual import report

    episodes = A.load_episodes(P.PROGRESS / game)
    summary = json.loads((P.RESULTS / game / "summary.json").read_text())
    registered = json.loads(json.dumps(A.analyse(episodes, game), default=float))
    if registered != summary:
        raise RuntimeError(f"the analysis of progress/{game} no longer gives results/{game}/summary.json")
    sha = _classifier_sha256()
    now = [_statuses_now(game, e, None if cache is None else cache / sha[:16]) for e in range(len(episodes))]
    changes = []
    for e, (ep, d) in enumerate(zip(episodes, now)):
        names = [str(n) for n in ep["statuses"]]
        last = len(d["status"]) - 1
        for i, row in enumerate(d["status"]):
            for j, new in enumerate(row):
                old = names[ep["status"][i, j]]
                if old != new:
                    dx, dy = (int(v) for v in ep["moves"][j])
                    changes.append({"episode": e, "state": i, "last_state": i == last, "move": f"{dx:+d},{dy:+d}",
                                    "old": old, "new": new, "detail": d["detail"][i][j]})
    trans = Counter(f"{c['old']} -> {c['new']}" for c in changes)
    kept_lost = [c for c in changes if c["old"] in P.KEEP and c["new"] not in P.KEEP]
    kept_won = [c for c in changes if c["old"] not in P.KEEP and c["new"] in P.KEEP]
    out = {"classifier_sha256": sha, "interventions": int(sum(ep["status"].size for ep in episodes)),
           "changed": len(changes), "transitions": dict(sorted(trans.items())),
           "kept_moves_registered": summary["intervention_status"]["ok"],
           "kept_moves_left_out": len(kept_lost), "kept_moves_gained": len(kept_won),
           "left_out_at_last_state": sum(c["last_state"] for c in kept_lost),
           "left_out_episodes": sorted({c["episode"] for c in kept_lost}), "changes": changes}
    if kept_won:
        out["note"] = ("moves the current code keeps were not kept by the run: their maps were never measured, "
                       "so the statistics below leave them out as the run did")
    if not kept_lost:
        return out
    # the registered analysis on the records with the current statuses; a move the run did not keep keeps its
    # recorded status (its maps were never measured)
    used = [[[o if n in P.KEEP and o not in P.KEEP else n for n, o in zip(row, ep["statuses"][ep["status"][i]])]
             for i, row in enumerate(d["status"])] for ep, d in zip(episodes, now)]
    eps = restatus(episodes, used)
    res = json.loads(json.dumps(A.analyse(eps, game), default=float))
    n_before, n_after = report.counts(episodes), report.counts(eps)
    rows = {}
    for m, r in res["methods"].items():
        reg = summary["methods"][m]
        rows[m] = {**_tests_row(r), "story_registered": reg["story"], "readings_registered": reg["readings"],
                   "n": n_after["methods"][m], "n_registered": n_before["methods"][m]}
    out["statistics"] = {
        "intervention_status": res["intervention_status"], "states_with_kept_move": res["states_with_kept_move"],
        "changed_stories": {m: [r["story_registered"], r["story"]] for m, r in rows.items()
                            if r["story"] != r["story_registered"]},
        "changed_readings": {f"{m} {s}": [r["readings_registered"][s], r["readings"][s]] for m, r in rows.items()
                             for s in P.STATS if r["readings"][s] != r["readings_registered"][s]},
        "methods": rows}
    return out


def reclassified_table(summary: dict, rc: dict) -> str:
    """The results README's table (markdown) of `reclassified`'s recomputed statistics: per method, the
    displacement and follow estimates [95%] and Holm p as registered (summary.json) -> with the current
    statuses, each test's reading and the story (one value where it stays, "a -> b" where it changes)."""
    from experiments.counterfactual.report import _ci, _p

    def both(a, b):
        return a if a == b else f"{a} -> {b}"

    rows = ["| method | displacement - area [95%], p_holm | follow rate - 0.5 [95%], p_holm | story |", "|---" * 4 + "|"]
    for m, r in rc["statistics"]["methods"].items():
        reg = summary["methods"][m]
        cells = [f"{_ci(reg['tests'][s])}, {_p(reg['tests'][s]['p_holm'])} -> {_ci(r['tests'][s])}, "
                 f"{_p(r['tests'][s]['p_holm'])} ({both(reg['readings'][s], r['readings'][s])})"
                 for s in ("displacement", "follow")]
        rows.append(f"| {m} | " + " | ".join(cells) + f" | {both(reg['story'], r['story'])} |")
    return "\n".join(rows)


def port(game: str = "breakout", episode: int = 0, methods=PORTED) -> dict:
    """Per ported method: the largest difference between the object shares the run recorded on one
    episode's states and those the current code gives (module doc, 3)."""
    import jax

    import jaxsal
    import jaxsal_agents
    from jaxsal.metrics import object_attribution
    from jaxsal.game_objects import boxes_from_ram

    agent = jaxsal_agents.load(P.AGENTS[game])
    moments = _moments(game, episode)
    recorded = R._load(P.PROGRESS / game / f"ep{episode:03d}.npz")
    obs = np.stack([m.obs for m in moments])
    boxes = boxes_from_ram(game, np.stack([m.rams for m in moments]))
    got = jaxsal.explain(agent.apply_fn, agent.params, obs, method=list(methods), target=P.TARGET,
                         actions=recorded["actions_explained"].astype(np.int32), key=jax.random.PRNGKey(P.METHOD_KEY))
    names = [str(m) for m in recorded["methods"]]
    out = {}
    for m in methods:
        share = np.asarray(object_attribution(np.asarray(got[m], np.float32), boxes).absolute)
        want = recorded["share"][names.index(m)]
        out[m] = {"max_abs_share_diff": float(np.nanmax(np.abs(share - want))), "states": len(moments)}
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.counterfactual.posthoc", description=__doc__.split("\n")[0])
    p.add_argument("--game", choices=P.GAMES, default="breakout",
                   help="`heights` reads Breakout's ball bytes: for pong only the other parts run")
    p.add_argument("--episode", type=int, default=0, help="the episode whose maps are recomputed")
    p.add_argument("--part", action="append", choices=("heights", "maps", "zero_maps", "port", "statuses", "reclassified"),
                   help="recompute only this part of posthoc.json (repeatable); default: all")
    a = p.parse_args(argv)
    if a.game != "breakout" and "heights" in (a.part or ["heights"]):
        p.error(f"--part heights reads Breakout's ball bytes; for {a.game} pass --part maps and/or --part zero_maps")
    import jaxsal

    jaxsal.cpu.use_fast_kernels()
    parts = {"heights": lambda: heights(a.game), "maps": lambda: maps(a.game, a.episode),
             "zero_maps": lambda: zero_maps(a.game), "port": lambda: port(a.game, a.episode),
             "statuses": lambda: statuses(a.game), "reclassified": lambda: reclassified(a.game)}
    f = P.RESULTS / a.game / "posthoc.json"
    res = json.loads(f.read_text()) if a.part and f.exists() else {}
    res["note"] = "post hoc, not registered (experiments/counterfactual/posthoc.py)"
    for k in a.part or parts:
        res[k] = parts[k]()
    f.write_text(json.dumps(res, indent=1) + "\n")
    print(f"wrote {f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
