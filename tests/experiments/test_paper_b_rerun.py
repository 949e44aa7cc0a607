"""Paper B re-run (issue 42): the registered analysis on planted answers, the coverage of its
episode-level intervals (and why states are the wrong unit), the state sampling, and the runner
end to end on a tiny configuration."""
import json
from argparse import Namespace
from types import SimpleNamespace

import numpy as np
import pytest
from scipy import stats
from scipy.signal import lfilter

from experiments.paper_b import run as PB
from experiments.paper_b import rerun as RR
from experiments.paper_b import rerun_analysis as A


# ------------------------------------------------------------------ sampling
@pytest.mark.parametrize("length", [1, 7, 49, 50, 51, 99, 100, 101, 257, 1000, 1234, 27000])
def test_streamed_states_are_the_registered_steps(length):
    k = 50
    buf = RR.SpreadBuffer(k)
    for t in range(length):
        buf.add(t, np.full((2, 2), t, np.int32))
    steps, obs = buf.result()
    want = RR.spread_steps(length, k)
    assert steps.tolist() == want.tolist()
    assert obs[:, 0, 0].tolist() == want.tolist()             # each state is the one of its step
    assert len(steps) == min(length, k) and steps[0] == 0 and len(set(steps.tolist())) == len(steps)
    assert len(buf.steps) <= 2 * k
    if length > k:      # spread over the whole episode: the last state is within one stride of the end
        assert length - 1 - steps[-1] < 2 * length / k
        assert np.diff(steps).max() <= 4 * length / k


def test_episode_seeds_differ_from_the_committed_study_and_each_other():
    seeds = [RR.env_seed(0, e) for e in range(20)]
    assert len(set(seeds)) == 20 and 0 not in seeds
    assert not set(seeds) & {RR.env_seed(1, e) for e in range(20)}


# ------------------------------------------------------------------ synthetic data
def _ar1(n, phi, rng):
    return lfilter([1.0], [1.0, -phi], rng.normal(size=n + 200))[200:] * np.sqrt(1 - phi ** 2)


def _series(rng, E=20, K=50, mu=0.0, episode_sd=1.0, rho=0.9, drift=0.0):
    """Per-state values of E episodes x K states: mu + an episode effect + AR(1) noise + a drift
    within the episode; returns (x, episode ids)."""
    x = np.concatenate([mu + episode_sd * rng.normal() + _ar1(K, rho, rng) + drift * np.linspace(-1, 1, K)
                        for _ in range(E)])
    return x, np.repeat(np.arange(E), K)


def test_cluster_bootstrap_covers_at_the_nominal_rate_and_state_bootstrap_does_not():
    rng = np.random.default_rng(0)
    reps, cover_c, cover_s = 300, 0, 0
    for r in range(reps):
        x, ep = _series(rng, drift=0.5)
        c = A.cluster_ci(x, ep, n_resamples=1000, seed=r)
        s = A.state_ci(x, n_resamples=300, seed=r)
        cover_c += c["low"] <= 0.0 <= c["high"]
        cover_s += s["low"] <= 0.0 <= s["high"]
    # percentile interval on 20 clusters: ~0.93 expected (t19 vs normal quantile); Monte Carlo sd ~0.015
    assert 0.88 <= cover_c / reps <= 0.985, cover_c / reps
    assert cover_s / reps < 0.6, cover_s / reps            # states as replicates: far too narrow


def test_twoway_sanity_test_holds_its_size_and_finds_a_real_difference():
    rng = np.random.default_rng(1)

    def cells(mu, D=10, E=20):
        return mu + 0.15 * rng.normal(size=(D, 1)) + 0.1 * rng.normal(size=(1, E)) + 0.05 * rng.normal(size=(D, E))
    rej = np.mean([A.twoway_test(cells(0.5))["p"] <= 0.05 for _ in range(400)])
    assert rej <= 0.08, rej
    assert np.mean([A.twoway_test(cells(0.75))["p"] <= 0.05 for _ in range(100)]) >= 0.8
    # the pigeonhole bootstrap interval covers the truth under the same model
    cov = np.mean([(lambda r: r["low"] <= 0.5 <= r["high"])(A.twoway_ci(cells(0.5), n_resamples=500, seed=i))
                   for i in range(150)])
    assert cov >= 0.85, cov


def _uneven_episodes(rng, E=12):
    """Per-state values of E episodes of unequal length, ids not 0..E-1 and states interleaved."""
    sizes = rng.integers(5, 40, E)
    ids = rng.choice(1000, E, replace=False)
    ep = np.repeat(ids, sizes)
    x = np.repeat(rng.normal(size=E), sizes) + rng.normal(size=len(ep))
    order = rng.permutation(len(ep))
    return x[order], ep[order]


def test_cluster_interval_is_the_percentile_interval_of_resampled_episode_means():
    """The definition by a loop: each resample draws E episodes with replacement, its value is the mean
    of their episode means (every episode weighs the same), the interval the 2.5 / 97.5 % quantiles."""
    rng = np.random.default_rng(8)
    x, ep = _uneven_episodes(rng)
    means = np.array([x[ep == e].mean() for e in np.unique(ep)])
    r = A.cluster_ci(x, ep, n_resamples=400, seed=5)
    pick = np.random.default_rng(5).integers(0, len(means), (400, len(means)))
    ref = [np.mean([means[j] for j in row]) for row in pick]
    assert r["mean"] == pytest.approx(means.mean()) and r["episodes"] == len(means)
    assert (r["low"], r["high"]) == pytest.approx(tuple(np.quantile(ref, [0.025, 0.975])))
    assert r["mean"] != pytest.approx(x.mean())          # not the mean over states (episodes differ in length)


def test_episode_test_is_scipy_s_paired_t_test_on_episode_means():
    rng = np.random.default_rng(9)
    y, ep = _uneven_episodes(rng)
    x = y + 0.15 + 0.5 * rng.normal(size=len(y))
    mx, my = ([v[ep == e].mean() for e in np.unique(ep)] for v in (x, y))
    want = stats.ttest_rel(mx, my)                       # two-sided, df = episodes - 1
    r = A.episode_test(x, y, ep)
    assert r["p"] == pytest.approx(want.pvalue, rel=1e-10) and r["df"] == len(mx) - 1 == want.df
    assert r["diff"] == pytest.approx(np.mean(np.subtract(mx, my)))
    assert A.episode_test(y, x, ep)["p"] == pytest.approx(r["p"], rel=1e-10)     # two-sided: symmetric


def test_twoway_test_is_welch_s_t_test_on_an_additive_table():
    """Cells c[d, e] = 0.5 + a_d - b_e: the draw means vary as a, the episode means as b, and
    mean(c) - 0.5 = mean(a) - mean(b), so the registered two-way test (SE^2 = var(draw means) / D +
    var(episode means) / E, Welch-Satterthwaite df) is exactly Welch's two-sample t-test of a against b.
    With no episode variation it is the one-sample t-test of the draw means (df = D - 1)."""
    rng = np.random.default_rng(10)
    a, b = 0.3 * rng.normal(size=10) + 0.1, 0.1 * rng.normal(size=20)
    r = A.twoway_test(0.5 + a[:, None] - b[None, :])
    want = stats.ttest_ind(a, b, equal_var=False)
    assert r["p"] == pytest.approx(want.pvalue, rel=1e-9) and r["df"] == pytest.approx(want.df, rel=1e-9)
    assert r["mean"] == pytest.approx(0.5 + a.mean() - b.mean())
    r = A.twoway_test(np.tile(0.5 + a[:, None], (1, 20)))
    want = stats.ttest_1samp(0.5 + a, 0.5)
    assert r["p"] == pytest.approx(want.pvalue, rel=1e-9) and r["df"] == pytest.approx(9)
    r = A.twoway_test(np.tile(0.4 - b[None, :], (10, 1)))
    assert r["p"] == pytest.approx(stats.ttest_1samp(0.4 - b, 0.5).pvalue, rel=1e-9) and r["df"] == pytest.approx(19)


def _planted(rng, draws=10, E=20, K=50, k_s=10, sanity_means=None):
    """aucs, sanity, episode ids: 'good' beats the random map, 'null' does not; sanity methods with
    given per-draw mean Spearman similarities at every layer."""
    ep = np.repeat(np.arange(E), K)
    ep_s = np.repeat(np.arange(E), k_s)
    aucs = {}
    for s in RR.SETTINGS:
        base, _ = _series(rng, E, K, episode_sd=0.3, rho=0.8)
        aucs[s] = {"good": base + 0.3 + 0.3 * _series(rng, E, K, episode_sd=0.2)[0],
                   "null": base + 0.3 * _series(rng, E, K, episode_sd=0.2)[0],
                   "random": base}
    sanity = {}
    for m, means in (sanity_means or {}).items():
        means = np.resize(np.asarray(means, float), draws)
        for g in ("q", "fc1", "conv1", "random_uniform"):
            sp = means[:, None] + 0.05 * rng.normal(size=(1, E))[:, ep_s] + 0.1 * rng.normal(size=(draws, E * k_s))
            sanity[(m, g)] = {k: sp for k in A.METRICS}
    return aucs, sanity, ep, ep_s


def _meta(game="mspacman", **kw):
    return {"game": game, "agent": game, "agent_return": 1758.3, "agent_return_ci95": [1571.3, 1945.4],
            "epsilon": 0.01, "distinct_episodes": 20, "episodes_truncated": 0,
            "states": 1000, "episodes": 20, "sanity_states": 200, "sanity_draws": 10,
            "resampling_unit": "episode", "episode_returns": list(np.linspace(1000, 2000, 20)), **kw}


def test_analysis_finds_what_is_planted_and_calls_the_issue_s_rise_inconclusive():
    rng = np.random.default_rng(2)
    means = {"passes": [0.1], "fails": [0.85, 0.8, 0.9], "varies": [0.65, 0.83, 0.42]}
    res = A.analyse(*_planted(rng, sanity_means=means), _meta(), n_resamples=500)
    assert res["design_met"]
    for s in RR.SETTINGS:
        ar = res["against_random"][s]
        assert ar["good"]["significant"] and ar["good"]["diff"] > 0 and ar["good"]["diff_low"] > 0
        assert not ar["null"]["significant"]
        assert ar["good"]["episodes"] == 20
        assert res["pairwise"][s][("good", "null")]["significant"]
    v = {k: r["verdict"] for k, r in res["sanity"].items()}
    assert v["passes", "q"] == "passes" and v["fails", "q"] == "fails"
    assert v["varies", "q"] == "inconclusive"            # RISE in MsPacman's draws: no confident fail
    assert res["sanity"]["varies", "random_uniform"]["verdict"] == ""   # baselines: reported, not tested
    # the same draws as the committed study (3): still inconclusive, and so with 10 draws of that spread
    res3 = A.analyse(*_planted(rng, draws=3, sanity_means=means), _meta(sanity_draws=3), n_resamples=500)
    assert res3["sanity"]["varies", "q"]["verdict"] == "inconclusive"
    assert not res3["design_met"] and not res3["design"]["sanity_draws"]
    # the committed study's mistake: one draw, states as replicates -> a narrow interval; here no verdict
    res1 = A.analyse(*_planted(rng, draws=1, sanity_means={"varies": [0.65]}), _meta(sanity_draws=1),
                     n_resamples=500)
    assert res1["sanity"]["varies", "q"]["verdict"] == "inconclusive"
    assert not np.isfinite(res1["sanity"]["varies", "q"]["p"])


def test_one_episode_cannot_decide():
    rng = np.random.default_rng(3)
    aucs, _, ep, _ = _planted(rng, E=1, K=500)
    res = A.analyse(aucs, {}, ep, ep[:0], _meta(episodes=1, game="minatar-breakout"), n_resamples=200)
    for s in RR.SETTINGS:
        r = res["against_random"][s]["good"]
        assert not r["significant"] and not np.isfinite(r["p"]) and not np.isfinite(r["low"])
    assert not res["design"]["episodes"]


def test_undefined_aucs_drop_the_state_for_every_method():
    """A state whose q_value AUC is NaN (clean Q_a(x) <= 0) leaves that setting for every method and the
    random map; the result equals the analysis of the other states, and the README lists the states."""
    rng = np.random.default_rng(5)
    aucs, sanity, ep, ep_s = _planted(rng)
    s = RR.SETTINGS[0]
    drop = np.array([3, 170, 588])
    poisoned = {k: ({m: x.copy() for m, x in v.items()} if k == s else v) for k, v in aucs.items()}
    poisoned[s]["good"][drop] = np.nan                  # undefined for one method only: dropped for all
    res = A.analyse(poisoned, sanity, ep, ep_s, _meta(), n_resamples=300)
    keep = np.setdiff1d(np.arange(len(ep)), drop)
    ref = A.analyse({s: {m: x[keep] for m, x in aucs[s].items()}}, {}, ep[keep], ep_s[:0], _meta(), n_resamples=300)
    for m in aucs[s]:
        got, want = res["against_random"][s][m], ref["against_random"][s][m]
        assert np.isfinite(got["mean"]) and got["mean"] == pytest.approx(want["mean"])
        assert got["low"] == pytest.approx(want["low"])
    assert res["undefined"][s].tolist() == drop.tolist() and list(res["undefined"]) == [s]
    assert np.isfinite(res["pairwise"][s][("good", "null")]["p"])
    assert "3 of 1000 states (3, 170, 588)" in A.markdown(res)
    assert A.to_json(res)["undefined_states"] == {"/".join(s): drop.tolist()}
    # what the rule prevents: the plain episode means of a NaN state are NaN
    assert not np.isfinite(A.episode_means(poisoned[s]["good"], ep)).all()


def test_multiplicity_is_holm_times_the_games():
    rows = A.adjust([{"p": 0.01}, {"p": 0.004}, {"p": float("nan")}])
    assert rows[1]["p_holm"] == pytest.approx(min(1, 4 * 0.004 * 2))
    assert rows[0]["p_holm"] == pytest.approx(4 * 0.01)
    assert [r["significant"] for r in rows] == [True, True, False]
    assert not A.adjust([{"p": 0.02}])[0]["significant"]        # 0.02 x 4 games > 0.05


def _game(rng, labels, groups, E=20, K=50, k_s=10, D=10):
    """A synthetic game as the runner writes it (sanity states first): SARFA planted best,
    the original noise score planted failing the sanity check, every other method passing."""
    ep = np.repeat(np.arange(E), K)
    order = np.concatenate([np.flatnonzero(np.isin(np.arange(K), RR.spread(K, k_s))) + e * K for e in range(E)])
    ep = ep[np.concatenate([order, np.setdiff1d(np.arange(E * K), order)])]
    aucs = {}
    for s in RR.SETTINGS:
        base = rng.normal(size=E * K)
        aucs[s] = {m: base + (0.5 if m == "sarfa" else 0.0) + 0.3 * rng.normal(size=E * K) for m in labels + ["random"]}
    sanity = {(m, g): {k: (0.85 if m == "noise_sensitivity_original" else 0.1) + 0.05 * rng.normal(size=(D, E * k_s))
                       for k in A.METRICS} for m in labels for g in groups}
    meta = {**_meta(), "episode_of_state": [int(e) for e in ep]}
    return aucs, sanity, ep, ep[:E * k_s], meta


def test_paper_b_claims_on_all_20_methods():
    res = A.analyse(*_game(np.random.default_rng(4), [m[0] for m in PB.METHODS], ("q", "conv1")), n_resamples=200)
    by = {(v["id"], v["mapping"]): v["verdict"] for v in res["verdicts"]}
    assert by["sanity:noise_sensitivity_original", ""] == "agree"      # planted: the original score fails
    assert by["sanity:noise_sensitivity", ""] == "agree"               # the fix passes
    assert by["best:sarfa", "matched"] == "agree"                      # SARFA planted best on every setting
    assert by["best:rise", "matched"] == "disagree"
    assert by["winner_depends", "all"] == "disagree"                   # one winner everywhere
    assert by["above_rise", "all"] == "some"
    c = A.claim_counts(res["verdicts"])
    assert (f"Paper B's claims (its noise column read as the original score): agree {c['agree']} / disagree "
            f"{c['disagree']} / inconclusive {c['inconclusive']}") in A.markdown(res)


def test_game_files_round_trip(tmp_path):
    """The runner's file layout in, summary.json and the README sections out, the same statistics."""
    aucs, sanity, ep, ep_s, meta = _game(np.random.default_rng(5), ["sarfa", "noise_sensitivity_original"],
                                         ("q", "random_uniform"))
    d = tmp_path / "mspacman"
    d.mkdir()
    PB.write_csv(d / "auc_per_state.csv.gz", [
        {"mode": s[0], "substrate": s[1], "score": s[2], "method": m, "state": j, "episode": int(ep[j]), "auc": v}
        for s, res in aucs.items() for m, x in res.items() for j, v in enumerate(x)])
    PB.write_csv(d / "sanity_per_state.csv.gz", [
        {"method": m, "randomised": g, "draw": k, "state": j, "episode": int(ep[j]),
         **{name: by[name][k, j] for name in A.METRICS}}
        for (m, g), by in sanity.items() for k in range(10) for j in range(len(ep_s))])
    (d / "meta.json").write_text(json.dumps(meta))
    res = A.write_game(d, n_resamples=200)
    ref = A.analyse(aucs, sanity, ep, ep_s, meta, n_resamples=200)
    s = ("insertion", "black", "advantage")
    assert res["against_random"][s]["sarfa"]["p"] == pytest.approx(ref["against_random"][s]["sarfa"]["p"])
    assert res["sanity"]["noise_sensitivity_original", "q"]["mean"] == pytest.approx(
        ref["sanity"]["noise_sensitivity_original", "q"]["mean"])
    summary = json.loads((d / "summary.json").read_text())
    assert summary["design_met"] and summary["meta"]["resampling_unit"] == "episode"
    assert summary["sanity"]["noise_sensitivity_original/q"]["verdict"] == "fails"
    readme = (d / "README.md").read_text()
    assert "1 agent, 20 episodes, 1000 states; sanity check on 200 states x 10 draws" in readme
    assert "Exploratory" not in readme
    assert "Paper B's claims" not in readme and "weaker" not in readme      # no Paper B set; returns as the card
    meta.update(episode_returns=[500.0 + i for i in range(20)], agent_return_ci95=[1571.3, 1945.4])
    (d / "meta.json").write_text(json.dumps(meta))
    A.write_game(d, n_resamples=200)
    assert "The sampled play is weaker than the card's evaluation." in (d / "README.md").read_text()
    readme = (d / "README.md").read_text()
    overall = A.write_readme(tmp_path).read_text()    # the shipped agent (named as its game): all four games
    assert readme in overall and "Not run yet: breakout, spaceinvaders, frostbite" in overall
    assert "[`summary.md`](summary.md)" in overall
    A.write_readme_with_deviations(tmp_path)
    assert "## Deviations from the registration" in (tmp_path / "README.md").read_text()
    (d / "meta.json").write_text(json.dumps({**meta, "agent": "agents/mspacman-seed1.json"}))   # another agent
    other = A.write_readme(tmp_path).read_text()
    assert "Not run yet" not in other and "summary.md" not in other
    assert "re-run on one more agent" in other and "agents_analysis" in other
    A.write_readme_with_deviations(tmp_path)
    tail = (tmp_path / "README.md").read_text()
    assert "agents_deviations.md" in tail and "## Deviations from the registration" not in tail


# ------------------------------------------------------------------ cost
def test_cost_estimate_from_the_committed_timing():
    e = RR.estimate(PB.OUT / "breakout" / "timing.csv")
    old = RR.estimate(PB.OUT / "breakout" / "timing.csv", draws=3)
    assert e["hours_maps_old"] == pytest.approx(old["hours_maps"])
    # 1,000 + 10 x 5 x 200 = 11,000 maps per method against 4,000: sanity 10/3 as long
    assert e["hours_sanity"] == pytest.approx(e["hours_sanity_old"] * 10 / 3)
    assert e["hours_maps"] == pytest.approx(e["hours_maps_old"] * 11 / 4)


# ------------------------------------------------------------------ runner end to end
def _args(tmp_path, **kw):
    a = dict(episodes=2, states=8, sanity_states=4, draws=2, epsilon=RR.EPSILON, max_episode_steps=40,
             methods=["gradient", "grad_x_input"], agent_file=None, batch_size=256, seed=0,
             cache=str(tmp_path / "cache"), out=str(tmp_path / "out"), progress="")
    a.update(kw)
    return Namespace(**a)


@pytest.mark.slow
def test_runner_tiny_end_to_end_and_resumes(tmp_path):
    """Resuming from the cache alone (--no-progress); tests/experiments/test_paper_b_rerun_progress.py resumes
    on a fresh machine from the progress folder."""
    pytest.importorskip("gymnax")
    logs = []
    out = RR.run_game("minatar-breakout", _args(tmp_path), log=logs.append)
    meta = json.loads((out / "meta.json").read_text())
    assert (meta["states"], meta["sanity_states"], meta["sanity_draws"], meta["episodes"]) == (8, 4, 2, 2)
    assert meta["resampling_unit"] == "episode" and len(meta["episode_of_state"]) == 8
    assert meta["episode_of_state"][:4] == [0, 0, 1, 1]          # sanity states first, 2 per episode
    assert len(meta["episode_returns"]) == 2 and meta["provenance"]["git_commit"]
    assert "hostname" in meta["provenance"]
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["design_met"] and "gradient/q" in summary["sanity"]
    assert "Exploratory" in (out / "README.md").read_text()
    assert any("maps on" in line for line in logs)
    # a second call does no work; a lost sanity draw is the only thing recomputed
    cache = next((tmp_path / "cache" / "minatar-breakout").iterdir())
    next((cache / "methods").glob("gradient_*")).joinpath("sanity_d01.npz").unlink()
    logs.clear()
    RR.run_game("minatar-breakout", _args(tmp_path), log=logs.append)
    work = [line for line in logs if "maps on" in line or "sanity check" in line or "episode" in line]
    assert work == ["[gradient] sanity check on 4 states, draw 1"], work
    assert len((cache / "provenance.jsonl").read_text().splitlines()) == 2


def test_missing_sanity_draws_of_forward_pass_methods_are_one_call(tmp_path, monkeypatch):
    """A method's missing draws go to one sanity_check(draws=...) (they share the trained trunk);
    each draw is saved as its own piece, the progress after the call, and nothing is redone."""
    calls, saves = [], []

    def fake(model, params, obs, *, method, draws, **kw):
        calls.append((method, list(draws)))
        return {k: {"q": {"spearman": np.full(len(obs), float(k))}} for k in draws}

    monkeypatch.setattr(RR, "sanity_check", fake)
    obs = np.zeros((3, 84, 84, 4), np.uint8)
    for method, label in (("rise", "rise"), ("occlusion", "occ"), ("gradient", "grad")):
        d = tmp_path / label
        d.mkdir()
        RR.save_npz(d / "sanity_d01.npz", **{"q/spearman": np.full(3, 1.0)})   # draw 1 done earlier
        out = RR.method_sanity(d, label, SimpleNamespace(model=None, params=None), obs, None, method, {},
                               None, range(4), ("q",), log=lambda s: None, saved=lambda: saves.append(label))
        assert sorted(out) == [0, 1, 2, 3] and all(out[k]["q"]["spearman"][0] == k for k in out)
    assert calls == [("rise", [0, 2, 3]), ("occlusion", [0, 2, 3]), ("gradient", [0, 2, 3])]
    assert saves == ["rise", "occ", "grad"]
    RR.method_sanity(tmp_path / "rise", "rise", None, obs, None, "rise", {}, None, range(4), ("q",),
                     log=lambda s: None, saved=lambda: saves.append("again"))
    assert len(calls) == 3 and saves == ["rise", "occ", "grad"]            # all four draws recorded


def test_estimate_names_the_measured_cost_and_is_silent_without_one(tmp_path):
    line = RR.measured_cost()
    res = json.loads(RR.COST.read_text())
    assert f"{res['hours_per_game']['after']:.2f} h per game" in line and res["commits"]["after"][:8] in line
    assert RR.measured_cost(tmp_path / "missing.json") is None
    (tmp_path / "bad.json").write_text("{}")
    assert RR.measured_cost(tmp_path / "bad.json") is None
