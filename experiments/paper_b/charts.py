"""Charts of the Paper B reproduction, drawn from its CSV outputs (so `--replot` redraws them).

- sanity.png: Adebayo et al. / Paper B style: similarity to the original map (y) along the
  randomisation cascade (x: none, then up to q, fc1, conv3, conv2, conv1), one line per method
  with its 95 % block-bootstrap band, one panel per metric (rows) and method family (columns);
  the random-map baselines as a grey band (min..max over the family's methods).
- insertion.png / deletion.png: mean curve over states per method, one panel per setting (rows:
  substrate x score) and method family (columns), the random-map curve dashed in every panel.
"""
from __future__ import annotations

import numpy as np

METRIC_TITLES = {"spearman": "Spearman rank corr.", "ssim_flat": "SSIM, flattened (Paper B)",
                 "ssim": "SSIM, 2-D 7x7 (variant)", "hog": "HOG Pearson"}


def _plt():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _colors(n):
    plt = _plt()
    cmap = plt.get_cmap("tab10")
    return [cmap(i % 10) for i in range(n)]


def sanity_chart(path, rows, families: dict, layers, metrics, title):
    """rows: sanity.csv dicts (method, randomised, metric, mean, low, high)."""
    plt = _plt()
    stat = {(r["method"], r["randomised"], r["metric"]): (float(r["mean"]), float(r["low"]), float(r["high"]))
            for r in rows}
    present = {r["method"] for r in rows}
    fams = {f: [m for m in ms if m in present] for f, ms in families.items()}
    fams = {f: ms for f, ms in fams.items() if ms}
    xs = ["none"] + list(layers)
    fig, axes = plt.subplots(len(metrics), len(fams), figsize=(4.6 * len(fams), 2.7 * len(metrics)),
                             sharex=True, sharey=True, squeeze=False)
    for j, (fam, methods) in enumerate(fams.items()):
        for i, metric in enumerate(metrics):
            ax = axes[i, j]
            base = [stat[m, b, metric][0] for m in methods for b in ("random_uniform", "random_gaussian")
                    if (m, b, metric) in stat]
            if base:
                ax.axhspan(min(base), max(base), color="0.85", zorder=0,
                           label="random-map baselines" if (i, j) == (0, 0) else None)
            for m, c in zip(methods, _colors(len(methods))):
                v = np.array([(1.0, 1.0, 1.0)] + [stat.get((m, g, metric), (np.nan,) * 3) for g in layers])
                ax.plot(range(len(xs)), v[:, 0], "-o", color=c, ms=3, lw=1.4, label=m if i == 0 else None)
                ax.fill_between(range(len(xs)), v[:, 1], v[:, 2], color=c, alpha=0.15, lw=0)
            ax.set_ylim(-0.05, 1.05)
            ax.grid(alpha=0.3)
            if j == 0:
                ax.set_ylabel(METRIC_TITLES.get(metric, metric))
            if i == 0:
                ax.set_title(fam)
            if i == len(metrics) - 1:
                ax.set_xticks(range(len(xs)))
                ax.set_xticklabels(xs, rotation=0)
                ax.set_xlabel("randomised from the top down to")
        axes[0, j].legend(fontsize=7, loc="lower left", framealpha=0.8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def curve_chart(path, rows, families: dict, settings, mode: str, title):
    """rows: curves.csv dicts (mode, substrate, score, method, step, mean) -> one chart per mode."""
    plt = _plt()
    curves = {}
    for r in rows:
        if r["mode"] == mode:
            curves.setdefault((r["method"], r["substrate"], r["score"]), []).append(
                (int(r["step"]), float(r["mean"])))
    curves = {k: np.array([v for _, v in sorted(c)]) for k, c in curves.items()}
    present = {k[0] for k in curves}
    fams = {f: [m for m in ms if m in present] for f, ms in families.items()}
    fams = {f: ms for f, ms in fams.items() if ms}
    fig, axes = plt.subplots(len(settings), len(fams), figsize=(4.6 * len(fams), 2.6 * len(settings)),
                             sharex=True, squeeze=False)
    for i, (sub, score) in enumerate(settings):
        for j, (fam, methods) in enumerate(fams.items()):
            ax = axes[i, j]
            for m, c in zip(methods, _colors(len(methods))):
                y = curves.get((m, sub, score))
                if y is not None:
                    ax.plot(y, color=c, lw=1.3, label=f"{m} (AUC {y.mean():.2f})")
            y = curves.get(("random", sub, score))
            if y is not None:
                ax.plot(y, "k--", lw=1.2, label=f"random map (AUC {y.mean():.2f})")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=6, loc="best", framealpha=0.7)
            if i == 0:
                ax.set_title(fam)
            if j == 0:
                ax.set_ylabel(f"{sub} substrate\n" + ("Q_a(x_t)/Q_a(x)" if score == "q_value"
                                                      else "Q_a - mean_b Q_b"), fontsize=8)
            if i == len(settings) - 1:
                ax.set_xlabel(f"{mode} step (84 px each)")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def maps_figure(path, obs, maps, title):
    """State 0 and every method's map of it."""
    plt = _plt()
    names = list(maps)
    cols = 6
    nrows = int(np.ceil((len(names) + 1) / cols))
    fig, axes = plt.subplots(nrows, cols, figsize=(2.2 * cols, 2.3 * nrows))
    axes = np.atleast_1d(axes).ravel()
    axes[0].imshow(np.asarray(obs[0, :, :, -1]), cmap="gray")
    axes[0].set_title("state (last frame)", fontsize=8)
    for ax, n in zip(axes[1:], names):
        ax.imshow(np.asarray(maps[n][0]), cmap="inferno")
        ax.set_title(n, fontsize=8)
    for ax in axes:
        ax.axis("off")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
