"""Emulator interventions (jaxsal_agents.interventions) on Breakout, Pong (and Space Invaders' cannon),
with ale-py's ROMs:
a replay without an edit gives the recorded stack bit for bit; a moved ball sits at old + delta in
every stacked frame with no other pixel changed; paddles the game writes back are flagged
"undone", balls pushed into bricks or out of the field "impossible", never kept. Known answers: an
agent that reads the ball's pixels changes its output when the ball moves and one that reads the
score does not; its gradient map, and the ball's box indicator, follow the ball in every kept
state. A few dozen emulator steps per test: seconds."""
import dataclasses

import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("ale_py")

import jaxsal  # noqa: E402
from jaxsal_agents.ale import make_ale  # noqa: E402
from jaxsal_agents.interventions import STATUSES, displace, measure, record, replay  # noqa: E402
from jaxsal.game_objects import table  # noqa: E402


@pytest.fixture(scope="module")
def moments():
    return {g: record(g, 60, seed=3) for g in ("breakout", "pong")}


@pytest.mark.parametrize("game", ["breakout", "pong"])
def test_a_replay_without_an_edit_gives_the_recorded_stack(moments, game):
    ms = moments[game]
    assert len(ms) > 20
    ale = make_ale(game, seed=99)          # another emulator: the state carries everything
    acts = list(ale.getMinimalActionSet())
    for m in ms[::5]:
        r = replay(ale, m, acts)
        assert np.array_equal(r.obs, m.obs) and np.array_equal(r.rams, m.rams) and not r.ended


def _grow(mask, d=1):
    """(N, H, W) bool dilated by d px."""
    out = mask.copy()
    for dy in range(-d, d + 1):
        for dx in range(-d, d + 1):
            out |= np.roll(np.roll(mask, dy, 1), dx, 2)
    return out


@pytest.mark.parametrize("game,delta", [("breakout", (12, 0)), ("breakout", (0, -16)), ("pong", (-20, 0))])
def test_a_moved_ball_is_at_old_plus_delta_and_nothing_else_changed(moments, game, delta):
    res = displace(moments[game], "ball", *delta)
    ok = res.status == "ok"
    assert ok.sum() >= 5 and np.array_equal(res.kept, ok)
    assert set(res.status) <= set(STATUSES)
    for i in np.where(ok)[0]:
        it = res.items[i]
        assert np.array_equal(it.achieved, it.expected) and not it.others_changed and it.stray_pixels == 0
    ci = res.boxes.classes.index("ball")
    old = np.asarray(res.base_boxes.masks(frame="union"))[:, ci]
    new = np.asarray(res.boxes.masks(frame="union"))[:, ci]
    diff = (res.obs != res.base_obs).any(-1)
    assert diff[ok].any(axis=(1, 2)).all()                             # every kept stack changed...
    assert not (diff & ~_grow(old | new))[ok].any()                    # ...only at the ball's two places
    assert (old != new)[ok].any(axis=(1, 2)).all()
    assert np.array_equal(res.obs[~res.kept & np.isin(res.status, ["impossible", "absent"])],
                          res.base_obs[~res.kept & np.isin(res.status, ["impossible", "absent"])])


@pytest.mark.parametrize("game,obj,delta", [("breakout", "paddle", (20, 0)), ("pong", "player", (0, 20)),
                                            ("pong", "enemy", (0, -20))])
def test_paddles_the_game_writes_back_are_flagged_undone(moments, game, obj, delta):
    res = displace(moments[game], obj, *delta)
    tried = ~np.isin(res.status, ["impossible", "absent"])           # a paddle at the wall cannot move
    assert tried.sum() >= 10 and (res.status[tried] == "undone").mean() > 0.8
    assert set(res.status) <= {"undone", "diverged", "impossible", "absent"} and not res.kept.any()
    for i in np.where(res.status == "undone")[0]:
        it = res.items[i]
        assert not np.array_equal(it.achieved[-1, -1], it.expected[-1, -1])


def _drawn(game, obj, rams):
    """(F, 2) bool: the table gives `obj` a box in each pooled raw frame of rams (F, 2, 128)."""
    tab = table(game)
    return np.array([[bool(tab.boxes(r)[obj]) for r in frame] for frame in rams])


def _check_missing_objects_are_not_kept(game, moments, res):
    """A move is kept only with the object in every raw frame of both stacks: missing from the original
    stack is `absent`, missing from the moved one only is `not_drawn` (or a status decided before).
    Returns the moments of each kind."""
    gone, vanished = [], []
    for i, (m, it) in enumerate(zip(moments, res.items)):
        if not _drawn(game, res.obj, m.rams).all():
            assert it.status in ("absent", "ended"), (i, it.status, it.detail)
            gone.append(i)
        elif it.rams is not None and not _drawn(game, res.obj, it.rams).all():
            assert it.status in ("not_drawn", "diverged", "undone", "ended"), (i, it.status, it.detail)
            vanished.append(i)
    assert not res.kept[gone + vanished].any()
    return gone, vanished


def test_a_ball_missing_from_the_original_stack_is_absent_not_ok():
    ms = record("pong", 62, seed=3)[50:]           # the agent misses at step 58: the ball is cleared for the serve
    ale = make_ale("pong")
    cleared = []                                     # on screen at the edit, in no stacked frame of the original
    for i, m in enumerate(ms):
        ale.restoreState(m.state)
        if table("pong").boxes(ale.getRAM())["ball"] and not _drawn("pong", "ball", m.rams).any():
            cleared.append(i)
    res = displace(ms, "ball", -8, 0)
    assert cleared and list(res.status[cleared]) == ["absent"] * len(cleared), res.status[cleared]
    assert np.array_equal(res.obs[cleared], res.base_obs[cleared])   # the move changed nothing on screen
    assert "original stack" in res.items[cleared[0]].detail
    gone, _ = _check_missing_objects_are_not_kept("pong", ms, res)
    assert set(cleared) < set(gone)


def test_a_ball_moved_below_the_paddle_where_the_table_draws_none_is_not_drawn(moments):
    res = displace(moments["breakout"], "ball", 0, 8)
    _, vanished = _check_missing_objects_are_not_kept("breakout", moments["breakout"], res)
    nd = [i for i in vanished if res.status[i] == "not_drawn"]
    assert nd and all("draws no ball" in res.items[i].detail for i in nd)
    for i in nd:                                     # the RAM moved as asked; the moved ball left the drawn rows
        it = res.items[i]
        assert np.array_equal(it.achieved, it.expected) and (it.rams[..., 101].astype(int) + 9 > 196).any()


def test_space_invaders_cannon_moves_and_its_shot_and_the_aliens_shots_react():
    res = displace(record("spaceinvaders", 70, seed=1)[35:], "player", 20, 0)   # the cannon shows after ~30 steps
    moved = np.isin(res.status, ["ok", "side_effects"])
    assert moved.sum() >= 5 and set(res.status) <= set(STATUSES)
    for i in np.where(moved)[0]:
        it = res.items[i]
        assert np.array_equal(it.achieved, it.expected) and set(it.others_changed) <= {"player_shot", "alien_shot"}
    assert any("player_shot" in it.others_changed for it in res.items)   # the shot rides on the cannon
    assert not res.kept[res.status == "side_effects"].any()


def test_balls_into_bricks_or_out_of_the_field_are_impossible(moments):
    ms = moments["breakout"]
    ale = make_ale("breakout")
    ys = []
    for m in ms:
        ale.restoreState(m.state)
        ys.append(int(ale.getRAM()[101]) + 9)
    res = displace(ms, "ball", 0, 70 - np.array(ys))                 # every ball to row 70: the bricks
    present = res.status != "absent"
    assert present.sum() > 10 and (res.status[present] == "impossible").all() and not res.kept.any()
    assert all("overlaps bricks" in it.detail for it, p in zip(res.items, present) if p)
    off = displace(ms, "ball", -150, 0)
    assert set(off.status) <= {"impossible", "absent"} and not off.kept.any()
    with pytest.raises(ValueError, match="movable objects"):
        displace(ms, "bricks", 4, 0)
    with pytest.raises(ValueError, match="has no y position"):
        displace(ms, "paddle", 0, 4)
    with pytest.raises(ValueError, match="unknown statuses"):
        displace(ms, "ball", 4, 0, keep=("fine",))


BAND = (38, 4, 74, 80)      # obs rows between Breakout's bricks and paddle, inside the walls
SCORE = (0, 0, 8, 84)       # the score and the top wall


def _band_agent(region):
    """Q_0 = sum over `region` of (pixel / 255)^2 x a ramp over columns: changes with the x of what is
    there, and its gradient is 0 on black pixels (the map sits on the ball); Q_1 = a constant."""
    y0, x0, y1, x1 = region
    ramp = jnp.arange(x0, x1, dtype=jnp.float32)[None, None, :, None] / 84.0

    def apply_fn(params, obs):
        v = jnp.asarray(obs, jnp.float32)[:, y0:y1, x0:x1] / 255.0
        q0 = (v * v * ramp).sum((1, 2, 3)) * params
        return jnp.stack([q0, jnp.full_like(q0, -1.0)], -1)
    return apply_fn


def test_an_agent_that_reads_the_ball_sees_its_move_and_one_that_ignores_it_does_not(moments):
    res = displace(moments["breakout"], "ball", 12, 0)
    ci = res.boxes.classes.index("ball")
    y0, x0, y1, x1 = BAND
    def inside(ob):                                                    # no ball pixel outside the band's rows
        return ~np.asarray(ob.masks(frame="union"))[:, ci][:, np.r_[0:y0, y1:84]].any((1, 2))
    k = res.kept & inside(res.base_boxes) & inside(res.boxes)          # the ball in the band in both stacks
    assert k.sum() >= 3
    reads, blind = _band_agent(BAND), _band_agent(SCORE)
    sub = dataclasses.replace(res, kept=k)
    out = measure(reads, jnp.float32(1.0), sub, ["gradient"])        # effects, and maps of both stacks in one call
    assert out["states"] == k.sum()
    assert (np.asarray(out["effects"].effect) < -0.05).all()          # moved right: the ramp gives more
    fol = out["follows"]["gradient"]                                   # 0 on black: the map sits on the ball
    assert fol.valid.all() and fol.rate() == 1.0 and (fol.moved_on_new > fol.chance_new).all()
    out = measure(blind, jnp.float32(1.0), sub, ["gradient"])
    assert np.all(np.asarray(out["effects"].effect) == 0) and not np.asarray(out["effects"].flips).any()
    assert out["follows"]["gradient"].rate() == 0.0

    box = lambda b: np.asarray(b.masks(frame="union"))[:, ci].astype(np.float32)   # noqa: E731
    fol = jaxsal.metrics.map_follows(box(res.base_boxes[k]), box(res.boxes[k]), res.base_boxes[k], res.boxes[k],
                                     "ball")
    assert fol.valid.all() and fol.rate() == 1.0
    with pytest.raises(ValueError, match="no kept moves"):
        measure(reads, jnp.float32(1.0), dataclasses.replace(res, kept=np.zeros_like(k)))


def test_boxes_that_only_touch_do_not_overlap():
    """(x, y, w, h) boxes are half-open: sharing an edge is no overlap (a ball moved flush against a brick is
    possible), one shared pixel is."""
    from jaxsal_agents.interventions import _overlaps

    ball = (10, 20, 2, 4)                        # columns 10..11, rows 20..23
    for other, hit in [((12, 20, 8, 6), False), ((2, 20, 8, 6), False), ((10, 24, 8, 6), False),
                       ((6, 14, 8, 6), False), ((11, 20, 8, 6), True), ((4, 23, 7, 6), True), ((0, 0, 3, 3), False)]:
        assert _overlaps(ball, [other]) == hit, other
    assert _overlaps(ball, [(12, 20, 8, 6), (11, 23, 1, 1)]) and not _overlaps(ball, [])
