"""Paper B re-analysis (issue 33): its rules on planted answers and its pipeline end to end on a
synthetic game folder (no committed data is read here)."""
import csv
import gzip
import json

import numpy as np
import pytest
from scipy.signal import lfilter

from experiments.paper_b import reanalysis as RA
from experiments.paper_b import report as R
from experiments.paper_b import stats as S


def _ar1(n, phi, rng):
    return lfilter([1.0], [1.0, -phi], rng.normal(size=n + 300))[300:] * np.sqrt(1 - phi ** 2)


def _setting(n, means, noise, rho, rng, shared_sd=0.5):
    """{method: per-state AUCs}: means + a state effect shared by all methods + AR(1) noise."""
    shared = shared_sd * _ar1(n, rho, rng)
    return {m: mu + shared + noise * _ar1(n, rho, rng) for m, mu in means.items()}


def _rows_pairs(aucs, variant="auto"):
    return RA.against_random(aucs, variant, with_ci=False), RA.pairwise(aucs, variant)


def test_best_needs_the_random_map_and_loses_to_a_significant_rival():
    rng = np.random.default_rng(0)
    pool = ["a", "b", "c"]
    # a on top but no better than the random map: no declared best, inconclusive
    rows, pairs = _rows_pairs(_setting(1000, {"a": 0.02, "b": -0.5, "c": -0.6, "random": 0.0}, 0.3, 0.5, rng))
    v = RA.best_verdict("a", pool, rows, pairs)
    assert (v["verdict"], v["declared_best"]) == ("inconclusive", None)
    # b clearly above a: disagree
    rows, pairs = _rows_pairs(_setting(1000, {"a": 0.5, "b": 1.0, "c": 0.0, "random": 0.0}, 0.3, 0.5, rng))
    v = RA.best_verdict("a", pool, rows, pairs)
    assert v["verdict"] == "disagree" and v["significantly_above_x"] == ["b"]
    assert RA.best_verdict("b", pool, rows, pairs)["verdict"] == "agree"
    assert RA.declared_best(rows, pool) == "b"


@pytest.mark.parametrize("low, high, want", [
    (0.55, 0.9, "fails"), (0.1, 0.45, "passes"),             # the whole interval above / below 0.5
    (0.4, 0.7, "inconclusive"), (0.3, 0.55, "inconclusive"),  # one end on each side
    (0.7, 0.7, "inconclusive"),                               # a collapsed interval (one block) decides nothing
])
def test_sanity_rule_needs_the_whole_interval_on_one_side(low, high, want):
    assert RA.sanity_verdict({"mean": (low + high) / 2, "low": low, "high": high}) == want


def _four(n, means_by_setting, noise, rho, seed):
    rng = np.random.default_rng(seed)
    return {s: _setting(n, means_by_setting[i], noise[i], rho, rng) for i, s in enumerate(RA.INSERTION)}


def _crossover(data, pool):
    rows = {s: RA.against_random(a, "auto", with_ci=False) for s, a in data.items()}
    pairs = {s: RA.pairwise(a, "auto") for s, a in data.items()}
    return RA.winner_crossover(rows, pairs, pool)


def test_winner_crossover_finds_a_planted_crossover():
    base = {"a": 1.0, "b": 0.6, "c": 0.3, "random": 0.0}
    swapped = {"a": 0.6, "b": 1.0, "c": 0.3, "random": 0.0}
    c = _crossover(_four(1000, [base, base, swapped, swapped], [0.3, 0.1, 0.6, 0.2], 0.9, 1), ["a", "b", "c"])
    assert c["verdict"] == "agree"
    assert c["declared_best"] == {"black/q_value": "a", "black/advantage": "a", "random/q_value": "b",
                                  "random/advantage": "b"}
    # one method far ahead everywhere: disagree
    far = {"a": 2.0, "b": 0.6, "c": 0.3, "random": 0.0}
    assert _crossover(_four(1000, [far] * 4, [0.3, 0.1, 0.6, 0.2], 0.9, 2), ["a", "b", "c"])["verdict"] == "disagree"


def test_winner_crossover_holds_its_level_when_only_scales_and_noise_differ():
    # the same order in every setting (a slightly ahead of b), settings with different noise and
    # scale, dependence like the games (AR(1) 0.9): a false "agree" at most ~alpha of the time
    hits = 0
    for s in range(60):
        means = [{m: k * v for m, v in {"a": 0.12, "b": 0.1, "c": 0.0, "random": -0.2}.items()}
                 for k in (1.0, 0.2, 3.0, 0.5)]
        c = _crossover(_four(1000, means, [0.3, 0.1, 1.5, 0.15], 0.9, 100 + s), ["a", "b", "c"])
        hits += c["verdict"] == "agree"
    assert hits / 60 <= 0.08


def _write_game(d, aucs, sanity):
    """A game folder as experiments.paper_b.run writes it, from per-state data (committed statistics
    recomputed by paper_b_stats, as the real run did)."""
    d.mkdir(parents=True)
    (d / "meta.json").write_text(json.dumps({"agent": "x", "agent_return": 1.0, "layer_norm": True}))
    per, auc_rows, pair_rows = [], [], []
    for (mode, sub, score), a in aucs.items():
        for m, x in a.items():
            per += [{"mode": mode, "substrate": sub, "score": score, "method": m, "state": i, "auc": v}
                    for i, v in enumerate(x)]
        for r in S.against_random(a):
            auc_rows.append({"mode": mode, "substrate": sub, "score": score, "method": r["method"], "mean": r["mean"],
                             "low": r["low"], "high": r["high"], "diff_vs_random": r["diff"], "p": r["p"],
                             "p_holm": r["p_holm"], "significant": r["significant"]})
        for r in S.pairwise(a):
            pair_rows.append({"mode": mode, "substrate": sub, "score": score, **r})
    san_per, san_rows = [], []
    for (m, g), x in sanity.items():
        mean, lo, hi = S.ci(x)
        san_rows.append({"method": m, "randomised": g, "metric": "spearman", "mean": mean, "low": lo, "high": hi})
        san_per += [{"method": m, "randomised": g, "metric": "spearman", "draw": 0, "state": i, "similarity": v}
                    for i, v in enumerate(x)]
    for name, rows in (("auc_per_state.csv.gz", per), ("auc.csv", auc_rows), ("pairwise.csv", pair_rows),
                       ("sanity.csv", san_rows), ("sanity_per_state.csv.gz", san_per)):
        opener = gzip.open if name.endswith(".gz") else open
        with opener(d / name, "wt", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)


def test_pipeline_on_a_synthetic_game_maps_the_noise_column_and_lists_the_change(tmp_path, monkeypatch):
    monkeypatch.setattr(RA, "N_RESAMPLES", 300)
    monkeypatch.setattr(RA, "N_PERMUTATIONS", 99)
    rng = np.random.default_rng(7)
    methods = list(dict.fromkeys(list(R.PAPER_B_SET) + [RA.NOISE_ORIGINAL]))
    aucs = {}
    for mode in ("insertion", "deletion"):
        for sub, score in R.SETTINGS:
            means = {m: 0.3 for m in methods}
            means.update({"sarfa": 1.0, "random": 0.0})
            if (mode, sub, score) == ("insertion", "black", "q_value"):
                # MsPacman black / Q: Paper B has noise sensitivity above its random map. Plant our
                # chosen-action fix above ours and the original score below it
                means.update({RA.NOISE_FIX: 0.5, RA.NOISE_ORIGINAL: -0.5})
            aucs[(mode, sub, score)] = _setting(300, means, 0.2, 0.5, rng)
    sanity = {(RA.NOISE_ORIGINAL, "q"): 0.9 + 0.02 * rng.normal(size=200),
              (RA.NOISE_FIX, "q"): 0.1 + 0.02 * rng.normal(size=200),
              ("rise", "q"): 0.65 + 0.02 * rng.normal(size=200)}
    _write_game(tmp_path / "mspacman", aucs, sanity)
    summary = RA.run(tmp_path, games=["mspacman"], log=lambda m: None)
    res, ch = summary["mspacman"]["res"], summary["mspacman"]["changes"]
    # the committed variant reproduces the committed tables
    committed_rows = {(r["substrate"], r["score"], r["method"]): r for r in RA._read(tmp_path / "mspacman" / "auc.csv")
                      if r["mode"] == "insertion"}
    for (mode, sub, score), rows in res["variants"]["committed"]["against_random"].items():
        if mode == "insertion":
            for m, r in rows.items():
                assert r["mean"] == pytest.approx(float(committed_rows[(sub, score, m)]["mean"]))
                if m != "random":
                    assert r["p_holm"] == pytest.approx(float(committed_rows[(sub, score, m)]["p_holm"]))
    rows = res["variants"]["auto"]["verdicts"]
    sign = {r["mapping"]: r["verdict"] for r in rows if r["id"] == "sign:noise_sensitivity:black/q_value"}
    assert sign == {"matched": "disagree", "fix": "agree"}
    c = next(c for c in ch if c["id"] == "sign:noise_sensitivity:black/q_value")
    assert (c["committed"], c["reanalysis"]) == ("agree", "disagree") and "noise mapping" in c["why"]
    # RISE fails the output-layer check by the same rule, and is reported
    assert next(r for r in rows if r["id"] == "sanity_q:rise")["verdict"] == "fails"
    assert "rise" in (tmp_path / "reanalysis.md").read_text().split("Output-layer sanity failures")[1]
    # SARFA is the planted best on black / advantage and beats the random map: agree under both mappings
    assert {r["mapping"]: r["verdict"] for r in rows if r["id"] == "best:sarfa"} == {"matched": "agree", "fix": "agree"}
    for f in ("reanalysis.md", "reanalysis.json", "reanalysis_tables.csv.gz"):
        assert (tmp_path / "mspacman" / f).exists()
    assert json.loads((tmp_path / "mspacman" / "reanalysis.json").read_text())["changes"]
