"""The Paper B re-run across its games: what the pages say, generated from each game's summary.json.

    python -m experiments.paper_b.rerun_summary           # summary.md + the pages' generated sections
    python -m experiments.paper_b.rerun_summary --check   # exit 1 where a page's section is out of date

Nothing here tests or decides: every verdict is the registered analysis' (rerun_analysis.py, per game).
This module counts and lists those verdicts across the games that meet the registered design, with N
beside every interval, and writes them where users choose a method: the method pages, the methods
index, the docs' Paper B page, the README's one sentence. A game not done yet is named as such.
Once the registered study of two more Breakout agents is analysed (`agents_analysis.py`, its
summary.json), the pages give its cross-agent label beside each claim and sanity verdict it covers.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

from experiments.common.paths import RESULTS, ROOT
from experiments.paper_b import report as R
from experiments.paper_b.rerun_analysis import CLAIM_KINDS, OUT, PRIMARY, _ci

GAMES = R.GAMES
LABEL = {"mspacman": "MsPacman", "breakout": "Breakout", "spaceinvaders": "Space Invaders", "frostbite": "Frostbite"}
STEPS = ("q", "fc1", "conv3", "conv2", "conv1")
STEP_LABEL = {"q": "output layer (q)", "fc1": "+ fc1", "conv3": "+ conv3", "conv2": "+ conv2", "conv1": "+ conv1"}
VARIANT = {  # method as the study names it -> (docs/methods page, how the page names it)
    "occlusion": ("occlusion", "Occlusion"),
    "noise_sensitivity_original": ("noise_sensitivity", 'Noise sensitivity, `score="output_l2"` (Paper B\'s score)'),
    "noise_sensitivity": ("noise_sensitivity", 'Noise sensitivity, `score="chosen_action"` (the default)'),
    "rise": ("rise", "RISE"),
    "lime_slic": ("lime", "LIME, SLIC segments (the default)"),
    "lime_quickshift": ("lime", "LIME, Quickshift segments"),
    "lime_felzenszwalb": ("lime", "LIME, Felzenszwalb segments"),
    "sarfa": ("sarfa", "SARFA, hard disk (the default)"),
    "sarfa_blurred": ("sarfa", 'SARFA, blurred disk (`mask_shape="gaussian"`)'),
    "gradient": ("gradient", "Gradient"),
    "grad_x_input": ("grad_x_input", "Gradient x Input"),
    "integrated_gradients": ("integrated_gradients", "Integrated Gradients"),
    "smoothgrad": ("smoothgrad", "SmoothGrad"),
    "guided_backprop": ("guided_backprop", "Guided Backprop"),
    "gradcam": ("gradcam", "Grad-CAM at conv3 (the default)"),
    "gradcam_post_relu": ("gradcam", 'Grad-CAM at conv3, `layer_activation="post_relu"`'),
    "gradcam_pp": ("gradcam_pp", "Grad-CAM++ at conv3"),
    "g1gradcam": ("g1gradcam", "G1Grad-CAM at conv3 (the default)"),
    "g1gradcam_post_relu": ("g1gradcam", 'G1Grad-CAM at conv3, `layer_activation="post_relu"`'),
    "guided_gradcam": ("guided_gradcam", "Guided Grad-CAM at conv3"),
}
KINDS = {  # verdict id prefix -> what Paper B claimed
    "sanity": "its two sanity findings (the original noise score fails at q, the chosen-action fix passes)",
    "best": "SARFA best on black / advantage; RISE best on random / Q-value",
    "table_best": "its best method in each of the four settings",
    "sign": "each of its seven methods above or below the random map, per setting",
    "winner_depends": "the substrate and the score decide the winner",
    "breakout": "Breakout's six black / Q-value AUCs, against the random map",
}
assert tuple(KINDS) == CLAIM_KINDS
RESULTS_README = "experiments/results/paper_b_rerun/README.md"
AGENTS_SUMMARY = RESULTS / "paper_b_agents" / "summary.json"
"""The across-agents study's results (`python -m experiments.paper_b.agents_analysis`), once it has run."""
AGENTS_README = "experiments/results/paper_b_agents/README.md"
SUMMARY_MD = "experiments/results/paper_b_rerun/summary.md"


# ------------------------------------------------------------------ reading
def load(root: Path = OUT) -> dict[str, dict]:
    """game -> its summary.json, for the games whose run meets the registered design."""
    out = {}
    for g in GAMES:
        p = Path(root) / g / "summary.json"
        if p.exists():
            s = json.loads(p.read_text())
            if s.get("design_met"):
                out[g] = s
    return out


def load_agents(path: Path = AGENTS_SUMMARY) -> dict | None:
    """The across-agents summary when every agent's re-run met the registered design, else None
    (the pages then say one agent per game was explained)."""
    p = Path(path)
    if not p.exists():
        return None
    a = json.loads(p.read_text())
    return a if a.get("agents") and all(x.get("design_met") for x in a["agents"].values()) else None


def agent_claims(agents: dict | None) -> dict[tuple[str, str], dict]:
    """(claim id, mapping) -> its row of the across-agents study (verdicts per agent, cross label)."""
    return {(c["id"], c["mapping"]): c for c in (agents or {}).get("claims", [])}


def agents_text(agents: dict) -> str:
    """'the shipped one, seed1 and seed2': the study's agents as its summary names them."""
    return _join([x if x != "shipped" else "the shipped one" for x in agents["agents"]])


def one_agent_text(agents: dict | None, prefix: str = "") -> str:
    """Whose play the pages' verdicts are about (links relative to the page: `prefix` leads to the repo root)."""
    if agents is None:
        return "One agent per game (the shipped one): nothing here is about other agents."
    g = LABEL.get(agents["game"], agents["game"])
    return (f"One agent per game (the shipped one), and in {g} {len(agents['agents'])} agents ({agents_text(agents)}; "
            f"[across agents]({prefix}{AGENTS_README})): a verdict holds for each of them only where it is labelled "
            f"\"same in all\" there.")


def cross_text(row: dict | None, agents: dict, finding: str | None = None) -> str:
    """One claim across the agents: each agent's verdict and the registered label; agent-dependent in bold.
    `finding`: the claim as Paper B makes it in the game whose line this is. Paper B's claim of a kind can
    differ between games (another best method, the other side of the random map): then the agents' verdicts
    are about the study game's own claim, and the text names it, so that no verdict reads as one on this claim."""
    if row is None:
        return ""
    label = f"**{row['cross']}**" if row["cross"] == "agent-dependent" else row["cross"]
    g = LABEL.get(agents["game"], agents["game"])
    whose = ("" if finding is None or same_claim(finding, row["finding"])
             else f", on {g}'s own claim \"{row['finding']}\"")
    return (f"{g}'s {len(row['verdicts'])} agents{whose}: "
            + ", ".join(f"{a} {v}" for a, v in row["verdicts"].items()) + f" ({label})")


def same_claim(a: str, b: str) -> bool:
    """Two games' findings of one verdict id make the same claim: the same method, direction and setting;
    Paper B's own value in parentheses at the end may differ ("best on random / advantage: rise (-0.01)" and
    "... rise (0.85)" are one claim)."""
    def claim(s: str) -> str:
        return re.sub(r"\s*\(-?\d[\d.]*\)$", "", s.strip())
    return claim(a) == claim(b)


def n_text(s: dict) -> str:
    m = s["meta"]
    return (f"1 agent, {m['episodes']} episodes, {m['states']:,} states; sanity {m['sanity_states']} states x "
            f"{m['sanity_draws']} draws")


def undefined_text(summaries: dict) -> str:
    """Where a Q-value setting leaves states out (its ratio score is undefined there), how many; "" if nowhere."""
    parts = []
    for g, s in summaries.items():
        n = max((len(v) for v in s.get("undefined_states", {}).values()), default=0)
        if n:
            parts.append(f"{LABEL[g]} {n} of {s['meta']['states']:,}")
    if not parts:
        return ""
    return (" The Q-value settings leave out the states where the ratio Q_a(x_t) / Q_a(x) is undefined (at most "
            + ", ".join(parts) + " per setting; each game's README lists them).")


def n_common(summaries: dict) -> str:
    """One N for all games when they share it (the registered design), else each game's."""
    texts = {n_text(s) for s in summaries.values()}
    if len(texts) == 1:
        return f"per game: {texts.pop()}"
    return "; ".join(f"{LABEL[g]}: {n_text(s)}" for g, s in summaries.items())


def not_done(summaries: dict) -> list[str]:
    return [LABEL[g] for g in GAMES if g not in summaries]


def _join(xs) -> str:
    xs = list(xs)
    return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]


def _games(gs) -> str:
    return _join([LABEL.get(g, g) for g in gs]) if gs else "none"


def sanity(s: dict, method: str, step: str) -> dict | None:
    return s["sanity"].get(f"{method}/{step}")


def sanity_cell(r: dict | None) -> str:
    if r is None:
        return "not run"
    return (f"**{r['verdict']}** {_ci(r)}; draws {min(r['draw_means']):.2f}-{max(r['draw_means']):.2f}")


def pattern(summaries: dict, method: str) -> dict[str, dict[str, list[str]]]:
    """verdict -> step -> the games with that verdict at that step."""
    out: dict[str, dict[str, list[str]]] = {"fails": {}, "inconclusive": {}, "passes": {}}
    for g, s in summaries.items():
        for step in STEPS:
            r = sanity(s, method, step)
            if r is not None:
                out[r["verdict"]].setdefault(step, []).append(g)
    return out


def pattern_sentence(summaries: dict, method: str) -> str:
    """Where a method fails and is inconclusive, in words; every step and game named, steps with the same games together."""
    p, n = pattern(summaries, method), len(summaries)
    parts = []
    for verdict in ("fails", "inconclusive"):
        by_games: dict[tuple, list[str]] = {}
        for st in STEPS:
            if p[verdict].get(st):
                by_games.setdefault(tuple(p[verdict][st]), []).append(st)
        where = [f"at {_join(steps)} in {'all ' + str(n) + ' games' if len(gs) == n and n > 1 else _games(gs)}"
                 for gs, steps in by_games.items()]
        if where:
            parts.append(f"{verdict} {'; '.join(where)}")
    return "; ".join(parts) + "; passes everywhere else" if parts else "passes at every step in every game"


# ------------------------------------------------------------------ Paper B's claims
def claims(summaries: dict, mappings=PRIMARY) -> list[dict]:
    """Every registered verdict on a claim of Paper B (agree / disagree / inconclusive) at these
    mappings; each method's own output-layer sanity verdict (`sanity_q:`) is not one of them."""
    return [dict(v, game=g) for g, s in summaries.items() for v in s["verdicts"]
            if v["verdict"] in ("agree", "disagree", "inconclusive") and v["mapping"] in mappings
            and v["id"].split(":")[0] in CLAIM_KINDS]


def counts(rows: list[dict]) -> dict[str, int]:
    return {k: sum(r["verdict"] == k for r in rows) for k in ("agree", "disagree", "inconclusive")}


def _count_text(c: dict) -> str:
    return f"{c['agree']} / {c['disagree']} / {c['inconclusive']}"


def overlap_text(rows: list[dict]) -> str:
    """Breakout's table claims compare the same maps with the random map as its black / Q-value sign
    cells: the counts once more without them, so no comparison counts twice."""
    again = [r for r in rows if r["id"].split(":")[0] == "breakout"]
    if not again:
        return ""
    rest = [r for r in rows if r["id"].split(":")[0] != "breakout"]
    return (f" (Breakout's {len(again)} black / Q-value AUCs are {len(again)} of its sign cells judged again: "
            f"{_count_text(counts(rest))} over {len(rest)} distinct comparisons)")


def claims_table(summaries: dict) -> list[str]:
    gs = list(summaries)
    lines = ["| Paper B's claim | " + " | ".join(LABEL[g] for g in gs) + " | all |",
             "|---" * (len(gs) + 2) + "|"]
    rows = claims(summaries)
    for kind, what in KINDS.items():
        of = [r for r in rows if r["id"].split(":")[0] == kind]
        if not of:
            continue
        cells = [_count_text(counts([r for r in of if r["game"] == g])) if any(r["game"] == g for r in of) else "-"
                 for g in gs]
        lines.append(f"| {what} | " + " | ".join(cells) + f" | {_count_text(counts(of))} |")
    lines.append("| **all** | " + " | ".join(_count_text(counts([r for r in rows if r["game"] == g])) for g in gs)
                 + f" | **{_count_text(counts(rows))}** |")
    return lines


def above_rise(summaries: dict) -> str:
    """Paper B: no method significantly above RISE on random / Q-value (its seven; our 20)."""
    parts = []
    for g, s in summaries.items():
        v = {x["mapping"]: x["detail"] for x in s["verdicts"] if x["id"] == "above_rise"}
        parts.append(f"{LABEL[g]}: {v.get('matched', '?')} of Paper B's methods, {v.get('all', '?')} of all 20")
    return "; ".join(parts)


def disagreement_lines(summaries: dict, agents: dict | None = None) -> list[str]:
    """Every significant disagreement with Paper B, at the primary mapping and then under the fix; with the
    across-agents study, the same claim's verdicts in its game's agents beside it (in every game)."""
    across = agent_claims(agents)
    lines = []
    for g in summaries:
        rows = [r for r in claims(summaries, PRIMARY + ("fix", "all")) if r["game"] == g and r["verdict"] == "disagree"]
        if not rows:
            lines.append(f"- **{LABEL[g]}**: none")
            continue
        lines.append(f"- **{LABEL[g]}** ({len(rows)}):")
        for r in rows:
            how = {"fix": " (noise column read as the chosen-action fix)", "all": " (all 20 methods)"}.get(r["mapping"], "")
            row = across.get((r["id"], r["mapping"]))
            lines.append(f"  - {r['finding']}{how}: {r['detail']}"
                         + (f"; {cross_text(row, agents, r['finding'])}" if row else ""))
    return lines


# ------------------------------------------------------------------ the generated sections
def method_section(summaries: dict, page: str, agents: dict | None = None) -> str:
    """A method page's sanity section: one table per variant the study ran, every step and game; with the
    across-agents study, each variant's output-layer verdict in that game's agents."""
    across = agent_claims(agents)
    gs = list(summaries)
    lines = [f"In the [Paper B reproduction](../reproductions/paper_b.md)'s registered re-run ({n_common(summaries)}; "
             "draws and episodes are the replicates), the cascading-randomisation check re-draws the weights from the "
             "output layer down and compares each map with the trained agent's (Spearman similarity; mean "
             "[95 % interval over draws x episodes]). **fails**: significantly above 0.5, the map survives the "
             "destruction of the weights it claims to explain; **passes**: significantly below; **inconclusive**: "
             "neither (p adjusted by Holm within the game and x4 for the games). Steps: q = the output layer re-drawn; "
             "fc1, conv3, conv2, conv1 = re-drawn from the output down to that layer. "
             + one_agent_text(agents, "../../")]
    if not_done(summaries):
        lines[0] += f" Not done yet: {_games(not_done(summaries))}."
    for method, (p, label) in VARIANT.items():
        if p != page:
            continue
        lines += ["", f"**{label}**: {pattern_sentence(summaries, method)}.", "",
                  "| randomised | " + " | ".join(LABEL[g] for g in gs) + " |", "|---" * (len(gs) + 1) + "|"]
        lines += [f"| {STEP_LABEL[st]} | " + " | ".join(sanity_cell(sanity(summaries[g], method, st)) for g in gs) + " |"
                  for st in STEPS]
        row = across.get((f"sanity_q:{method}", ""))
        if row:
            lines += ["", f"Output layer re-drawn, {cross_text(row, agents)}."
                      + (" The agents' verdicts differ, so this method's output-layer verdict, in any game, may not "
                         "hold for another agent." if row["cross"] == "agent-dependent" else "")]
    return "\n".join(lines)


def across_sanity_sentence(agents: dict | None) -> str:
    """The variants whose output-layer verdict is agent-dependent in the across-agents study; "" without it."""
    if agents is None:
        return ""
    across = agent_claims(agents)
    dep = [VARIANT[m][1] for m in VARIANT
           if (across.get((f"sanity_q:{m}", "")) or {}).get("cross") == "agent-dependent"]
    g = LABEL.get(agents["game"], agents["game"])
    return (f" Output layer re-drawn, in {g}'s {len(agents['agents'])} agents: "
            + (f"**agent-dependent** for {_join(dep)}: their verdicts may not hold for another agent in any game."
               if dep else "no variant's verdict differs between the agents (a verdict decided in some and undecided "
                           "in others is not a difference)."))


def index_cell(summaries: dict, method: str, game: str) -> str:
    """Where one variant fails and is inconclusive in one game: the steps, or "passes" at every step."""
    verdicts = {st: r["verdict"] for st in STEPS if (r := sanity(summaries[game], method, st)) is not None}
    parts = [f"{v}: {', '.join(st for st in STEPS if verdicts.get(st) == v)}" for v in ("fails", "inconclusive")
             if v in verdicts.values()]
    return "; ".join(parts) if parts else "passes at every step"


def index_section(summaries: dict, link=lambda page: f"{page}.md", agents: dict | None = None,
                  prefix: str = "../../") -> str:
    """The methods index's table: for every variant and game, the steps where it fails or is inconclusive;
    with the across-agents study, the variants whose output-layer verdict differs between its agents."""
    gs = list(summaries)
    lines = [f"Registered re-run of the Paper B reproduction ({n_common(summaries)}). "
             + one_agent_text(agents, prefix) + " A method fails where its maps stay significantly similar (Spearman "
             "above 0.5) to the trained agent's after the weights are re-drawn; inconclusive is neither a pass nor "
             "a fail."
             + (f" Not done yet: {_games(not_done(summaries))}." if not_done(summaries) else "")
             + across_sanity_sentence(agents), "",
             "| method | " + " | ".join(LABEL[g] for g in gs) + " |", "|---" * (len(gs) + 1) + "|"]
    for method, (page, label) in VARIANT.items():
        lines.append(f"| [{label}]({link(page)}) | " + " | ".join(index_cell(summaries, method, g) for g in gs) + " |")
    lines += ["", "Steps: q = the output layer re-drawn; fc1, conv3, conv2, conv1 = that layer and every layer above "
              "it re-drawn too. At the steps not named the method passes. Each method's page has the similarities, "
              "their intervals and the range over the 10 draws."]
    return "\n".join(lines)


def design_lines(summaries: dict) -> list[str]:
    lines = ["| game | episodes | states | sanity states x draws | return over the episodes (epsilon 0.01) | card (greedy, 30 games) | distinct episodes |",
             "|---|---|---|---|---|---|---|"]
    for g, s in summaries.items():
        m, r = s["meta"], s["returns"]
        lines.append(f"| {LABEL[g]} | {m['episodes']} | {m['states']:,} | {m['sanity_states']} x {m['sanity_draws']} | "
                     f"{_ci(r, 1)} | {R.fmt_return(m.get('agent_return'))} | {m.get('distinct_episodes')} of {m['episodes']} |")
    return lines


def across_agents_lines(agents: dict | None, prefix: str) -> list[str]:
    """The across-agents study in a paragraph: Paper B's claims by cross-agent label, every agent-dependent
    one with each agent's verdict, and the rankings' concordance; none without the study."""
    if agents is None:
        return []
    g, n = LABEL.get(agents["game"], agents["game"]), len(agents["agents"])
    rows = [c for c in agents["claims"] if c["id"].split(":")[0] in CLAIM_KINDS and c["mapping"] in PRIMARY]
    by: dict[str, list[dict]] = {}
    for c in rows:
        key = "decided in some, undecided in the others" if c["cross"][0].isdigit() else c["cross"]
        by.setdefault(key, []).append(c)
    dep = by.get("agent-dependent", [])
    shared = [r["table"] for r in agents["concordance"] if r["shared_ranking"]]
    lines = [f"**Across agents** ({g}: {agents_text(agents)}, each through the same re-run; "
             f"[registered study]({prefix}{AGENTS_README})). Paper B's {len(rows)} claims in {g} (its noise column "
             "read as the original score): " + "; ".join(f"{k} {len(v)}" for k, v in sorted(by.items())) + ". "
             + ("Agent-dependent, each agent's verdict:" if dep else "None is agent-dependent."), ""]
    lines += [f"- {c['finding']}: " + ", ".join(f"{a} {v}" for a, v in c["verdicts"].items()) for c in dep]
    lines += ([""] if dep else []) + [
        f"The agents rank the 20 methods alike (Kendall's W, permutation test, Holm over "
        f"{len(agents['concordance'])} tables) in {len(shared)} of {len(agents['concordance'])} tables"
        + (f": {', '.join(shared)}" if shared else "") + "; in the others a shared ranking is not shown (which is "
        "not evidence of different rankings)."]
    return lines


def findings_section(summaries: dict, prefix: str = "../../", agents: dict | None = None) -> str:
    """The docs' Paper B page: design, Paper B's claims by game, every disagreement, every sanity failure;
    with the across-agents study, its labels beside them."""
    readme = f"{prefix}{RESULTS_README}"
    pb = claims(summaries)
    c = counts(pb)
    san = {g: {v["id"].split(":")[1]: v for v in s["verdicts"] if v["id"].startswith("sanity:")} for g, s in summaries.items()}
    lines = [f"Games done: {_games(summaries)}" + (f"; not done yet: {_games(not_done(summaries))}" if not_done(summaries) else "")
             + f". N {n_common(summaries)}.{undefined_text(summaries)} {one_agent_text(agents, prefix)} "
             "Intervals: 95 %, cluster bootstrap over episodes (sanity: over draws x episodes); verdicts"
             " from paired t-tests on episode means (sanity: against 0.5), Holm within a game and "
             f"x4 for the games. Each game's tables: [the re-run's results]({readme}).", "",
             *design_lines(summaries), "",
             "**Paper B's sanity finding.** The original noise-sensitivity score at the output layer: "
             + "; ".join(f"{LABEL[g]} {san[g]['noise_sensitivity_original']['detail'].replace('Spearman at q ', '')}"
                         for g in summaries)
             + ". The chosen-action fix: "
             + "; ".join(f"{LABEL[g]} {san[g]['noise_sensitivity']['detail'].replace('Spearman at q ', '')}" for g in summaries)
             + ".", "",
             f"**Paper B's claims** (agree / disagree / inconclusive; its noise column read as the original score): "
             f"{_count_text(c)} over {len(pb)} verdicts{overlap_text(pb)}. Agree: Paper B's direction holds for this agent's play; "
             "disagree: the opposite is significant; inconclusive: the design cannot tell, which supports neither.", "",
             *claims_table(summaries), "",
             *across_agents_lines(agents, prefix), *([""] if agents else []),
             f"Methods significantly above RISE on random / Q-value (Paper B: none): {above_rise(summaries)}.", "",
             "**Every disagreement with Paper B**, with its estimate [95 % interval] or difference and adjusted p:", "",
             *disagreement_lines(summaries, agents), "",
             "**Sanity failures of all 20 variants** (per step and game):", "",
             index_section(summaries, link=lambda page: f"../methods/{page}.md", agents=agents, prefix=prefix)]
    return "\n".join(lines)


def readme_section(summaries: dict, agents: dict | None = None) -> str:
    """The README's one sentence: which methods fail the sanity check at the output layer in every game
    (and, with the across-agents study, how that verdict fares across its agents)."""
    if not summaries:
        return ("The [methods index](docs/methods/index.md#sanity-checks-on-the-shipped-agents) lists which methods "
                "pass the randomisation sanity check on the shipped agents.")
    n = len(summaries)
    failing = [m for m in VARIANT if m not in ("gradcam_post_relu", "g1gradcam_post_relu")
               and len(pattern(summaries, m)["fails"].get("q", [])) == n]
    everywhere = [short_name(m) for m in failing]
    m = next(iter(summaries.values()))["meta"]
    games = "four Atari games" if n == len(GAMES) else _games(summaries)
    where = (f"On the shipped agents ({games}, one agent each, {m['episodes']} episodes and {m['sanity_draws']} "
             "randomisation draws per game), ")
    what = (f"{_join(everywhere)} {'fails' if len(everywhere) == 1 else 'fail'} the randomisation sanity check in "
            "every game: their maps stay similar when the output layer is re-drawn." if everywhere else
            "no method fails the randomisation sanity check at the output layer in every game.")
    if agents is not None and failing:
        across = agent_claims(agents)
        g = LABEL.get(agents["game"], agents["game"])
        what += (f" In {g}, where {len(agents['agents'])} agents were explained: "
                 + "; ".join(f"{short_name(m)}: {(across.get((f'sanity_q:{m}', '')) or {}).get('cross', 'not run')}"
                             for m in failing) + ".")
    return (where + what + " The [methods index](docs/methods/index.md#sanity-checks-on-the-shipped-agents) lists "
            "every method's result.")


def short_name(method: str) -> str:
    """A variant as a sentence names it."""
    if method == "noise_sensitivity_original":
        return "Paper B's original noise-sensitivity score"
    return VARIANT[method][1].split(" (")[0].split(",")[0].replace(" at conv3", "")


def summary_md(summaries: dict, agents: dict | None = None) -> str:
    """experiments/results/paper_b_rerun/summary.md: the games side by side."""
    return "\n".join(["# Paper B re-run: the games side by side", "",
                      "Generated by `python -m experiments.paper_b.rerun_summary` from each game's `summary.json` "
                      "(the registered analysis); nothing here is tested anew. Each game's section: "
                      "[README.md](README.md).", "",
                      "![the output-layer check, every variant and game](sanity_q.png)", "",
                      findings_section(summaries, prefix="../../../", agents=agents)
                      .replace("../methods/", "../../../docs/methods/"), ""])


# ------------------------------------------------------------------ the figure
SANITY_PNG = "experiments/results/paper_b_rerun/sanity_q.png"
COLOUR = {"fails": "#c0392b", "inconclusive": "#7f8c8d", "passes": "#27ae60"}


def sanity_figure(summaries: dict, path: Path) -> None:
    """The output-layer check of every variant in every game: the 10 draw means as dots, the mean with its
    interval over draws x episodes as a bar, coloured by the verdict; the 0.5 line is the rule."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(VARIANT)
    fig, axes = plt.subplots(len(summaries), 1, figsize=(11, 2.3 * len(summaries) + 0.9), sharex=True, squeeze=False)
    for ax, (g, s) in zip(axes[:, 0], summaries.items()):
        for i, m in enumerate(methods):
            r = sanity(s, m, "q")
            if r is None:
                continue
            c = COLOUR[r["verdict"]]
            ax.scatter(np.full(len(r["draw_means"]), i) + np.linspace(-0.18, 0.18, len(r["draw_means"])),
                       r["draw_means"], s=7, color=c, alpha=0.55, linewidths=0)
            ax.errorbar(i, r["mean"], yerr=[[r["mean"] - r["low"]], [r["high"] - r["mean"]]], fmt="_", color=c,
                        markersize=14, capsize=3, lw=1.6)
        ax.axhline(0.5, color="k", lw=0.8, ls="--")
        ax.set_ylim(0, 1)
        ax.set_ylabel(f"{LABEL[g]}\nSpearman")
        ax.grid(axis="y", alpha=0.3)
    axes[-1, 0].set_xticks(range(len(methods)), methods, rotation=60, ha="right", fontsize=8)
    handles = [plt.Line2D([], [], color=c, marker="_", ls="", markersize=12, label=v) for v, c in COLOUR.items()]
    axes[0, 0].legend(handles=handles, loc="upper left", fontsize=8, ncol=3, frameon=False)
    m = next(iter(summaries.values()))["meta"]
    axes[0, 0].set_title(f"Output layer re-drawn: similarity to the trained agent's maps (per game: 1 agent, "
                         f"{m['episodes']} episodes, {m['sanity_states']} states x {m['sanity_draws']} draws; dots: "
                         "the draws' means)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------ writing the pages
START = "<!-- paper_b_rerun {name}: generated by `python -m experiments.paper_b.rerun_summary` from the games' summary.json -->"
END = "<!-- end of paper_b_rerun {name} -->"


def sections(summaries: dict, agents: dict | None = None) -> dict[str, dict[str, str]]:
    """page (repo path) -> section name -> its generated text."""
    out = {f"docs/methods/{page}.md": {"sanity": method_section(summaries, page, agents)}
           for page in dict.fromkeys(p for p, _ in VARIANT.values())}
    out["docs/methods/index.md"] = {"sanity": index_section(summaries, agents=agents)}
    out["docs/reproductions/paper_b.md"] = {"findings": findings_section(summaries, agents=agents)}
    out["README.md"] = {"sanity": readme_section(summaries, agents)}
    return out


def replace_section(text: str, name: str, body: str, page: str) -> str:
    start, end = START.format(name=name), END.format(name=name)
    pat = re.compile(re.escape(start) + r"\n(?:.*?\n)?" + re.escape(end), re.S)
    if not pat.search(text):
        raise SystemExit(f"{page}: no generated section {name!r}; put the two lines\n{start}\n{end}\n"
                         "where it belongs, then rerun")
    return pat.sub(lambda _: f"{start}\n{body}\n{end}", text)


def update(root: Path = ROOT, summaries: dict | None = None, check: bool = False,
           agents: dict | None = None) -> list[str]:
    """Write (or with check, compare) every generated section and summary.md; the stale paths. With no
    summaries given, the committed ones and the across-agents study's (where it has run)."""
    if summaries is None:
        summaries, agents = load(), load_agents() if agents is None else agents
    stale = []
    wanted = {SUMMARY_MD: summary_md(summaries, agents)}
    for page, secs in sections(summaries, agents).items():
        text = (Path(root) / page).read_text()
        new = text
        for name, body in secs.items():
            new = replace_section(new, name, body, page)
        wanted[page] = new
    for page, new in wanted.items():
        p = Path(root) / page
        if not p.exists() or p.read_text() != new:
            stale.append(page)
            if not check:
                p.write_text(new)
    if not check and summaries:   # the figure is redrawn, not compared (its bytes follow matplotlib's version)
        sanity_figure(summaries, Path(root) / SANITY_PNG)
    return stale


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="only report the pages out of date (exit 1 if any)")
    a = ap.parse_args(argv)
    stale = update(check=a.check)
    for p in stale:
        print(("out of date: " if a.check else "wrote ") + p)
    if a.check and stale:
        sys.exit(1)


if __name__ == "__main__":
    main()
