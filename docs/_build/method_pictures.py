"""Draw every method's picture, the methods gallery and the README's hero picture from committed frames.

Reads the states saved by `docs/_build/method_frames.py` (`docs/images/data/method_frames.npz`: the
shipped Breakout and MsPacman agents, three states of one greedy game each), explains each with every
registered method at its defaults through the shipped agents (the greedy action), and writes

- `docs/images/methods/<method>.png`: the method's maps on all six states,
- `docs/images/methods/gallery_<agent>.png`: every method side by side on one state of each agent,
- `docs/images/hero.png`: the README's picture, both agents with the demo's four methods.

Each map has its own scale and colour bar, its ends at the map's 0.5th and 99.5th percentiles (a single
extreme pixel does not wash out the rest). The map's value of no effect (see `scale`) is drawn clear; above
it the map goes from red to yellow, below it from blue to cyan, more opaque the further from it, over the
newest of the state's four stacked frames, dimmed. Needs no game emulator; a few minutes on two CPU cores.

    python docs/_build/method_pictures.py                    # the committed pictures
    python docs/_build/method_pictures.py --tiny --out DIR   # all of them into DIR, cheaply (tests)
"""
from __future__ import annotations

import argparse
import inspect
import io
import re
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FRAMES = ROOT / "docs" / "images" / "data" / "method_frames.npz"
OUT = ROOT / "docs" / "images" / "methods"
HERO = ROOT / "docs" / "images" / "hero.png"
HERO_METHODS = ("gradcam", "gradient", "guided_backprop", "occlusion")  # what `jaxsal demo` shows
GALLERY_STATE = 1  # the gallery shows each agent's middle state
TITLES = {"breakout": "Breakout", "mspacman": "MsPacman"}
ACTIONS = {"breakout": ("NOOP", "FIRE", "RIGHT", "LEFT"),  # the games' minimal action sets, in ALE's order
           "mspacman": ("NOOP", "UP", "RIGHT", "LEFT", "DOWN", "UPRIGHT", "UPLEFT", "DOWNRIGHT", "DOWNLEFT")}
# cheap stand-ins for the costly options, for a test that only checks what is written (--tiny)
TINY = {"smoothgrad": {"n_samples": 2}, "integrated_gradients": {"steps": 2}, "rise": {"n_masks": 8},
        "lime": {"n_samples": 16}, "occlusion": {"patch": 12, "stride": 12},
        "noise_sensitivity": {"stride": 12}, "sarfa": {"stride": 12}}
DPI = 100
RAMP_UP = np.array([[0.85, 0.1, 0.1], [1.0, 0.95, 0.3]])  # above the map's base: red, to yellow at its end
RAMP_DOWN = np.array([[0.1, 0.3, 1.0], [0.45, 1.0, 1.0]])  # below: blue, to cyan
ALPHA, GAMMA = 0.95, 0.75  # opacity at the scale's end, and how fast it grows
BAR_BACKGROUND = 0.15  # the grey the colour bars are drawn over, about a dimmed frame's
FRAME_MAX = 400  # the frame drawn at up to 255/400 of white, so that the maps stand out


def method_title(method: str, with_key: bool = True) -> str:
    """The method's name as its page spells it (its first heading), with its registry name, or only that."""
    page = ROOT / "docs" / "methods" / f"{method}.md"
    heading = page.read_text().split("\n", 1)[0].lstrip("# ").strip() if page.is_file() else ""
    if not heading or heading == method:
        return method
    return f"{heading} ({method})" if with_key else heading


def state_title(name: str, d: dict, j: int) -> str:
    """'Breakout, step 180: RIGHT': the game, the play step and the explained (greedy) action."""
    actions, a = ACTIONS.get(name, ()), int(d["actions"][j])
    return f"{TITLES.get(name, name)}, step {d['steps'][j]}: {actions[a] if a < len(actions) else f'action {a}'}"


def compute_maps(frames, methods, options=None):
    """{agent: {"obs", "steps", "actions", "maps": {method: (k, 84, 84)}}} at each method's defaults
    (plus `options[method]`), the target being the greedy action's Q-value."""
    import jax
    import jaxsal
    import jaxsal_agents

    options = options or {}
    out = {}
    for name in [str(n) for n in frames["agents"]]:
        agent = jaxsal_agents.load(name)
        obs = np.asarray(frames[f"{name}_obs"])
        q = np.asarray(agent.apply_fn(agent.params, obs))
        maps = {}
        for m in methods:
            kw = dict(options.get(m, {}))
            if "key" in inspect.signature(jaxsal.METHODS[m]).parameters:
                kw["key"] = jax.random.PRNGKey(0)
            t = time.perf_counter()
            maps[m] = np.asarray(jaxsal.explain(agent.apply_fn, agent.params, obs, method=m, **kw), np.float32)
            print(f"{name:9s} {m:21s} {time.perf_counter() - t:5.1f} s", flush=True)
        out[name] = {"obs": obs, "steps": np.asarray(frames[f"{name}_steps"]), "actions": q.argmax(-1),
                     "maps": maps}
    return out


def scale(m, sequential=False):
    """(vmin, base, vmax) of one map, its ends at the 0.5th/99.5th percentiles, `base` its value of no
    effect, drawn clear: its low end for a `sequential` map (a CAM: evidence from its weakest to its
    strongest); 0 where the map takes both signs; its median where that lies well inside its range (an
    offset map, such as occlusion's 1 - Q_a(x'), whose median is a patch that changes nothing); else the
    end its median is nearest to."""
    lo, hi = (float(v) for v in np.percentile(m, [0.5, 99.5]))
    if sequential and hi > lo:
        return lo, lo, hi
    if lo < 0 < hi:
        s = float(np.percentile(np.abs(m), 99.5)) or 1.0
        return -s, 0.0, s
    if hi <= lo:
        return lo, lo, lo + (abs(lo) or 1.0) * 1e-6
    c = float(np.median(m))
    if min(c - lo, hi - c) > 0.2 * (hi - lo):
        s = float(np.percentile(np.abs(m - c), 99.5))
        return c - s, c, c + s
    return (lo, lo, hi) if c - lo <= hi - c else (lo, hi, hi)


def overlay(m, vmin, base, vmax):
    """RGBA of a map: red to yellow above `base`, blue to cyan below, more opaque the further from it."""
    m = np.asarray(m, np.float64) - base
    up = m / (vmax - base) if vmax > base else np.zeros_like(m)  # a sequential scale has one side only
    down = m / (base - vmin) if base > vmin else np.zeros_like(m)
    v = np.clip(np.where(m >= 0, up, down), -1, 1)[..., None]
    a = np.abs(v)
    rgb = np.where(v >= 0, (1 - a) * RAMP_UP[0] + a * RAMP_UP[1], (1 - a) * RAMP_DOWN[0] + a * RAMP_DOWN[1])
    return np.clip(np.concatenate([rgb, ALPHA * a ** GAMMA], -1), 0, 1)


def _labels(ticks):
    """Tick labels with the fewest significant digits that tell the ticks apart."""
    for digits in range(2, 7):
        labels = [f"{t:.{digits}g}" for t in ticks]
        if len(set(labels)) == len(labels):
            return labels
    return labels


def draw_map(fig, ax, frame, m, fontsize=8, sequential=False):
    """The frame in grey, dimmed, and the map over it on its own scale, with a colour bar below that shows
    the map's colours as they look over a dark frame."""
    import matplotlib as mpl

    vmin, base, vmax = scale(m, sequential)
    ax.imshow(frame, cmap="gray", vmin=0, vmax=FRAME_MAX, interpolation="nearest")
    ax.imshow(overlay(m, vmin, base, vmax), interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    rgba = overlay(np.linspace(vmin, vmax, 256), vmin, base, vmax)
    colours = rgba[:, :3] * rgba[:, 3:] + BAR_BACKGROUND * (1 - rgba[:, 3:])
    bar = fig.colorbar(mpl.cm.ScalarMappable(mpl.colors.Normalize(vmin, vmax), mpl.colors.ListedColormap(colours)),
                       ax=ax, orientation="horizontal", fraction=0.07, pad=0.03, aspect=14)
    ticks = sorted({vmin, base, vmax})
    bar.set_ticks(ticks, labels=_labels(ticks))
    bar.ax.tick_params(labelsize=fontsize, length=2, pad=1)
    bar.outline.set_linewidth(0.5)


def save_png(fig, path: Path):
    """Save at DPI with a palette of 256 colours (a third of the size, no visible loss)."""
    import matplotlib.pyplot as plt
    from PIL import Image

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI)
    plt.close(fig)
    buf.seek(0)
    img = Image.open(buf).convert("RGB").quantize(256, method=Image.Quantize.MEDIANCUT)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, optimize=True)


def is_cam(method: str) -> bool:
    """Whether the method is a CAM (it taps a layer, `layer=`): its maps are drawn on a sequential scale."""
    import jaxsal

    return "layer" in inspect.signature(jaxsal.METHODS[method]).parameters


def _frame(ax, frame, title, fontsize):
    """The state's newest frame as the agent sees it, for reference next to the maps."""
    ax.imshow(frame, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=fontsize)


def method_figure(method, data):
    """One row per agent, one column per state."""
    import matplotlib.pyplot as plt

    agents = list(data)
    k = len(data[agents[0]]["obs"])
    fig, axes = plt.subplots(len(agents), k, figsize=(2.45 * k, 2.95 * len(agents)), squeeze=False,
                             layout="constrained")
    for row, name in zip(axes, agents):
        d = data[name]
        for j, ax in enumerate(row):
            draw_map(fig, ax, d["obs"][j, ..., -1], d["maps"][method][j], fontsize=8, sequential=is_cam(method))
            ax.set_title(state_title(name, d, j), fontsize=9)
    fig.suptitle(method_title(method), fontsize=12, fontweight="bold")
    return fig


def gallery_figure(methods, name, d, state=GALLERY_STATE, columns=5):
    """The state's frame, then every method on it, `columns` to a row."""
    import matplotlib.pyplot as plt

    rows = -(-(len(methods) + 1) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(1.65 * columns, 2.0 * rows), squeeze=False,
                             layout="constrained")
    frame = d["obs"][state, ..., -1]
    _frame(axes.flat[0], frame, "the frame", 8)
    for ax, m in zip(axes.flat[1:], methods):
        draw_map(fig, ax, frame, d["maps"][m][state], fontsize=7, sequential=is_cam(m))
        ax.set_title(m, fontsize=8)
    for ax in axes.flat[len(methods) + 1:]:
        ax.axis("off")
    fig.suptitle(f"Every method on {state_title(name, d, state)}", fontsize=10, fontweight="bold")
    return fig


def hero_figure(data, methods=HERO_METHODS, state=GALLERY_STATE):
    """One row per agent, on one state: its frame, then each method's map."""
    import matplotlib.pyplot as plt

    cols = 1 + len(methods)
    fig, axes = plt.subplots(len(data), cols, figsize=(1.65 * cols, 2.05 * len(data)), squeeze=False,
                             layout="constrained")
    for row, (name, d) in zip(axes, data.items()):
        frame = d["obs"][state, ..., -1]
        _frame(row[0], frame, state_title(name, d, state).replace(", step", "\nstep"), 8)
        for ax, m in zip(row[1:], methods):
            draw_map(fig, ax, frame, d["maps"][m][state], fontsize=7, sequential=is_cam(m))
            ax.set_title(method_title(m, with_key=False), fontsize=9)
    return fig


def ordered(methods):
    """The methods in the order the methods overview lists them (by family), any others after them."""
    index = (ROOT / "docs" / "methods" / "index.md")
    listed = re.findall(r"^\| \[`(\w+)`\]", index.read_text(), re.M) if index.is_file() else []
    rank = {m: i for i, m in enumerate(listed)}
    return sorted(methods, key=lambda m: (rank.get(m, len(rank)), m))


def main(argv=None):
    import matplotlib

    matplotlib.use("Agg")
    import jaxsal

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=Path, default=FRAMES)
    p.add_argument("--out", type=Path, help="write every picture into this folder instead")
    p.add_argument("--tiny", action="store_true", help="cheap settings for the costly methods (tests)")
    args = p.parse_args(argv)
    methods = ordered(jaxsal.methods())
    with np.load(args.frames) as f:
        frames = {k: f[k] for k in f.files}
    data = compute_maps(frames, methods, TINY if args.tiny else None)
    out = args.out or OUT
    for m in methods:
        save_png(method_figure(m, data), out / f"{m}.png")
    for name, d in data.items():
        save_png(gallery_figure(methods, name, d), out / f"gallery_{name}.png")
    hero = out / HERO.name if args.out else HERO
    save_png(hero_figure(data, [m for m in HERO_METHODS if m in methods]), hero)
    print(f"wrote {len(methods)} method pictures, {len(data)} galleries and {hero}")

if __name__ == "__main__":
    main()
