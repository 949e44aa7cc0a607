"""Cost pilot of the counterfactual study, on the development seed only (plan.DEV_SEED, never a
study seed): per game, one full game played and replayed, and the registered measurements with
every method on a few of its states; CPU-seconds per study episode extrapolated from them.

    python -m experiments.counterfactual.pilot --states 3      # writes experiments/counterfactual/pilot.json

The pilot's results are never analysed: only its timings and the interventions' status counts
(is each registered move feasible) are read.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from experiments.counterfactual import plan as P
from experiments.counterfactual import run as R


def pilot_game(game: str, states: int, methods=None) -> dict:
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
    assert rep["trajectory_sha256"] == ep["trajectory_sha256"]
    c2 = time.process_time()
    pick = R.spread(len(rep["moments"]), states)
    R.measure_episode(agent, game, [rep["moments"][i] for i in pick[:1]], methods, P.MOVES[game])   # compile
    c3 = time.process_time()
    res = R.measure_episode(agent, game, [rep["moments"][i] for i in pick], methods, P.MOVES[game])
    c4 = time.process_time()
    per_state = (c4 - c3) / len(pick)
    per_episode = (c1 - c0) + (c2 - c1) + per_state * P.STATES_PER_EPISODE + (c3 - c2)
    status = np.asarray(res["statuses"])[res["status"]]
    return {"game": game, "seed": P.DEV_SEED, "length": ep["length"], "return": ep["return"],
            "eligible": len(ep["eligible"]), "methods": len(methods), "states_measured": int(len(pick)),
            "cpu_s": {"play": round(c1 - c0, 1), "replay": round(c2 - c1, 1), "compile_first_state": round(c3 - c2, 1),
                      "measure_per_state": round(per_state, 1)},
            "cpu_s_per_episode": round(per_episode, 0),
            "cpu_hours_per_game": round(per_episode * P.EPISODES / 3600, 2),
            "wall_s": round(time.perf_counter() - w0, 1),
            "status_counts": {s: int((status == s).sum()) for s in np.unique(status)}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.counterfactual.pilot", description=__doc__.split("\n")[0])
    p.add_argument("--game", action="append", choices=P.GAMES)
    p.add_argument("--states", type=int, default=3)
    p.add_argument("--out", default=str(P.HERE / "pilot.json"))
    a = p.parse_args(argv)
    import jaxsal

    jaxsal.cpu.use_fast_kernels()
    out = {g: pilot_game(g, a.states) for g in (a.game or P.GAMES)}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
