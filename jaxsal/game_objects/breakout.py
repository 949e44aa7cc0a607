"""Breakout: the ball, the paddle and the remaining bricks.

RAM (OCAtari `ocatari/ram/breakout.py`): paddle x = ram[72] - 47 (16x4 at row 189); ball
x = ram[99] - 49, y = ram[101] + 9 (2x4; none when ram[101] == 0 or it is below row 196).
Bricks: 6 rows of 18 bricks (8x6 px, x = 8 + 8c, y = 57 + 6r). Each brick row is drawn from
six playfield bytes ram[i + 6j] (i = 5 - r, the bottom row first) that the game writes to the
TIA's playfield registers, j = 0..5 = PF2, PF1, PF0 of the right half, then PF2, PF1, PF0 of
the left half; a brick is two 4-px playfield bits. We decode them with the TIA's bit order
(PF0 bits 4-7, PF1 bits 7-0, PF2 bits 0-7, left to right) rather than OCAtari's string
slicing; tests check every brick against the rendered screen after random RAM writes.
Adjacent bricks of a row are merged into one box (at most 9 runs per row).
"""
from jaxsal.game_objects.table import RamTable

_BYTE_OF = {(0, "PF0"): 5, (0, "PF1"): 4, (0, "PF2"): 3, (1, "PF0"): 2, (1, "PF1"): 1, (1, "PF2"): 0}


def _pf_bit(p):
    """(j, bit) of playfield pixel p (0..39, 4 screen px each) in a row's six RAM bytes."""
    half, q = divmod(p, 20)
    if q < 4:
        return _BYTE_OF[half, "PF0"], 4 + q
    if q < 12:
        return _BYTE_OF[half, "PF1"], 7 - (q - 4)
    return _BYTE_OF[half, "PF2"], q - 12


BRICK_BITS = [_pf_bit(2 + 2 * c) for c in range(18)]   # first playfield pixel of brick c


def bricks(ram):
    """(6, 18) bools: which bricks are still there (row 0 = top)."""
    return [[bool(ram[(5 - r) + 6 * j] >> b & 1) for j, b in BRICK_BITS] for r in range(6)]


def detect(ram):
    runs = []
    for r, row in enumerate(bricks(ram)):
        c = 0
        while c < 18:
            if row[c]:
                start = c
                while c < 18 and row[c]:
                    c += 1
                runs.append((8 + 8 * start, 57 + 6 * r, 8 * (c - start), 6))
            c += 1
    ball = [(ram[99] - 49, ram[101] + 9, 2, 4)] if ram[101] != 0 and ram[101] + 9 <= 196 else []
    return {"ball": ball, "paddle": [(ram[72] - 47, 189, 16, 4)], "bricks": runs}


TABLE = RamTable("breakout", ("ball", "paddle", "bricks"), {"ball": 1, "paddle": 1, "bricks": 54}, detect)
