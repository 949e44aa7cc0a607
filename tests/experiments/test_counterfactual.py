"""The counterfactual study (experiments/counterfactual): its registered analysis on planted data
(what it must find, what it must not, whether it can reject at the registered size), the runner's
resume and its refusals."""
from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from experiments.counterfactual import analysis as A
from experiments.counterfactual import plan as P
from experiments.counterfactual import run as R

STATUSES = ["ok", "side_effects", "diverged"]


def planted(n_ep=P.EPISODES, s=P.STATES_PER_EPISODE, c=3, j=2, seed=0, strength=1.0):
    """Episode records as run.py writes them: method "story" whose shares rank the objects as
    their removal and displacement effects do and whose map follows the moved object (strength
    1); method "blind" whose shares and shifts are unrelated to the effects."""
    rng = np.random.default_rng(seed)
    eps = []
    for e in range(n_ep):
        imp = rng.gamma(2.0, 1.0, (s, c))                            # how much each object matters
        chance = rng.uniform(0.01, 0.3, (s, c))                      # areas, unrelated to importance
        removal = imp * rng.choice((-1, 1), (s, c)) + rng.normal(0, 0.3, (s, c))
        disp = np.abs(imp[:, :1] * strength + rng.normal(0, 0.5, (s, j)))
        story = imp / imp.sum(1, keepdims=True) * strength + rng.uniform(0, 0.2, (s, c)) * (2 - strength)
        blind = rng.uniform(0, 1, (s, c))
        shift = np.stack([np.abs(rng.normal(0.05, 0.02, (s, j))) * (1 if strength > 0 else 1) *
                          np.where(rng.random((s, j)) < 0.5 + 0.45 * strength, 1, -1),
                          rng.normal(0, 0.02, (s, j))]).astype(np.float32)
        status = rng.choice(3, (s, j), p=[0.8, 0.1, 0.1]).astype(np.int8)
        eps.append({"methods": np.array(["story", "blind"]), "classes": np.array(["ball", "paddle", "bricks"][:c]),
                    "moved": np.array("ball"), "moves": np.array([[8, 0], [-8, 0]][:j]),
                    "statuses": np.array(STATUSES), "share": np.stack([story, blind]).astype(np.float32),
                    "chance": chance.astype(np.float32), "present": np.ones((s, c), bool),
                    "removal": removal.astype(np.float32), "removal_ok": np.ones((s, c), bool),
                    "removal_newest": removal.astype(np.float32), "removal_newest_ok": np.ones((s, c), bool),
                    "status": status, "disp": np.where(status == 0, disp, np.nan).astype(np.float32),
                    "shift": np.where(status == 0, shift, np.nan).astype(np.float32),
                    "seed": np.array(P.DEV_SEED + e), "length": np.array(1000), "return": np.array(10.0),
                    "truncated": np.array(False), "random_actions": np.array(10)})
    return eps


def test_a_planted_story_holds_and_a_blind_map_does_not():
    res = A.analyse(planted(), "breakout", n_resamples=500)
    story, blind = res["methods"]["story"], res["methods"]["blind"]
    assert story["story"] == "holds", story["readings"]
    assert all(v == "supported" for v in story["readings"].values())
    assert blind["story"] != "holds"
    assert all(v != "supported" for v in blind["readings"].values()), blind["readings"]
    assert res["complete"] and res["episodes"] == P.EPISODES and res["states"] == P.STATES
    assert res["intervention_status"]["ok"] + res["intervention_status"]["diverged"] + \
        res["intervention_status"]["side_effects"] == res["interventions"]
    json.dumps(res, default=float)                                   # summary.json can be written
    assert "| story |" in A.markdown(res)


def test_the_registered_size_can_reject():
    """With the registered episodes, the exact test's smallest p is below Holm's strictest threshold
    for every registered method, and a planted effect of one between-episode SD is found often."""
    from jaxsal import registry

    assert len(registry.SHIPPED) == P.REGISTERED_METHODS  # the shipped methods (tests register their own)
    strictest = P.ALPHA / len(P.GAMES) / P.n_tests(P.REGISTERED_METHODS, P.GAMES[:1])
    assert A.smallest_p(P.EPISODES) < strictest / 100
    assert A.smallest_p(P.MIN_EPISODES_PER_TEST) < strictest <= A.smallest_p(P.MIN_EPISODES_PER_TEST - 1)
    assert A.sign_flip_p(np.full(P.EPISODES, 0.3)) == A.smallest_p(P.EPISODES)
    assert A.power(P.EPISODES, strictest, effect_sd=1.0, sims=400) > 0.4
    assert A.power(P.EPISODES, strictest, effect_sd=1.5, sims=400) > 0.9
    assert A.power(P.EPISODES, strictest, effect_sd=0.0, sims=400) < 0.01


def test_sign_flip_matches_brute_force_and_monte_carlo():
    v = np.random.default_rng(3).normal(0.4, 1.0, 9)
    brute = np.mean([np.dot(s, v) >= v.sum() - 1e-9 for s in itertools.product((-1, 1), repeat=9)])
    assert A.sign_flip_p(v) == pytest.approx(brute)
    assert A.sign_flip_p(v, exact_up_to=0, n_mc=100_000) == pytest.approx(brute, abs=0.01)
    w = np.random.default_rng(4).normal(0.4, 1.0, 18)                # two slices of the exact enumeration
    assert A.sign_flip_p(w) == pytest.approx(A.sign_flip_p(w, exact_up_to=0, n_mc=200_000), abs=0.005)


def test_monte_carlo_sign_flips_carry_the_plus_one():
    """Beyond the exact range, p = (1 + hits) / (1 + patterns): never 0. 30 equal positive values are
    reached only by the all-plus pattern (chance 2^-30), so none of 1,000 random patterns hits."""
    assert A.sign_flip_p(np.full(30, 0.2), exact_up_to=0, n_mc=1000) == 1 / 1001


def test_cluster_interval_is_the_percentile_interval_of_resampled_episodes():
    v = np.random.default_rng(6).normal(0.2, 1.0, 20)
    v[[3, 11]] = np.nan                                             # episodes without a value: left out
    r = A.cluster_ci(v, n_resamples=400, seed=2)
    kept = v[np.isfinite(v)]
    pick = np.random.default_rng(2).integers(0, 18, (400, 18))
    ref = [np.mean([kept[j] for j in row]) for row in pick]
    assert r["episodes"] == 18 and r["mean"] == pytest.approx(kept.mean())
    assert (r["low"], r["high"]) == pytest.approx(tuple(np.quantile(ref, [0.025, 0.975])))


def _t(mean, low, high, p_holm, episodes=P.EPISODES):
    return {"mean": mean, "low": low, "high": high, "p_holm": p_holm, "episodes": episodes}


@pytest.mark.parametrize("test, reading", [
    (_t(0.3, 0.1, 0.5, 1e-4), "supported"),
    (_t(0.3, 0.1, 0.5, 0.03), "not shown"),                  # Holm p between 0.05 / 3 and 0.05
    (_t(-0.01, -0.02, 0.0, 1e-4), "not shown"),              # supported needs a mean above 0
    (_t(-0.3, -0.5, -0.1, 1.0), "contradicted"),             # the whole interval below 0
    (_t(-0.1, -0.3, 0.1, 0.9), "not shown"),                 # an interval reaching above 0 contradicts nothing
    (_t(0.3, 0.1, 0.5, 1e-4, episodes=P.MIN_EPISODES_PER_TEST - 1), "not estimable"),
    (_t(0.3, 0.1, 0.5, float("nan")), "not estimable"),
])
def test_the_registered_reading_of_one_test(test, reading):
    """registration.md: supported when Holm p < 0.05 / 3 and mean > 0; contradicted when the 95 %
    interval lies below 0; not estimable under 12 episodes; else not shown."""
    ok = _t(0.3, 0.1, 0.5, 1e-4)
    v = A.verdict({"removal": test, "displacement": ok, "follow": ok}, P.ALPHA / 3)
    assert v["readings"]["removal"] == reading
    assert v["story"] == {"supported": "holds", "not estimable": "not estimable"}.get(reading, "partly holds")


def test_stories_from_the_readings():
    a = P.ALPHA / 3
    yes, no, neg = _t(0.3, 0.1, 0.5, 1e-4), _t(0.0, -0.2, 0.2, 0.5), _t(-0.3, -0.5, -0.1, 1.0)
    assert A.verdict({"removal": no, "displacement": neg, "follow": no}, a)["story"] == "contradicted"
    assert A.verdict({"removal": no, "displacement": no, "follow": no}, a)["story"] == "not shown"
    assert A.verdict({"removal": neg, "displacement": yes, "follow": no}, a)["story"] == "partly holds"


def test_the_game_s_alpha_is_the_registered_0_05_over_3(monkeypatch):
    """Every raw p 0.005: Holm over the game's 2 x 3 tests gives 0.03, which 0.05 would support and the
    registered per-game 0.05 / 3 does not."""
    monkeypatch.setattr(A, "sign_flip_p", lambda v: 0.005)
    res = A.analyse(planted(), "breakout", n_resamples=200)
    assert res["alpha_game"] == pytest.approx(0.05 / 3) and res["family_tests"] == 6
    story = res["methods"]["story"]
    assert all(t["p_holm"] == pytest.approx(0.03) and t["mean"] > 0 for t in story["tests"].values())
    assert story["story"] == "not shown", story["readings"]


def test_rowwise_spearman_equals_scipy_per_row():
    from scipy.stats import spearmanr

    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 4, (50, 6)).astype(float), rng.normal(size=(50, 6))
    ok = rng.random((50, 6)) < 0.8
    got = A.rowwise_spearman(a, b, ok)
    for i in range(50):
        k = ok[i]
        if k.sum() < 2:
            assert np.isnan(got[i])
        elif np.ptp(a[i, k]) == 0:
            assert got[i] == 0.0
        else:
            assert got[i] == pytest.approx(spearmanr(a[i, k], b[i, k]).statistic)


def test_incomplete_and_unestimable_studies_say_so():
    res = A.analyse(planted(n_ep=P.MIN_EPISODES_PER_TEST - 1), "pong", n_resamples=200)
    assert not res["complete"]
    assert all(m["story"] == "not estimable" for m in res["methods"].values())
    assert "Incomplete study" in A.markdown(res)


def test_a_short_episode_is_padded_not_refused():
    eps = planted(n_ep=P.EPISODES)
    short = planted(n_ep=1, s=7, seed=5)[0]
    res = A.analyse(eps[:-1] + [short], "breakout", n_resamples=200)
    assert res["states"] == (P.EPISODES - 1) * P.STATES_PER_EPISODE + 7 and not res["complete"]
    assert res["interventions"] == res["states"] * 2
    assert res["methods"]["story"]["story"] == "holds"


def test_the_analysis_refuses_mixed_records():
    eps = planted(n_ep=3)
    eps[1]["methods"] = np.array(["story", "other"])
    with pytest.raises(ValueError, match="other methods"):
        A.analyse(eps, "breakout", n_resamples=10)
    with pytest.raises(ValueError, match="no episodes"):
        A.analyse([], "breakout")


def test_the_runner_refuses_bad_input(tmp_path, capsys):
    with pytest.raises(ValueError, match="no counterfactual study for 'mspacman'"):
        R.check_args("mspacman", 20, 25, 0.01, 100)
    with pytest.raises(ValueError, match="episodes must be a positive integer"):
        R.check_args("pong", 0, 25, 0.01, 100)
    with pytest.raises(ValueError, match="epsilon must be in"):
        R.check_args("pong", 20, 25, 1.5, 100)
    R.open_progress(tmp_path, {"game": "pong", "epsilon": 0.01})
    with pytest.raises(R.ProgressMismatch, match="other settings"):
        R.open_progress(tmp_path, {"game": "pong", "epsilon": 0.05})
    assert R.open_progress(tmp_path, {"game": "pong", "epsilon": 0.01})
    with pytest.raises(SystemExit):
        R.main(["--game", "mspacman"])
    assert "choose one of breakout, pong, spaceinvaders" in capsys.readouterr().err


def test_the_plan_is_the_registration_s():
    """registration.md states plan.py's numbers, and is frozen."""
    text = (P.HERE / "registration.md").read_text()
    assert "Status: frozen" in text
    for needle in (f"{P.EPISODES} ", f"{P.STATES} ", f"{P.EPSILON}", f"{P.SEED_BASE}", f"{P.DEV_SEED}",
                   f"{P.STATES_PER_EPISODE} per episode", f"{P.MAX_EPISODE_STEPS} agent steps",
                   f"fewer than {P.MIN_EPISODES_PER_TEST} episodes", f"{P.N_RESAMPLES} resamples",
                   f"{P.REGISTERED_METHODS} at registration"):
        assert needle in text, needle
    for game in P.GAMES:
        for dx, dy in P.MOVES[game]:
            assert f"({dx}, {dy})" in text


@pytest.mark.slow
def test_a_resumed_run_equals_an_uninterrupted_one(tmp_path):
    pytest.importorskip("ale_py")
    kw = dict(methods=["gradient"], episodes=2, states_per_episode=2, max_steps=60, moves=[(8, 0)],
              seed_of=lambda e: P.DEV_SEED + e, log=lambda *_: None)
    import jaxsal_agents

    agent = jaxsal_agents.load("breakout")
    assert R.run_game("breakout", progress=tmp_path / "a", agent=agent, **kw) == [0, 1]
    assert R.run_game("breakout", progress=tmp_path / "b", agent=agent, max_new=1, **kw) == [0]
    (tmp_path / "b" / "ep001.npz").unlink(missing_ok=True)
    assert R.run_game("breakout", progress=tmp_path / "b", agent=agent, **kw) == [0, 1]
    for f in ("ep000.npz", "ep001.npz", "play/ep000.npz", "play/ep001.npz"):
        a, b = R._load(tmp_path / "a" / f), R._load(tmp_path / "b" / f)
        a.pop("seconds", None), b.pop("seconds", None)
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{f}:{k}")
    # a replay from the recorded actions alone (the fresh machine's path) gives the same results
    (tmp_path / "b" / "ep001.npz").unlink()
    assert R.run_game("breakout", progress=tmp_path / "b", agent=agent, **kw) == [0, 1]
    a, b = R._load(tmp_path / "a" / "ep001.npz"), R._load(tmp_path / "b" / "ep001.npz")
    for k in a:
        if k != "seconds":
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)
    # a record of another run is refused
    with pytest.raises(R.ProgressMismatch):
        R.run_game("breakout", progress=tmp_path / "b", agent=agent, **{**kw, "states_per_episode": 3})
