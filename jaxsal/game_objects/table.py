"""One game's RAM table: which object classes exist and where the RAM says they are on screen.

A table turns one 128-byte Atari RAM snapshot into boxes `(x, y, w, h)` on the raw 210x160
screen, grouped by class. Tables are small and written from the published RAM addresses of
the Object-Centric Atari work (OCAtari, Delfosse et al. 2023, github.com/k4ntz/OC_Atari,
`ocatari/ram/<game>.py`), re-expressed here and checked against the rendered frames
(tests/game_objects/test_tables.py).
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

SCREEN_H, SCREEN_W = 210, 160


@dataclasses.dataclass(frozen=True)
class RamTable:
    """`detect(ram) -> {class: [(x, y, w, h), ...]}` (raw screen pixels) for one game.

    `max_objects[c]` bounds how many boxes class c can have in one frame (the padding of
    `ObjectBoxes`); `background` is the grey level of the empty playfield in ALE's grey
    palette (what the table tests check box contents against).
    """
    game: str
    classes: tuple
    max_objects: dict
    detect: Callable[[np.ndarray], dict]

    def boxes(self, ram) -> dict:
        """Boxes of one RAM snapshot, clipped to the screen; empty boxes dropped."""
        ram = np.asarray(ram)
        if ram.shape != (128,):
            raise ValueError(f"{self.game}: RAM must be the 128 bytes of ale.getRAM(), got shape {ram.shape}")
        out = {}
        for c, boxes in self.detect(ram.astype(np.int64)).items():
            kept = []
            for x, y, w, h in boxes:
                x0, y0 = max(int(x), 0), max(int(y), 0)
                x1, y1 = min(int(x + w), SCREEN_W), min(int(y + h), SCREEN_H)
                if x1 > x0 and y1 > y0:
                    kept.append((x0, y0, x1 - x0, y1 - y0))
            out[c] = kept[: self.max_objects[c]]
        return out


def wrap_x(x, y, w, h):
    """A box that runs off the right edge of the screen, split into the part that wraps to the left."""
    x = int(x) % SCREEN_W
    if x + w <= SCREEN_W:
        return [(x, y, w, h)]
    return [(x, y, SCREEN_W - x, h), (0, y, x + w - SCREEN_W, h)]
