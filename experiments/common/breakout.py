"""Breakout's geometry on 84x84 frames, shared by the studies that look at where Breakout maps fall
(Paper A's claims, the frame-stack study's secondary analyses)."""
from __future__ import annotations

import numpy as np

BRICKS_END_ROW = 38            # 84x84 Breakout: bricks end above this row (rows 23-37)
WALL_COLS = 5                  # side walls: columns 0-4 and 79-83 (84x84 frames)


def ball_paddle_rows(obs) -> np.ndarray:
    """(N, H) bool: rows of 84x84 Breakout stacks below the bricks where the newest frame has a
    lit pixel between the walls (the ball and the paddle), widened by one row each side."""
    f = np.asarray(obs)[..., -1]
    lit = (f[:, BRICKS_END_ROW:, WALL_COLS:f.shape[2] - WALL_COLS] > 0).any(-1)
    rows = np.zeros(f.shape[:2], bool)
    rows[:, BRICKS_END_ROW:] = lit
    return rows | np.roll(rows, 1, 1) | np.roll(rows, -1, 1)
