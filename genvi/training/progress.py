"""`gv.fit`'s progress bar: steps done, the running objective and the time left.

Example:
    >>> from genvi.training.progress import ProgressBar
    >>> bar = ProgressBar(100, enabled=False)   # quiet: no terminal, or CI set
    >>> bar.advance(10, -1.5); bar.close()
"""

from __future__ import annotations

import math
import os
import sys


class ProgressBar:
    """A rich progress bar with the running objective; silent when output is not a
    terminal or the CI variable is set.

    Example:
        >>> from genvi.training.progress import ProgressBar
        >>> ProgressBar(10, enabled=False).enabled
        False
    """

    def __init__(self, total: int, enabled: bool):
        self.enabled = enabled and sys.stdout.isatty() and not os.environ.get("CI")
        if self.enabled:
            from rich.progress import (BarColumn, Progress, TextColumn,  # noqa: PLC0415 - only on a terminal
                                       TimeRemainingColumn)
            self.progress = Progress(TextColumn("gv.fit"), BarColumn(),
                                     TextColumn("{task.completed}/{task.total}"),
                                     TextColumn("objective {task.fields[value]}"),
                                     TimeRemainingColumn())
            self.progress.start()
            self.task = self.progress.add_task("fit", total=total, value="…")

    def advance(self, n: int, value: float | None = None) -> None:
        """Move on `n` steps, showing `value` (the chunk's mean objective) if finite."""
        if self.enabled and n:
            shown = "…" if value is None or not math.isfinite(value) else f"{value:.4g}"
            self.progress.update(self.task, advance=n, value=shown)

    def close(self, note: str | None = None) -> None:
        """Stop the bar; `note` (e.g. why the fit stopped early) is printed under it."""
        if self.enabled:
            self.progress.stop()
            if note:
                print(f"gv.fit: {note}")
