"""PNG image grids for the generative-model experiments."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np


def pyplot():
    """matplotlib's pyplot on the file-only Agg backend (imported on use)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path: str, **savefig_kwargs) -> str:
    """Write `fig` to `path` (creating its folder), close it, return `path`."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, **{"dpi": 100, **savefig_kwargs})
    pyplot().close(fig)
    return path


def save_grid(path: str, rows: Sequence[np.ndarray], shape: tuple[int, int],
              row_titles: Sequence[str] | None = None, title: str | None = None) -> str:
    """Save `rows` (each an array `(n, h·w)` of values in [0, 1]) as one grid of
    grey images, one row per entry; returns `path`."""
    plt = pyplot()

    rows = [np.asarray(r).reshape(len(r), *shape) for r in rows]
    n = max(len(r) for r in rows)
    fig, axes = plt.subplots(len(rows), n, figsize=(0.6 * n + 1.2, 0.6 * len(rows) + 0.4),
                             squeeze=False)
    for i, row in enumerate(rows):
        for j in range(n):
            ax = axes[i, j]
            ax.set_xticks([])
            ax.set_yticks([])
            if j < len(row):
                ax.imshow(row[j], cmap="gray_r", vmin=0.0, vmax=1.0)
            else:
                ax.axis("off")
        if row_titles:
            axes[i, 0].set_ylabel(row_titles[i], rotation=0, ha="right", va="center", fontsize=8)
    if title:
        fig.suptitle(title, fontsize=9)
    return save_figure(fig, path, bbox_inches="tight")


def save_curves(path: str, x: Sequence[float], series: dict[str, Sequence[float]],
                xlabel: str = "epoch", ylabel: str = "nats per image") -> str:
    """Save line plots of `series` (name → values over `x`) on one axis; returns `path`."""
    plt = pyplot()

    fig, ax = plt.subplots(figsize=(5, 3.2))
    for name, ys in series.items():
        ax.plot(x, ys, label=name)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
