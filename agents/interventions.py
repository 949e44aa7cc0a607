"""Emulator interventions: move a game object by writing the RAM, and re-simulate the frame stack.

    moments = record("breakout", steps=200, policy=greedy(agent))   # states whose F frames can be replayed
    res = displace(moments, "ball", dx=12)                          # Interventions: obs, boxes, status per moment
    res.obs[res.kept], res.base_obs[res.kept]                       # stacks before/after, only clean moves
    out = measure(agent.apply_fn, agent.params, res, ["gradient", "gradcam"])   # Q change; do maps follow?

A pixel removal changes what a state means (Breakout without a ball is the state before a serve);
moving the object through the emulator keeps a state of the game and asks whether the agent uses
the object's position (Atrey et al. 2020). A `Moment` holds the emulator state before the step that
made the oldest stacked frame, and the F actions of the stack. `displace` restores that state,
adds (dx, dy) screen pixels to the object's RAM position, replays the same actions with the
agent's preprocessing (frame skip 4, the last two raw frames max-pooled, INTER_AREA to 84x84, as
`jaxsal_agents.ale.AleAtariEnv`) and checks what the game made of the edit: every intervention
gets a status (STATUSES), and only "ok" ones are `kept` unless the caller says otherwise.
"""
from __future__ import annotations

import dataclasses
import time

import numpy as np

from .ale import AleAtariEnv, make_ale
from .area_resize import resize_area
from .envs import check_game
from .errors import AgentInputError

SKIP = 4          # raw frames per agent step (EnvPool)
POOLED = 2        # the last POOLED raw frames of a step are max-pooled
MARGIN = 1        # px around the moved object's boxes its own pixels may reach (Pong's ball: a row off its box)

# RAM bytes of an object's screen position; one unit is one screen pixel in every table here
MOVABLE = {
    "breakout": {"ball": {"x": 99, "y": 101}, "paddle": {"x": 72}},
    "pong": {"ball": {"x": 49, "y": 54}, "player": {"y": 51}, "enemy": {"y": 50}},
    "spaceinvaders": {"player": {"x": 28}},
}
# where a moved object's box may lie, (x0, y0, x1, y1) half-open raw-screen pixels: inside the walls
FIELD = {"breakout": (8, 32, 152, 196), "pong": (0, 34, 160, 194), "spaceinvaders": (0, 20, 160, 195)}

STATUSES = {
    "ok": "the object sits at its old place + (dx, dy) in every replayed raw frame, its pixels moved with "
          "it, and nothing else on screen changed",
    "side_effects": "the object moved as asked, but other objects or pixels changed too (e.g. Pong's "
                    "opponent follows the ball): the effect is not the object's alone",
    "diverged": "the game changed the object's course within the stack (a bounce, a collision): its "
                "place is neither the old one nor old + (dx, dy)",
    "undone": "the game wrote the object back: in the newest frame it is where it was without the edit",
    "not_drawn": "the RAM moved but the object is not drawn at its new place in some replayed raw frame: "
                 "the table gives it no box there, or no pixel of its new box changed (the game does not draw "
                 "from that byte)",
    "impossible": "the moved box leaves the playfield, overlaps another object, or the RAM byte overflows",
    "ended": "a life was lost or the game ended within the replayed steps",
    "absent": "the object is not on screen when the edit is made, or missing from some replayed raw frame "
              "of the original stack: there is no old place to move it from",
    "not_reproducible": "replaying the moment without an edit does not give its recorded stack",
}


@dataclasses.dataclass
class Moment:
    """What re-simulating one observation takes: `state` (ale_py.ALEState) before the step that made
    the oldest stacked frame, the F agent `actions` of the stack, and the recorded `obs` (84, 84, F)
    uint8 and `rams` (F, 2, 128) (the RAM after each pooled raw frame)."""
    game: str
    state: object
    actions: np.ndarray
    obs: np.ndarray
    rams: np.ndarray
    lives: int


def greedy(agent):
    """A policy obs (84, 84, F) uint8 -> action: the agent's argmax Q."""
    import jax
    import jax.numpy as jnp

    fn = jax.jit(agent.apply_fn)

    def policy(obs):
        out = fn(agent.params, jnp.asarray(obs)[None])
        return int(jnp.argmax(out["q"] if isinstance(out, dict) else out, -1)[0])
    return policy


def record(game: str, steps: int, policy=None, seed: int = 0, noops: int | None = None,
           frame_stack: int = 4) -> list[Moment]:
    """Play one env of `AleAtariEnv` for `steps` steps with `policy` (obs -> action; default uniform
    random) and keep every observation made of F plain steps (none of them a reset) as a Moment."""
    env = AleAtariEnv(game, 1, train=False, seed=seed, frame_stack=frame_stack)
    ale = env.emulators()[0]
    rng = np.random.default_rng(seed)
    obs = env.reset(noops)[0]
    history, out = [], []
    for _ in range(int(steps)):
        a = int(rng.integers(env.num_actions)) if policy is None else int(policy(obs))
        plain = not env.resets_next()[0]
        state, lives = ale.cloneState(), ale.lives()
        obs = env.step([a])[0][0]
        history = history + [(state, a, lives)] if plain else []
        history = history[-frame_stack:]
        if len(history) == frame_stack and not env.resets_next()[0]:
            out.append(Moment(env.game, history[0][0], np.array([h[1] for h in history], np.int32),
                              obs.copy(), env.rams()[0].copy(), history[0][2]))
    return out


@dataclasses.dataclass
class Replay:
    """One re-simulated stack: obs (84, 84, F) uint8, rams (F, 2, 128), the raw screens
    (F, 2, 210, 160) pooled into it, and whether a life was lost or the game ended."""
    obs: np.ndarray
    rams: np.ndarray
    screens: np.ndarray
    ended: bool


def replay(ale, moment: Moment, actions, writes: dict | None = None) -> Replay:
    """Restore the moment's state, write `writes` {byte: value} into the RAM, play its F actions with
    the agent's preprocessing. `actions`: the minimal action set (AleAtariEnv.ale_actions())."""
    ale.restoreState(moment.state)
    for i, v in (writes or {}).items():
        ale.setRAM(int(i), int(v))
    f = len(moment.actions)
    h, w = ale.getScreenDims()
    screens = np.zeros((f, POOLED, h, w), np.uint8)
    rams = np.zeros((f, POOLED, 128), np.uint8)
    obs = np.zeros((84, 84, f), np.uint8)
    ended = False
    for j, a in enumerate(moment.actions):
        for k in range(SKIP):
            if ale.game_over():
                ended = True
                break
            ale.act(actions[int(a)])
            if k >= SKIP - POOLED:
                screens[j, k - (SKIP - POOLED)] = ale.getScreenGrayscale()
                rams[j, k - (SKIP - POOLED)] = ale.getRAM()
        obs[..., j] = resize_area(np.maximum(screens[j, 0], screens[j, 1]))
    ended = ended or ale.game_over() or ale.lives() < moment.lives
    return Replay(obs, rams, screens, ended)


def _box_mask(boxes, h, w, grow: int = 0):
    m = np.zeros((h, w), bool)
    for x, y, bw, bh in boxes:
        m[max(y - grow, 0):y + bh + grow, max(x - grow, 0):x + bw + grow] = True
    return m


def _frames_without(tab, rams, obj: str) -> list:
    """Stacked frames j of `rams` (F, POOLED, 128) in one of whose pooled raw frames `tab` draws no `obj`."""
    return [j for j in range(rams.shape[0]) if any(not tab.boxes(r)[obj] for r in rams[j])]


def _overlaps(box, others) -> bool:
    x, y, w, h = box
    return any(x < ox + ow and ox < x + w and y < oy + oh and oy < y + h for ox, oy, ow, oh in others)


@dataclasses.dataclass
class Intervention:
    """One displacement: `status` (a key of STATUSES) and `detail` (why, in words); the intervened
    `obs` (84, 84, F) and `rams` (F, 2, 128) (None when it was not simulated: impossible, absent,
    not reproducible, or a life lost even without the edit); `expected` / `achieved` (F, 2, A): the
    object's RAM position per pooled raw frame, asked (old + delta) and after the replay;
    `others_changed`: classes whose boxes moved too; `stray_pixels`: changed screen pixels outside
    the object's old and new boxes (grown by MARGIN px) and outside the boxes of every class in
    `others_changed`; `seconds`: the emulator time spent."""
    status: str
    detail: str
    obs: np.ndarray | None
    rams: np.ndarray | None
    expected: np.ndarray | None = None
    achieved: np.ndarray | None = None
    others_changed: tuple = ()
    stray_pixels: int = 0
    seconds: float = 0.0


def _check_object(game: str, obj: str, dx: int, dy: int) -> dict:
    if game not in MOVABLE:
        raise AgentInputError(f"no RAM interventions for {game!r}; games with them: {sorted(MOVABLE)}")
    if obj not in MOVABLE[game]:
        raise AgentInputError(f"{game}: cannot move {obj!r}; movable objects: {sorted(MOVABLE[game])}")
    axes = MOVABLE[game][obj]
    for name, d in (("x", dx), ("y", dy)):
        if d and name not in axes:
            raise AgentInputError(f"{game}: {obj} has no {name} position in RAM (moves along {sorted(axes)}); "
                             f"pass d{name}=0")
    if not any((dx, dy)):
        raise AgentInputError("a displacement needs dx or dy (screen pixels) other than 0")
    return axes


def intervene(ale, moment: Moment, obj: str, dx: int = 0, dy: int = 0, actions=None) -> Intervention:
    """Move `obj` by (dx, dy) raw-screen pixels at the moment's first step and re-simulate its stack
    (module doc); `ale`: an emulator of the moment's game (make_ale), `actions`: its minimal action set."""
    from jaxsal.game_objects import table

    t0 = time.perf_counter()
    game = moment.game
    axes = _check_object(game, obj, dx, dy)
    tab = table(game)
    actions = list(ale.getMinimalActionSet()) if actions is None else actions
    delta = {"x": int(dx), "y": int(dy)}
    idx = [axes[a] for a in sorted(axes)]

    def done(status, detail, **kw):
        return Intervention(status, detail, seconds=time.perf_counter() - t0, **kw)

    base = replay(ale, moment, actions)
    if not np.array_equal(base.obs, moment.obs) or not np.array_equal(base.rams, moment.rams):
        return done("not_reproducible", "the replay without an edit differs from the recorded stack", obs=None,
                    rams=None)
    if base.ended:
        return done("ended", "a life is lost within the stack's steps even without the edit", obs=None, rams=None)
    ale.restoreState(moment.state)
    ram0 = ale.getRAM().astype(np.int64)
    now = tab.boxes(ram0)
    if not now[obj]:
        return done("absent", f"no {obj} on screen at the edit", obs=None, rams=None)
    gone = _frames_without(tab, base.rams, obj)
    if gone:
        return done("absent", f"no {obj} on screen in stacked frame {gone[0]} of the original stack", obs=None,
                    rams=None)
    writes = {axes[a]: ram0[axes[a]] + delta[a] for a in axes}
    bad = [f"byte {i} would be {v}" for i, v in writes.items() if not 0 <= v <= 255]
    if bad:
        return done("impossible", "RAM overflow: " + ", ".join(bad), obs=None, rams=None)
    x, y, w, h = now[obj][0]
    moved = (x + dx, y + dy, w, h)
    fx0, fy0, fx1, fy1 = FIELD[game]
    if not (fx0 <= moved[0] and moved[0] + w <= fx1 and fy0 <= moved[1] and moved[1] + h <= fy1):
        return done("impossible", f"the moved {obj} box {moved} leaves the playfield {FIELD[game]}", obs=None,
                    rams=None)
    hit = [c for c, bs in now.items() if c != obj and _overlaps(moved, bs)]
    if hit:
        return done("impossible", f"the moved {obj} box {moved} overlaps {', '.join(hit)}", obs=None, rams=None)

    new = replay(ale, moment, actions, writes)
    expected = base.rams[..., idx].astype(np.int64) + np.array([delta[a] for a in sorted(axes)])
    achieved = new.rams[..., idx].astype(np.int64)
    kw = {"obs": new.obs, "rams": new.rams, "expected": expected, "achieved": achieved}
    if new.ended:
        return done("ended", "a life is lost or the game ends within the replayed steps after the edit", **kw)
    if np.array_equal(achieved[-1, -1], base.rams[-1, -1, idx]):
        return done("undone", f"the game wrote {obj}'s RAM position back by the newest frame", **kw)
    if not np.array_equal(expected, achieved):
        j = int(np.argwhere((expected != achieved).any(-1))[0][0])
        return done("diverged", f"{obj} leaves old + delta from stacked frame {j} on (the game changed its course)",
                    **kw)
    unboxed = _frames_without(tab, new.rams, obj)
    others, stray, unchanged = set(), 0, []
    sh, sw = base.screens.shape[-2:]
    for j in range(base.screens.shape[0]):
        for r in range(POOLED):
            b0, b1 = tab.boxes(base.rams[j, r]), tab.boxes(new.rams[j, r])
            changed = [c for c in b0 if c != obj and b0[c] != b1[c]]
            others.update(changed)
            allowed = (_box_mask(b0[obj] + b1[obj], sh, sw, MARGIN)
                       | _box_mask([b for c in changed for b in b0[c] + b1[c]], sh, sw))
            diff = base.screens[j, r] != new.screens[j, r]
            stray += int((diff & ~allowed).sum())
            fresh = _box_mask(b1[obj], sh, sw) & ~_box_mask(b0[obj], sh, sw)
            if fresh.any() and not (diff & fresh).any():
                unchanged.append(j)
    kw.update(others_changed=tuple(sorted(others)), stray_pixels=stray)
    if unboxed:
        return done("not_drawn", f"{obj}'s RAM moved but the table draws no {obj} in moved stacked frame "
                    f"{unboxed[0]}", **kw)
    if unchanged:
        return done("not_drawn", f"{obj}'s RAM moved but no screen pixel changed at its new place (stacked frame "
                    f"{unchanged[0]})", **kw)
    if others or stray:
        what = ", ".join(sorted(others)) + (f"; {stray} other pixels" if stray else "")
        return done("side_effects", f"{obj} moved, and so did: {what.strip('; ')}", **kw)
    return done("ok", f"{obj} moved by ({dx}, {dy}) in every frame; nothing else changed", **kw)


@dataclasses.dataclass
class Interventions:
    """Displacements of one object in N moments: `base_obs` / `obs` (N, 84, 84, F) uint8 (obs is the
    recorded stack where nothing was simulated), `base_boxes` / `boxes` (jaxsal.game_objects.ObjectBoxes of
    N states), `status` (N,) str, `items` (the Intervention of each) and `kept` (N,) bool: the status
    is in `keep`."""
    game: str
    obj: str
    base_obs: np.ndarray
    obs: np.ndarray
    base_boxes: object
    boxes: object
    status: np.ndarray
    items: list
    kept: np.ndarray

    def counts(self) -> dict:
        """{status: how many} over the moments."""
        s, n = np.unique(self.status, return_counts=True)
        return {str(k): int(v) for k, v in zip(s, n)}


def displace(moments, obj: str, dx: int = 0, dy: int = 0, keep=("ok",)) -> Interventions:
    """`intervene` on each moment (one game) with the same (dx, dy) (or per-moment arrays (N,)), one
    emulator for all; `keep`: the statuses counted as usable (`kept`)."""
    from jaxsal.game_objects import boxes_from_ram

    moments = list(moments)
    if not moments:
        raise AgentInputError("no moments to intervene on: record() found no stack of plain steps")
    games = {m.game for m in moments}
    if len(games) != 1:
        raise AgentInputError(f"moments of several games {sorted(games)}: displace one game at a time")
    game = check_game(moments[0].game)
    bad = [k for k in keep if k not in STATUSES]
    if bad:
        raise AgentInputError(f"unknown statuses {bad} in keep; statuses: {list(STATUSES)}")
    n = len(moments)
    dxs, dys = np.broadcast_to(np.asarray(dx, int), (n,)), np.broadcast_to(np.asarray(dy, int), (n,))
    _check_object(game, obj, int(np.abs(dxs).max()), int(np.abs(dys).max()))
    ale = make_ale(game)
    actions = list(ale.getMinimalActionSet())
    items = [intervene(ale, m, obj, int(a), int(b), actions) for m, a, b in zip(moments, dxs, dys)]
    base_obs = np.stack([m.obs for m in moments])
    obs = np.stack([it.obs if it.obs is not None else m.obs for it, m in zip(items, moments)])
    base_rams = np.stack([m.rams for m in moments])
    rams = np.stack([it.rams if it.rams is not None else m.rams for it, m in zip(items, moments)])
    status = np.array([it.status for it in items])
    return Interventions(game, obj, base_obs, obs, boxes_from_ram(game, base_rams), boxes_from_ram(game, rams),
                         status, items, np.isin(status, list(keep)))


def measure(apply_fn, params, res: Interventions, methods=("gradient",), target="q_chosen", share: str = "absolute",
            batch_size: int | None = None, **options) -> dict:
    """On the kept moves of `res`: the output change (jaxsal.metrics.displacement_effects) and, per
    jaxsal method, whether its map follows the object (jaxsal.metrics.map_follows). The maps of the
    original and the moved stacks come from one batched jaxsal.explain call (2N stacks) and explain
    the same action, the one chosen in the original stack. Returns {"effects", "follows": {method:
    MapFollows}, "states"}; `options` go to jaxsal.explain."""
    import jaxsal

    k = np.asarray(res.kept, bool)
    if not k.any():
        raise AgentInputError(f"no kept moves to measure (statuses: {res.counts()}); widen keep= in displace or "
                         "record more steps")
    x, xm = res.base_obs[k], res.obs[k]
    eff = jaxsal.metrics.displacement_effects(apply_fn, params, x, xm, target=target)
    acts = np.asarray(eff.actions)
    given = np.concatenate([acts, acts]) if jaxsal.targets.explains_action(target) else None
    methods = [methods] if isinstance(methods, str) else list(methods)
    maps = jaxsal.explain(apply_fn, params, np.concatenate([x, xm]), method=methods, target=target, actions=given,
                          batch_size=batch_size, **options)
    n = len(x)
    follows = {m: jaxsal.metrics.map_follows(v[:n], v[n:], res.base_boxes[k], res.boxes[k], res.obj, share)
               for m, v in maps.items()}
    return {"effects": eff, "follows": follows, "states": n}


__all__ = ["FIELD", "MOVABLE", "Moment", "Intervention", "Interventions", "Replay", "STATUSES", "displace",
           "greedy", "intervene", "measure", "record", "replay"]
