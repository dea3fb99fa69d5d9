"""PNG figures people expect from a training run (matplotlib, imported on use), and
the moving average that makes a noisy per-step objective curve readable."""

from __future__ import annotations

import os
from typing import Mapping, Sequence

import numpy as np


def _pyplot():
    try:
        import matplotlib  # noqa: PLC0415
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("saving figures needs matplotlib: pip install matplotlib") from err
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    return plt


def moving_average(values: Sequence[float] | np.ndarray, window: int = 50) -> np.ndarray:
    """The trailing mean of the last `window` values at each step (of fewer at the
    start, so the result is as long as `values`): a readable curve of the noisy
    per-step objective estimates in `gv.fit(...).history["objective"]`.

    Args:
        values: the per-step values.
        window: the number of trailing values averaged.

    Returns:
        a numpy array as long as `values`.

    Example:
        >>> import genvi as gv
        >>> gv.moving_average([1.0, 3.0, 5.0, 7.0], window=2).tolist()
        [1.0, 2.0, 4.0, 6.0]
    """
    if window < 1:
        raise ValueError(f"moving_average: window must be at least 1, got {window}")
    values = np.asarray(values, np.float64)
    sums = np.cumsum(np.insert(values, 0, 0.0))
    steps = np.arange(1, len(values) + 1)
    counts = np.minimum(steps, window)
    return (sums[1:] - sums[steps - counts]) / counts


def plot_history(history: Mapping, path: str, title: str = "objective", smooth: int = 50) -> str:
    """Save the per-step objective (and held-out evaluations, if any) as a PNG.

    Args:
        history: a `FitResult.history`.
        path: where to save the PNG.
        title: the plot's title.
        smooth: the moving average's window.

    Returns:
        `path`.

    Example:
        >>> import genvi as gv, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "curve.png")
        >>> gv.plot_history({"objective": np.linspace(-3, -1, 200)}, path).endswith(".png")
        True
    """
    plt = _pyplot()
    values = np.asarray(history["objective"], np.float64)
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.plot(values, lw=0.6, alpha=0.35, label="estimate")
    if values.size >= smooth > 1:
        kernel = np.ones(smooth) / smooth
        ax.plot(np.arange(smooth - 1, values.size), np.convolve(values, kernel, "valid"),
                lw=1.5, label=f"mean of {smooth}")
    if len(history.get("eval", ())):
        ax.plot(history["eval_step"], history["eval"], "o-", label="held out")
    ax.set_xlabel("step"), ax.set_ylabel("objective"), ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
