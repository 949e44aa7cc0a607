"""The registered analysis of the Paper B re-run (experiments/paper_b/rerun_registration.md):
episodes, not states, are the replicates; for the sanity check, draws and episodes.

    python -m experiments.paper_b.rerun_analysis --game mspacman   # <out>/<game>/summary.json + README.md

Inputs per game (written by experiments/paper_b/rerun.py): meta.json, auc_per_state.csv.gz
(every state with its episode id), sanity_per_state.csv.gz (every sanity state x draw with its
episode id). Fixed here, before any of the re-run's data exist:
- Estimate: the mean of the episode means (every episode weighs the same).
- Intervals: percentile cluster bootstrap, whole episodes resampled with replacement,
  N_RESAMPLES = 10,000, seed SEED = 0, level 95 %; for the sanity check, draws and episodes
  resampled independently (two-way "pigeonhole" bootstrap of the draw x episode cell means).
- Tests: against the random map and between methods, a two-sided paired t-test on the
  episode means of the per-state differences (df = episodes - 1). Sanity check: a two-sided
  t-test of the mean Spearman similarity against FAIL_SPEARMAN = 0.5 with the variance
  var(draw means) / draws + var(episode means) / episodes (the two-way standard error,
  conservative by one interaction term) and Welch-Satterthwaite degrees of freedom.
- Multiplicity: Holm within a game over a family, then Bonferroni over the N_GAMES = 4 games:
  p_adj = min(1, 4 x Holm p); significant at p_adj <= ALPHA = 0.05. Families per game: the
  sanity check (every method x randomised layer); against the random map, one per setting
  (mode x substrate x score) over the methods; between methods, one per setting over all pairs.
  So the family-wise error over methods x games is <= ALPHA in every family, and each game's
  verdicts are final when that game is done.
- Verdicts: sanity "fails" = mean above 0.5 and significant, "passes" = below and significant,
  else "inconclusive" (also when the design cannot estimate the variance: one draw or one
  episode). Paper B's claims with the re-analysis' rules (experiments/paper_b/reanalysis.py:
  best_verdict, winner_crossover, sign_verdict, verdicts) on these statistics.
- A run below the registered size (states, episodes, sanity states, draws) is analysed the
  same way and labelled exploratory (`design_met: false`).
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
from pathlib import Path

import numpy as np
from scipy import stats

from experiments.common.paths import RESULTS
from experiments.paper_b import reanalysis as RA
from experiments.paper_b import report as R
from jaxsal.metrics.statistics import holm

OUT = RESULTS / "paper_b_rerun"
N_RESAMPLES, LEVEL, ALPHA, SEED, N_GAMES = 10_000, 0.95, 0.05, 0, 4
FAIL_SPEARMAN = 0.5
DESIGN = {"states": 1000, "episodes": 20, "sanity_states": 200, "sanity_draws": 10}
BASELINES = ("random_uniform", "random_gaussian")
RANDOM = "random"
METRICS = ("spearman", "ssim_flat", "ssim", "hog")
CLAIM_KINDS = ("sanity", "best", "table_best", "sign", "winner_depends", "breakout")
"""Verdict id prefixes that judge a claim of Paper B; `sanity_q:` (each method's own output-layer
check) and `above_rise` (a count) are not claims and are never counted as agree / disagree /
inconclusive."""
PRIMARY = ("", "matched")
"""Mappings of the primary reading: Paper B's noise column read as the original score."""


def claim_counts(verdicts, mappings=PRIMARY) -> dict[str, int]:
    """Paper B's claims among `verdicts` at `mappings`: agree / disagree / inconclusive counts."""
    rows = [v["verdict"] for v in verdicts if v["id"].split(":")[0] in CLAIM_KINDS and v["mapping"] in mappings]
    return {k: rows.count(k) for k in ("agree", "disagree", "inconclusive")}


# ------------------------------------------------------------------ statistics
def episode_means(x, episode) -> np.ndarray:
    """Mean of x per episode, episodes in increasing id order."""
    x, episode = np.asarray(x, np.float64), np.asarray(episode)
    ids, inv = np.unique(episode, return_inverse=True)
    return np.bincount(inv, x) / np.bincount(inv)


def cluster_ci(x, episode, n_resamples=N_RESAMPLES, level=LEVEL, seed=SEED) -> dict:
    """{mean, low, high, episodes}: the mean of the episode means and its percentile interval from
    resampling whole episodes with replacement (no interval from fewer than 2 episodes)."""
    m = episode_means(x, episode)
    n = len(m)
    out = {"mean": float(m.mean()), "low": float("nan"), "high": float("nan"), "episodes": n}
    if n >= 2:
        idx = np.random.default_rng(seed).integers(0, n, (n_resamples, n))
        lo, hi = np.quantile(m[idx].mean(1), [(1 - level) / 2, (1 + level) / 2])
        out.update(low=float(lo), high=float(hi))
    return out


def state_ci(x, n_resamples=N_RESAMPLES, level=LEVEL, seed=SEED) -> dict:
    """The same interval with states as independent units (what this design rejects; tests show
    why)."""
    x = np.asarray(x, np.float64)
    idx = np.random.default_rng(seed).integers(0, len(x), (n_resamples, len(x)))
    lo, hi = np.quantile(x[idx].mean(1), [(1 - level) / 2, (1 + level) / 2])
    return {"mean": float(x.mean()), "low": float(lo), "high": float(hi)}


def episode_test(x, y, episode) -> dict:
    """Two-sided paired t-test on the episode means of x - y: {diff, p, df, episodes}."""
    d = episode_means(np.asarray(x, np.float64) - np.asarray(y, np.float64), episode)
    n = len(d)
    diff = float(d.mean())
    if n < 2:
        return {"diff": diff, "p": float("nan"), "df": 0, "episodes": n}
    se = d.std(ddof=1) / np.sqrt(n)
    if se == 0:
        p = 1.0 if diff == 0 else 0.0
    else:
        p = float(2 * stats.t.sf(abs(diff / se), n - 1))
    return {"diff": diff, "p": p, "df": n - 1, "episodes": n}


def cells(values, episode) -> np.ndarray:
    """(draws, episodes) cell means of per-draw, per-state values (draws, n_states)."""
    return np.stack([episode_means(v, episode) for v in np.asarray(values, np.float64)])


def twoway_ci(c, n_resamples=N_RESAMPLES, level=LEVEL, seed=SEED) -> dict:
    """Mean of the (draws, episodes) cell means, percentile interval from resampling draws and
    episodes independently with replacement (none with fewer than 2 of either)."""
    c = np.asarray(c, np.float64)
    D, E = c.shape
    out = {"mean": float(c.mean()), "low": float("nan"), "high": float("nan"), "draws": D, "episodes": E}
    if D >= 2 and E >= 2:
        rng = np.random.default_rng(seed)
        di, ei = rng.integers(0, D, (n_resamples, D)), rng.integers(0, E, (n_resamples, E))
        boot = _grid_means(c, di, ei)
        lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
        out.update(low=float(lo), high=float(hi))
    return out


def _counts(idx, n):
    """(resamples, n) how often each unit is drawn in each resample."""
    out = np.zeros((idx.shape[0], n))
    np.add.at(out, (np.arange(idx.shape[0])[:, None], idx), 1.0)
    return out


def _grid_means(c, di, ei):
    """Mean of c over the grid of resampled draws x resampled episodes, per resample:
    sum_d sum_e w_d v_e c[d, e] / (D E) with w, v the draw and episode counts."""
    w, v = _counts(di, c.shape[0]), _counts(ei, c.shape[1])
    return np.einsum("bd,de,be->b", w, c, v) / (c.shape[0] * c.shape[1])


def twoway_test(c, mu0=FAIL_SPEARMAN) -> dict:
    """Two-sided t-test of mean(c) = mu0 for (draws, episodes) cell means, SE^2 = var(draw
    means)/D + var(episode means)/E, Welch-Satterthwaite df: {mean, p, df, se}. p is NaN where
    the design cannot estimate a term (one draw or one episode)."""
    c = np.asarray(c, np.float64)
    D, E = c.shape
    mean = float(c.mean())
    if D < 2 or E < 2:
        return {"mean": mean, "p": float("nan"), "df": float("nan"), "se": float("nan")}
    vd, ve = c.mean(1).var(ddof=1) / D, c.mean(0).var(ddof=1) / E
    se2 = vd + ve
    if se2 == 0:
        return {"mean": mean, "p": 1.0 if mean == mu0 else 0.0, "df": float("inf"), "se": 0.0}
    df = se2 ** 2 / (vd ** 2 / (D - 1) + ve ** 2 / (E - 1))
    return {"mean": mean, "p": float(2 * stats.t.sf(abs(mean - mu0) / np.sqrt(se2), df)), "df": float(df),
            "se": float(np.sqrt(se2))}


def adjust(rows: list[dict], n_games: int = N_GAMES, alpha: float = ALPHA) -> list[dict]:
    """p_adj = min(1, n_games x Holm p) over the family `rows` (NaN p stays NaN, never significant)."""
    ps = [r["p"] for r in rows]
    for r, p in zip(rows, holm(ps)):
        p_adj = float(min(1.0, n_games * p)) if np.isfinite(p) else float("nan")
        r["p_holm"] = p_adj
        r["significant"] = bool(np.isfinite(p_adj) and p_adj <= alpha)
    return rows


def sanity_verdict(row: dict) -> str:
    if not row["significant"]:
        return "inconclusive"
    return "fails" if row["mean"] > FAIL_SPEARMAN else "passes"


# ------------------------------------------------------------------ one game
def defined_states(res: dict, state_episode):
    """(res, state_episode, skipped) restricted to the states whose AUC is finite for every method and
    the random map (deviation 3: a ratio score such as q_value, Q_a(x_t) / Q_a(x), is undefined where the
    clean Q_a(x) <= 0), so every comparison stays paired; skipped: the excluded states' indices."""
    ok = np.all([np.isfinite(np.asarray(x, np.float64)) for x in res.values()], axis=0)
    if ok.all():
        return res, np.asarray(state_episode), np.array([], int)
    return ({m: np.asarray(x)[ok] for m, x in res.items()}, np.asarray(state_episode)[ok],
            np.flatnonzero(~ok))


def analyse(aucs: dict, sanity: dict, state_episode, sanity_episode, meta: dict,
            n_resamples: int = N_RESAMPLES) -> dict:
    """aucs: {(mode, substrate, score): {method: (N,) per state}} with the random map as "random";
    sanity: {(method, randomised): {metric: (draws, n_sanity)}}; *_episode: the states' episode ids."""
    game = meta["game"]
    methods = [m for m in next(iter(aucs.values())) if m != RANDOM] if aucs else []
    ar, pw, undefined = {}, {}, {}
    for s, res in aucs.items():
        res, s_episode, skipped = defined_states(res, state_episode)
        if skipped.size:
            undefined[s] = skipped
        rows = {}
        for m, x in res.items():
            rows[m] = cluster_ci(x, s_episode, n_resamples)
            if m != RANDOM:
                t = episode_test(x, res[RANDOM], s_episode)
                d = cluster_ci(np.asarray(x) - res[RANDOM], s_episode, n_resamples)
                rows[m].update(diff=t["diff"], p=t["p"], df=t["df"], diff_low=d["low"], diff_high=d["high"])
        adjust([r for m, r in rows.items() if m != RANDOM])
        ar[s] = rows
        names = list(res)
        pairs = {(a, b): episode_test(res[a], res[b], s_episode) for i, a in enumerate(names) for b in names[i + 1:]}
        adjust(list(pairs.values()))
        pw[s] = pairs
    san, tested = {}, []
    for (m, g), by_metric in sanity.items():
        c = cells(by_metric["spearman"], sanity_episode)
        row = {**twoway_ci(c, n_resamples), "draw_means": [float(v) for v in c.mean(1)],
               "other_metrics": {k: twoway_ci(cells(v, sanity_episode), n_resamples)["mean"]
                                 for k, v in by_metric.items() if k != "spearman"}}
        if g not in BASELINES:
            t = twoway_test(c)
            row.update(p=t["p"], df=t["df"], se=t["se"])
            tested.append(row)
        san[(m, g)] = row
    adjust(tested)
    for (m, g), row in san.items():
        row["verdict"] = sanity_verdict(row) if g not in BASELINES else ""
    out = {"against_random": ar, "pairwise": pw, "sanity": san, "undefined": undefined}
    paper_b = game in R.PAPER_B_AUC and set(RA.MAPPINGS["matched"].values()) | set(R.PAPER_B_SET) <= set(methods) \
        and all(s in ar for s in RA.INSERTION)
    out["verdicts"] = RA.verdicts(game, out, methods) if paper_b else [
        {"id": f"sanity_q:{m}", "game": game, "finding": f"{m}: output-layer sanity check", "mapping": "",
         "verdict": san[(m, "q")]["verdict"], "detail": ""} for m in methods if (m, "q") in san]
    ret = meta.get("episode_returns") or []
    design = {k: int(meta.get(k, 0)) >= v for k, v in DESIGN.items()}
    design["resampling_unit"] = meta.get("resampling_unit") == "episode"
    return {"game": game, "design": design, "design_met": all(design.values()), "meta": meta,
            "returns": cluster_ci(ret, np.arange(len(ret)), n_resamples) if ret else None, **out}


# ------------------------------------------------------------------ files
def _read(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


def load_game(d: Path):
    """(aucs, sanity, state_episode, sanity_episode, meta) from a game's output folder."""
    meta = json.loads((d / "meta.json").read_text())
    ep = np.asarray(meta["episode_of_state"])
    acc = {}
    for r in _read(d / "auc_per_state.csv.gz"):
        acc.setdefault((r["mode"], r["substrate"], r["score"]), {}).setdefault(r["method"], {})[int(r["state"])] = \
            float(r["auc"])
    aucs = {s: {m: np.array([v[i] for i in range(len(ep))]) for m, v in ms.items()} for s, ms in acc.items()}
    san = {}
    if (d / "sanity_per_state.csv.gz").exists():
        for r in _read(d / "sanity_per_state.csv.gz"):
            for k in METRICS:
                san.setdefault((r["method"], r["randomised"]), {}).setdefault(k, {}).setdefault(
                    int(r["draw"]), {})[int(r["state"])] = float(r[k])
    n_s = int(meta["sanity_states"])
    sanity = {key: {k: np.array([[v[d][i] for i in range(n_s)] for d in sorted(v)]) for k, v in by.items()}
              for key, by in san.items()}
    return aucs, sanity, ep, ep[:n_s], meta


def _default(o):
    if isinstance(o, (np.floating, np.integer, np.bool_)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    raise TypeError(type(o))


def to_json(res: dict) -> dict:
    j = lambda k: "/".join(k)
    meta = {k: v for k, v in res["meta"].items() if k not in ("episode_of_state", "step_of_state", "sessions")}
    return {"game": res["game"], "design": res["design"], "design_met": res["design_met"], "meta": meta,
            "analysis": {"n_resamples": N_RESAMPLES, "level": LEVEL, "alpha": ALPHA, "seed": SEED, "n_games": N_GAMES,
                         "fail_spearman": FAIL_SPEARMAN, "code": "experiments/paper_b/rerun_analysis.py"},
            "returns": res["returns"], "verdicts": res["verdicts"],
            "undefined_states": {j(s): v.tolist() for s, v in res.get("undefined", {}).items()},
            "sanity": {j(k): r for k, r in res["sanity"].items()},
            "against_random": {j(s): rows for s, rows in res["against_random"].items()},
            "pairwise": {j(s): {f"{a} - {b}": r for (a, b), r in prs.items()} for s, prs in res["pairwise"].items()}}


def _ci(r, nd=2):
    if not np.isfinite(r["low"]):
        return f"{r['mean']:.{nd}f} [no interval]"
    return f"{r['mean']:.{nd}f} [{r['low']:.{nd}f}, {r['high']:.{nd}f}]"


def weaker(res: dict) -> bool:
    """The episodes' return interval lies wholly below the card's 95 % interval (the registered note)."""
    card, r = res["meta"].get("agent_return_ci95"), res["returns"]
    return bool(card and r and np.isfinite(r["high"]) and r["high"] < card[0])


def markdown(res: dict) -> str:
    """The game's README section: N beside every interval, the design's status, every verdict."""
    m, g = res["meta"], res["game"]
    n = (f"1 agent, {m['episodes']} episodes, {m['states']} states; sanity check on {m['sanity_states']} "
         f"states x {m['sanity_draws']} draws")
    lines = [f"## {g}: the registered re-run", "",
             f"N: {n}. Intervals: 95 % per comparison, cluster bootstrap over episodes ({N_RESAMPLES} resamples); "
             "sanity over draws x episodes. Verdicts come from the adjusted tests, not the intervals. Tests: paired t-tests on episode means; sanity: two-way t-test against 0.5. "
             f"Significant = p <= {ALPHA} after Holm within the game and x{N_GAMES} for the games. Analysis: "
             "`experiments/paper_b/rerun_analysis.py`, registered in `experiments/paper_b/rerun_registration.md`.", ""]
    if not res["design_met"]:
        short = ", ".join(k for k, ok in res["design"].items() if not ok)
        lines += [f"**Exploratory: below the registered design ({short}).** No verdict here is a registered result.", ""]
    if res["returns"]:
        r = res["returns"]
        lines += [f"Agent {m['agent']}: mean return over the {r['episodes']} episodes {_ci(r, 1)} (epsilon "
                  f"{m.get('epsilon')}); its card: {R.fmt_return(m.get('agent_return'))} (greedy). Distinct "
                  f"episodes: {m.get('distinct_episodes')} of {m['episodes']}; truncated: {m.get('episodes_truncated')}."
                  + (" The sampled play is weaker than the card's evaluation." if weaker(res) else ""), ""]
    layers = list(dict.fromkeys(k[1] for k in res["sanity"] if k[1] not in BASELINES))
    if layers:
        lines += [f"### Sanity check: Spearman similarity to the original map ({n})", "",
                  "| method | " + " | ".join(layers) + " |", "|---" * (len(layers) + 1) + "|"]
        for meth in dict.fromkeys(k[0] for k in res["sanity"]):
            cells_ = []
            for layer in layers:
                r = res["sanity"].get((meth, layer))
                cells_.append("" if r is None else f"{_ci(r)} {r['verdict']}; draws {min(r['draw_means']):.2f}-"
                              f"{max(r['draw_means']):.2f}")
            lines.append(f"| {meth} | " + " | ".join(cells_) + " |")
    undefined = res.get("undefined", {})
    if undefined:
        lines += ["", "### States without a defined AUC", "",
                  "Excluded from the setting for every method and the random map, so comparisons stay paired "
                  "(deviation 3 in `experiments/paper_b/rerun_deviations.md`):", ""]
        lines += [f"- {'/'.join(s)}: {len(v)} of {m['states']} states ({', '.join(map(str, v))})"
                  for s, v in undefined.items()]
    for s, rows in res["against_random"].items():
        if s[0] != "insertion":
            continue
        n_s = m["states"] - len(undefined.get(s, ()))
        lines += ["", f"### Insertion AUC, {s[1]} substrate, {s[2]} ({m['episodes']} episodes, {n_s} states)",
                  "", "| method | mean [95 % CI] | minus random [95 % CI] | p adj | significant |", "|---|---|---|---|---|"]
        for meth, r in rows.items():
            if meth == RANDOM:
                lines.append(f"| {meth} | {_ci(r)} | | | |")
                continue
            dci = {"mean": r["diff"], "low": r["diff_low"], "high": r["diff_high"]}
            lines.append(f"| {meth} | {_ci(r)} | {_ci(dci)} | {r['p_holm']:.3g} | {'yes' if r['significant'] else 'no'} |")
    lines += ["", "### Verdicts", "", "| finding | mapping | verdict | detail |", "|---|---|---|---|"]
    lines += [f"| {v['finding']} | {v['mapping']} | {v['verdict']} | {v['detail']} |" for v in res["verdicts"]]
    primary, fix = claim_counts(res["verdicts"]), claim_counts(res["verdicts"], ("fix",))
    if sum(primary.values()):
        say = lambda c: " / ".join(f"{k} {c[k]}" for k in c)                     # noqa: E731
        lines += ["", f"Paper B's claims (its noise column read as the original score): {say(primary)}"
                  + (f"; the {sum(fix.values())} verdicts re-read with the chosen-action fix: {say(fix)}"
                     if sum(fix.values()) else "") + "."]
    return "\n".join(lines) + "\n"


def write_game(d: Path, n_resamples: int = N_RESAMPLES) -> dict:
    """summary.json and README.md of the game in folder d."""
    aucs, sanity, ep, ep_s, meta = load_game(Path(d))
    res = analyse(aucs, sanity, ep, ep_s, meta, n_resamples)
    (Path(d) / "summary.json").write_text(json.dumps(to_json(res), indent=1, default=_default))
    (Path(d) / "README.md").write_text(markdown(res))
    return res


def shipped_agents(root: Path) -> bool:
    """Whether root holds the re-run of the shipped agents (each game's meta.json names its game as the
    agent, as the runner does without --agent-file), not another agent's (an agent file named)."""
    metas = [json.loads(m.read_text()) for m in sorted(Path(root).glob("*/meta.json"))]
    return all(m.get("agent") == m.get("game") for m in metas)


def write_readme(root: Path = OUT, games=R.GAMES) -> Path:
    """root/README.md: the registration's pointer and each game's section (for the shipped agents'
    re-run, the games not run yet listed; for another agent's, its own games only)."""
    root = Path(root)
    lines = ["# Paper B re-run: episodes and randomisation draws as the replicates", "",
             "Registered before any of its data in `experiments/paper_b/rerun_registration.md`; runner "
             "`python -m experiments.paper_b.rerun --game GAME`, analysis `experiments/paper_b/rerun_analysis.py`. "]
    if shipped_agents(root):
        lines[-1] += ("One agent per game: no result here is about other agents. The games side by side, with every "
                      "disagreement with Paper B and every sanity failure: [`summary.md`](summary.md) "
                      "(`python -m experiments.paper_b.rerun_summary`).")
        missing = [g for g in games if not (root / g / "README.md").exists()]
    else:  # another agent's re-run (the across-agents study's seeds): its own games only
        missing = []
        games = [g for g in games if (root / g / "README.md").exists()]
        lines[-1] += ("This folder is the re-run on one more agent (the agent file named in each game's section): "
                      "no result here is about other agents. The readings across agents are the registered "
                      "`python -m experiments.paper_b.agents_analysis`'s, in [`../README.md`](../README.md) once "
                      "every agent's re-run is done.")
    lines.append("")
    if missing:
        lines += ["Not run yet: " + ", ".join(missing), ""]
    for g in games:
        if g not in missing:
            lines += [(root / g / "README.md").read_text(), ""]
    (root / "README.md").write_text("\n".join(lines))
    return root / "README.md"


RECHECK_TOLERANCE = 1e-3
"""A recheck of a sanity draw differing by more than this in any value is a deviation (rerun_deviations.md)."""
DEVIATIONS = Path(__file__).with_name("rerun_deviations.md")


def code_versions(meta: dict) -> list[str]:
    """A game README's lines on the commits its results were computed under and the rechecks of
    draws made under earlier ones (rerun_deviations.md, item 1); none where nothing was recorded."""
    commits = meta.get("piece_commits") or {}
    if not commits:
        return []
    every = list(dict.fromkeys(c for by in commits.values() for c in by))
    lines = ["### Code versions", "",
             f"The methods' pieces (fidelity, sanity draws, timing) were computed under {len(every)} commit(s): "
             + "; ".join(f"{m} " + ", ".join(f"{str(c)[:8]} x{n}" for c, n in by.items()) for m, by in commits.items())
             + "."]
    lines += host_lines(meta)
    rows = meta.get("rechecks") or []
    if rows:
        lines += ["", "Sanity draws recorded under an earlier commit, recomputed from the states under a later one "
                  "and compared at the outputs' 5 decimals:", "",
                  "| method | draw | recorded under | recomputed under | values | differing | max abs diff |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['method']} | {r['draw']} | {str(r['recorded_commit'])[:8]} | {str(r['recheck_commit'])[:8]} | "
                  f"{r['values']} | {r['differing']} | {r['max_abs_diff']:g} |" for r in rows]
        big = [r for r in rows if r["max_abs_diff"] > RECHECK_TOLERANCE]
        lines += ["", (f"**Deviation:** {len(big)} recheck(s) differ by more than {RECHECK_TOLERANCE:g}: "
                       + ", ".join(f"{r['method']} draw {r['draw']}" for r in big) + ".") if big else
                  f"Every recheck agrees within {RECHECK_TOLERANCE:g}."]
    hog = hog_lines(meta)
    return lines + [""] + (hog + [""] if hog else [])


def host_lines(meta: dict) -> list[str]:
    """The Code versions section's list of the hosts the pieces ran on (meta's piece_hosts and
    recheck_hosts, written by the runner; rerun_deviations.md, deviation 5); none for a meta.json
    written before hosts were."""
    pieces, rechecks = meta.get("piece_hosts"), meta.get("recheck_hosts") or {}
    if pieces is None:
        return []
    every = {}
    for kind, by_label in (("pieces", pieces), ("rechecks", rechecks)):
        for label, by in by_label.items():
            for h, n in by.items():
                every.setdefault(h, {"pieces": {}, "rechecks": {}})[kind][label] = n

    def part(by: dict, what: str) -> str:
        n = sum(by.values())
        return f"{n} {what}" + ("" if len(every) == 1 else " (" + ", ".join(f"{m} x{c}" for m, c in by.items()) + ")")

    lines = ["", "Hosts the pieces ran on (CPU, its CPUs and those the process could use, XLA_FLAGS, jax, jaxlib; "
                 "\"unrecorded\": a piece recorded before hosts were):", ""]
    for h, kinds in every.items():
        lines.append(f"- {h}: " + "; ".join(part(by, what) for what, by in (("piece(s)", kinds["pieces"]),
                                                                            ("recheck(s)", kinds["rechecks"])) if by))
    return lines


def _draw_list(draws: list, of: int) -> str:
    """Draw numbers as ranges ("0-3, 7"), with how many of how many."""
    if not draws:
        return f"none of {of}"
    runs, start = [], draws[0]
    for a, b in zip(draws, draws[1:] + [None]):
        if b != a + 1:
            runs.append(f"{start}-{a}" if a > start else f"{a}")
            start = b
    return ", ".join(runs) + (f" (all {of})" if len(draws) == of else f" ({len(draws)} of {of})")


def hog_lines(meta: dict) -> list[str]:
    """The section beside Code versions on the HOG similarity before its fix (rerun_deviations.md,
    deviation 4): per method, the sanity draws (and rechecks) whose HOG values were computed under a
    commit without the fix (meta's hog_before_fix, written by the runner); none for a meta.json
    written before the flag was."""
    hog = meta.get("hog_before_fix")
    if not hog:
        return []
    fix = str(meta.get("hog_fix_commit") or "")[:8]
    lines = ["### HOG similarity before its fix", "",
             f"The HOG similarity (a reported sanity metric, never tested) read up to ~0.05 low on piecewise-constant "
             f"maps until commit {fix} fixed it (deviation 4 in `experiments/paper_b/rerun_deviations.md`). Per "
             f"method, the sanity draws whose HOG values were computed under a commit without {fix}:", "",
             "| method | sanity draws before the fix | rechecks before the fix |", "|---|---|---|"]
    lines += [f"| {m} | {_draw_list(r['sanity_draws'], r['of'])} | "
              f"{', '.join(map(str, r['recheck_draws'])) or 'none'} |" for m, r in hog.items()]
    unknown = meta.get("hog_unknown_commits") or {}
    if unknown:
        lines += ["", "Counted as before the fix because git here does not know their commit: " + "; ".join(
            f"{c if c == 'unrecorded' else c[:8]} ({n} piece(s))" for c, n in unknown.items()) + "."]
    across = [f"{r['method']} draw {r['draw']}" for r in meta.get("rechecks") or []
              if r["method"] in hog and r["draw"] in hog[r["method"]]["sanity_draws"]
              and r["draw"] not in hog[r["method"]]["recheck_draws"]]
    if across:
        lines += ["", "Rechecks made after the fix of draws made before it (their HOG differences include the fix's): "
                  + ", ".join(across) + "."]
    return lines + ["", "No conclusion is drawn from HOG: it is reported only, and a game's HOG values may mix draws "
                        "computed before and after the fix."]


def write_analysis(game_dir: Path, root: Path) -> None:
    """The registered analysis of one game (summary.json, README.md), the game README's code versions,
    then the re-run's README with its deviations from the registration (rerun_deviations.md)."""
    write_game_with_versions(game_dir)
    write_readme_with_deviations(root)


def write_game_with_versions(game_dir: Path) -> None:
    """The game's summary.json and README.md, its README ending with the code versions."""
    write_game(game_dir)
    extra = code_versions(json.loads((Path(game_dir) / "meta.json").read_text()))
    if extra:
        f = Path(game_dir) / "README.md"
        f.write_text(f.read_text().rstrip("\n") + "\n\n" + "\n".join(extra))


def write_readme_with_deviations(root: Path) -> None:
    """The re-run's README, ending with the deviations from the registration."""
    readme = write_readme(root)
    if shipped_agents(root):
        tail = DEVIATIONS.read_text()
    else:  # another agent's re-run: the deviations it shares are the runner's and the across-agents study's
        tail = ("## Deviations\n\nThis re-run uses the registered runner and analysis: their deviations are listed in "
                "`experiments/paper_b/rerun_deviations.md` (those about the four shipped agents' data apply to them "
                "only), and the across-agents study's own in `experiments/paper_b/agents_deviations.md`. This folder's "
                "rechecks and code versions are in each game's section above.\n")
    readme.write_text(readme.read_text().rstrip("\n") + "\n\n" + tail)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--game", nargs="+", required=True)
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args(argv)
    for g in a.game:
        write_game_with_versions(Path(a.out) / g)
    write_readme_with_deviations(Path(a.out))


if __name__ == "__main__":
    main()
