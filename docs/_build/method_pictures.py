"""Draw every method's picture, the methods gallery and the README's hero picture from committed frames.

Reads the states saved by `docs/_build/method_frames.py` (`docs/images/data/method_frames.npz`: the
shipped Breakout and MsPacman agents, three states of one greedy game each), explains each with every
registered method at its defaults through the shipped agents, and writes

- `docs/images/methods/<method>.png`: the method's maps on all six states,
- `docs/images/methods/gallery_<agent>.png`: all methods side by side on one state of each agent,
- `experiments/results/demo/breakout_grid.png`: the hero, Breakout with the demo's four methods.

Each map has its own colour scale and colour bar: diverging (blue negative, red positive, centred on 0)
where the map takes both signs, sequential from its low to its high end otherwise; the ends are the
0.5th and 99.5th percentiles, so a single extreme pixel does not wash out the rest. The map is drawn
over the newest of the state's four stacked frames, more opaque where it is stronger. Needs no game
emulator; about two minutes on two CPU cores.

    python docs/_build/method_pictures.py               # the committed pictures
    python docs/_build/method_pictures.py --out DIR     # all of them into DIR (tests)
"""
from __future__ import annotations

import argparse
import inspect
import io
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
FRAMES = ROOT / "docs" / "images" / "data" / "method_frames.npz"
OUT = ROOT / "docs" / "images" / "methods"
HERO = ROOT / "experiments" / "results" / "demo" / "breakout_grid.png"
HERO_METHODS = ("gradcam", "gradient", "guided_backprop", "occlusion")  # what `jaxsal demo` shows
GALLERY_STATE = 1  # the gallery shows each agent's middle state
TITLES = {"breakout": "Breakout", "mspacman": "MsPacman"}
# cheap stand-ins for the costly options, for a test that only checks what is written (--tiny)
TINY = {"smoothgrad": {"n_samples": 2}, "integrated_gradients": {"steps": 2}, "rise": {"n_masks": 8},
        "lime": {"n_samples": 16}, "occlusion": {"patch": 12, "stride": 12},
        "noise_sensitivity": {"stride": 12}, "sarfa": {"stride": 12}}
DPI = 100


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


def scale(m):
    """(cmap name, vmin, vmax, signed) of one map: diverging about 0 where it takes both signs at its
    0.5th/99.5th percentiles, else sequential between them."""
    lo, hi = (float(v) for v in np.percentile(m, [0.5, 99.5]))
    if lo < 0 < hi:
        s = float(np.percentile(np.abs(m), 99.5)) or 1.0
        return "RdBu_r", -s, s, True
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0) * 1e-6
    return "inferno", lo, hi, False


def draw_map(fig, ax, frame, m, fontsize=7):
    """The frame in grey, dimmed, and the map over it on its own scale, with a colour bar below."""
    import matplotlib as mpl

    name, vmin, vmax, signed = scale(m)
    cmap = mpl.colormaps[name]
    norm = mpl.colors.Normalize(vmin, vmax)
    strength = np.abs(m) / vmax if signed else (m - vmin) / (vmax - vmin)
    rgba = cmap(norm(m))
    rgba[..., 3] = 0.9 * np.clip(strength, 0, 1) ** 0.5
    ax.imshow(frame, cmap="gray", vmin=0, vmax=400, interpolation="nearest")
    ax.imshow(rgba, interpolation="nearest")
    ax.set_xticks([])
    ax.set_yticks([])
    bar = fig.colorbar(mpl.cm.ScalarMappable(norm, cmap), ax=ax, orientation="horizontal",
                       fraction=0.07, pad=0.03, aspect=14)
    ticks = [vmin, 0.0, vmax] if signed else [vmin, vmax]
    bar.set_ticks(ticks, labels=[f"{t:.2g}" for t in ticks])
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
            draw_map(fig, ax, d["obs"][j, ..., -1], d["maps"][method][j], fontsize=8)
            ax.set_title(f"{TITLES.get(name, name)}, step {d['steps'][j]}, action {d['actions'][j]}", fontsize=9)
    fig.suptitle(method, fontsize=11, fontweight="bold")
    return fig


def gallery_figure(methods, d, state, title, columns=6):
    """Every method on one state, `columns` to a row."""
    import matplotlib.pyplot as plt

    rows = -(-len(methods) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(1.4 * columns, 1.78 * rows), squeeze=False,
                             layout="constrained")
    for ax, m in zip(axes.flat, methods):
        draw_map(fig, ax, d["obs"][state, ..., -1], d["maps"][m][state], fontsize=6.5)
        ax.set_title(m, fontsize=8)
    for ax in axes.flat[len(methods):]:
        ax.axis("off")
    fig.suptitle(title, fontsize=10)
    return fig


def hero_figure(d, methods=HERO_METHODS):
    """One row per state: the frame, then each method's map."""
    import matplotlib.pyplot as plt

    k = len(d["obs"])
    cols = 1 + len(methods)
    fig, axes = plt.subplots(k, cols, figsize=(1.62 * cols, 1.95 * k), squeeze=False, layout="constrained")
    for j, row in enumerate(axes):
        frame = d["obs"][j, ..., -1]
        row[0].imshow(frame, cmap="gray", vmin=0, vmax=255, interpolation="nearest")
        row[0].set_xticks([])
        row[0].set_yticks([])
        row[0].set_title(f"step {d['steps'][j]}, action {d['actions'][j]}", fontsize=8)
        for ax, m in zip(row[1:], methods):
            draw_map(fig, ax, frame, d["maps"][m][j], fontsize=7)
            ax.set_title(m, fontsize=8)
    return fig


def main(argv=None):
    import matplotlib

    matplotlib.use("Agg")
    import jaxsal

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", type=Path, default=FRAMES)
    p.add_argument("--out", type=Path, help="write every picture into this folder instead")
    p.add_argument("--tiny", action="store_true", help="cheap settings for the costly methods (tests)")
    args = p.parse_args(argv)
    methods = jaxsal.methods()
    with np.load(args.frames) as f:
        frames = {k: f[k] for k in f.files}
    data = compute_maps(frames, methods, TINY if args.tiny else None)
    out, hero = (args.out, args.out / HERO.name) if args.out else (OUT, HERO)
    for m in methods:
        save_png(method_figure(m, data), out / f"{m}.png")
    for name, d in data.items():
        title = f"{TITLES.get(name, name)}, step {d['steps'][GALLERY_STATE]}, action {d['actions'][GALLERY_STATE]}"
        save_png(gallery_figure(methods, d, GALLERY_STATE, title), out / f"gallery_{name}.png")
    save_png(hero_figure(data["breakout"]), hero)
    print(f"wrote {len(methods)} method pictures, {len(data)} galleries and {hero}")


if __name__ == "__main__":
    main()
