"""AIR's figures: accuracy and ELBO against steps and wall-clock (the paper's Fig. 7),
and reconstructions with the inferred boxes drawn.

Example:
    >>> from genvi_experiments.air.figures import box_corners
    >>> import numpy as np
    >>> box_corners(np.array([2.0, 0.0, 0.0]), 50)   # centred, half the canvas wide
    (12.5, 12.5, 25.0)
"""

from __future__ import annotations

import jax
import numpy as np

from genvi_experiments.common.figures import pyplot, save_figure


def save_training_curves(path: str, logs: dict[str, list[dict]]) -> str:
    """2×2 panels: count accuracy and held-out ELBO against steps and seconds."""
    fig, axes = pyplot().subplots(2, 2, figsize=(10, 7))
    for name, log in logs.items():
        steps = [r["step"] for r in log]
        secs = [r["seconds"] for r in log]
        for col, x in enumerate((steps, secs)):
            axes[0, col].plot(x, [r["accuracy"] for r in log], label=name)
            axes[1, col].plot(x, [r["elbo"] for r in log], label=name)
    for col, xlabel in enumerate(("training step", "training seconds (compile excluded)")):
        axes[0, col].set_ylabel("count accuracy (held out)")
        axes[1, col].set_ylabel("ELBO per canvas (held out)")
        for row in range(2):
            axes[row, col].set_xlabel(xlabel)
            axes[row, col].grid(alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)


def box_corners(z_where: np.ndarray, canvas: int) -> tuple[float, float, float]:
    """(left, top, side) in pixels of the canvas region a window with `z_where`
    covers: side 1/s of the canvas, centred at (−x/s, −y/s) in [-1, 1] coordinates."""
    s, x, y = (float(v) for v in z_where)
    side = canvas / s
    cx, cy = (-x / s + 1) / 2 * canvas, (-y / s + 1) / 2 * canvas
    return cx - side / 2, cy - side / 2, side


def save_reconstructions(path: str, model, guide, params: dict, images: np.ndarray,
                         key: jax.Array) -> str:
    """Top row: canvases with the inferred boxes; bottom row: the model's canvas
    rendered from the guide's latents."""
    plt = pyplot()
    n = len(images)
    fig, axes = plt.subplots(2, n, figsize=(1.4 * n, 3), squeeze=False)
    colours = ["tab:red", "tab:green", "tab:blue", "tab:orange"]
    keys = jax.random.split(key, n)
    for i, (image, k) in enumerate(zip(images, keys)):
        trace = guide.simulate(k, params, image)
        _, canvas = model.assess(trace.choices, params, image)
        pres = np.asarray(trace.choices["steps", "z_pres"])
        wheres = np.asarray(trace.choices["steps", "z_where"])
        for row, picture in enumerate((image, np.asarray(canvas))):
            ax = axes[row, i]
            ax.imshow(np.clip(picture, 0, 1), cmap="gray_r", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            for t in np.flatnonzero(pres):
                left, top, side = box_corners(wheres[t], image.shape[0])
                ax.add_patch(plt.Rectangle((left - 0.5, top - 0.5), side, side, fill=False,
                                           color=colours[t % len(colours)], linewidth=1.2))
        axes[0, i].set_title(f"{int(pres.sum())} found", fontsize=8)
    axes[0, 0].set_ylabel("data", fontsize=8)
    axes[1, 0].set_ylabel("model", fontsize=8)
    fig.tight_layout()
    return save_figure(fig, path)
