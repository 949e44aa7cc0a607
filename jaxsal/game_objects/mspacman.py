"""Ms. Pac-Man: Ms. Pac-Man herself, the ghosts, the bonus fruit and the power pills.

RAM (OCAtari `ocatari/ram/mspacman.py`): every sprite's box is (ram[xa] - 13, ram[ya] + 1, 9, 10)
with (xa, ya) = (10, 16) for the player, (6 + i, 12 + i) for ghost i (ghosts are on screen
when ram[47] > 0; ghost i > 0 only when ram[19] >= i), (11, 17) for the fruit (when both are
non-zero). Power pills: bits 2..5 of ram[117], fixed 4x7 boxes in the maze's corners.
"""
from jaxsal.game_objects.table import RamTable

_PILLS = ((4, 148, 146), (8, 148, 14), (16, 8, 147), (32, 8, 15))   # (bit, x, y)


def _sprite(ram, xa, ya):
    return (ram[xa] - 13, ram[ya] + 1, 9, 10)


def detect(ram):
    ghosts = []
    if ram[47] > 0:
        ghosts = [_sprite(ram, 6 + i, 12 + i) for i in range(4) if i == 0 or ram[19] >= i]
    fruit = [_sprite(ram, 11, 17)] if ram[11] > 0 and ram[17] > 0 else []
    pills = [(x, y, 4, 7) for bit, x, y in _PILLS if ram[117] & bit]
    return {"player": [_sprite(ram, 10, 16)], "ghost": ghosts, "fruit": fruit, "power_pill": pills}


TABLE = RamTable("mspacman", ("player", "ghost", "fruit", "power_pill"),
                 {"player": 1, "ghost": 4, "fruit": 1, "power_pill": 4}, detect)
