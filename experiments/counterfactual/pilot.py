"""Cost pilot of the counterfactual study, on the development seed only (plan.DEV_SEED, never a
study seed): per game, one full game played and replayed, and the registered measurements on its
25 states with one cheap method (gradient: the interventions, removals, Q changes and follows are
measured as the study makes them); every other method's cost per map is taken from the committed
CPU throughput table (experiments/results/throughput_cpu.json, this VM, library defaults) times the
maps a study episode needs (25 + its kept moves).

    python -m experiments.counterfactual.pilot        # writes experiments/counterfactual/pilot.json

Only the timings and the interventions' status counts (is each registered move feasible) are read;
the pilot's measurements are never analysed.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from experiments.counterfactual import plan as P
from experiments.counterfactual import run as R


THROUGHPUT = P.HERE.parent / "results" / "throughput_cpu.json"
# methods the throughput table lacks, costed as the nearest one it has
STAND_IN = {"xgradcam": "gradcam", "scorecam": "smoothgrad (n=50)"}


def seconds_per_map(methods) -> dict:
    """{method: wall seconds per map on the 2-core VM at library defaults} from the throughput table
    (median maps/s at the largest measured batch)."""
    import json

    cases = json.loads(THROUGHPUT.read_text())["cases"]
    by_name = {}
    for k, v in cases.items():                                   # the first row of a name: the default path
        by_name.setdefault(k.split(" (")[0], v)
    out = {}
    for m in methods:
        rows = cases.get(STAND_IN.get(m, ""), None) or by_name.get(m)
        if rows is None:
            raise ValueError(f"no throughput row for {m}: add it to STAND_IN")
        out[m] = 1.0 / rows[-1]["median_maps_per_s"]
    return out


def pilot_game(game: str, methods=None) -> dict:
    """CPU seconds of one development-seed episode of `game`, measured and extrapolated."""
    import jaxsal
    import jaxsal_agents
    from jaxsal_agents.interventions import greedy

    agent = jaxsal_agents.load(P.AGENTS[game])
    methods = list(jaxsal.methods() if methods is None else methods)
    c0, w0 = time.process_time(), time.perf_counter()
    ep = R.play_episode(game, P.DEV_SEED, P.EPSILON, P.MAX_EPISODE_STEPS, policy=greedy(agent))
    steps = ep["eligible"][R.spread(len(ep["eligible"]), P.STATES_PER_EPISODE)]
    c1 = time.process_time()
    rep = R.play_episode(game, P.DEV_SEED, P.EPSILON, P.MAX_EPISODE_STEPS, actions=ep["actions"], keep=steps)
    assert rep["trajectory_sha256"] == ep["trajectory_sha256"], "the replay does not reproduce the game"
    c2 = time.process_time()
    res = R.measure_episode(agent, game, rep["moments"], ["gradient"], P.MOVES[game])
    c3 = time.process_time()
    status = np.asarray(res["statuses"])[res["status"]]
    kept = int(np.isin(status, P.KEEP).sum())
    maps = len(rep["moments"]) + kept
    per_map = seconds_per_map(methods)
    # the table's seconds are wall seconds of a process using both cores: at most 2 CPU seconds each
    maps_cpu = 2.0 * maps * sum(v for k, v in per_map.items() if k != "gradient")
    per_episode = (c3 - c0) + maps_cpu
    return {"game": game, "seed": P.DEV_SEED, "length": ep["length"], "return": ep["return"],
            "truncated": ep["truncated"], "eligible_steps": len(ep["eligible"]), "states": len(rep["moments"]),
            "methods": len(methods), "maps_per_episode": maps,
            "cpu_s": {"play": round(c1 - c0, 1), "replay": round(c2 - c1, 1),
                      "measure_with_gradient_incl_compile": round(c3 - c2, 1),
                      "other_methods_maps_from_throughput": round(maps_cpu, 1)},
            "cpu_s_per_episode": round(per_episode),
            "cpu_hours_per_game": round(per_episode * P.EPISODES / 3600, 2),
            "pilot_wall_s": round(time.perf_counter() - w0, 1),
            "status_counts": {str(s): int((status == s).sum()) for s in np.unique(status)}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.counterfactual.pilot", description=__doc__.split("\n")[0])
    p.add_argument("--game", action="append", choices=P.GAMES)
    p.add_argument("--out", default=str(P.HERE / "pilot.json"))
    a = p.parse_args(argv)
    import jaxsal

    jaxsal.cpu.use_fast_kernels()
    out = {g: pilot_game(g) for g in (a.game or P.GAMES)}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
