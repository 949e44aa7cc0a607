"""Paper B's statistics, fixed before any full-size data were looked at (issue 16).

Pre-declared analysis (also stated in experiments/results/paper_b/README.md):
- Unit of resampling: blocks of BLOCK_LEN = 25 consecutive greedy-play states (100 emulator
  frames, ~1.7 s of play at frame skip 4), cut with numpy.array_split into round(n / 25)
  near-equal contiguous blocks (1,000 states -> 40 blocks; 200 sanity states -> 8 blocks).
  Chosen from the game's time scale, not from the data; the runs record the value used.
- Means get 95 % percentile block-bootstrap intervals, N_RESAMPLES = 10,000 resamples, seed 0.
- Each method against the random-map baseline, per setting (mode x substrate x score): a
  two-sided Wilcoxon signed-rank test on the per-block means of the paired per-state AUC
  differences (method - random map, same states, same substrate draw); Holm-adjusted over the
  methods of that setting, significant at ALPHA = 0.05.
- Between methods, per setting: the same test for every pair, Holm-adjusted over all pairs
  of the setting.
- Sanity check: per state, the similarity is averaged over the randomisation draws first
  (draws share the states, so they are not independent samples of states), then the block
  bootstrap gives the interval over states.
"""
from __future__ import annotations

import itertools

import numpy as np

from jaxsal.metrics.statistics import block_bootstrap_ci, holm, paired_block_test

BLOCK_LEN = 25
N_RESAMPLES = 10_000
LEVEL = 0.95
ALPHA = 0.05
SEED = 0
TEST = ("two-sided Wilcoxon signed-rank test on per-block means of paired per-state differences, "
        "Holm-adjusted")


def ci(x, block_len: int = BLOCK_LEN):
    """(mean, low, high) of per-state values x (in play order), block bootstrap."""
    return block_bootstrap_ci(x, block_len, N_RESAMPLES, LEVEL, SEED)


def against_random(aucs: dict, baseline: str = "random", block_len: int = BLOCK_LEN) -> list[dict]:
    """Rows {method, mean, low, high, diff, p, p_holm, significant} for one setting.

    aucs: {method: (N,) per-state AUCs} including the baseline; the baseline's row has no test."""
    rows = []
    for m, x in aucs.items():
        mean, lo, hi = ci(x, block_len)
        row = {"method": m, "mean": mean, "low": lo, "high": hi, "diff": np.nan, "p": np.nan}
        if m != baseline:
            row.update({k: v for k, v in paired_block_test(x, aucs[baseline], block_len).items()
                        if k in ("diff", "p")})
        rows.append(row)
    adj = holm([r["p"] for r in rows])
    for r, p in zip(rows, adj):
        r["p_holm"] = p
        r["significant"] = bool(p <= ALPHA) if np.isfinite(p) else False
    return rows


def pairwise(aucs: dict, block_len: int = BLOCK_LEN) -> list[dict]:
    """Every pair (a, b) of methods of one setting: diff = mean(a - b), p, Holm p, significant."""
    rows = []
    for a, b in itertools.combinations(list(aucs), 2):
        t = paired_block_test(aucs[a], aucs[b], block_len)
        rows.append({"a": a, "b": b, "diff": t["diff"], "p": t["p"]})
    adj = holm([r["p"] for r in rows])
    for r, p in zip(rows, adj):
        r["p_holm"] = p
        r["significant"] = bool(p <= ALPHA) if np.isfinite(p) else False
    return rows


def significance_matrix(methods: list, pairs: list[dict], higher_is_better: bool = True) -> list[str]:
    """Markdown matrix: cell (row r, column c) '>' when r is significantly better than c, '<'
    significantly worse, '.' not significant (better = higher AUC for insertion, lower for
    deletion)."""
    sig = {}
    for r in pairs:
        if r["significant"]:
            better = (r["diff"] > 0) == higher_is_better
            sig[r["a"], r["b"]] = ">" if better else "<"
            sig[r["b"], r["a"]] = "<" if better else ">"
    short = {m: str(i + 1) for i, m in enumerate(methods)}
    lines = ["| # | method | " + " | ".join(short[m] for m in methods) + " |",
             "|---|---|" + "---|" * len(methods)]
    for m in methods:
        cells = ["" if m == c else sig.get((m, c), ".") for c in methods]
        lines.append(f"| {short[m]} | {m} | " + " | ".join(cells) + " |")
    return lines
