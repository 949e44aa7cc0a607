"""Ground-truth game objects for Atari, from the emulator's RAM, aligned with the agent's frames.

    table = jaxsal.game_objects.table("pong")              # classes ("ball", "player", "enemy")
    table.boxes(ale.getRAM())                         # {class: [(x, y, w, h)]} on the raw screen
    ob = jaxsal.game_objects.boxes_from_ram("pong", rams)  # rams (N, F, R, 128) -> ObjectBoxes at 84x84
    masks = ob.masks()                                # (N, F, C, 84, 84) bool, on device

`agents.ale.AleAtariEnv` plays a game with EnvPool's preprocessing and records these boxes for
every stacked frame; `jaxsal.metrics.object_attribution` scores maps against them.
"""
from __future__ import annotations

import numpy as np

from jaxsal.game_objects import breakout, frostbite, mspacman, pong, spaceinvaders
from jaxsal.game_objects.boxes import ObjectBoxes, boxes_to_masks, screen_to_obs
from jaxsal.game_objects.table import RamTable

TABLES = {t.game: t for t in (pong.TABLE, breakout.TABLE, mspacman.TABLE, spaceinvaders.TABLE, frostbite.TABLE)}


def games() -> list[str]:
    """Games with a RAM table."""
    return sorted(TABLES)


def table(game: str) -> RamTable:
    """The RAM table of `game` ("pong", "breakout", "mspacman", "spaceinvaders", "frostbite")."""
    key = game.lower().replace("_", "").replace("-", "").replace(" ", "")
    if key not in TABLES:
        raise KeyError(f"no object table for game {game!r}; games with one: {', '.join(games())}")
    return TABLES[key]


def boxes_from_ram(game: str, rams, obs_h: int = 84, obs_w: int = 84) -> ObjectBoxes:
    """RAM snapshots (N, F, R, 128): per state, per stacked frame, the R raw frames that were
    max-pooled into it (EnvPool: the last 2 of each frame skip) -> ObjectBoxes at obs_h x obs_w.
    A stacked frame's boxes are those of all its raw frames: the max-pool shows both positions."""
    t = table(game)
    rams = np.asarray(rams)
    if rams.ndim != 4 or rams.shape[-1] != 128:
        raise ValueError(f"rams must be (N, F, R, 128) RAM snapshots, got shape {rams.shape}")
    n, f = rams.shape[:2]
    rows = []
    for s in range(n):
        per_frame = []
        for j in range(f):
            items = []
            for ram in rams[s, j]:
                for c, boxes in t.boxes(ram).items():
                    ci = t.classes.index(c)
                    for b in boxes:
                        ob = screen_to_obs(b, obs_h, obs_w)
                        if ob[2] > ob[0] and ob[3] > ob[1]:
                            items.append((ob, ci))
            per_frame.append(items)
        rows.append(per_frame)
    k = max([1] + [len(items) for per_frame in rows for items in per_frame])
    boxes = np.zeros((n, f, k, 4), np.int16)
    labels = np.full((n, f, k), -1, np.int8)
    for s, per_frame in enumerate(rows):
        for j, items in enumerate(per_frame):
            for i, (ob, ci) in enumerate(items):
                boxes[s, j, i], labels[s, j, i] = ob, ci
    return ObjectBoxes(boxes, labels, t.classes, obs_h, obs_w)


__all__ = ["ObjectBoxes", "RamTable", "TABLES", "boxes_from_ram", "boxes_to_masks", "games", "screen_to_obs",
           "table"]
