"""Small display helpers shared by the tutorial notebooks in `notebooks/`: a
markdown table for results and a moving average for noisy objective curves."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], digits: int = 3):
    """`rows` under `headers` as a markdown table that a notebook renders (an
    `IPython.display.Markdown`); floats are shown with `digits` decimals.

    Example:
        >>> from experiments.common.tutorial import markdown_table
        >>> print(markdown_table(["objective", "value"], [["ELBO", -8.0812]], digits=2).data)
        | objective | value |
        |---|---|
        | ELBO | -8.08 |
    """
    from IPython.display import Markdown

    def cell(value: Any) -> str:
        if isinstance(value, (float, np.floating)) or (
                isinstance(value, np.ndarray) and value.ndim == 0):
            return f"{float(value):.{digits}f}"
        return str(value).replace("|", "\\|")

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return Markdown("\n".join(lines))


def moving_average(values: Sequence[float], window: int = 50) -> np.ndarray:
    """The trailing mean of the last `window` values at each step (shorter at the
    start), for plotting per-step objective estimates.

    Example:
        >>> from experiments.common.tutorial import moving_average
        >>> moving_average([1.0, 3.0, 5.0, 7.0], window=2).tolist()
        [1.0, 2.0, 4.0, 6.0]
    """
    values = np.asarray(values, np.float64)
    sums = np.cumsum(np.insert(values, 0, 0.0))
    counts = np.minimum(np.arange(1, len(values) + 1), window)
    return (sums[1:] - sums[np.arange(1, len(values) + 1) - counts]) / counts
