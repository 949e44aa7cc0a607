"""Paper B across agents (experiments/paper_b/agents_analysis.py): the cross-agent label, Kendall's W
against the Friedman statistic, a permutation test that holds its level and rejects shared rankings,
and a variance split whose interaction/noise ratio is about 1 without agent x method effects."""
import numpy as np
import pytest
import scipy.stats

from experiments.paper_b import agents_analysis as A
from tests._support import ROOT


@pytest.mark.parametrize("verdicts, want", [
    (["agree", "agree", "agree"], "same in all"),
    (["inconclusive", "inconclusive", "inconclusive"], "undecided in all"),
    (["none", "none", "none"], "undecided in all"),
    (["agree", "disagree", "inconclusive"], "agent-dependent"),
    (["passes", "fails", "passes"], "agent-dependent"),
    (["fails", "inconclusive", "fails"], "2 of 3, undecided in the others"),
    (["some", "none", "none"], "1 of 3, undecided in the others"),
])
def test_cross_label(verdicts, want):
    assert A.cross_label(verdicts) == want


def test_kendall_w_is_friedmans_statistic_scaled():
    rng = np.random.default_rng(0)
    for m, n in ((3, 20), (4, 7)):
        v = rng.normal(size=(m, n)) + np.linspace(0, 2, n)
        chi2 = scipy.stats.friedmanchisquare(*v.T).statistic
        assert A.kendall_w(v) == pytest.approx(chi2 / (m * (n - 1)), rel=1e-12)
    same = np.tile(np.arange(20.0), (3, 1))
    assert A.kendall_w(same) == pytest.approx(1.0)


def test_permutation_test_holds_its_level_and_rejects_shared_rankings():
    rng = np.random.default_rng(1)
    p_null = [A.permutation_p(rng.normal(size=(3, 20)), n=400, seed=k) for k in range(200)]
    assert 0.02 <= np.mean(np.array(p_null) <= 0.05) <= 0.09       # independent rankings: level ~0.05
    shared = np.linspace(0, 1, 20) + rng.normal(scale=0.05, size=(3, 20))
    assert A.permutation_p(shared, n=2000) <= 1e-3


def test_permutation_p_counts_the_registered_draws():
    """Without ties, the reference distribution is W of the registered draws, by a loop: draw i gives
    each agent the uniformly random ranking argsort(argsort(rng.random((n, agents, methods))[i])) + 1
    (seed SEED); W from scipy's Friedman statistic; p = (1 + #{W_i >= W}) / (1 + n)."""
    rng = np.random.default_rng(3)
    v = rng.normal(size=(3, 8)) + np.linspace(0, 1, 8)
    n, seed = 300, 5
    observed = A.kendall_w(v)
    hits = 0
    for d in np.random.default_rng(seed).random((n, 3, 8)):
        ranking = np.argsort(np.argsort(d, axis=1), axis=1) + 1.0
        hits += scipy.stats.friedmanchisquare(*ranking.T).statistic / (3 * 7) >= observed - 1e-12
    assert 0.01 < (1 + hits) / (1 + n) < 0.99                       # a comparison, not a floor or ceiling
    assert A.permutation_p(v, n=n, seed=seed) == pytest.approx((1 + hits) / (1 + n))


def test_holm_by_hand():
    assert A.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])


def test_components_interaction_is_noise_without_agent_by_method_effects():
    rng = np.random.default_rng(2)
    method, agent, noise = rng.normal(size=20), rng.normal(size=(3, 1)) * 0.5, np.full((3, 20), 0.04)
    ratios, with_inter = [], []
    for _ in range(300):
        y = method + agent + rng.normal(scale=0.2, size=(3, 20))
        ratios.append(A.components(y, noise)["interaction_over_noise"])
        with_inter.append(A.components(y + rng.normal(scale=0.6, size=(3, 20)), noise)["interaction_over_noise"])
    assert 0.9 <= np.mean(ratios) <= 1.1
    assert np.mean(with_inter) > 5
    c = A.components(method + agent + 0.0 * noise, noise)
    assert c["sd_agent_x_method"] == 0 and c["sd_method"] == pytest.approx(np.std(method, ddof=1), rel=1e-9)


def test_an_additive_table_s_spreads_are_the_sds_of_its_effects():
    """Table = method effect + agent effect, no interaction: the method and agent spreads are the SDs
    (ddof 1) of the planted effects, the interaction spread 0; against correlated noise of 0 the agent
    spread is the same."""
    rng = np.random.default_rng(4)
    method, agent = rng.normal(size=(1, 20)), rng.normal(size=(3, 1))
    y = method + agent
    c = A.components(y, np.full((3, 20), 0.01))
    assert c["sd_method"] == pytest.approx(np.std(method, ddof=1), rel=1e-9)
    assert c["sd_agent"] == pytest.approx(np.std(agent, ddof=1), rel=1e-9)
    assert c["sd_agent_x_method"] == 0 and c["sd_cell_noise"] == pytest.approx(0.1)
    corr = A.with_correlated_noise(c, y, {"inter": 0.0, "agent": 0.0})
    assert corr["sd_agent_corr"] == pytest.approx(np.std(agent, ddof=1), rel=1e-9)
    assert corr["sd_agent_x_method_corr"] == pytest.approx(0, abs=1e-12)


def test_tied_values_share_their_average_rank():
    """Ties broken by column order would make agents that tie the same methods look concordant: each
    agent here ranks one different method first and ties the other 19 (deviation 2)."""
    one_hot = np.eye(3, 20)
    w = A.kendall_w(one_hot)
    assert w == pytest.approx(12 * 255 / (9 * (20 ** 3 - 20) - 3 * 3 * (19 ** 3 - 19)))   # 0.298, by hand
    assert A.kendall_w(np.tile([1.0, 1.0, 2.0, 3.0], (3, 1))) == pytest.approx(1.0)
    assert A.permutation_p(one_hot, n=2000) > 0.2
    rng = np.random.default_rng(1)
    ties = rng.integers(0, 4, size=(3, 20)).astype(float)
    p_null = [A.permutation_p(rng.integers(0, 4, size=(3, 20)).astype(float), n=300, seed=k) for k in range(150)]
    assert np.mean(np.array(p_null) <= 0.05) <= 0.10                      # the level holds with ties
    assert A.kendall_w(ties) <= 1.0


def test_correlated_cells_noise_is_what_sampling_puts_into_the_mean_squares():
    """An agent's methods share its episodes, so its cells' errors are correlated: with no agent or
    agent x method effect the mean squares average the correlated noise terms, not the mean variance."""
    rng = np.random.default_rng(0)
    a, m = 3, 20
    covs = []
    for _ in range(a):   # equicorrelated (rho 0.6: the shared episodes), methods of unequal noise
        d = np.diag(rng.uniform(0.5, 1.5, m))
        covs.append(d @ (0.4 * np.eye(m) + 0.6 * np.ones((m, m))) @ d)
    noise = A.correlated_noise(covs)
    method = rng.normal(size=(1, m))
    ms_int, ms_agent = [], []
    diag = np.array([np.diag(c) for c in covs])
    for _ in range(3000):
        y = method + np.stack([rng.multivariate_normal(np.zeros(m), c) for c in covs])
        row, col, g = y.mean(1, keepdims=True), y.mean(0, keepdims=True), y.mean()
        ms_int.append(((y - row - col + g) ** 2).sum() / ((a - 1) * (m - 1)))
        ms_agent.append(m * ((row - g) ** 2).sum() / (a - 1))
    assert np.mean(ms_int) == pytest.approx(noise["inter"], rel=0.05)
    assert np.mean(ms_agent) == pytest.approx(noise["agent"], rel=0.1)
    assert np.mean(ms_int) < 0.6 * diag.mean()   # the registered noise (mean variance) overstates it: ~1 - rho
    c = A.with_correlated_noise(A.components(y, diag), y, noise)
    assert c["null_ratio"] == pytest.approx(noise["inter"] / diag.mean())


def _summary(verdicts):
    return {"verdicts": [{"id": i, "finding": f, "mapping": "", "verdict": v, "detail": ""} for i, f, v in verdicts]}


def test_side_by_side_lines_up_the_claims_and_refuses_other_claims():
    a = _summary([("x", "one", "agree"), ("y", "two", "inconclusive")])
    b = _summary([("y", "two", "disagree"), ("x", "one", "agree")])
    rows = A.side_by_side({"a": a, "b": b})
    assert [(r["id"], r["verdicts"]["b"], r["cross"]) for r in rows] == [
        ("x", "agree", "same in all"), ("y", "disagree", "1 of 2, undecided in the others")]
    with pytest.raises(ValueError, match="claims differ"):
        A.side_by_side({"a": a, "c": _summary([("x", "one", "agree")])})


@pytest.mark.slow  # reads a committed game three times (~10 s)
def test_three_copies_of_one_agent_agree_everywhere(tmp_path):
    d = str(ROOT / "experiments" / "results" / "paper_b_rerun" / "breakout")
    A.main(["--agent", f"a={d}", "--agent", f"b={d}", "--agent", f"c={d}", "--out", str(tmp_path),
            "--permutations", "500"])
    import json
    res = json.loads((tmp_path / "summary.json").read_text())
    assert {c["cross"] for c in res["claims"]} <= {"same in all", "undecided in all"}
    assert all(r["w"] == pytest.approx(1.0) and r["shared_ranking"] for r in res["concordance"])
    assert all(c["sd_agent"] < 1e-6 and c["sd_agent_x_method"] < 1e-6 for c in res["components"].values())
    assert all(c["sd_agent_x_method_corr"] < 1e-6 for k, c in res["components"].items() if k.startswith("fidelity"))
    assert all(0 < c["null_ratio"] < 1.2 for k, c in res["components"].items() if k.startswith("fidelity"))
    readme = (tmp_path / "README.md").read_text()
    assert "| a | True | 20 | 1000 | 200 x 10 |" in readme
    assert readme.rstrip().endswith(A.DEVIATIONS.read_text().rstrip())  # the deviations close the README
