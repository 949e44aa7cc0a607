"""Paper B across agents of one game: method effects against agent effects (registered analysis).

    python -m experiments.paper_b.agents_analysis            # the registered run (agents_registration.md)
    python -m experiments.paper_b.agents_analysis --agent shipped=DIR --agent seed1=DIR ...

Each agent's re-run (`experiments.paper_b.rerun`, the registered single-agent protocol) gives its
`summary.json` and `auc_per_state.csv.gz`. From them, for the agents together:

1. every registered verdict side by side, and one cross-agent label per claim (`cross_label`);
2. whether the agents rank the 20 methods alike: Kendall's W of the method means per fidelity setting
   (difference to the random map) and per sanity cascade step (Spearman), with a permutation p-value
   (each agent's ranking permuted on its own), Holm over the 13 tests (`concordance`);
3. a descriptive split of the agent x method table of each setting into method, agent and
   agent x method spreads, beside the sampling noise of a cell (`components`); for the fidelity tables
   also against the noise of their correlated cells (`with_correlated_noise`, deviation 2).

Writes `summary.json` and `README.md` under --out. Nothing here looks at the agents' data before
the registration is committed; the analysis is this file at the freezing commit.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from experiments.common.paths import RESULTS, write_results
from jaxsal.metrics import statistics

OUT = RESULTS / "paper_b_agents"
DEVIATIONS = Path(__file__).with_name("agents_deviations.md")  # the README ends with them
GAME = "breakout"
AGENTS = {"shipped": RESULTS / "paper_b_rerun" / GAME,
          "seed1": OUT / "seed1" / GAME,
          "seed2": OUT / "seed2" / GAME}
"""Registered agents (label -> the re-run's game folder): the shipped agent and two seeds."""
SETTINGS = [f"{mode}/{sub}/{score}" for mode in ("insertion", "deletion") for sub in ("black", "random")
            for score in ("q_value", "advantage")]
STEPS = ("q", "fc1", "conv3", "conv2", "conv1")
NONSIG = ("inconclusive", "none")
"""Verdicts that decide nothing: the design could not tell, or no method had a significant lead."""
N_PERMUTATIONS, SEED, ALPHA = 10_000, 0, 0.05


def cross_label(verdicts: list[str]) -> str:
    """One label for a claim's per-agent verdicts (registered):

    - "same in all": every agent gives the same deciding verdict;
    - "undecided in all": no agent's verdict decides;
    - "agent-dependent": two agents give different deciding verdicts (e.g. agree and disagree);
    - "k of n, undecided in the others": one deciding verdict in k agents, the rest undecided.
    """
    decided = [v for v in verdicts if v not in NONSIG]
    if not decided:
        return "undecided in all"
    if len(set(decided)) > 1:
        return "agent-dependent"
    if len(decided) == len(verdicts):
        return "same in all"
    return f"{len(decided)} of {len(verdicts)}, undecided in the others"


def side_by_side(summaries: dict) -> list[dict]:
    """Every registered claim (id, finding, mapping) with each agent's verdict and the cross label.
    A claim missing from an agent's summary is an error (the agents ran the same protocol)."""
    keys = None
    per_agent = {}
    for label, s in summaries.items():
        rows = {(v["id"], v["finding"], v["mapping"]): v for v in s["verdicts"]}
        if len(rows) != len(s["verdicts"]):
            raise ValueError(f"{label}: verdicts are not unique by (id, finding, mapping)")
        per_agent[label] = rows
        keys = list(rows) if keys is None else keys
        if set(rows) != set(keys):
            raise ValueError(f"{label}: its claims differ from the first agent's: "
                             f"{sorted(set(rows) ^ set(keys))[:3]}")
    out = []
    for k in keys:
        verdicts = {label: per_agent[label][k]["verdict"] for label in summaries}
        out.append({"id": k[0], "finding": k[1], "mapping": k[2], "verdicts": verdicts,
                    "details": {label: per_agent[label][k]["detail"] for label in summaries},
                    "cross": cross_label(list(verdicts.values()))})
    return out


def ranks(values: np.ndarray) -> np.ndarray:
    """Each row's ranks of its columns, 1..n, tied values sharing their average rank (deviation 2)."""
    from scipy.stats import rankdata
    return rankdata(values, method="average", axis=1)


def _w(rank_rows: np.ndarray, ties: float) -> np.ndarray:
    """Kendall's W of (..., agents, methods) rank rows; `ties`: the correction sum over agents of t^3 - t."""
    m, n = rank_rows.shape[-2:]
    s = ((rank_rows.sum(-2) - m * (n + 1) / 2) ** 2).sum(-1)
    return 12 * s / (m ** 2 * (n ** 3 - n) - m * ties)


def tie_sum(r: np.ndarray) -> float:
    """Sum over rows and tie groups of t^3 - t (0 without ties)."""
    return float(sum(((c := np.unique(row, return_counts=True)[1]) ** 3 - c).sum() for row in r))


def kendall_w(values: np.ndarray) -> float:
    """Kendall's coefficient of concordance of the rows' rankings of the columns: (agents, methods);
    tied values take their average rank and the denominator its tie correction."""
    r = ranks(values)
    return float(_w(r, tie_sum(r)))


def permutation_p(values: np.ndarray, n: int = N_PERMUTATIONS, seed: int = SEED) -> float:
    """P(W >= observed) when each agent ranks the methods independently at random: each row's ranks
    permuted on its own, n times; (1 + hits) / (1 + n). A row's own rank values are permuted, so its
    ties stay (without ties these are the registered draws exactly: the same uniform permutations)."""
    m, k = values.shape
    r = ranks(values)
    observed, ties = float(_w(r, tie_sum(r))), tie_sum(r)
    rng = np.random.default_rng(seed)
    perm = rng.random((n, m, k)).argsort(axis=2).argsort(axis=2)       # the registered draws, 0-based ranks
    w = _w(np.take_along_axis(np.broadcast_to(np.sort(r, axis=1), (n, m, k)), perm, axis=2), ties)
    return float((1 + np.sum(w >= observed - 1e-12)) / (1 + n))


def holm(ps: list[float]) -> list[float]:
    """Holm-adjusted p-values, in the order given; as registered, a NaN counts in the family and
    reads 1 (never significant)."""
    adj = statistics.holm(ps, nan="count")
    return np.where(np.isnan(adj), 1.0, adj).tolist()


def tables(summaries: dict) -> dict:
    """(agents, methods) tables of the method means: per fidelity setting the difference to the random
    map, per sanity step the mean Spearman; with the method names."""
    first = next(iter(summaries.values()))
    methods = [m for m in first["against_random"][SETTINGS[0]] if m != "random"]
    out = {}
    for st in SETTINGS:
        out[f"fidelity:{st}"] = np.array([[s["against_random"][st][m]["diff"] for m in methods]
                                          for s in summaries.values()], float)
    for step in STEPS:
        out[f"sanity:{step}"] = np.array([[s["sanity"][f"{m}/{step}"]["mean"] for m in methods]
                                          for s in summaries.values()], float)
    return {"methods": methods, "tables": out}


def concordance(summaries: dict, n: int = N_PERMUTATIONS, seed: int = SEED) -> list[dict]:
    """Kendall's W per table with its permutation p, Holm over all tables (one family)."""
    t = tables(summaries)
    rows = [{"table": name, "w": kendall_w(v), "p": permutation_p(v, n, seed), "agents": v.shape[0],
             "methods": v.shape[1]} for name, v in t["tables"].items()]
    for r, p in zip(rows, holm([r["p"] for r in rows])):
        r["p_holm"] = p
        r["shared_ranking"] = bool(p <= ALPHA)
    return rows


def fidelity_noise(game_dir: Path, methods: list[str], covariance: bool = False) -> dict:
    """Per setting and method, the sampling variance of the mean difference to the random map:
    the variance of its 20 episode means / 20, on the states the registered analysis keeps. With
    `covariance`, per setting the (methods, methods) covariance of those means / 20 instead: the
    methods share the episodes and the random map, so their errors are correlated (deviation 2)."""
    from experiments.paper_b.rerun_analysis import RANDOM, defined_states, episode_means, load_game
    aucs, _, state_episode, _, _ = load_game(Path(game_dir))
    out = {}
    for st in SETTINGS:
        res, ep, _ = defined_states(aucs[tuple(st.split("/"))], state_episode)
        out[st] = {}
        means = {m: episode_means(np.asarray(res[m]) - np.asarray(res[RANDOM]), ep) for m in methods}
        if covariance:
            e = np.stack([means[m] for m in methods], axis=1)            # (episodes, methods)
            out[st] = np.cov(e, rowvar=False, ddof=1) / e.shape[0]
            continue
        for m in methods:
            out[st][m] = float(np.var(means[m], ddof=1) / len(means[m]))
    return out


def correlated_noise(covs: list[np.ndarray]) -> dict:
    """What sampling alone puts into an (agents, methods) table's mean squares when each agent's cells
    have the covariance matrix covs[i] (agents independent): E[MS agent x method] =
    sum_i (tr C_i - 1'C_i1 / m) / (a (m - 1)) and E[MS agent] = mean_i 1'C_i1 / m (deviation 2)."""
    a, m = len(covs), covs[0].shape[0]
    return {"inter": float(sum(np.trace(c) - c.sum() / m for c in covs) / (a * (m - 1))),
            "agent": float(np.mean([c.sum() / m for c in covs]))}


def components(values: np.ndarray, noise: np.ndarray) -> dict:
    """Method, agent and agent x method spreads of an (agents, methods) table of means (moment
    estimates of a two-way random-effects split, floored at 0), and the mean sampling variance of a
    cell. An agent x method spread near 0 with the cells' noise explaining the interaction means the
    method effects are the same for every agent; descriptive, no test."""
    a, m = values.shape
    grand = values.mean()
    row, col = values.mean(1, keepdims=True), values.mean(0, keepdims=True)
    ms_method = a * ((col - grand) ** 2).sum() / (m - 1)
    ms_agent = m * ((row - grand) ** 2).sum() / (a - 1)
    ms_inter = ((values - row - col + grand) ** 2).sum() / ((a - 1) * (m - 1))
    cell_noise = float(np.mean(noise))
    return {"sd_method": float(np.sqrt(max(0.0, (ms_method - ms_inter) / a))),
            "sd_agent": float(np.sqrt(max(0.0, (ms_agent - ms_inter) / m))),
            "sd_agent_x_method": float(np.sqrt(max(0.0, ms_inter - cell_noise))),
            "sd_cell_noise": float(np.sqrt(cell_noise)),
            "interaction_over_noise": float(ms_inter / cell_noise) if cell_noise > 0 else float("inf")}


def with_correlated_noise(c: dict, values: np.ndarray, noise: dict) -> dict:
    """The registered split `c` of a fidelity table, and beside it the same split against the noise
    its correlated cells put into the mean squares (deviation 2): `null_ratio` is what the registered
    interaction / noise reads with no agent x method effect at all (1 only for independent cells)."""
    a, m = values.shape
    row, col, grand = values.mean(1, keepdims=True), values.mean(0, keepdims=True), values.mean()
    ms_agent = m * ((row - grand) ** 2).sum() / (a - 1)
    ms_inter = ((values - row - col + grand) ** 2).sum() / ((a - 1) * (m - 1))
    agent_sq = (ms_agent - ms_inter - (noise["agent"] - noise["inter"])) / m
    return {**c, "null_ratio": noise["inter"] / c["sd_cell_noise"] ** 2 if c["sd_cell_noise"] > 0 else float("nan"),
            "sd_agent_corr": float(np.sqrt(max(0.0, agent_sq))),
            "sd_agent_x_method_corr": float(np.sqrt(max(0.0, ms_inter - noise["inter"]))),
            "interaction_over_noise_corr": float(ms_inter / noise["inter"]) if noise["inter"] > 0 else float("inf")}


def all_components(summaries: dict, dirs: dict) -> dict:
    t = tables(summaries)
    methods, out = t["methods"], {}
    noise = {label: fidelity_noise(Path(d), methods) for label, d in dirs.items()}
    covs = {label: fidelity_noise(Path(d), methods, covariance=True) for label, d in dirs.items()}
    for st in SETTINGS:
        nz = np.array([[noise[label][st][m] for m in methods] for label in summaries])
        v = t["tables"][f"fidelity:{st}"]
        out[f"fidelity:{st}"] = with_correlated_noise(components(v, nz), v,
                                                      correlated_noise([covs[label][st] for label in summaries]))
    for step in STEPS:
        nz = np.array([[s["sanity"][f"{m}/{step}"]["se"] ** 2 for m in methods] for s in summaries.values()])
        out[f"sanity:{step}"] = components(t["tables"][f"sanity:{step}"], nz)
    return out


def design(summaries: dict) -> dict:
    """Each agent's design check and return, as its own summary records them."""
    keys = ("states", "episodes", "sanity_states", "sanity_draws")
    return {label: {"design_met": s["design_met"], **{k: s["meta"].get(k) for k in keys},
                    "return": s["returns"], "agent": s["meta"].get("agent")} for label, s in summaries.items()}


def analyse(dirs: dict, n: int = N_PERMUTATIONS, seed: int = SEED) -> dict:
    summaries = {label: json.loads((Path(d) / "summary.json").read_text()) for label, d in dirs.items()}
    return {"game": GAME, "agents": design(summaries), "claims": side_by_side(summaries),
            "concordance": concordance(summaries, n, seed), "components": all_components(summaries, dirs),
            "analysis": {"n_permutations": n, "seed": seed, "alpha": ALPHA, "family": "Holm over 13 tables"}}


def markdown(res: dict) -> str:
    labels = list(res["agents"])
    lines = [f"# Paper B across {len(labels)} agents ({res['game']})", "",
             "Registered in `experiments/paper_b/agents_registration.md`; N per agent: the episodes, states and "
             "draws below. Each agent's own verdicts and intervals are in its re-run folder.", "",
             "| agent | design met | episodes | states | sanity states x draws | return (20 episodes) |",
             "|---|---|---:|---:|---|---|"]
    for label, a in res["agents"].items():
        r = a["return"]
        lines.append(f"| {label} | {a['design_met']} | {a['episodes']} | {a['states']} | "
                     f"{a['sanity_states']} x {a['sanity_draws']} | {r['mean']:.1f} [{r['low']:.1f}, {r['high']:.1f}] |")
    from experiments.paper_b.rerun_analysis import CLAIM_KINDS, PRIMARY

    def label_counts(rows):
        counts = {}
        for c in rows:
            key = c["cross"] if not c["cross"][0].isdigit() else "some decided, others undecided"
            counts[key] = counts.get(key, 0) + 1
        return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) or "none"
    claims = [c for c in res["claims"] if c["id"].split(":")[0] in CLAIM_KINDS and c["mapping"] in PRIMARY]
    own = [c for c in res["claims"] if c["id"].startswith("sanity_q:")]
    lines += ["", "## Claims, agent by agent", "",
              f"Cross-agent labels (deviation 3): Paper B's {len(claims)} claims, its noise column read as the "
              f"original score: {label_counts(claims)}. The {len(own)} variants' own output-layer sanity verdicts: "
              f"{label_counts(own)}. The table lists every verdict: the other readings of Paper B's noise column "
              "and the counts of methods above RISE too.", "",
              "| claim | mapping | " + " | ".join(labels) + " | across agents |",
              "|---|---|" + "---|" * len(labels) + "---|"]
    for c in res["claims"]:
        lines.append(f"| {c['finding']} | {c['mapping'] or '-'} | " + " | ".join(c["verdicts"][x] for x in labels)
                     + f" | {c['cross']} |")
    lines += ["", "## Do the agents rank the methods alike?", "",
              f"Kendall's W over {res['concordance'][0]['methods']} methods and {len(labels)} agents; p: each "
              f"agent's ranking permuted on its own ({res['analysis']['n_permutations']:,} permutations), Holm over "
              "the 13 tables.", "",
              "| table | W | p | p (Holm) | shared ranking |", "|---|---:|---:|---:|---|"]
    for r in res["concordance"]:
        lines.append(f"| {r['table']} | {r['w']:.2f} | {r['p']:.4f} | {r['p_holm']:.4f} | "
                     f"{'yes' if r['shared_ranking'] else 'not shown'} |")
    lines += ["", "## Method, agent and agent x method spreads (descriptive)", "",
              "Moment estimates from the agent x method table of means; cell noise: the sampling SD of a cell "
              "mean (episodes; for the sanity check draws and episodes). Interaction/noise near 1: the method "
              "effects differ between agents no more than sampling explains (for independent cells).", "",
              "| table | SD method | SD agent | SD agent x method | SD cell noise | interaction / noise |",
              "|---|---:|---:|---:|---:|---:|"]
    for name, c in res["components"].items():
        lines.append(f"| {name} | {c['sd_method']:.3f} | {c['sd_agent']:.3f} | {c['sd_agent_x_method']:.3f} | "
                     f"{c['sd_cell_noise']:.3f} | {c['interaction_over_noise']:.2f} |")
    corr = {k: c for k, c in res["components"].items() if "null_ratio" in c}
    if corr:
        lines += ["", "The fidelity tables' cells are not independent: an agent's 20 method means share its 20 "
                  "episodes and the random map, so sampling alone gives the interaction / noise above the value in "
                  "`null ratio`, not 1, and lifts the agent spread (deviation 2). The same split against the noise "
                  "of correlated cells (each agent's covariance of its methods' episode means / 20):", "",
                  "| table | null ratio | SD agent | SD agent x method | interaction / correlated noise |",
                  "|---|---:|---:|---:|---:|"]
        lines += [f"| {name} | {c['null_ratio']:.2f} | {c['sd_agent_corr']:.3f} | {c['sd_agent_x_method_corr']:.3f} "
                  f"| {c['interaction_over_noise_corr']:.2f} |" for name, c in corr.items()]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agent", action="append", default=None, metavar="LABEL=DIR",
                   help="an agent's re-run game folder (default: the registered three)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--permutations", type=int, default=N_PERMUTATIONS)
    a = p.parse_args(argv)
    dirs = dict(x.split("=", 1) for x in a.agent) if a.agent else {k: str(v) for k, v in AGENTS.items()}
    missing = [f"{k} ({d})" for k, d in dirs.items() if not (Path(d) / "summary.json").exists()]
    if missing:
        raise SystemExit("no re-run summary yet for: " + ", ".join(missing)
                         + "\n(run `python -m experiments.paper_b.rerun --game breakout --agent-file CARD --out DIR` "
                           "for each agent; agents_registration.md has the commands)")
    res = analyse(dirs, a.permutations)
    write_results(a.out, res, markdown(res) + "\n" + DEVIATIONS.read_text(), "summary.json", "README.md")
    print(f"wrote {a.out}/summary.json and README.md")


if __name__ == "__main__":
    main()
