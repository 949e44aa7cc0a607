"""The Paper B results README's verdicts against Paper B's own per-game table, on synthetic outputs."""
import csv
import json

import pytest

from experiments.paper_b import report as R

FIELDS = ["mode", "substrate", "score", "method", "mean", "low", "high", "diff_vs_random", "p", "p_holm",
          "significant"]


def _write(d, means, significant_pairs=(), above_random=()):
    """A game folder with insertion AUCs `means` {(sub, score): {method: mean}}; pairs in
    significant_pairs differ significantly; methods in above_random differ from the random map."""
    d.mkdir()
    (d / "meta.json").write_text(json.dumps({"agent": "x", "agent_return": 12.345, "layer_norm": True}))
    rows, pairs = [], []
    for (sub, score), ms in means.items():
        rnd = ms["random"]
        for m, v in ms.items():
            rows.append({"mode": "insertion", "substrate": sub, "score": score, "method": m, "mean": v,
                         "low": v - 0.1, "high": v + 0.1, "diff_vs_random": v - rnd, "p": 0, "p_holm": 0,
                         "significant": m in above_random})
        names = [m for m in ms if m != "random"]
        for i, a in enumerate(names):
            for b in names[i + 1:]:
                pairs.append({"mode": "insertion", "substrate": sub, "score": score, "a": a, "b": b,
                              "diff": ms[a] - ms[b], "p": 0, "p_holm": 0,
                              "significant": frozenset((a, b)) in significant_pairs})
    for name, data, fields in (("auc.csv", rows, FIELDS),
                               ("pairwise.csv", pairs, ["mode", "substrate", "score", "a", "b", "diff", "p",
                                                        "p_holm", "significant"])):
        with open(d / name, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            w.writeheader()
            w.writerows(data)


def _means(best):
    """Every setting: `best` first at 2.0, the other Paper B methods at 1.0, random at 0.5."""
    return {s: {**{m: (2.0 if m == best else 1.0) for m in R.PAPER_B_SET}, "random": 0.5} for s in R.SETTINGS}


def test_paper_b_table_matches_the_spec_breakout_row():
    b = R.PAPER_B_AUC["breakout"][("black", "q_value")]
    assert {m: b[m] for m in R.PAPER_B_BREAKOUT} == R.PAPER_B_BREAKOUT
    assert b["random"] == R.PAPER_B_RANDOM
    assert set(R.PAPER_B_AUC) == set(R.GAMES)


@pytest.mark.parametrize("best, sig, verdict", [
    ("sarfa", set(), "agree"),                                                  # Paper B's winner
    ("occlusion", set(), "inconclusive"),                                      # another, tied with it
    ("occlusion", {frozenset(("occlusion", "sarfa"))}, "disagree"),            # another, above it
])
def test_winner_verdicts(tmp_path, best, sig, verdict):
    # MsPacman, black / advantage: Paper B's best of its seven is SARFA (1.7)
    _write(tmp_path / "g", _means(best), significant_pairs=sig)
    rows = {f["finding"]: f for f in R.paper_b_winners("mspacman", tmp_path / "g")}
    row = rows["best on black / advantage: sarfa (1.7)"]
    assert row["verdict"] == verdict
    assert (row["reason"] == "") == (verdict == "agree")


def test_direction_table_counts(tmp_path):
    # MsPacman black / q_value: Paper B has occlusion above its random map, noise sensitivity above too
    means = _means("occlusion")
    means[("black", "q_value")]["noise_sensitivity"] = 0.2          # ours below random
    _write(tmp_path / "g", means, above_random={"occlusion", "noise_sensitivity"})
    lines, counts = R.direction_table("mspacman", tmp_path / "g")
    occl = next(line for line in lines if line.startswith("| occlusion |"))
    noise = next(line for line in lines if line.startswith("| noise_sensitivity |"))
    assert occl.split(" | ")[1].endswith("agree")
    assert noise.split(" | ")[1].endswith("disagree")
    assert sum(counts.values()) == len(R.PAPER_B_SET) * len(R.SETTINGS)
    assert counts["inconclusive"] == (len(R.PAPER_B_SET) - 2) * len(R.SETTINGS)


def test_return_formatting():
    assert R.fmt_return(1758.3333333) == "1758.3"
    assert R.fmt_return(None) == "unknown"


def test_regenerating_the_readme_keeps_the_reanalysis_section(tmp_path):
    (tmp_path / "README.md").write_text("old text\n\n" + R.REANALYSIS_HEADER + "\n\nrules fixed first\n")
    R.write(tmp_path)
    text = (tmp_path / "README.md").read_text()
    assert "old text" not in text and text.endswith(R.REANALYSIS_HEADER + "\n\nrules fixed first\n")
    assert text.startswith("# Paper B on our agents")
