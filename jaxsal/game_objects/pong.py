"""Pong: the ball and the two paddles (our agent plays the right, green paddle).

RAM (OCAtari `ocatari/ram/pong.py`): ball x = ram[49] - 49, y = ram[54] - 14 (no ball when
ram[54] == 0 or ram[49] <= 49); enemy paddle top = ram[50] - 15 at x 16; player paddle top =
ram[51] - 13 at x 140. Paddles are 4x15 and are cut at the playfield's walls (rows 34..193).
"""
from jaxsal.game_objects.table import RamTable

FIELD_TOP, FIELD_BOTTOM = 34, 194


def _paddle(x, top):
    top, bottom = max(top, FIELD_TOP), min(top + 15, FIELD_BOTTOM)
    return [(x, top, 4, bottom - top)] if bottom > top else []


def detect(ram):
    ball = [(ram[49] - 49, ram[54] - 14, 2, 4)] if ram[54] != 0 and ram[49] > 49 else []
    return {"ball": ball, "player": _paddle(140, ram[51] - 13), "enemy": _paddle(16, ram[50] - 15)}


TABLE = RamTable("pong", ("ball", "player", "enemy"), {"ball": 1, "player": 1, "enemy": 1}, detect)
