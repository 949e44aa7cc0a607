"""experiments.paper_a.claims: the measurements on known answers."""
import numpy as np
import pytest

from experiments.paper_a import claims as pac


def frames(n=3, t=2, seed=0):
    rng = np.random.default_rng(seed)
    x = np.zeros((n, 84, 84, t))
    for i in range(n):
        for k in range(t):
            r, c = rng.integers(10, 70, 2)
            x[i, r:r + 8, c:c + 12, k] = 200.0       # one bright block per frame
    return x


def test_laplacian_and_sobel_of_a_block():
    x = frames(1, 1)
    lap, sob = pac.laplacian(x), pac.sobel_magnitude(x)
    assert lap.shape == sob.shape == x.shape
    inside = np.argwhere(x[0, :, :, 0] > 0)
    r, c = inside.min(0) + 4                                           # 8x12 block: 4 px from every edge
    assert lap[0, r, c, 0] == 0 and sob[0, r, c, 0] == 0               # flat interior
    assert np.abs(lap).sum() > 0 and sob[0, :, :, 0].max() > 0
    assert sob[0, 0, 0, 0] == 0                                        # flat background


def test_edge_correlations_known_answers():
    x = frames()
    lap = pac.laplacian(x)
    # a GBP map equal to -|Laplacian| (all its mass negative) correlates 1 with |Laplacian|
    c = pac.edge_correlations(-np.abs(lap), x)
    np.testing.assert_allclose(c["neg_gbp_vs_abs_laplacian"], 1.0, atol=1e-12)
    # a map equal to the signed Laplacian: 1 for the signed correlation
    np.testing.assert_allclose(pac.edge_correlations(lap, x)["gbp_vs_laplacian"], 1.0, atol=1e-12)
    # a map equal to the Sobel magnitude: 1 for |GBP| vs Sobel
    np.testing.assert_allclose(pac.edge_correlations(pac.sobel_magnitude(x), x)["abs_gbp_vs_sobel"], 1.0, atol=1e-12)
    # noise unrelated to the frame: near 0
    noise = np.random.default_rng(1).standard_normal(x.shape)
    c = pac.edge_correlations(noise, x)
    assert all(abs(v).max() < 0.1 for v in c.values())


def test_spearman_and_discriminativeness_known_answers():
    rng = np.random.default_rng(0)
    a = rng.random((4, 5, 5))
    np.testing.assert_allclose(pac.spearman_maps(a, a), 1.0)
    np.testing.assert_allclose(pac.spearman_maps(a, -a), -1.0)
    np.testing.assert_allclose(pac.spearman_maps(a, a ** 3 + 2), 1.0)        # monotone: rank-equal
    # maps that ignore the action: action change 0, ratio 0
    states = rng.random((6, 5, 5))
    same = pac.discriminativeness_from_maps(np.stack([states] * 3), states)
    assert same["action_change"]["mean"] == pytest.approx(0.0) and same["ratio"] == pytest.approx(0.0)
    assert same["state_change"]["mean"] > 0.5
    # maps that are independent draws per action: action change ~ state change, ratio ~ 1
    indep = pac.discriminativeness_from_maps(rng.random((3, 6, 5, 5)), states)
    assert 0.7 < indep["ratio"] < 1.3


def test_rows_and_shares_on_a_breakout_like_frame():
    obs = np.zeros((1, 84, 84, 4))
    obs[0, 60:62, 40:42, -1] = 100       # ball
    obs[0, 77:79, 30:46, -1] = 100       # paddle
    obs[0, 25:30, 4:80, -1] = 100        # bricks (above BRICKS_END_ROW): not counted
    obs[0, :79, 0:5, -1] = 100           # side walls as in 84x84 Breakout frames (5 px, to row 78):
    obs[0, :79, 79:84, -1] = 100         # not counted
    rows = pac.ball_paddle_rows(obs)
    assert set(np.flatnonzero(rows[0])) == {59, 60, 61, 62, 76, 77, 78, 79}
    maps = np.zeros((1, 84, 84))
    maps[0, 60, 10] = 3.0
    maps[0, 10, 10] = 1.0
    share, chance = pac.row_share(maps, rows)
    assert share[0] == pytest.approx(0.75) and chance[0] == pytest.approx(8 / 84)


def test_rise_step_and_mean_ci():
    steps = np.arange(1, 41) * 100
    rets = np.r_[np.ones(20), np.full(20, 10.0)]
    # the mean of the last 20 reaches 3.4 once 3 of them are 10: (17 + 30) / 20 = 2.35 < 3.4; 4 -> 2.8;
    # 5 -> 3.25; 6 -> 3.7
    assert pac.rise_step(steps, rets) == steps[25]
    assert pac.rise_step(steps, np.ones(40)) is None
    ci = pac.mean_ci([1.0, 2.0, np.nan, 3.0], n_boot=200)
    assert ci["mean"] == pytest.approx(2.0) and ci["n"] == 3 and ci["ci95"][0] <= 2.0 <= ci["ci95"][1]


def test_report_tables_and_figure_from_claims(tmp_path):
    """The report turns a claims.json of main()'s structure into tables with every interval."""
    import json

    from experiments.paper_a.claims_report import report

    ci = lambda m: {"mean": m, "ci95": [m - 0.1, m + 0.1], "n": 8}
    res = {
        "agent": "breakout-dddqn", "probes": 8, "random_inits": 2,
        "edges": {k: {"trained": ci(0.3), "random_init": ci(0.1), "trained_minus_random": ci(0.2)}
                  for k in ("neg_gbp_vs_abs_laplacian", "gbp_vs_laplacian", "abs_gbp_vs_sobel")},
        "action_discriminativeness": {
            net: {m: {"action_change": ci(0.2), "state_change": ci(0.5), "ratio": r}
                  for m in ("gradient", "gradcam")} for net, r in (("trained", 0.4), ("random_init", 0.05))},
        "cam_look": {net: {"rows": {"gradcam": {"ball_paddle_rows": {"share": ci(0.25), "chance": 0.1}}},
                           "objects": {"gradcam": {"ball": {"share": 0.05, "chance": 0.01},
                                                   "paddle": {"share": 0.1, "chance": 0.02}}}}
                     for net in ("trained", "random_init")},
        "snapshots": {"/runs/dddqn": {"rise_step": 300, "rise_level": 3.4, "snapshots": [
            {"step": s, "method": m, "before_rise": s < 300, "share": 0.1 + s / 1e4, "chance": 0.1,
             "objects": {"ball": {"share": 0.02, "chance": 0.01}, "paddle": {"share": 0.03, "chance": 0.02}}}
            for s in (100, 200, 300, 400) for m in ("gradcam", "g1gradcam")]}},
        "split_attention": {"params": "random init (seed 0)", "q": {"frame_shares": [0.5, 0.5]},
                            "value": {"frame_shares": [0.25, 0.75]}, "advantage": {"frame_shares": [1.0, 0.0]},
                            "value_attention": [0.4, 0.6], "advantage_attention": [0.9, 0.1]},
    }
    (tmp_path / "claims.json").write_text(json.dumps(res))
    text = report(tmp_path).read_text()
    assert "| max(-GBP, 0) vs abs(Laplacian) | 0.300 (0.200 to 0.400) | 0.100 (0.000 to 0.200) |" in text
    assert "| gradcam | 0.200 (0.100 to 0.300) | 0.500 (0.400 to 0.600) | 0.40 | 0.05 |" in text
    assert "ball 0.050 (0.010) / paddle 0.100 (0.020)" in text
    assert "first reaches 3.4 at env step 300" in text
    assert "| 200 | yes | 0.120 (0.100) | 0.120 (0.100) | 0.020 (0.010) | 0.030 (0.020) |" in text
    assert "| 400 | no |" in text
    assert "| - | GBP share, value | 0.250 | 0.750 |" in text
    one = {k: res["split_attention"][k] for k in ("q", "value", "advantage", "value_attention", "advantage_attention")}
    res["split_attention"] = {"params": "shipped `sa`", "trained": one,
                              "random_init": dict(one, value_attention=[0.5, 0.5])}
    (tmp_path / "claims.json").write_text(json.dumps(res))
    text = report(tmp_path).read_text()
    assert "| trained | GBP share, value | 0.250 | 0.750 |" in text
    assert "| random init | value attention weight | 0.500 | 0.500 |" in text
    assert (tmp_path / "claims.png").stat().st_size > 10_000


def test_claim1_reanalysis_checks_the_committed_means_and_flags_changed_intervals():
    from experiments.paper_a import claims_reanalysis as RA

    rng = np.random.default_rng(0)
    # runs of 8 nearly equal states: the i.i.d. interval excludes 0, the block one need not
    run = np.repeat(rng.normal(size=8), 8) + 0.01 * rng.normal(size=64)
    values = {"c": {"trained": run + 0.3, "random_init": np.full(64, -1.0) + 0.01 * rng.normal(size=64),
                    "trained_minus_random": run + 0.3}}
    committed = {"c": {p: {"mean": float(np.mean(v))} for p, v in values["c"].items()}}
    res = RA.analyse(values, committed)
    assert res["c/random_init"]["committed_excludes_0"] and not res["c/random_init"]["changed"]
    iv = res["c/trained"]["intervals"]
    assert iv["auto"]["high"] - iv["auto"]["low"] > iv["committed_iid"]["ci95"][1] - iv["committed_iid"]["ci95"][0]
    committed["c"]["trained"]["mean"] += 0.01
    with pytest.raises(SystemExit, match="differs from the committed"):
        RA.analyse(values, committed)
