"""The Paper B re-run across games (experiments/paper_b/rerun_summary.py): the pages that quote the
registered verdicts are generated from the committed summary.json files and stay current; counts,
lists and sentences follow the verdicts they are made of."""
import copy
import json
import re

import pytest

from experiments.paper_b import rerun_summary as S
from tests._support import ROOT


def _sanity(mean, verdict, draws=(0.4, 0.6)):
    return {"mean": mean, "low": mean - 0.02, "high": mean + 0.02, "draw_means": list(draws), "verdict": verdict}


def _summary(game, fails_at_q=("guided_backprop",), verdicts=()):
    sanity = {f"{m}/{st}": _sanity(0.9, "fails", (0.85, 0.95)) if (m in fails_at_q and st == "q")
              else _sanity(0.2, "passes", (0.1, 0.3)) for m in S.VARIANT for st in S.STEPS}
    base = [{"id": "sanity:noise_sensitivity_original", "finding": "original fails", "mapping": "", "verdict": "agree",
             "detail": "Spearman at q 0.90 [0.88, 0.92] (fails)"},
            {"id": "sanity:noise_sensitivity", "finding": "fix passes", "mapping": "", "verdict": "agree",
             "detail": "Spearman at q 0.20 [0.18, 0.22] (passes)"},
            {"id": "above_rise", "finding": "above RISE", "mapping": "matched", "verdict": "none", "detail": "none"},
            {"id": "above_rise", "finding": "above RISE", "mapping": "all", "verdict": "none", "detail": "none"},
            # each method's own output-layer check: a verdict of the re-run, not a claim of Paper B's
            {"id": "sanity_q:lime_slic", "finding": "lime_slic: output-layer sanity check", "mapping": "",
             "verdict": "inconclusive", "detail": ""},
            {"id": "sanity_q:gradient", "finding": "gradient: output-layer sanity check", "mapping": "",
             "verdict": "passes", "detail": ""}]
    return {"game": game, "design_met": True, "sanity": sanity, "verdicts": base + list(verdicts),
            "returns": {"mean": 10.0, "low": 8.0, "high": 12.0, "episodes": 20},
            "meta": {"episodes": 20, "states": 1000, "sanity_states": 200, "sanity_draws": 10,
                     "agent_return": 11.0, "distinct_episodes": 20}}


def _sign(verdict, mapping="matched", detail="ours +0.1, Holm p 0.01"):
    return {"id": "sign:rise:black/q_value", "finding": "rise above the random map (black / q_value)",
            "mapping": mapping, "verdict": verdict, "detail": detail}


def test_the_committed_pages_are_generated_from_the_committed_summaries():
    # a page that quotes a verdict differently from summary.json fails here; fix: run the module
    assert S.update(check=True) == [], "run `python -m experiments.paper_b.rerun_summary`"


def test_the_check_rejects_a_page_that_no_longer_matches(tmp_path):
    summaries, agents = S.load(), S.load_agents()   # agents: the across-agents study's, where it has run
    assert summaries, "the committed re-run has games"
    for page in list(S.sections(summaries, agents)) + [S.SUMMARY_MD]:
        (tmp_path / page).parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / page).exists():
            (tmp_path / page).write_text((ROOT / page).read_text())
    assert S.update(tmp_path, summaries, check=True, agents=agents) == []
    changed = copy.deepcopy(summaries)
    g = next(iter(changed))
    changed[g]["sanity"]["rise/q"]["verdict"] = "fails"
    stale = S.update(tmp_path, changed, check=True, agents=agents)
    assert "docs/methods/rise.md" in stale and "docs/methods/index.md" in stale
    assert "docs/methods/gradient.md" not in stale
    assert S.update(tmp_path, changed, agents=agents) == stale               # writes them, and draws the figure
    assert (tmp_path / S.SANITY_PNG).stat().st_size > 10_000
    assert S.update(tmp_path, changed, check=True, agents=agents) == []
    assert "**fails**" in (tmp_path / "docs/methods/rise.md").read_text()


def test_a_page_without_its_markers_gets_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="no generated section 'sanity'.*put the two lines"):
        S.replace_section("# a page\n", "sanity", "body", "docs/methods/x.md")


def test_method_section_every_step_and_game_with_n_and_draws():
    s = {"mspacman": _summary("mspacman"), "breakout": _summary("breakout")}
    text = S.method_section(s, "guided_backprop")
    assert "20 episodes, 1,000 states; sanity 200 states x 10 draws" in text
    assert "Not done yet: Space Invaders and Frostbite." in text
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + len(S.STEPS)                       # header + one row per step
    assert "**fails** 0.90 [0.88, 0.92]; draws 0.85-0.95" in rows[1]
    assert "fails at q in all 2 games" in text
    lime = S.method_section(s, "lime")                          # three variants, three tables
    assert lime.count("| randomised |") == 3


def test_pattern_sentence_names_each_game_and_step():
    s = {"mspacman": _summary("mspacman", fails_at_q=("rise",)), "breakout": _summary("breakout", fails_at_q=())}
    s["breakout"]["sanity"]["rise/conv2"] = _sanity(0.5, "inconclusive")
    s["breakout"]["sanity"]["rise/conv1"] = _sanity(0.5, "inconclusive")
    s["mspacman"]["sanity"]["rise/fc1"] = _sanity(0.9, "fails")
    assert S.pattern_sentence(s, "rise") == ("fails at q and fc1 in MsPacman; inconclusive at conv2 and conv1 in "
                                             "Breakout; passes everywhere else")
    assert S.pattern_sentence(s, "gradient") == "passes at every step in every game"
    assert S.index_cell(s, "rise", "breakout") == "inconclusive: conv2, conv1"
    assert S.index_cell(s, "gradient", "breakout") == "passes at every step"


def test_claim_counts_and_every_disagreement_listed():
    s = {"mspacman": _summary("mspacman", verdicts=[_sign("disagree"), _sign("agree", mapping="fix")]),
         "breakout": _summary("breakout", verdicts=[_sign("inconclusive"), _sign("disagree", mapping="fix")])}
    rows = S.claims(s)                                         # the primary mapping only
    assert S.counts(rows) == {"agree": 4, "disagree": 1, "inconclusive": 1}
    table = "\n".join(S.claims_table(s))
    assert "| **all** | 2 / 1 / 0 | 2 / 0 / 1 | **4 / 1 / 1** |" in table
    lines = S.disagreement_lines(s)
    assert "- **MsPacman** (1):" in lines and "- **Breakout** (1):" in lines
    assert any("(noise column read as the chosen-action fix)" in x for x in lines)   # the fix's are listed, marked


def test_a_claim_judged_twice_is_counted_once_more_without_its_repeat():
    """Breakout's table claims judge the same comparisons as its black / Q-value sign cells: the page
    gives the counts again without them."""
    again = dict(_sign("agree"), id="breakout:rise")
    s = {"breakout": _summary("breakout", verdicts=[_sign("agree"), again, _sign("disagree", mapping="fix")])}
    rows = S.claims(s)
    assert S.counts(rows) == {"agree": 4, "disagree": 0, "inconclusive": 0}
    assert S.overlap_text(rows) == (" (Breakout's 1 black / Q-value AUCs are 1 of its sign cells judged again: "
                                    "3 / 0 / 0 over 3 distinct comparisons)")
    assert S.overlap_text(S.claims({"mspacman": _summary("mspacman", verdicts=[_sign("agree")])})) == ""


def test_a_game_readme_counts_paper_b_claims_at_each_reading():
    """The per-game README's count line: Paper B's claims only (not each method's own sanity verdict),
    the primary reading and the chosen-action fix apart, no verdict counted twice."""
    from experiments.paper_b import rerun_analysis as A
    v = _summary("mspacman", verdicts=[_sign("disagree"), _sign("agree", mapping="fix"),
                                       dict(_sign("agree"), mapping="all")])["verdicts"]
    assert A.claim_counts(v) == {"agree": 2, "disagree": 1, "inconclusive": 0}
    assert A.claim_counts(v, ("fix",)) == {"agree": 1, "disagree": 0, "inconclusive": 0}


def test_readme_sentence_follows_the_verdicts():
    s = {g: _summary(g, fails_at_q=("guided_backprop", "g1gradcam")) for g in ("mspacman", "breakout")}
    text = S.readme_section(s)
    assert "(MsPacman and Breakout, one agent each, 20 episodes and 10 randomisation draws per game)" in text
    assert "Guided Backprop and G1Grad-CAM fail the randomisation sanity check in every game" in text
    s["breakout"]["sanity"]["g1gradcam/q"] = _sanity(0.55, "inconclusive")
    assert "Guided Backprop fails the randomisation sanity check in every game" in S.readme_section(s)
    s["breakout"]["sanity"]["guided_backprop/q"] = _sanity(0.55, "inconclusive")
    assert "no method fails" in S.readme_section(s)
    s4 = {g: _summary(g) for g in S.GAMES}
    assert "(four Atari games," in S.readme_section(s4)


def test_load_keeps_only_games_that_meet_the_design(tmp_path):
    for g, met in (("mspacman", True), ("breakout", False)):
        (tmp_path / g).mkdir()
        (tmp_path / g / "summary.json").write_text(json.dumps(dict(_summary(g), design_met=met)))
    assert list(S.load(tmp_path)) == ["mspacman"]


def test_the_docs_page_states_what_the_summaries_hold():
    """The hand-written lines of the Paper B page quote figures of the generated section: they agree."""
    summaries = S.load()
    page = (ROOT / "docs/reproductions/paper_b.md").read_text()
    c = S.counts(S.claims(summaries))
    if S.not_done(summaries):   # the lines name the games done; once all are, they say so
        assert f"Done: {S._games(summaries)}" in page
    else:
        assert "its play under the sampling above, in all four games" in page
    assert re.search(rf"{c['agree']} agree, {c['disagree']} disagree and\s+{c['inconclusive']} inconclusive of "
                     rf"{sum(c.values())} verdicts", page)


def test_states_left_out_of_a_q_value_setting_are_counted_beside_n():
    clean, some = _summary("mspacman"), _summary("breakout")
    some["undefined_states"] = {"insertion/black/q_value": [3, 7], "deletion/black/q_value": [3]}
    assert S.undefined_text({"mspacman": clean}) == ""
    text = S.undefined_text({"mspacman": clean, "breakout": some})
    assert "Breakout 2 of 1,000" in text and "MsPacman" not in text
    assert text in S.findings_section({"mspacman": clean, "breakout": some})


def _agents(gbp=("fails", "fails", "passes"), rise=("disagree", "agree", "inconclusive"), design_met=True):
    """An across-agents summary (agents_analysis.py's layout) of three Breakout agents."""
    from experiments.paper_b.agents_analysis import cross_label
    labels = ("shipped", "seed1", "seed2")

    def row(id_, finding, mapping, verdicts):
        v = dict(zip(labels, verdicts))
        return {"id": id_, "finding": finding, "mapping": mapping, "verdicts": v,
                "details": {a: "" for a in labels}, "cross": cross_label(list(v.values()))}
    return {"game": "breakout",
            "agents": {a: {"design_met": design_met, "episodes": 20} for a in labels},
            "claims": [row("sanity_q:guided_backprop", "guided_backprop: output-layer sanity check", "", gbp),
                       row("sign:rise:black/q_value", "rise above the random map (black / q_value)", "matched", rise),
                       row("sanity_q:gradient", "gradient: output-layer sanity check", "", ("passes",) * 3)],
            "concordance": [{"table": "insertion/black/q_value", "w": 0.9, "p": 1e-4, "p_holm": 1e-3,
                             "shared_ranking": True, "methods": 20},
                            {"table": "sanity/q", "w": 0.4, "p": 0.3, "p_holm": 0.6, "shared_ranking": False,
                             "methods": 20}]}


def test_the_pages_label_each_verdict_across_agents_once_the_study_has_run():
    """Registered (agents_registration.md, "What each outcome means"): an agent-dependent finding is said
    so on every page and game where it appears; before the study, every page says one agent per game."""
    s = {"mspacman": _summary("mspacman", verdicts=[_sign("disagree")]),
         "breakout": _summary("breakout", verdicts=[_sign("disagree")])}
    ag = _agents()
    before, after = S.findings_section(s), S.findings_section(s, agents=ag)
    assert "One agent per game (the shipped one): nothing here is about other agents." in before
    assert "Across agents" not in before and "Breakout's 3 agents" not in before
    assert "in Breakout 3 agents (the shipped one, seed1 and seed2;" in after
    assert "**Across agents**" in after and "agent-dependent 1" in after
    assert "- rise above the random map (black / q_value): shipped disagree, seed1 agree, seed2 inconclusive" in after
    # the disagreement is listed in both games, each time with Breakout's three verdicts beside it
    assert after.count("Breakout's 3 agents: shipped disagree, seed1 agree, seed2 inconclusive (**agent-dependent**)") == 2
    assert "in 1 of 2 tables: insertion/black/q_value" in after
    page = S.method_section(s, "guided_backprop", ag)
    assert "Output layer re-drawn, Breakout's 3 agents: shipped fails, seed1 fails, seed2 passes (**agent-dependent**)." \
        in page and "may not hold for another agent" in page
    assert "(same in all)." in S.method_section(s, "gradient", ag)
    assert "may not hold" not in S.method_section(s, "gradient", ag)
    assert "**agent-dependent** for Guided Backprop:" in S.index_section(s, agents=ag)
    assert "no variant's verdict differs" in S.index_section(s, agents=_agents(gbp=("fails", "inconclusive", "fails")))
    assert "In Breakout, where 3 agents were explained: Guided Backprop: agent-dependent." in S.readme_section(s, ag)


def test_a_game_whose_claim_differs_from_the_study_games_names_the_claim_the_agents_judged():
    """Paper B's claim under one verdict id can differ between games (the other side of the random map,
    another best method): Breakout's agents' verdicts beside another game's line then name Breakout's own
    claim, so that "agree" never reads as agreement with the opposite claim; Paper B's value alone does not
    make another claim."""
    below = dict(_sign("disagree"), finding="rise below the random map (black / q_value)")
    s = {"mspacman": _summary("mspacman", verdicts=[below]),
         "breakout": _summary("breakout", verdicts=[_sign("disagree")])}
    lines = S.disagreement_lines(s, _agents())
    mspacman = next(x for x in lines if x.startswith("  - rise below"))
    breakout = next(x for x in lines if x.startswith("  - rise above"))
    assert ("Breakout's 3 agents, on Breakout's own claim \"rise above the random map (black / q_value)\": "
            "shipped disagree, seed1 agree, seed2 inconclusive (**agent-dependent**)") in mspacman
    assert "own claim" not in breakout and "Breakout's 3 agents: shipped disagree" in breakout
    assert S.same_claim("best on random / advantage: rise (-0.01)", "best on random / advantage: rise (0.85)")
    assert not S.same_claim("best on black / q_value: occlusion (3.08)", "best on black / q_value: lime_felzenszwalb (7.48)")


def test_the_across_agents_study_counts_only_once_every_agent_met_the_design(tmp_path):
    f = tmp_path / "summary.json"
    assert S.load_agents(f) is None
    f.write_text(json.dumps(_agents(design_met=False)))
    assert S.load_agents(f) is None
    f.write_text(json.dumps(_agents()))
    assert S.load_agents(f)["game"] == "breakout"
