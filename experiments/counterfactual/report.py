"""The written-up results of the counterfactual study: the N behind every registered interval, the
results README's tables and its figure, all from a game's progress folder and its `summary.json`.

    python -m experiments.counterfactual.report --game pong     # counts.json, statistics.png, tables on stdout
    python -m experiments.counterfactual.report --stories       # the three-game table of stories

Nothing here changes the registered analysis (`analysis.py`): `counts` recounts what each of its
three statistics used (episodes, states, kept moves or valid pairs) with the same rules, and the
tables print `summary.json`'s numbers as they are.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from experiments.counterfactual import analysis as A
from experiments.counterfactual import plan as P

TITLES = {"breakout": "Breakout", "pong": "Pong", "spaceinvaders": "Space Invaders"}   # the results README's sections


def counts(episodes: list[dict]) -> dict:
    """What each registered statistic used, per method: {"removal": {"episodes", "states"},
    "displacement": {"episodes", "states", "kept_moves"}, "follow": {"episodes", "pairs"}}, plus the
    kept moves and states with a kept move, the status counts per move (dx, dy), and per class the
    states where it is present and where its removal is kept (it is not wholly under another class's box),
    its mean (|) removal effect and the share of states where its |effect| is the largest."""
    d = A.stack(episodes)
    names = np.asarray(d["statuses"] + ["(no state)"])
    status = names[d["status"]]                                           # (E, S, J)
    kept = np.isin(status, P.KEEP)
    c_obj = d["classes"].index(d["moved"])
    mag = np.where(kept, np.abs(d["disp"]), np.nan)
    has_move = np.isfinite(mag).any(2)
    disp_ok = d["present"][..., c_obj] & has_move                         # displacement_values' `ok`
    out = {"methods": {}, "kept_moves": int(kept.sum()), "states_with_kept_move": int(kept.any(-1).sum()),
           "per_episode": {"kept_moves": kept.sum((1, 2)).tolist(),
                           "states_with_kept_move": kept.any(-1).sum(1).tolist()},
           "status_by_move": {f"{dx:+d},{dy:+d}": {s: int((status[..., j] == s).sum()) for s in d["statuses"]}
                              for j, (dx, dy) in enumerate(d["moves"])}}
    rem_ok = d["removal_ok"] & d["present"]
    eff = np.where(rem_ok, d["removal"], np.nan)
    largest = np.where(rem_ok, np.abs(d["removal"]), -1.0).argmax(-1)
    out["removal_pairs"] = {c: {"present": int(d["present"][..., k].sum()), "kept": int(rem_ok[..., k].sum()),
                                "mean_effect": float(np.nanmean(eff[..., k])),
                                "mean_abs_effect": float(np.nanmean(np.abs(eff[..., k]))),
                                "largest_abs_effect_share": float((largest == k).mean())}
                            for k, c in enumerate(d["classes"])}
    e_n, s_n, c_n = d["chance"].shape
    mag_rem = np.abs(d["removal"]).reshape(e_n * s_n, c_n)
    area_rho = A.rowwise_spearman(d["chance"].reshape(e_n * s_n, c_n), mag_rem, rem_ok.reshape(e_n * s_n, c_n))
    for i, m in enumerate(d["methods"]):
        rho = A.rowwise_spearman(d["share"][i].reshape(e_n * s_n, c_n), mag_rem, rem_ok.reshape(e_n * s_n, c_n))
        used = np.isfinite(rho - area_rho).reshape(e_n, s_n)
        valid = np.isfinite(np.where(kept, d["shift"][i], np.nan))
        disp_ep = np.isfinite(A.displacement_values(d["share"][i][..., c_obj], d["chance"][..., c_obj], d["disp"], kept,
                                                    d["present"][..., c_obj])[0])
        states = disp_ok & np.isfinite(d["share"][i][..., c_obj]) & disp_ep[:, None]     # a map without mass: no share
        out["methods"][m] = {
            "removal": {"episodes": int(used.any(1).sum()), "states": int(used.sum())},
            "displacement": {"episodes": int(disp_ep.sum()), "states": int(states.sum()),
                             "kept_moves": int((kept & states[..., None]).sum())},
            "follow": {"episodes": int(valid.any((1, 2)).sum()), "pairs": int(valid.sum())}}
    return out


def _ci(t: dict) -> str:
    return f"{t['mean']:.3f} [{t['low']:.3f}, {t['high']:.3f}]"


def _p(p: float) -> str:
    return f"{p:.1e}" if p < 1e-3 else f"{p:.4f}"


def tables(summary: dict, n: dict) -> dict[str, str]:
    """The results README's tables (markdown) from summary.json and `counts`: "episodes", "status",
    "tests" (each registered test with its N, raw and Holm p, reading) and "parts" (reported, not tested)."""
    out = {}
    rows = ["| episode | seed | length | return | truncated | random actions | kept moves | states with a kept move |",
            "|---" * 8 + "|"]
    pe = n["per_episode"]
    rows += [f"| {e} | {m['seed']} | {m['length']} | {m['return']:.0f} | {'yes' if m['truncated'] else 'no'} | "
             f"{m['random_actions']} | {pe['kept_moves'][e]} | {pe['states_with_kept_move'][e]} |"
             for e, m in enumerate(summary["episode_meta"])]
    out["episodes"] = "\n".join(rows)
    st = [s for s in summary["intervention_status"]]
    rows = ["| move (dx, dy) | " + " | ".join(st) + " |", "|---" * (len(st) + 1) + "|"]
    rows += [f"| {mv} | " + " | ".join(str(c[s]) for s in st) + " |" for mv, c in n["status_by_move"].items()]
    rows.append("| all | " + " | ".join(str(summary["intervention_status"][s]) for s in st) + " |")
    out["status"] = "\n".join(rows)
    rows = ["| method | removal - area [95%] | p, p_holm | N | displacement - area [95%] | p, p_holm | N | "
            "follow rate - 0.5 [95%] | p, p_holm | N | story |", "|---" * 11 + "|"]
    for m, r in summary["methods"].items():
        t, c = r["tests"], n["methods"][m]
        cell = lambda s: f"{_ci(t[s])} ({r['readings'][s]}) | {_p(t[s]['p'])}, {_p(t[s]['p_holm'])}"
        rows.append(f"| {m} | {cell('removal')} | {c['removal']['episodes']} ep, {c['removal']['states']} states | "
                    f"{cell('displacement')} | {c['displacement']['episodes']} ep, {c['displacement']['states']} "
                    f"states, {c['displacement']['kept_moves']} moves | {cell('follow')} | "
                    f"{c['follow']['episodes']} ep, {c['follow']['pairs']} moves | **{r['story']}** |")
    out["tests"] = "\n".join(rows)
    rows = ["| method | removal rho, method | removal rho, area | removal (newest frame) - area | "
            "displacement rho, method | displacement rho, area | follow rate |", "|---" * 7 + "|"]
    keys = ("removal_rho_method", "removal_rho_area", "removal_newest_minus_area", "displacement_rho_method",
            "displacement_rho_area", "follow_rate")
    rows += [f"| {m} | " + " | ".join(_ci(r["parts"][k]) for k in keys) + " |" for m, r in summary["methods"].items()]
    out["parts"] = "\n".join(rows)
    return out


def stories(summaries: dict[str, dict]) -> str:
    """The three-game table (markdown): per method (rows) and game (columns, in the order given), the
    registered story, with the supported tests named where it partly holds."""
    games = list(summaries)
    rows = ["| method | " + " | ".join(TITLES.get(g, g) for g in games) + " |", "|---" * (len(games) + 1) + "|"]
    for m in summaries[games[0]]["methods"]:
        cells = []
        for g in games:
            r = summaries[g]["methods"][m]
            named = [s for s in P.STATS if r["readings"][s] == "supported"]
            cells.append(f"partly holds ({', '.join(named)})" if r["story"] == "partly holds" else r["story"])
        rows.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def figure(summary: dict, n: dict, path: Path) -> None:
    """Per method the follow rate against chance (0.5) and the removal and displacement statistics,
    each with its 95% episode-bootstrap interval; methods in summary.json's order."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(summary["methods"])
    y = np.arange(len(methods))[::-1]
    fig, axes = plt.subplots(1, 3, figsize=(10.5, 4.6), sharey=True)
    panels = (("follow", "follow rate (chance 0.5)", 0.5, lambda r: r["parts"]["follow_rate"]),
              ("removal", "removal: rho(method) - rho(area)", 0.0, lambda r: r["tests"]["removal"]),
              ("displacement", "displacement: rho(method) - rho(area)", 0.0, lambda r: r["tests"]["displacement"]))
    colours = {"supported": "#1b7837", "contradicted": "#b2182b", "not shown": "#777777", "not estimable": "#bbbbbb"}
    for ax, (stat, title, ref, get) in zip(axes, panels):
        for yi, m in zip(y, methods):
            r = summary["methods"][m]
            t = get(r)
            c = colours[r["readings"][stat]]
            ax.plot([t["low"], t["high"]], [yi, yi], color=c, lw=2)
            ax.plot(t["mean"], yi, "o", color=c, ms=4)
        ax.axvline(ref, color="k", lw=0.8, ls="--")
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=8)
    axes[0].set_xlim(-0.02, 1.02)
    axes[0].set_yticks(y, methods)
    eps = summary["episodes"]
    fig.suptitle(f"{summary['game']}: {eps} episodes, {summary['states']} states, {n['kept_moves']} kept "
                 f"{summary['moved']} moves; "
                 "95% intervals over episodes; green supported, red contradicted, grey not shown (Holm)", fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.counterfactual.report", description=__doc__.split("\n")[0])
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--game", choices=P.GAMES)
    g.add_argument("--stories", action="store_true", help="print the three-game table of stories and stop")
    a = p.parse_args(argv)
    if a.stories:
        files = {game: P.RESULTS / game / "summary.json" for game in P.GAMES}
        missing = [str(f) for f in files.values() if not f.exists()]
        if missing:
            p.error(f"--stories needs every game's summary; missing: {', '.join(missing)}")
        print(stories({game: json.loads(f.read_text()) for game, f in files.items()}))
        return 0
    res = P.RESULTS / a.game
    summary_file = res / "summary.json"
    if not summary_file.exists():
        p.error(f"{summary_file} does not exist: run `python -m experiments.counterfactual.analysis --game {a.game}` "
                "once the game's 20 episodes are finished")
    summary = json.loads(summary_file.read_text())
    n = counts(A.load_episodes(P.PROGRESS / a.game))
    (res / "counts.json").write_text(json.dumps(n, indent=1) + "\n")
    figure(summary, n, res / "statistics.png")
    for name, t in tables(summary, n).items():
        print(f"<!-- {name} -->\n{t}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
