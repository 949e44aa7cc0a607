"""The counterfactual study's write-up (experiments/counterfactual/report.py): the N it reports behind
each registered statistic, the results README's tables (which must be summary.json's numbers as they
are) and its figure."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from experiments.counterfactual import analysis as A
from experiments.counterfactual import plan as P
from experiments.counterfactual import report
from tests.experiments.test_counterfactual import planted

README = P.RESULTS / "README.md"
TITLES = report.TITLES


def test_counts_are_what_each_statistic_used():
    eps = planted(n_ep=4, s=6)
    eps[1]["share"][0, :2] = np.nan                    # method "story": two states whose map has no mass
    n = report.counts(eps)
    status = np.stack([e["status"] for e in eps])
    kept = int((status == 0).sum())
    assert n["kept_moves"] == kept and n["states_with_kept_move"] == int((status == 0).any(-1).sum())
    assert n["methods"]["story"]["removal"] == {"episodes": 4, "states": 4 * 6 - 2}
    assert n["methods"]["blind"]["removal"] == {"episodes": 4, "states": 4 * 6}
    assert n["methods"]["blind"]["follow"] == {"episodes": 4, "pairs": kept}
    lost = int((status[1, :2] == 0).any(-1).sum())     # those states drop out of the method's displacement rho
    assert n["methods"]["story"]["displacement"]["states"] == n["methods"]["blind"]["displacement"]["states"] - lost
    by_move = n["status_by_move"]
    assert [by_move[k]["ok"] for k in ("+8,+0", "-8,+0")] == [int((status[..., j] == 0).sum()) for j in range(2)]
    # the registered analysis gives each test the same episodes
    res = A.analyse(eps, "breakout", n_resamples=200)
    for m in ("story", "blind"):
        for s in P.STATS:
            assert n["methods"][m][s]["episodes"] == res["methods"][m]["tests"][s]["episodes"]


@pytest.fixture(scope="module", params=P.GAMES)
def game(request):
    """A written-up game: its name, summary.json and the counts from its progress folder."""
    f = P.RESULTS / request.param / "summary.json"
    if not f.exists():
        pytest.skip(f"no {request.param} summary")
    return request.param, json.loads(f.read_text()), report.counts(A.load_episodes(P.PROGRESS / request.param))


def test_the_counts_match_the_summary(game):
    name, summary, n = game
    assert n["states_with_kept_move"] == summary["states_with_kept_move"]
    assert n["kept_moves"] == summary["intervention_status"]["ok"]
    for s, c in summary["intervention_status"].items():
        assert sum(m[s] for m in n["status_by_move"].values()) == c
    assert json.loads((P.RESULTS / name / "counts.json").read_text()) == json.loads(json.dumps(n))


def readme_section(text: str, title: str) -> str:
    """The results README's section `## title`, up to the next section."""
    return text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def test_the_results_readme_holds_each_game_s_registered_numbers(game):
    name, summary, n = game
    section = readme_section(README.read_text(), TITLES[name])
    for table_name, table in report.tables(summary, n).items():
        assert table in section, (f"results/README.md's {TITLES[name]} section lacks the current {table_name} "
                                  "table: rerun report.py and paste it")
    rule = section.split("### What the rule concludes", 1)[1].split("\n### ", 1)[0]
    bullets = re.split(r"\n(?=- )", rule.strip().split("\n\n")[0])   # the list's top-level bullets
    for story in ("holds", "partly holds", "contradicted", "not shown", "not estimable"):
        want = sorted(m for m, r in summary["methods"].items() if r["story"] == story)
        bullet = [b for b in bullets if b.startswith(f"- **{story.capitalize()}")]
        assert len(bullet) == 1, f"results/README.md: no single '- **{story.capitalize()}' bullet under the rule"
        named = sorted(m for m in summary["methods"] if re.search(rf"\b{m}\b", bullet[0]))
        assert named == want, (name, story, named, want)


def test_the_three_game_summary_holds_each_game_s_stories():
    files = {g: P.RESULTS / g / "summary.json" for g in P.GAMES}
    if not all(f.exists() for f in files.values()):
        pytest.skip("not every game has a summary")
    summaries = {g: json.loads(f.read_text()) for g, f in files.items()}
    table = report.stories(summaries)
    assert table in readme_section(README.read_text(), "Across the three games"), (
        "results/README.md's three-game section lacks the current table: rerun report.py --stories and paste it")
    row = {line.split(" | ")[0][2:]: line for line in table.splitlines()[2:]}
    assert row["smoothgrad"].endswith("| partly holds (removal) | holds | holds |")


def test_the_figure_is_small(tmp_path, game):
    _, summary, n = game
    report.figure(summary, n, tmp_path / "f.png")
    assert 10_000 < (tmp_path / "f.png").stat().st_size < 200_000


def test_the_posthoc_partial_correlation_removes_a_shared_cause():
    from experiments.counterfactual.posthoc import _ranks_partial

    rng = np.random.default_rng(0)
    cause = rng.normal(size=400)
    a, b = cause + 0.3 * rng.normal(size=400), cause + 0.3 * rng.normal(size=400)
    assert _ranks_partial(a, b, []) > 0.8                 # both follow the cause
    assert abs(_ranks_partial(a, b, [cause])) < 0.15      # nothing left once it is partialled out
    assert _ranks_partial(a + b, b, [cause]) > 0.5        # a real link survives


def test_restatus_replaces_statuses_and_drops_the_moves_no_longer_kept():
    from experiments.counterfactual.posthoc import restatus

    eps = planted(n_ep=3, s=5)
    names = [str(n) for n in eps[0]["statuses"]]
    now = [np.asarray(names)[ep["status"]].copy() for ep in eps]
    kept = np.argwhere(now[1] == "ok")[0]
    now[1][tuple(kept)] = "diverged"
    out = restatus(eps, now)
    assert np.array_equal(out[0]["status"], eps[0]["status"]) and out[1]["status"].dtype == eps[1]["status"].dtype
    assert names[out[1]["status"][tuple(kept)]] == "diverged" and names[eps[1]["status"][tuple(kept)]] == "ok"
    assert report.counts(out)["kept_moves"] == report.counts(eps)["kept_moves"] - 1
    assert eps[1]["status"][tuple(kept)] == names.index("ok")             # the records are left as they were
    with pytest.raises(ValueError, match="not in the record's list"):
        restatus(eps, [np.full(s.shape, "absent") for s in now])      # not among planted's statuses
    with pytest.raises(ValueError, match="statuses for a record of shape"):
        restatus(eps, [s[:-1] for s in now])


def test_the_results_readme_holds_the_reclassified_statistics(game):
    from experiments.counterfactual.posthoc import reclassified_table

    name, summary, _ = game
    f = P.RESULTS / name / "posthoc.json"
    stats = json.loads(f.read_text()).get("reclassified", {}).get("statistics") if f.exists() else None
    if stats is None or all(r["tests"][s] == {k: summary["methods"][m]["tests"][s][k] for k in r["tests"][s]}
                            for m, r in stats["methods"].items() for s in P.STATS):
        pytest.skip(f"{name}: the current statuses change no registered statistic")
    table = reclassified_table(summary, {"statistics": stats})
    assert table in readme_section(README.read_text(), TITLES[name]), (
        f"results/README.md's {TITLES[name]} section lacks the current reclassified table: rerun "
        "posthoc.reclassified_table and paste it")
