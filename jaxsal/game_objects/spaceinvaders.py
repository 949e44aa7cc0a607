"""Space Invaders: the player's cannon, the aliens, the shots, the shields and the mothership.

RAM (OCAtari `ocatari/ram/spaceinvaders.py`): cannon x = ram[28] - 1 (7x10 at row 185).
Aliens: a 6x6 formation whose left column sits at x = ram[26] - 1 and whose top row sits at
y = 31 + 2 ram[16]; alien (row i, column b) is alive when bit b of ram[23 - i] is set and is
drawn at (ram[26] - 1 + 16 b, 31 + 2 ram[16] + 18 i), 8x10 (OCAtari's bitmap with its empty
left columns, re-derived as a plain bit test). Shots are 1x10: the two alien bombs at
(ram[83 + k] - 2, 2 ram[81 + k] + 3), the cannon's shot at (ram[87] - 2, 2 ram[85] + 3),
shown while 20 < y < 195. Shields: three 8-px-wide bunkers at x = 42 + 32 s from row 157,
trimmed to their non-empty RAM rows (ram[43 + 9 s .. 51 + 9 s], 2 px each). Mothership: 7x8 at
(ram[30] - 1, 12) while 0 < ram[30] != 180.
"""
from jaxsal.game_objects.table import RamTable


def _shot(x, y):
    return [(x, y, 1, min(10, 195 - y))] if 20 < y < 195 else []


def _shield(ram, s):
    rows = [ram[43 + 9 * s + k] != 0 for k in range(9)]
    if not any(rows):
        return []
    first = rows.index(True)
    last = 8 - rows[::-1].index(True)
    return [(42 + 32 * s, 157 + 2 * first, 8, 2 * (last - first + 1))]


def detect(ram):
    x0, y0 = ram[26] - 1, 31 + 2 * ram[16]
    aliens = [(x0 + 16 * b, y0 + 18 * i, 8, 10) for i in range(6) for b in range(6) if ram[23 - i] >> b & 1]
    shots = _shot(ram[83] - 2, 2 * ram[81] + 3) + _shot(ram[84] - 2, 2 * ram[82] + 3)
    mother = [(ram[30] - 1, 12, 7, 8)] if ram[30] and ram[30] != 180 else []
    return {"player": [(ram[28] - 1, 185, 7, 10)], "alien": aliens, "alien_shot": shots,
            "player_shot": _shot(ram[87] - 2, 2 * ram[85] + 3),
            "shield": [b for s in range(3) for b in _shield(ram, s)], "mothership": mother}


TABLE = RamTable("spaceinvaders", ("player", "alien", "alien_shot", "player_shot", "shield", "mothership"),
                 {"player": 1, "alien": 36, "alien_shot": 2, "player_shot": 1, "shield": 3, "mothership": 1},
                 detect)
