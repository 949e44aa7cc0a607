"""Frostbite: Frostbite Bailey, the ice floes, the hazards (birds, crabs, clams), the fish,
the igloo and the polar bear.

RAM (OCAtari `ocatari/ram/frostbite.py`): player (ram[102], ram[100] + 29), 8x18, sinking by
ram[107] (gone when ram[106] == 26 or ram[107] >= 18). Four floe rows i = 0..3 at y = 174 - 26 i,
7 px high, x from ram[31 + i]: three 24-px floes 32 px apart when ram[30] == 8, else six 16-px
floes that split apart by |ram[30] - 8|. Row i's creature: type ram[35 + i] (18/26 bird,
34-38 or 50-54 crab, 66-70 or 94-98 clam, 109-113 or 124-128 fish), at (ram[84 + i], 160 - 26 i)
while 0 < ram[84 + i] < 160 or ram[88 + i] != 0 (a second one 32 px to the right when
ram[88 + i] != 0), 8x7. Igloo: built to stage ram[77] (255 = none) at x 112. Bear at
(ram[104] + 3, 58), 14x16, unless ram[104] == 140. Floes and creatures wrap around the screen.
"""
from jaxsal.game_objects.table import RamTable, wrap_x

_IGLOO_Y = (51, 51, 51, 51, 47, 47, 47, 47, 42, 42, 42, 42, 39, 39, 35, 35)
_IGLOO_WH = ((8, 4), (16, 4), (24, 4), (32, 4)) + ((32, 8),) * 4 + ((32, 13),) * 4 + ((32, 16),) * 2 + ((32, 20),) * 2


def _creature_class(kind):
    if kind in (18, 26):
        return "hazard"     # bird
    if 33 < kind < 39 or 49 < kind < 55 or 65 < kind < 71 or 93 < kind < 99:
        return "hazard"     # crab, clam
    if 108 < kind < 114 or 123 < kind < 129:
        return "fish"
    return None


def _floes(ram, i):
    y, x = 174 - 26 * i, ram[31 + i]
    if ram[30] == 8:
        return [b for k in range(3) for b in wrap_x(x + 32 * k - 8, y, 24, 7)]
    space, out = abs(ram[30] - 8), []
    for k in range(6):
        shift = -8 - max(0, space - 4) if k % 2 == 0 else -16 + min(space, 4)
        out += wrap_x(x + 16 * k + shift, y, 16, 7)
    return out


def detect(ram):
    out = {c: [] for c in ("player", "floe", "hazard", "fish", "igloo", "bear")}
    if ram[106] != 26 and ram[107] < 18:
        sink = ram[107]
        out["player"].append((ram[102], ram[100] + 29 + sink, 8, 18 - sink))
    for i in range(4):
        out["floe"] += _floes(ram, i)
        cls = _creature_class(ram[35 + i])
        if cls and (0 < ram[84 + i] < 160 or ram[88 + i]):
            y = 160 - 26 * i
            out[cls] += wrap_x(ram[84 + i], y, 8, 7)
            if ram[88 + i]:
                out[cls] += wrap_x(ram[84 + i] + 32, y, 8, 7)
    if ram[77] != 255 and ram[77] < 16:
        w, h = _IGLOO_WH[ram[77]]
        out["igloo"].append((112, _IGLOO_Y[ram[77]], w, h))
    if ram[104] != 140:
        out["bear"].append((ram[104] + 3, 58, 14, 16))
    return out


TABLE = RamTable("frostbite", ("player", "floe", "hazard", "fish", "igloo", "bear"),
                 {"player": 1, "floe": 48, "hazard": 16, "fish": 16, "igloo": 1, "bear": 1}, detect)
