"""The registered analysis of the counterfactual study (registration.md): pure functions from the
per-episode results in `progress/<game>/` to `results/<game>/summary.json` and `summary.md`.

    python -m experiments.counterfactual.analysis --game breakout     # after run.py finished the game

Per method and game, three episode-level statistics (each episode one value, the unit of every
interval and test): `removal` (within-state rank agreement of object shares with |removal
effects|, minus that of the area share), `displacement` (within-episode rank agreement across
states of the moved object's share with |Q change| when it is moved, minus that of its area
share) and `follow` (the rate at which the map's mass follows the moved object, minus 0.5).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from experiments.counterfactual import plan as P


# ------------------------------------------------------------------ rank agreement
def rowwise_spearman(pred, effect, ok):
    """Spearman correlation per row of `pred` and `effect` (R, K) over the columns where `ok`
    (R, K) (average ranks). A row with fewer than 2 columns or a constant effect: NaN (left out);
    a constant predictor against a varying effect: 0 (it ranks nothing)."""
    from scipy.stats import rankdata

    ok = np.asarray(ok, bool) & np.isfinite(pred) & np.isfinite(effect)
    a = np.where(ok, pred, np.nan)
    b = np.where(ok, effect, np.nan)
    ra = rankdata(a, axis=1, nan_policy="omit")
    rb = rankdata(b, axis=1, nan_policy="omit")
    n = ok.sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        ra = np.where(ok, ra - np.nansum(np.where(ok, ra, 0), 1, keepdims=True) / n[:, None], 0.0)
        rb = np.where(ok, rb - np.nansum(np.where(ok, rb, 0), 1, keepdims=True) / n[:, None], 0.0)
        va, vb, cov = (ra * ra).sum(1), (rb * rb).sum(1), (ra * rb).sum(1)
        rho = np.where(va > 1e-12, cov / np.sqrt(va * vb), 0.0)
    return np.where((n >= 2) & (vb > 1e-12), rho, np.nan)


def _mean_or_nan(x, axis):
    ok = np.isfinite(x)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(ok.any(axis), np.where(ok, x, 0.0).sum(axis) / ok.sum(axis), np.nan)


# ------------------------------------------------------------------ per-episode statistics
def removal_values(share, chance, effect, ok):
    """Per episode (E,): mean over its states of [rho(share, |effect|) - rho(area, |effect|)]
    across the classes of each state. share, chance, effect, ok: (E, S, C); also returns the
    episode means of the method's and the area's rho."""
    e, s, c = share.shape
    flat = lambda x: x.reshape(e * s, c)
    mag = np.abs(effect)
    rm = rowwise_spearman(flat(share), flat(mag), flat(ok)).reshape(e, s)
    ra = rowwise_spearman(flat(chance), flat(mag), flat(ok)).reshape(e, s)
    return _mean_or_nan(rm - ra, 1), _mean_or_nan(rm, 1), _mean_or_nan(ra, 1)


def displacement_values(share_obj, chance_obj, disp, kept, present, min_states: int = 3):
    """Per episode (E,): rho across its states of the moved object's share with the mean |Q change|
    of its kept moves, minus that rho for the object's area share. share_obj, chance_obj, present
    (E, S); disp, kept (E, S, J). Episodes with fewer than `min_states` usable states: NaN."""
    mag = np.where(kept, np.abs(disp), np.nan)
    d = _mean_or_nan(mag, 2)                                    # (E, S)
    ok = present & np.isfinite(d)
    rm, ra = rowwise_spearman(share_obj, d, ok), rowwise_spearman(chance_obj, d, ok)
    enough = ok.sum(1) >= min_states
    return np.where(enough, rm - ra, np.nan), np.where(enough, rm, np.nan), np.where(enough, ra, np.nan)


def follow_values(shift, chance: float = P.FOLLOW_CHANCE):
    """Per episode (E,): the share of its valid (state, move) pairs whose map followed the moved
    object (shift > 0), minus `chance`; shift (E, S, J) with NaN where not valid or not kept."""
    ok = np.isfinite(shift)
    rate = _mean_or_nan(np.where(ok, (shift > 0).astype(float), np.nan).reshape(len(shift), -1), 1)
    return rate - chance, rate


# ------------------------------------------------------------------ intervals and tests on episode values
def cluster_ci(values, n_resamples: int = P.N_RESAMPLES, level: float = P.LEVEL, seed: int = P.BOOT_SEED) -> dict:
    """Mean of the episode values (NaN: left out) with its percentile bootstrap interval over
    episodes (resampled with replacement)."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return {"mean": float("nan"), "low": float("nan"), "high": float("nan"), "episodes": 0}
    rng = np.random.default_rng(seed)
    boot = v[rng.integers(0, v.size, (n_resamples, v.size))].mean(1)
    a = (1 - level) / 2
    lo, hi = np.quantile(boot, [a, 1 - a])
    return {"mean": float(v.mean()), "low": float(lo), "high": float(hi), "episodes": int(v.size)}


def sign_flip_p(values, exact_up_to: int = P.EXACT_FLIPS_UP_TO, n_mc: int = P.MC_FLIPS, seed: int = P.BOOT_SEED):
    """One-sided sign-flip test that the episode values' mean is > 0: the share of sign patterns
    whose mean is >= the observed one (all 2^n patterns up to `exact_up_to` episodes, else `n_mc`
    random ones with the +1 correction). NaN without values."""
    v = np.asarray(values, np.float64)
    v = v[np.isfinite(v)]
    n = v.size
    if n == 0:
        return float("nan")
    obs = v.sum() - 1e-12 * max(1.0, np.abs(v).sum())          # ties with the observed count as >=
    if n <= exact_up_to:
        hits, total, chunk = 0, 2 ** n, 1 << min(n, 16)
        bits = ((np.arange(chunk)[:, None] >> np.arange(min(n, 16))) & 1) * 2 - 1    # (chunk, low bits)
        low = bits @ v[:min(n, 16)]
        high_n = n - min(n, 16)
        for h in range(2 ** high_n):                            # at most 64 slices of 65,536 patterns
            signs = ((h >> np.arange(high_n)) & 1) * 2 - 1
            hits += int((low + signs @ v[16:] >= obs).sum())
        return hits / total
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, n_mc, 20_000):
        s = rng.choice((-1.0, 1.0), (min(20_000, n_mc - start), n))
        hits += int((s @ v >= obs).sum())
    return (hits + 1) / (n_mc + 1)


def smallest_p(n_episodes: int) -> float:
    """The smallest p-value the exact sign-flip test can give with n episodes: 2^-n."""
    return 2.0 ** -int(n_episodes)


def power(n_episodes: int, alpha: float, effect_sd: float = P.POWER_EFFECT_SD, sims: int = P.POWER_SIMULATIONS,
          n_flips: int = 20_000, seed: int = 1) -> float:
    """Share of simulated studies (episode values ~ Normal(effect_sd, 1), n episodes) whose
    sign-flip p (Monte Carlo, `n_flips` patterns) is below `alpha`."""
    rng = np.random.default_rng(seed)
    v = rng.normal(effect_sd, 1.0, (sims, n_episodes))
    s = rng.choice((-1.0, 1.0), (n_flips, n_episodes))
    obs = v.sum(1) - 1e-12
    hits = np.concatenate([((s @ v[i:i + 100].T) >= obs[i:i + 100]).sum(0) for i in range(0, sims, 100)])
    p = (hits + 1) / (n_flips + 1)
    return float((p < alpha).mean())


# ------------------------------------------------------------------ verdicts
def verdict(tests: dict, alpha: float) -> dict:
    """The registered rule: tests {stat: {"p_holm", "mean", "high", "episodes"}} -> the reading.
    A test supports the story when its Holm-adjusted p < alpha; it contradicts it when its
    interval lies below 0; fewer than MIN_EPISODES_PER_TEST episodes: not estimable."""
    state = {}
    for k, t in tests.items():
        if t["episodes"] < P.MIN_EPISODES_PER_TEST or not np.isfinite(t["p_holm"]):
            state[k] = "not estimable"
        elif t["p_holm"] < alpha and t["mean"] > 0:
            state[k] = "supported"
        elif t["high"] < 0:
            state[k] = "contradicted"
        else:
            state[k] = "not shown"
    sup = [k for k in P.STATS if state[k] == "supported"]
    if any(v == "not estimable" for v in state.values()):
        story = "not estimable"
    elif len(sup) == len(P.STATS):
        story = "holds"
    elif sup:
        story = "partly holds"
    elif any(v == "contradicted" for v in state.values()):
        story = "contradicted"
    else:
        story = "not shown"
    return {"story": story, "readings": state}


# ------------------------------------------------------------------ the game's summary
def stack(episodes: list[dict]) -> dict:
    """The per-episode records (run.py) as arrays with a leading episode axis; refuses records
    of other methods, classes or moves than the first."""
    if not episodes:
        raise ValueError("no episodes to analyse: run experiments.counterfactual.run first")
    first = episodes[0]
    for i, ep in enumerate(episodes):
        for k in ("methods", "classes", "moves"):
            if not np.array_equal(ep[k], first[k]):
                raise ValueError(f"episode {i} was run with other {k} ({ep[k]}) than episode 0 ({first[k]}): "
                                 "analyse one run's progress folder")
    s = max(len(ep["present"]) for ep in episodes)          # an episode with fewer states is padded
    fills = {"share": np.nan, "chance": np.nan, "present": False, "removal": np.nan, "removal_ok": False,
             "removal_newest": np.nan, "removal_newest_ok": False, "status": -1, "disp": np.nan, "shift": np.nan}

    def pad(x, k):
        axis = 1 if k in ("share", "shift") else 0
        width = [(0, 0)] * x.ndim
        width[axis] = (0, s - x.shape[axis])
        return np.pad(x, width, constant_values=fills[k])
    out = {k: np.stack([pad(np.asarray(ep[k]), k) for ep in episodes]) for k in fills}
    out["real"] = np.stack([np.arange(s) < len(ep["present"]) for ep in episodes])     # (E, S)
    out["share"] = np.moveaxis(out["share"], 1, 0)              # (M, E, S, C)
    out["shift"] = np.moveaxis(out["shift"], 1, 0)              # (M, E, S, J)
    out.update(methods=[str(m) for m in first["methods"]], classes=[str(c) for c in first["classes"]],
               moved=str(first["moved"]), moves=np.asarray(first["moves"]).tolist(),
               statuses=[str(s) for s in first["statuses"]])
    return out


def analyse(episodes: list[dict], game: str, n_games: int = len(P.GAMES), n_resamples: int = P.N_RESAMPLES) -> dict:
    """The registered statistics, tests and verdicts of one game (summary.json's content)."""
    from jaxsal.metrics.statistics import holm

    d = stack(episodes)
    alpha = P.ALPHA / n_games
    c_obj = d["classes"].index(d["moved"])
    names = np.asarray(d["statuses"] + ["(no state)"])
    status = names[d["status"]]                                  # -1: a padded state's slot
    kept = np.isin(status, P.KEEP)
    rows, pvals = [], []
    for i, m in enumerate(d["methods"]):
        share = d["share"][i]
        rem, rem_m, rem_a = removal_values(share, d["chance"], d["removal"], d["removal_ok"] & d["present"])
        rem2, _, _ = removal_values(share, d["chance"], d["removal_newest"], d["removal_newest_ok"] & d["present"])
        dis, dis_m, dis_a = displacement_values(share[..., c_obj], d["chance"][..., c_obj], d["disp"], kept,
                                                d["present"][..., c_obj])
        fol, rate = follow_values(np.where(kept, d["shift"][i], np.nan))
        vals = {"removal": rem, "displacement": dis, "follow": fol}
        tests = {k: {**cluster_ci(v, n_resamples), "p": sign_flip_p(v)} for k, v in vals.items()}
        rows.append({"method": m, "tests": tests,
                     "parts": {"removal_rho_method": cluster_ci(rem_m, n_resamples),
                               "removal_rho_area": cluster_ci(rem_a, n_resamples),
                               "removal_newest_minus_area": cluster_ci(rem2, n_resamples),
                               "displacement_rho_method": cluster_ci(dis_m, n_resamples),
                               "displacement_rho_area": cluster_ci(dis_a, n_resamples),
                               "follow_rate": cluster_ci(rate, n_resamples)}})
        pvals += [tests[k]["p"] for k in P.STATS]
    adj = holm(pvals)
    for j, row in enumerate(rows):
        for k, s in enumerate(P.STATS):
            row["tests"][s]["p_holm"] = float(adj[3 * j + k])
        row.update(verdict(row["tests"], alpha))
    counts = {s: int((status == s).sum()) for s in d["statuses"]}
    n_ep = len(episodes)
    return {"game": game, "moved": d["moved"], "moves": d["moves"], "classes": d["classes"],
            "episodes": n_ep, "states": int(d["real"].sum()),
            "episode_meta": [{k: (ep[k].item() if np.ndim(ep[k]) == 0 else None) for k in
                              ("seed", "length", "return", "truncated", "random_actions")} for ep in episodes],
            "intervention_status": counts, "interventions": int(sum(counts.values())),
            "states_with_kept_move": int(kept.any(-1).sum()),
            "alpha_game": alpha, "family_tests": len(pvals), "smallest_p": smallest_p(n_ep),
            "complete": bool(n_ep >= P.EPISODES and d["real"].sum() >= P.STATES),
            "methods": {r["method"]: {k: v for k, v in r.items() if k != "method"} for r in rows}}


def _f(x, nd=3):
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.{nd}f}"


def markdown(res: dict) -> str:
    """summary.md: one table row per method, the three tests and the verdict."""
    lines = [f"# Counterfactual study: {res['game']} (moved: {res['moved']})", "",
             f"{res['episodes']} episodes, {res['states']} states, {res['interventions']} interventions "
             f"({', '.join(f'{k} {v}' for k, v in res['intervention_status'].items() if v)}); "
             f"{res['states_with_kept_move']} states with a kept move. Tests: one-sided sign flips on episode "
             f"values, Holm over the game's {res['family_tests']} tests at {res['alpha_game']:.4f}; intervals: "
             f"95% bootstrap over episodes." + ("" if res["complete"] else " **Incomplete study** (registration)."),
             "", "| method | removal - area [95%] p_holm | displacement - area [95%] p_holm | "
             "follow rate - 0.5 [95%] p_holm | story |", "|---|---|---|---|---|"]
    for m, r in res["methods"].items():
        cells = [f"{_f(t['mean'])} [{_f(t['low'])}, {_f(t['high'])}] {_f(t['p_holm'], 4)}"
                 for t in (r["tests"][s] for s in P.STATS)]
        lines.append(f"| {m} | " + " | ".join(cells) + f" | {r['story']} |")
    return "\n".join(lines) + "\n"


def load_episodes(folder: Path) -> list[dict]:
    """The finished episode records in a game's progress folder, in episode order."""
    files = sorted(Path(folder).glob("ep*.npz"))
    out = []
    for f in files:
        with np.load(f, allow_pickle=False) as z:
            out.append({k: z[k] for k in z.files})
    return out


def write_game(game: str, folder: Path | None = None, out: Path = P.RESULTS) -> dict:
    """Analyse `game`'s progress folder (default progress/<game>) and write results/<game>/summary.json
    and summary.md."""
    res = analyse(load_episodes(folder or P.PROGRESS / game), game)
    d = Path(out) / game
    d.mkdir(parents=True, exist_ok=True)
    (d / "summary.json").write_text(json.dumps(res, indent=1, default=float) + "\n")
    (d / "summary.md").write_text(markdown(res))
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.counterfactual.analysis", description=__doc__.split("\n")[0])
    p.add_argument("--game", choices=P.GAMES, action="append", required=True)
    p.add_argument("--progress", default=None, help="the game's progress folder (default progress/GAME)")
    p.add_argument("--out", default=str(P.RESULTS))
    a = p.parse_args(argv)
    for g in a.game:
        r = write_game(g, Path(a.progress) if a.progress else None, Path(a.out))
        print(f"{g}: " + ", ".join(f"{m} {v['story']}" for m, v in r["methods"].items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
