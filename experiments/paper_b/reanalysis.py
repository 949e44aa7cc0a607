"""Re-analysis of Paper B's committed per-state data (issue 33, item 1): the same AUCs and
similarities, inference that holds under autocorrelation, rules that can fail.

    python -m experiments.paper_b.reanalysis            # all four games -> <game>/reanalysis.{md,json}
                                                        # + reanalysis_tables.csv.gz, ../reanalysis.md

Nothing is recomputed from maps: the inputs are each game's auc_per_state.csv.gz (1,000
consecutive greedy-play states per game) and sanity_per_state.csv.gz (the first 200 states x 3
randomisation draws). Fixed before this code was run on those files (committed first):

Inference (jaxsal.metrics.statistics), for every statistic under five VARIANTS:
- "auto" (primary): intervals = percentile stationary bootstrap (Politis & Romano), mean block
  length = the automatic Politis-White / Patton-Politis-White length of the series itself,
  N_RESAMPLES = 10,000, seed 0; tests = two-sided batch-means t-test on contiguous blocks of the
  automatic length of the tested series (the per-state paired differences), Holm-adjusted in the
  same families as before (against the random map: the methods of a setting; between methods:
  all pairs of a setting, the random map included).
- 25, 50, 100: the same with a fixed (mean) block length, shown beside.
- "committed": the committed analysis (non-overlapping 25-state block bootstrap, Wilcoxon on
  25-state block means), recomputed, to attribute every change.
- A verdict is "robust" when the auto and the 100-state variants give the same verdict.

Rules (one rule per kind of claim, the same at every variant):
- Sanity check (every method, every cascade step, RISE included): "fails" = the interval of the
  mean draw-averaged Spearman similarity lies above FAIL_SPEARMAN = 0.5; "passes" = below;
  else inconclusive (the committed rule, applied to all methods instead of two).
- "X is best in setting Y" with a pool of methods: disagree = some pool method is
  significantly above X (pairwise, Holm); agree = X has the pool's highest mean insertion AUC
  AND is significantly above the random map (Holm); else inconclusive. The pool's declared best
  = its highest-mean method if that one is significantly above the random map, else none.
- "The substrate and the score decide the winner" (`winner_crossover`): agree = two settings
  have different declared bests (all 20 methods), each significantly above the other's in its
  own setting at Holm p <= ALPHA / 4; disagree = one method is the declared best in all four
  settings and significantly above every other method in each; else inconclusive. The rank
  interaction permutation test (`rank_interaction_test`) is reported beside it, not as the rule.
- Against the random map (the sign cells and Breakout's six): agree = same sign as Paper B and
  significant (Holm), disagree = opposite sign and significant, else inconclusive.

Paper B's noise-sensitivity column: Paper B's insertion script calls
`generate_greydanus_explanation(x, r=3, blur=1)` without `raw_diff`, so its `greydanus.py` scores
with Greydanus' original 1/2 ||f(x) - f(x')||^2 over the output. Our method with that score is
`noise_sensitivity_original` (score="output_l2"); `noise_sensitivity` is the chosen-action fix.
Every comparison with Paper B's tables maps its column to the original score (MATCHED, primary)
and shows the fix beside it (FIX, labelled); Paper B's own sanity findings keep their own
methods (the original fails, the fix passes).
"""
from __future__ import annotations

import argparse
import csv
import gzip
import json
from pathlib import Path

import numpy as np

from experiments.common.paths import RESULTS
from experiments.paper_b import report as R
from experiments.paper_b import stats as S
from jaxsal.metrics.statistics import (batch_means_test, holm, optimal_block_length, paired_block_test,
                                       rank_interaction_test, stationary_bootstrap_ci)

ROOT = RESULTS / "paper_b"
GAMES = R.GAMES
VARIANTS = ("auto", 25, 50, 100, "committed")
PRIMARY, ROBUST_AT = "auto", 100
N_RESAMPLES = 10_000
N_PERMUTATIONS = 10_000
LEVEL, ALPHA, SEED = 0.95, 0.05, 0
CROSSOVER_ALPHA = ALPHA / 4          # per setting: a false crossover needs a false claim in one of 4
FAIL_SPEARMAN = R.FAIL_SPEARMAN
INSERTION = [("insertion", s, c) for s, c in R.SETTINGS]
RANDOM = "random"
NOISE_ORIGINAL, NOISE_FIX = "noise_sensitivity_original", "noise_sensitivity"
# Paper B's seven methods; Paper B's "noise_sensitivity" column mapped to our method
MAPPINGS = {"matched": {m: (NOISE_ORIGINAL if m == "noise_sensitivity" else m) for m in R.PAPER_B_SET},
            "fix": {m: m for m in R.PAPER_B_SET}}
MAPPING_TITLES = {"matched": "Paper B's noise column = our original score (noise_sensitivity_original)",
                  "fix": "Paper B's noise column = our chosen-action fix (noise_sensitivity), as committed"}


# ------------------------------------------------------------------ inputs
def _read(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", newline="") as f:
        return list(csv.DictReader(f))


def load_aucs(d: Path) -> dict:
    """{(mode, substrate, score): {method: (N,) AUCs in play order}} from auc_per_state.csv.gz."""
    acc = {}
    for r in _read(d / "auc_per_state.csv.gz"):
        acc.setdefault((r["mode"], r["substrate"], r["score"]), {}).setdefault(r["method"], []).append(
            (int(r["state"]), float(r["auc"])))
    return {k: {m: np.array([v for _, v in sorted(rows)]) for m, rows in ms.items()} for k, ms in acc.items()}


def load_sanity(d: Path, metric: str = "spearman") -> dict:
    """{(method, randomised): (n,) similarity per state, averaged over the draws first}."""
    acc = {}
    for r in _read(d / "sanity_per_state.csv.gz"):
        if r["metric"] == metric:
            acc.setdefault((r["method"], r["randomised"]), {}).setdefault(int(r["state"]), []).append(
                float(r["similarity"]))
    return {k: np.array([np.mean(v[i]) for i in sorted(v)]) for k, v in acc.items()}


# ------------------------------------------------------------------ statistics per variant
def interval(x, variant) -> dict:
    if variant == "committed":
        mean, lo, hi = S.ci(x, S.BLOCK_LEN)
        return {"mean": mean, "low": lo, "high": hi, "block_len": float(S.BLOCK_LEN)}
    return stationary_bootstrap_ci(x, None if variant == "auto" else variant, N_RESAMPLES, LEVEL, SEED)


def paired_test(x, y, variant) -> dict:
    if variant == "committed":
        t = paired_block_test(x, y, S.BLOCK_LEN)
        return {"diff": t["diff"], "p": t["p"], "block_len": float(S.BLOCK_LEN), "blocks": t["blocks"]}
    t = batch_means_test(x, y, None if variant == "auto" else variant)
    return {"diff": t["diff"], "p": t["p"], "block_len": t["block_len"], "blocks": t["blocks"]}


def _holm_flags(rows, alpha=ALPHA):
    for r, p in zip(rows, holm([r["p"] for r in rows])):
        r["p_holm"] = float(p)
        r["significant"] = bool(np.isfinite(p) and p <= alpha)
    return rows


def against_random(aucs: dict, variant, with_ci: bool = True) -> dict:
    """{method: {mean, low, high, block_len, diff, p, p_holm, significant, test_block_len}} of one
    setting; Holm over the methods (the random map's row has no test). with_ci=False: the mean
    only, no interval (what the verdict rules need; for simulations)."""
    out, tested = {}, []
    for m, x in aucs.items():
        row = dict(interval(x, variant)) if with_ci else {"mean": float(np.mean(x))}
        if m != RANDOM:
            t = paired_test(x, aucs[RANDOM], variant)
            row.update({"diff": t["diff"], "p": t["p"], "test_block_len": t["block_len"]})
            tested.append(row)
        out[m] = row
    _holm_flags(tested)
    return out


def pairwise(aucs: dict, variant) -> dict:
    """{(a, b): {diff = mean(a - b), p, p_holm, significant}} over every pair of the setting
    (random map included, as committed); Holm over all pairs."""
    names = list(aucs)
    keys = [(a, b) for i, a in enumerate(names) for b in names[i + 1:]]
    rows = []
    for a, b in keys:
        t = paired_test(aucs[a], aucs[b], variant)
        rows.append({"diff": t["diff"], "p": t["p"], "test_block_len": t["block_len"]})
    _holm_flags(rows)
    return dict(zip(keys, rows))


def pair(pairs: dict, a, b, alpha=ALPHA):
    """(a above b significantly, b above a significantly) at Holm p <= alpha."""
    r = pairs.get((a, b))
    sign = 1.0
    if r is None:
        r, sign = pairs[(b, a)], -1.0
    sig = np.isfinite(r["p_holm"]) and r["p_holm"] <= alpha
    d = sign * r["diff"]
    return bool(sig and d > 0), bool(sig and d < 0)


# ------------------------------------------------------------------ rules
def sanity_verdict(ci: dict) -> str:
    """fails / passes / inconclusive by the committed rule (interval vs FAIL_SPEARMAN)."""
    lo, hi = ci["low"], ci["high"]
    if lo == hi:
        return "inconclusive"
    return "fails" if lo > FAIL_SPEARMAN else "passes" if hi < FAIL_SPEARMAN else "inconclusive"


def declared_best(rows: dict, pool) -> str | None:
    """The pool's highest-mean method if it is significantly above the random map, else None."""
    ranked = sorted((m for m in pool if m in rows), key=lambda m: -rows[m]["mean"])
    if not ranked:
        return None
    top = rows[ranked[0]]
    return ranked[0] if top["significant"] and top["diff"] > 0 else None


def best_verdict(x: str, pool, rows: dict, pairs: dict) -> dict:
    """Rule for "x is best" among `pool` in one setting (insertion: higher is better)."""
    pool = [m for m in pool if m in rows]
    ranked = sorted(pool, key=lambda m: -rows[m]["mean"])
    above = [m for m in pool if m != x and pair(pairs, m, x)[0]]
    x_beats_random = bool(rows[x]["significant"] and rows[x]["diff"] > 0)
    lead = all(pair(pairs, x, m)[0] for m in pool if m != x)
    if above:
        v, why = "disagree", f"significantly below {', '.join(above)}"
    elif ranked[0] == x and x_beats_random:
        v, why = "agree", "highest mean, above the random map" + ("; lead significant" if lead else
                                                                   "; lead not significant")
    elif ranked[0] == x:
        v, why = "inconclusive", "highest mean but not significantly above the random map"
    else:
        v, why = "inconclusive", f"{ranked[0]} has the highest mean, not significantly above {x}"
    return {"verdict": v, "why": why, "rank": ranked.index(x) + 1, "of": len(ranked), "top": ranked[0],
            "declared_best": declared_best(rows, pool), "x_beats_random": x_beats_random,
            "significantly_above_x": above}


def winner_crossover(rows_by_setting: dict, pairs_by_setting: dict, pool) -> dict:
    """Rule for "the substrate and the score decide the winner": a qualitative (crossover)
    method x setting interaction of the declared bests.

    agree: settings s, s' have declared bests w != w' (each significantly above the random
    map), w significantly above w' in s and w' significantly above w in s', both at Holm
    p <= CROSSOVER_ALPHA (= ALPHA / 4) over the pairs of that setting. Under the null that one
    ordering of the methods holds in every setting, a crossover needs a false directional claim
    in at least one of the four settings, so its probability is at most 4 x ALPHA / 4 = ALPHA
    whatever the dependence between settings (they share the states). disagree: one method is
    the declared best in all four settings and significantly above every other pool method in
    each (Holm, ALPHA). Else inconclusive.

    Why not a quantitative interaction test: AUC scales differ between settings (Q-value vs
    advantage), so additive interactions appear without any change of order; rank-based
    exchangeability tests (`rank_interaction_test`) also reject when one setting is only noisier
    (its mean ranks are compressed), again without any change of winner (tests show both). The
    claim is about the winner, and a significant crossover of winners is exactly that."""
    best = {s: declared_best(rows_by_setting[s], pool) for s in rows_by_setting}
    settings = list(rows_by_setting)
    found = []
    for i, s in enumerate(settings):
        for s2 in settings[i + 1:]:
            w, w2 = best[s], best[s2]
            if w is None or w2 is None or w == w2:
                continue
            if pair(pairs_by_setting[s], w, w2, CROSSOVER_ALPHA)[0] and \
                    pair(pairs_by_setting[s2], w2, w, CROSSOVER_ALPHA)[0]:
                found.append((s, s2, w, w2))
    if found:
        v = "agree"
    elif len({best[s] for s in settings}) == 1 and best[settings[0]] is not None and all(
            all(pair(pairs_by_setting[s], best[s], m)[0] for m in pool if m != best[s] and m in rows_by_setting[s])
            for s in settings):
        v = "disagree"
    else:
        v = "inconclusive"
    return {"verdict": v, "declared_best": {"/".join(s[1:]): b for s, b in best.items()},
            "crossovers": [{"settings": ["/".join(a[1:]), "/".join(b[1:])], "winners": [w, w2]}
                           for a, b, w, w2 in found]}


def sign_verdict(paper_b_above: bool, row: dict) -> str:
    if not row["significant"]:
        return "inconclusive"
    return "agree" if (row["diff"] > 0) == paper_b_above else "disagree"


def interaction_block_len(aucs_by_setting: dict, methods) -> int:
    """Block length of the rank interaction test: the largest automatic length among the
    per-state (method - random map) series of the four insertion settings."""
    return int(round(max(optimal_block_length(aucs_by_setting[s][m] - aucs_by_setting[s][RANDOM])
                         for s in aucs_by_setting for m in methods)))


# ------------------------------------------------------------------ one game
def analyse_game(aucs: dict, sanity: dict, game: str, variants=VARIANTS, n_permutations=None) -> dict:
    """Every statistic and verdict of one game, per variant. aucs / sanity as load_aucs / load_sanity."""
    n_permutations = N_PERMUTATIONS if n_permutations is None else n_permutations
    methods = [m for m in next(iter(aucs.values())) if m != RANDOM]
    res = {"game": game, "variants": {}}
    # automatic block lengths of every series (what the "auto" variant uses)
    bl = {"auc": [optimal_block_length(x) for k in aucs for x in aucs[k].values()],
          "diff_vs_random": [optimal_block_length(aucs[k][m] - aucs[k][RANDOM]) for k in aucs for m in methods],
          "sanity": [optimal_block_length(x) for x in sanity.values()] if sanity else []}
    res["block_lengths"] = {k: _summary(v) for k, v in bl.items() if v}
    ins = {s: aucs[s] for s in INSERTION if s in aucs}
    for variant in variants:
        out = {"against_random": {}, "pairwise": {}, "sanity": {}, "verdicts": []}
        for k, a in aucs.items():
            out["against_random"][k] = against_random(a, variant)
            if k[0] == "insertion":
                out["pairwise"][k] = pairwise(a, variant)
        for k, x in sanity.items():
            ci = interval(x, variant)
            out["sanity"][k] = {**ci, "verdict": sanity_verdict(ci)}
        out["verdicts"] = verdicts(game, out, methods)
        if len(ins) == 4:
            L = interaction_block_len(ins, methods) if variant == "auto" else (
                S.BLOCK_LEN if variant == "committed" else variant)
            vals = np.stack([np.stack([ins[s][m] for m in methods], -1) for s in INSERTION], 1)
            t = rank_interaction_test(vals, L, n_permutations, SEED)
            out["rank_interaction"] = {"block_len": L, "blocks": t["blocks"], "T": t["T"], "p": t["p"]}
        res["variants"][variant] = out
    return res


def _summary(v):
    v = np.asarray(v, float)
    return {"n": int(len(v)), "min": float(v.min()), "median": float(np.median(v)), "max": float(v.max()),
            "at_cap": int(np.sum(v >= v.max() - 1e-9)) if len(v) else 0}


def verdicts(game: str, out: dict, methods) -> list[dict]:
    """The verdict rows of one game and variant: (id, finding, mapping, verdict, detail)."""
    ar, pw, san = out["against_random"], out["pairwise"], out["sanity"]
    rows = []

    def add(fid, finding, verdict, detail, mapping=""):
        rows.append({"id": fid, "game": game, "finding": finding, "mapping": mapping, "verdict": verdict,
                     "detail": detail})
    # Paper B's sanity findings (their own methods)
    for m, want, text in ((NOISE_ORIGINAL, "fails", "original noise sensitivity fails the output-layer check"),
                          (NOISE_FIX, "passes", "the chosen-action fix passes it")):
        r = san.get((m, "q"))
        if r:
            got = r["verdict"]
            v = "inconclusive" if got == "inconclusive" else ("agree" if got == want else "disagree")
            add(f"sanity:{m}", text, v, f"Spearman at q {_ci(r)} ({got})")
    # every method's output-layer check by the same rule (not a Paper B finding: reported, no verdict)
    for m in methods:
        r = san.get((m, "q"))
        if r:
            add(f"sanity_q:{m}", f"{m}: output-layer sanity check", r["verdict"], f"Spearman at q {_ci(r)}")
    # SARFA / RISE best (Paper B's headline), Paper B's seven methods
    for x, sub, score, text in (("sarfa", "black", "advantage", "SARFA best on black / advantage"),
                                ("rise", "random", "q_value", "RISE best on random / Q-value")):
        s = ("insertion", sub, score)
        if s not in ar:
            continue
        for mp, pool in MAPPINGS.items():
            b = best_verdict(x, list(pool.values()), ar[s], pw[s])
            add(f"best:{x}", text, b["verdict"], _best_detail(b, ar[s], x), mp)
    # "none significantly above RISE" on random / Q-value (main README), three pools
    s = ("insertion", "random", "q_value")
    if s in pw:
        for name, pool in (("matched", list(MAPPINGS["matched"].values())), ("fix", list(MAPPINGS["fix"].values())),
                           ("all", methods)):
            above = [m for m in pool if m != "rise" and pair(pw[s], m, "rise")[0]]
            add("above_rise", "methods significantly above RISE on random / Q-value",
                "none" if not above else "some", ", ".join(above) or "none", name)
    # the substrate and the score decide the winner
    if all(s in ar for s in INSERTION):
        for name, pool in (("all", methods), ("matched", list(MAPPINGS["matched"].values()))):
            c = winner_crossover({s: ar[s] for s in INSERTION}, {s: pw[s] for s in INSERTION}, pool)
            det = "; ".join(f"{k}: {v or 'none'}" for k, v in c["declared_best"].items())
            if c["crossovers"]:
                det += "; crossover " + ", ".join(f"{x['winners'][0]} ({x['settings'][0]}) vs {x['winners'][1]} "
                                                 f"({x['settings'][1]})" for x in c["crossovers"])
            add("winner_depends", "the substrate and the score decide the winner", c["verdict"], det, name)
    # Paper B's own table: its best per setting, and each method's sign against its random map
    for sub, score in R.SETTINGS:
        s = ("insertion", sub, score)
        if s not in ar:
            continue
        theirs = {m: v for m, v in R.PAPER_B_AUC[game][(sub, score)].items() if m in R.PAPER_B_SET}
        b_best = max(theirs, key=theirs.get)
        for mp, mapping in MAPPINGS.items():
            b = best_verdict(mapping[b_best], list(mapping.values()), ar[s], pw[s])
            add(f"table_best:{sub}/{score}", f"best on {sub} / {score}: {b_best} ({theirs[b_best]})", b["verdict"],
                _best_detail(b, ar[s], mapping[b_best]), mp)
        b_tab = R.PAPER_B_AUC[game][(sub, score)]
        for m in R.PAPER_B_SET:
            up = b_tab[m] > b_tab["random"]
            for mp, mapping in MAPPINGS.items():
                if mp == "fix" and mapping[m] == MAPPINGS["matched"][m]:
                    continue                                   # the same method under both mappings
                r = ar[s][mapping[m]]
                add(f"sign:{m}:{sub}/{score}", f"{m} {'above' if up else 'below'} the random map ({sub} / {score})",
                    sign_verdict(up, r), f"ours {r['diff']:+.3f}, Holm p {r['p_holm']:.3g}", mp)
    if game == "breakout":
        s = ("insertion", "black", "q_value")
        for m, theirs in R.PAPER_B_BREAKOUT.items():
            up = theirs > R.PAPER_B_RANDOM
            for mp, mapping in MAPPINGS.items():
                if mp == "fix" and mapping[m] == MAPPINGS["matched"][m]:
                    continue
                r = ar[s][mapping[m]]
                add(f"breakout:{m}", f"{m} {'above' if up else 'below'} the random map (black/Q: {theirs} vs "
                    f"{R.PAPER_B_RANDOM})", sign_verdict(up, r),
                    f"{_ci(r)}; minus random {r['diff']:+.2f}, Holm p {r['p_holm']:.3g}", mp)
    return rows


def _ci(r):
    return f"{r['mean']:.2f} [{r['low']:.2f}, {r['high']:.2f}]"


def _best_detail(b, rows, x):
    d = f"{x} {_ci(rows[x])}, rank {b['rank']} of {b['of']}; {b['why']}"
    if b["top"] != x:
        d += f"; top {b['top']} {_ci(rows[b['top']])}"
    return d + f"; declared best: {b['declared_best'] or 'none (no method above the random map)'}"


# ------------------------------------------------------------------ committed verdicts and changes
def committed_verdicts(game: str, d: Path) -> dict:
    """{verdict id: committed verdict} from the committed report's own functions."""
    out = {}
    for f in R.game_findings(game, d):
        t = f["finding"]
        if t.startswith("original noise"):
            out[f"sanity:{NOISE_ORIGINAL}"] = f["verdict"]
        elif t.startswith("the chosen-action fix"):
            out[f"sanity:{NOISE_FIX}"] = f["verdict"]
        elif t.startswith("SARFA best"):
            out["best:sarfa"] = f["verdict"]
        elif t.startswith("RISE best"):
            out["best:rise"] = f["verdict"]
        elif t.startswith("the substrate"):
            out["winner_depends"] = f["verdict"]
        elif game == "breakout":
            out[f"breakout:{t.split(' ')[0]}"] = f["verdict"]
    for f in R.paper_b_winners(game, d):
        setting = f["finding"].split(":")[0].replace("best on ", "").replace(" / ", "/")
        out[f"table_best:{setting}"] = f["verdict"]
    lines, _ = R.direction_table(game, d)
    for line in lines[2:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        for (sub, score), c in zip(R.SETTINGS, cells[1:]):
            out[f"sign:{cells[0]}:{sub}/{score}"] = c.rsplit(": ", 1)[-1]
    return out


def _why(vid, res, mapping) -> str:
    """Which step moves the committed verdict: new rule on the committed statistics (fix mapping),
    then the matched mapping, then the autocorrelation-robust statistics."""
    steps = [("rule", "committed", "fix"), ("noise mapping", "committed", mapping), ("statistics", PRIMARY, mapping)]
    vals = []
    for name, variant, mp in steps:
        v = _lookup(res["variants"][variant]["verdicts"], vid, mp)
        vals.append((name, v))
    return vals


def _lookup(rows, vid, mapping):
    """The verdict of `vid` under `mapping` ("" rows have one verdict; fix falls back to matched
    where both map to the same method)."""
    want = [r for r in rows if r["id"] == vid]
    for mp in (mapping, "matched" if mapping == "fix" else mapping, ""):
        for r in want:
            if r["mapping"] == mp:
                return r["verdict"]
    return None


def changes(res: dict, committed: dict) -> list[dict]:
    """Every verdict whose primary re-analysis value (matched mapping, pool of all 20 for the
    winner claim) differs from the committed one, with the step that moved it."""
    prim = res["variants"][PRIMARY]["verdicts"]
    out = []
    for vid, old in committed.items():
        mp = "all" if vid == "winner_depends" else "matched"
        new = _lookup(prim, vid, mp)
        if new is None or new == old:
            continue
        row = next(r for r in prim if r["id"] == vid and r["mapping"] in (mp, ""))
        path = [] if vid == "winner_depends" else _why(vid, res, mp)
        prev, why = old, []
        for name, v in path:
            if v is not None and v != prev:
                why.append(f"{name}: {prev} -> {v}")
                prev = v
        if vid == "winner_depends":
            why = ["rule: argmax over 20 methods differs -> significant crossover of declared bests"]
        out.append({"id": vid, "game": res["game"], "finding": row["finding"], "committed": old, "reanalysis": new,
                    "robust": _lookup(res["variants"][ROBUST_AT]["verdicts"], vid, mp) == new,
                    "why": "; ".join(why) or "combination", "detail": row["detail"]})
    return out


# ------------------------------------------------------------------ outputs
def robust(res, vid, mapping):
    a = _lookup(res["variants"][PRIMARY]["verdicts"], vid, mapping)
    b = _lookup(res["variants"][ROBUST_AT]["verdicts"], vid, mapping)
    return a == b


def game_markdown(res: dict, committed: dict, ch: list[dict]) -> str:
    g = res["game"]
    v = res["variants"]
    bl = res["block_lengths"]
    lines = [f"# Re-analysis of Paper B on {g} (committed data, issue 33)", "",
             R.first_study_banner("../../paper_b_rerun/summary.md"), "",
             "**Re-analysis** of the committed per-state AUCs and similarities (no map recomputed). Rules: "
             "`experiments/paper_b/reanalysis.py` and the results README's \"Re-analysis (pre-declared)\". "
             "Primary = stationary bootstrap / batch-means tests at the automatic block length; `robust` = the "
             "same verdict with 100-state blocks.", "",
             "## Automatic block lengths (states)", "", "| series | n | min | median | max |", "|---|---|---|---|---|"]
    for k, s in bl.items():
        lines.append(f"| {k} | {s['n']} | {s['min']:.1f} | {s['median']:.1f} | {s['max']:.1f} |")
    if "rank_interaction" in v[PRIMARY]:
        lines += ["", "Rank interaction test (reported, not a rule): " + "; ".join(
            f"{var}: blocks of {v[var]['rank_interaction']['block_len']} ({v[var]['rank_interaction']['blocks']}), "
            f"p {v[var]['rank_interaction']['p']:.4g}" for var in VARIANTS if "rank_interaction" in v[var])]
    lines += ["", "## Verdicts", "", "mapping: matched = Paper B's noise column read as our original score "
              "(primary); fix = read as our chosen-action fix (as committed). all = all 20 methods.", "",
              "| finding | mapping | committed | re-analysis (auto) | 25 | 50 | 100 | committed stats | detail (auto) |",
              "|---|---|---|---|---|---|---|---|---|"]
    for r in v[PRIMARY]["verdicts"]:
        if r["id"].startswith("sanity_q:"):
            continue
        old = "" if (r["id"] == "winner_depends" and r["mapping"] == "matched") else committed.get(r["id"], "")
        others = [(_lookup(v[var]["verdicts"], r["id"], r["mapping"]) or "") for var in (25, 50, 100, "committed")]
        lines.append(f"| {r['finding']} | {r['mapping']} | {old} | **{r['verdict']}** | " + " | ".join(others) +
                     f" | {r['detail']} |")
    lines += ["", "## Output-layer sanity check of every method (Spearman at `q`, the rule that fails noise "
              "sensitivity)", "", "| method | auto: mean [95 % CI] (block) | verdict | 100-state blocks | verdict "
              "| committed CI | verdict |", "|---|---|---|---|---|---|---|"]
    for key, r in v[PRIMARY]["sanity"].items():
        if key[1] != "q":
            continue
        r100, rc = v[100]["sanity"][key], v["committed"]["sanity"][key]
        lines.append(f"| {key[0]} | {_ci(r)} ({r['block_len']:.1f}) | {r['verdict']} | {_ci(r100)} | "
                     f"{r100['verdict']} | {_ci(rc)} | {rc['verdict']} |")
    fails = {}
    for key, r in v[PRIMARY]["sanity"].items():
        if r["verdict"] == "fails":
            fails.setdefault(key[0], []).append(key[1])
    lines += ["", "Every cascade step at which a method fails by the same rule (auto): " +
              ("; ".join(f"{m}: {', '.join(gs)}" for m, gs in fails.items()) or "none")]
    lines += ["", "## Insertion AUC against the random map (auto)", "",
              "| setting | method | mean [95 % CI] (block) | minus random | Holm p (auto) | sig. auto / 100 / committed |",
              "|---|---|---|---|---|---|"]
    for s in INSERTION:
        for m, r in v[PRIMARY]["against_random"].get(s, {}).items():
            if m == RANDOM:
                lines.append(f"| {s[1]} / {s[2]} | {m} | {_ci(r)} ({r['block_len']:.1f}) | | | |")
                continue
            flags = "/".join("*" if v[var]["against_random"][s][m]["significant"] else "." for var in
                             (PRIMARY, 100, "committed"))
            lines.append(f"| {s[1]} / {s[2]} | {m} | {_ci(r)} ({r['block_len']:.1f}) | {r['diff']:+.3f} | "
                         f"{r['p_holm']:.3g} | {flags} |")
    lines += ["", f"## Verdicts that change against the committed summary ({len(ch)})", ""]
    lines += [f"- {c['finding']}: {c['committed']} -> **{c['reanalysis']}**{'' if c['robust'] else ' (not robust at 100)'}"
              f" ({c['why']}). {c['detail']}" for c in ch] or ["- none"]
    return "\n".join(lines) + "\n"


def _jsonable(res: dict) -> dict:
    """res without the big per-pair tables (those go to reanalysis_tables.csv.gz), keys as strings."""
    out = {"game": res["game"], "block_lengths": res["block_lengths"], "variants": {}}
    for var, o in res["variants"].items():
        out["variants"][str(var)] = {
            "verdicts": o["verdicts"], "rank_interaction": o.get("rank_interaction"),
            "sanity": {f"{k[0]}/{k[1]}": r for k, r in o["sanity"].items()},
            "against_random": {"/".join(k): r for k, r in o["against_random"].items()}}
    return out


def table_rows(res: dict):
    for var, o in res["variants"].items():
        for k, rows in o["against_random"].items():
            for m, r in rows.items():
                yield {"variant": var, "table": "against_random", "mode": k[0], "substrate": k[1], "score": k[2],
                       "a": m, "b": RANDOM, **{f: r.get(f, "") for f in ("mean", "low", "high", "block_len", "diff",
                                                                          "p", "p_holm", "significant")}}
        for k, prs in o["pairwise"].items():
            for (a, b), r in prs.items():
                yield {"variant": var, "table": "pairwise", "mode": k[0], "substrate": k[1], "score": k[2], "a": a,
                       "b": b, "mean": "", "low": "", "high": "", "block_len": r["test_block_len"], "diff": r["diff"],
                       "p": r["p"], "p_holm": r["p_holm"], "significant": r["significant"]}
        for (m, grp), r in o["sanity"].items():
            yield {"variant": var, "table": "sanity_spearman", "mode": "", "substrate": grp, "score": "", "a": m,
                   "b": "", "mean": r["mean"], "low": r["low"], "high": r["high"], "block_len": r["block_len"],
                   "diff": "", "p": "", "p_holm": "", "significant": r["verdict"]}


def run(root: Path = ROOT, games=GAMES, log=print) -> dict:
    summary = {}
    for g in games:
        d = root / g
        log(f"[{g}] loading")
        res = analyse_game(load_aucs(d), load_sanity(d), g)
        committed = committed_verdicts(g, d)
        ch = changes(res, committed)
        (d / "reanalysis.md").write_text(game_markdown(res, committed, ch))
        (d / "reanalysis.json").write_text(json.dumps({**_jsonable(res), "committed_verdicts": committed,
                                                       "changes": ch}, indent=1, default=_default))
        rows = list(table_rows(res))
        with gzip.open(d / "reanalysis_tables.csv.gz", "wt", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
        summary[g] = {"res": res, "committed": committed, "changes": ch}
        log(f"[{g}] {len(ch)} verdicts change")
    (root / "reanalysis.md").write_text(overall_markdown(summary))
    return summary


def _default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, np.bool_):
        return bool(o)
    raise TypeError(type(o))


def overall_markdown(summary: dict) -> str:
    lines = ["# Re-analysis of Paper B's committed data (issue 33, item 1)", "",
             R.first_study_banner("../paper_b_rerun/summary.md"), "",
             "**Re-analysis**: the committed per-state AUCs and similarities of the four games under "
             "autocorrelation-robust inference and the rules of the results README's \"Re-analysis "
             "(pre-declared)\" (`python -m experiments.paper_b.reanalysis`). Per game: `<game>/reanalysis.md`.", "",
             "## Automatic block lengths (states; median [min, max])", "",
             "| game | AUC series | method - random map | sanity (200 states) | rank interaction test |",
             "|---|---|---|---|---|"]
    for g, s in summary.items():
        b = s["res"]["block_lengths"]
        ri = s["res"]["variants"][PRIMARY].get("rank_interaction", {})
        cells = [f"{b[k]['median']:.1f} [{b[k]['min']:.1f}, {b[k]['max']:.1f}]" if k in b else "" for k in
                 ("auc", "diff_vs_random", "sanity")]
        lines.append(f"| {g} | " + " | ".join(cells) + f" | {ri.get('block_len', '')} |")
    lines += ["", "## Counts (primary: auto, matched noise mapping)", "",
              "| verdict family | committed agree / disagree / inconclusive | re-analysis | robust at 100 |",
              "|---|---|---|---|"]
    fams = {"sanity": "Paper B's sanity findings", "best": "SARFA / RISE best", "winner_depends": "winner depends on the setting",
            "table_best": "Paper B's best per setting", "sign": "each method against the random map",
            "breakout": "Breakout's committed AUCs (sign)"}
    for pre, title in fams.items():
        old, new, rob = [], [], []
        for g, s in summary.items():
            for vid, v in s["committed"].items():
                if vid.split(":")[0] != pre:
                    continue
                mp = "all" if pre == "winner_depends" else "matched"
                old.append(v)
                nv = _lookup(s["res"]["variants"][PRIMARY]["verdicts"], vid, mp)
                new.append(nv)
                rob.append(nv if robust(s["res"], vid, mp) else "inconclusive")
        lines.append(f"| {title} | {_count(old)} | {_count(new)} | {_count(rob)} |")
    lines += ["", "`robust at 100`: a verdict that the 100-state blocks do not confirm is counted inconclusive.", "",
              "## Every verdict that changes", "", "| game | finding | committed | re-analysis | robust at 100 | why "
              "| detail |", "|---|---|---|---|---|---|---|"]
    for g, s in summary.items():
        for c in s["changes"]:
            lines.append(f"| {g} | {c['finding']} | {c['committed']} | {c['reanalysis']} | "
                         f"{'yes' if c['robust'] else 'no'} | {c['why']} | {c['detail']} |")
    lines += ["", "## Output-layer sanity failures by the one rule (auto; Spearman at `q` above 0.5)", ""]
    for g, s in summary.items():
        f = [f"{k[0]} {_ci(r)}" for k, r in s["res"]["variants"][PRIMARY]["sanity"].items()
             if k[1] == "q" and r["verdict"] == "fails"]
        lines.append(f"- {g}: " + ("; ".join(f) or "none"))
    return "\n".join(lines) + "\n"


def _count(v):
    return f"{v.count('agree')} / {v.count('disagree')} / {v.count('inconclusive')}"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--games", nargs="+", default=list(GAMES), choices=GAMES)
    p.add_argument("--root", default=str(ROOT))
    a = p.parse_args(argv)
    run(Path(a.root), a.games)


if __name__ == "__main__":
    main()
