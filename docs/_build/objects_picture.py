"""Draw the objects guide's picture (docs/images/breakout_effects.png) from committed data.

Reads `docs/images/data/breakout_effects.npz` (one state of the shipped Breakout agent: its stacked
frames and RAM boxes, frame 8 of `python -m jaxsal_agents.record_objects --agent breakout --steps
120`), explains it with Grad-CAM through the shipped agent, removes each object class
(`object_effects` at its defaults) and draws the frame, the map with the boxes and the effect bars
as `jaxsal render` does. Prints the numbers the guide quotes (`numbers`). Needs no emulator; a few
seconds on a CPU.

    python docs/_build/objects_picture.py                  # the committed picture
    python docs/_build/objects_picture.py --out DIR        # into DIR (tests)
    python docs/_build/objects_picture.py --capture        # re-record the state (needs ale-py)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "docs" / "images" / "data" / "breakout_effects.npz"
OUT = ROOT / "docs" / "images" / "breakout_effects.png"
FRAME, STEPS, METHOD = 8, 120, "gradcam"


def capture(path: Path = DATA) -> None:
    """Record the pictured state as record_objects does (seed 0, epsilon 0.05) and keep frame 8."""
    import jaxsal_agents
    from jaxsal_agents.ale import collect_objects

    agent = jaxsal_agents.load("breakout")
    batch, boxes = collect_objects(agent, STEPS, epsilon=0.05, seed=0)
    b = boxes[np.array([FRAME])]
    np.savez_compressed(path, obs=np.asarray(batch.obs[FRAME:FRAME + 1], np.uint8), boxes=b.boxes, labels=b.labels,
                        classes=np.asarray(b.classes), size=np.asarray([b.height, b.width]), game=np.asarray("breakout"),
                        frame=np.asarray(FRAME))


def load(path: Path = DATA):
    """(obs (1, 84, 84, 4) uint8, ObjectBoxes of that state) from the committed file."""
    from jaxsal.game_objects.boxes import ObjectBoxes

    with np.load(path, allow_pickle=False) as z:
        h, w = (int(v) for v in z["size"])
        return z["obs"], ObjectBoxes(z["boxes"], z["labels"], tuple(str(c) for c in z["classes"]), h, w)


def numbers(path: Path = DATA) -> dict:
    """What the picture shows, per class: Grad-CAM's positive share and the area share (chance), and
    the drop in Q of the chosen action when the class is removed (and whether the action flips)."""
    import jaxsal
    import jaxsal_agents
    from jaxsal.metrics import object_attribution, object_effects

    obs, boxes = load(path)
    agent = jaxsal_agents.load("breakout")
    maps = np.asarray(jaxsal.explain(agent.apply_fn, agent.params, obs, method=METHOD))
    sh = object_attribution(maps, boxes)
    eff = object_effects(agent.apply_fn, agent.params, obs, boxes)
    q = np.asarray(agent.apply_fn(agent.params, obs))
    q = q["q"] if isinstance(q, dict) else q
    return {"maps": maps, "effects": eff, "boxes": boxes, "obs": obs, "q_chosen": float(q[0].max()),
            "classes": {c: {"share": float(sh.positive[0, i]), "chance": float(sh.chance[0, i]),
                            "drop": float(eff.effect[0, i]), "flips": bool(eff.flips[0, i])}
                        for i, c in enumerate(boxes.classes)}}


def draw(out: Path = OUT, path: Path = DATA) -> dict:
    """Write the picture; returns `numbers`' per-class table and Q."""
    from jaxsal.cli.render.pictures import effects_png

    n = numbers(path)
    e = n["effects"]
    eff = {"effect": np.asarray(e.effect), "flips": np.asarray(e.flips), "present": np.asarray(e.present),
           "classes": list(e.classes), "action": np.asarray(e.actions), "overlap": np.asarray(e.overlap),
           "residue": np.asarray(e.residue)}
    effects_png(out, n["obs"], {METHOD: n["maps"]}, 0, eff, 0, boxes=n["boxes"], caption=f"frame {FRAME}")
    return {"q_chosen": n["q_chosen"], "classes": n["classes"]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None, help="a folder for the picture (default: docs/images/)")
    p.add_argument("--capture", action="store_true", help="re-record the state first (needs ale-py)")
    a = p.parse_args(argv)
    if a.capture:
        capture()
    out = OUT if a.out is None else Path(a.out) / OUT.name
    out.parent.mkdir(parents=True, exist_ok=True)
    print(json.dumps(draw(out), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
