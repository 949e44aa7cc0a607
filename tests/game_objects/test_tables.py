"""RAM tables against the rendered frames, and the ale-py player against EnvPool, per game."""
import numpy as np
import pytest

pytest.importorskip("ale_py")

from jaxsal_agents.ale import AleAtariEnv, ROM_NAMES   # noqa: E402
from jaxsal_agents.area_resize import resize_area      # noqa: E402
from jaxsal import game_objects                  # noqa: E402

GAMES = ["pong", "breakout", "mspacman", "spaceinvaders", "frostbite"]
ENVPOOL = {"pong": "Pong-v5", "breakout": "Breakout-v5", "mspacman": "MsPacman-v5",
           "spaceinvaders": "SpaceInvaders-v5", "frostbite": "Frostbite-v5"}
# classes that may be drawn on alternate frames only or blink (not every box shows pixels):
# Ms. Pac-Man's power pills blink for long stretches; everything else must be visible in the
# max-pooled frame pair nearly always (an object drawn off-screen or mid-explosion is rare)
BLINKING = {("mspacman", "power_pill")}


def _raw_play(game, frames=800, seed=1):
    import ale_py
    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)
    ale.setFloat("repeat_action_probability", 0.0)
    ale.loadROM(ale_py.roms.get_rom_path(ROM_NAMES[game]))
    acts = ale.getMinimalActionSet()
    ale.reset_game()
    rng = np.random.default_rng(seed)
    rams, screens, a = [], [], 0
    for t in range(frames):
        if t % 4 == 0:
            a = int(rng.integers(len(acts)))
        ale.act(acts[a])
        if ale.game_over():
            ale.reset_game()
        rams.append(ale.getRAM().copy())
        screens.append(ale.getScreenRGB().copy())
    return np.array(rams), np.array(screens)


def _shows_object(img, x, y, w, h):
    """True if the box holds a pixel unlike the most common colour of a 2-px ring around it."""
    y0, x0 = max(y - 2, 0), max(x - 2, 0)
    ring = np.ones(img.shape[:2], bool)
    ring[y:y + h, x:x + w] = False
    around = img[y0:y + h + 2, x0:x + w + 2][ring[y0:y + h + 2, x0:x + w + 2]]
    if not len(around):
        return True
    cols, counts = np.unique(around, axis=0, return_counts=True)
    return bool((img[y:y + h, x:x + w] != cols[counts.argmax()]).any())


@pytest.mark.parametrize("game", GAMES)
def test_boxes_hold_the_rendered_objects(game):
    table = game_objects.table(game)
    rams, screens = _raw_play(game)
    seen = {c: [] for c in table.classes}
    for t in range(8, len(rams) - 1, 2):       # boxes of a raw-frame pair vs its max-pooled screen
        img = np.maximum(screens[t], screens[t + 1])
        for ram in (rams[t], rams[t + 1]):
            for c, boxes in table.boxes(ram).items():
                seen[c] += [_shows_object(img, *b) for b in boxes]
    found = {c: v for c, v in seen.items() if v}
    assert len(found) >= 2, f"{game}: random play showed only {list(found)}"
    for c, v in found.items():
        need = 0.5 if (game, c) in BLINKING else 0.9
        assert np.mean(v) >= need, f"{game}/{c}: only {np.mean(v):.2f} of {len(v)} boxes show the object"


def test_breakout_bricks_match_the_screen_bit_by_bit():
    import ale_py
    from jaxsal.game_objects.breakout import bricks
    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)
    ale.loadROM(ale_py.roms.get_rom_path("breakout"))
    ale.reset_game()
    rng = np.random.default_rng(0)
    for _ in range(10):
        for a in range(36):        # random walls written into the playfield bytes
            ale.setRAM(a, int(rng.integers(256)))
        ale.act(ale_py.Action.NOOP)
        rgb, ram = ale.getScreenRGB(), ale.getRAM()
        shown = (rgb[60:96:6, 10:154:8] != rgb[100, 80]).any(-1)    # one pixel in each brick
        np.testing.assert_array_equal(shown, np.array(bricks(ram)))


@pytest.mark.parametrize("game", GAMES)
def test_player_frames_equal_envpool(game):
    envpool = pytest.importorskip("envpool")
    ep = envpool.make(ENVPOOL[game], env_type="gymnasium", num_envs=1, seed=0, episodic_life=True,
                      reward_clip=False, stack_num=4, noop_max=1, repeat_action_probability=0.0,
                      img_height=84, img_width=84, gray_scale=True, frame_skip=4, max_episode_steps=27000)
    ref, _ = ep.reset()
    env = AleAtariEnv(game, noop_max=1)
    obs = env.reset()
    np.testing.assert_array_equal(ref.transpose(0, 2, 3, 1), obs)
    rng = np.random.default_rng(0)
    dones = 0
    for t in range(250):
        a = rng.integers(env.num_actions, size=1)
        ref, r_ref, term, trunc, _ = ep.step(a.astype(np.int32))
        obs, r, done, _ = env.step(a)
        np.testing.assert_array_equal(ref.transpose(0, 2, 3, 1), obs, err_msg=f"{game} step {t}")
        np.testing.assert_array_equal(r, r_ref, err_msg=f"{game} step {t}: rewards (evaluation: unclipped)")
        dones += int(term[0] or trunc[0])
    rams = env.rams()
    assert rams.shape == (1, 4, 2, 128)
    ob = env.objects()
    assert ob.classes == game_objects.table(game).classes and ob.boxes.shape[:2] == (1, 4)


def test_resize_area_is_an_area_average():
    img = np.zeros((210, 160), np.uint8)
    img[:, :80] = 200
    out = resize_area(img)
    assert out.shape == (84, 84) and out[:, :41].min() == 200 and out[:, 43:].max() == 0
    with pytest.raises(ValueError, match="downsizes"):
        resize_area(np.zeros((50, 50), np.uint8))


def test_unknown_game_lists_the_tables():
    with pytest.raises(KeyError, match="pong"):
        game_objects.table("tetris")


# objects the game always shows, with their number: a table that loses one passes the tests above
ALWAYS = {"pong": {"player": 1, "enemy": 1}, "breakout": {"paddle": 1}, "spaceinvaders": {"player": 1},
          "mspacman": {"player": 1, "ghost": 4}}    # Ms. Pac-Man's four ghosts are all in the maze from the start


@pytest.mark.parametrize("game", sorted(ALWAYS))
def test_objects_the_game_always_shows_always_have_their_boxes(game):
    table = game_objects.table(game)
    rams, _ = _raw_play(game, frames=400)
    for t in range(60, len(rams)):
        boxes = table.boxes(rams[t])
        for c, n in ALWAYS[game].items():
            assert len(boxes[c]) == n, (game, c, t, boxes[c])


def test_a_table_clips_boxes_to_the_screen_and_drops_empty_ones():
    """(x, y, w, h) on the 160-wide, 210-high screen: parts beyond an edge are cut, boxes left empty dropped."""
    boxes = [(-3, 5, 10, 4), (155, 200, 10, 20), (160, 0, 4, 4), (10, 10, 0, 5), (20, 30, 2, 3), (5, -8, 3, 8)]
    t = game_objects.RamTable("fake", ("a",), {"a": 6}, lambda ram: {"a": boxes})
    assert t.boxes(np.zeros(128, np.uint8))["a"] == [(0, 5, 7, 4), (155, 200, 5, 10), (20, 30, 2, 3)]


def test_space_invaders_aliens_match_the_screen_for_random_formations():
    """Random alive-alien bytes written into the RAM: every box shows an alien, and every drawn pixel in the
    aliens' rows lies in a box (the shots' boxes aside)."""
    import ale_py
    ale = ale_py.ALEInterface()
    ale.setLoggerMode(ale_py.LoggerMode.Error)
    ale.loadROM(ale_py.roms.get_rom_path("space_invaders"))
    ale.reset_game()
    for _ in range(60):
        ale.act(ale_py.Action.NOOP)
    table, rng = game_objects.table("spaceinvaders"), np.random.default_rng(0)
    for _ in range(8):
        for byte in range(18, 24):
            ale.setRAM(byte, int(rng.integers(64)))
        ale.act(ale_py.Action.NOOP)
        rgb, boxes = ale.getScreenRGB(), table.boxes(ale.getRAM())
        drawn = (rgb != rgb[0, 0]).any(-1)
        drawn[:25], drawn[155:] = False, False                  # the score and mothership; shields and cannon
        boxed = np.zeros_like(drawn)
        for x, y, w, h in boxes["alien"]:
            assert drawn[y:y + h, x:x + w].any(), (x, y)
            boxed[y:y + h, x:x + w] = True
        for x, y, w, h in boxes["alien_shot"] + boxes["player_shot"]:
            boxed[max(y - 1, 0):y + h + 1, max(x - 1, 0):x + w + 1] = True
        assert 6 < len(boxes["alien"]) < 30 and not (drawn & ~boxed).any()


def test_resize_area_to_non_square_sizes_is_the_area_average():
    """Each output pixel is the mean of its source window, each source pixel weighted by its overlap
    (INTER_AREA's definition, in float64 here): exact for integer scales, within rounding otherwise."""
    img = np.random.default_rng(0).integers(0, 256, (210, 160)).astype(np.uint8)

    def weights(src, dst):
        scale, w = src / dst, np.zeros((dst, src))
        for d in range(dst):
            for s in range(src):
                w[d, s] = max(0.0, min(s + 1, (d + 1) * scale) - max(s, d * scale)) / scale
        return w

    for h, w in [(105, 40), (70, 32), (84, 60), (100, 84)]:
        got = resize_area(img, h, w)
        want = weights(210, h) @ img.astype(np.float64) @ weights(160, w).T
        assert got.shape == (h, w)
        if 210 % h == 0 and 160 % w == 0:
            np.testing.assert_array_equal(got, np.rint(want))
        else:                                                   # a rounding of the exact mean (float32 sums)
            assert np.abs(got - want).max() <= 0.5 + 1e-3


class _Noop:
    @staticmethod
    def apply(params, obs):
        return np.zeros((obs.shape[0], 4), np.float32)


def test_collect_objects_gives_each_state_the_boxes_of_its_own_frames():
    """Row i of the boxes is the objects of the Batch's state i (env-major, 2 envs): the same play stepped
    by hand, each state's boxes read from the RAM while it is the current observation."""
    from jaxsal_agents.ale import collect_objects
    from jaxsal_agents.zoo import Agent

    steps = 12
    agent = Agent("noop", _Noop(), None, {"game": "breakout", "num_actions": 4})
    batch, boxes = collect_objects(agent, steps, env=AleAtariEnv("breakout", 2, seed=5))
    env = AleAtariEnv("breakout", 2, seed=5)
    obs, masks = [env.reset()], [np.asarray(env.objects().masks())]
    for _ in range(steps - 1):
        obs.append(env.step([0, 0])[0])
        masks.append(np.asarray(env.objects().masks()))
    got = np.asarray(boxes.masks())
    assert len(boxes) == len(batch) == 2 * steps
    for e in range(2):
        for t in range(steps):
            np.testing.assert_array_equal(batch.obs[e * steps + t], obs[t][e])
            np.testing.assert_array_equal(got[e * steps + t], masks[t][e], err_msg=f"env {e} step {t}")
    moved = [not np.array_equal(masks[t][e], masks[t + 1][e]) for e in range(2) for t in range(steps - 1)]
    assert np.mean(moved) > 0.5 and not np.array_equal(masks[-1][0], masks[-1][1])   # the rows can be told apart


# the ball's colour on the raw RGB screen, and rows where nothing else has it (walls, bricks, paddles left out)
BALL = {"pong": ((236, 236, 236), (34, 194), (0, 160)), "breakout": ((200, 72, 72), (100, 186), (8, 152))}


@pytest.mark.parametrize("game", sorted(BALL))
def test_the_balls_box_is_its_drawn_pixels_bounding_box(game):
    """Pixel-exact, not just overlapping: in most frames the ball's box is the bounding box of its drawn
    pixels (Pong draws it a row higher in about a fifth of the frames: interventions.MARGIN)."""
    colour, (y0, y1), (x0, x1) = BALL[game]
    table = game_objects.table(game)
    rams, screens = _raw_play(game, frames=1500)
    exact = []
    for ram, img in zip(rams, screens):
        box = table.boxes(ram)["ball"]
        ys, xs = np.nonzero((img[y0:y1, x0:x1] == colour).all(-1))
        if box and len(ys) and y0 <= box[0][1] and box[0][1] + box[0][3] <= y1:
            drawn = (xs.min() + x0, ys.min() + y0, xs.max() - xs.min() + 1, ys.max() - ys.min() + 1)
            exact.append(drawn == box[0])
    assert len(exact) > 300 and np.mean(exact) > 0.7, (len(exact), np.mean(exact))
