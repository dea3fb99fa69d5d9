"""What `gv.compare_estimators` returns: `EstimatorComparison`, its table and plot,
and the family-wise z threshold that flags a biased or non-finite estimator.

Example:
    >>> from genvi.training.comparison import z_threshold
    >>> z_threshold(1)
    5.0
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from genvi.training.plots import _pyplot

Z_LEVEL = 5.0  # the |z| a single scalar must exceed to be flagged


def z_threshold(entries: int, level: float = Z_LEVEL) -> float:
    """The |z| above which a leaf with `entries` entries is flagged: the largest of
    `entries` independent standard-normal |z| exceeds it with the probability that
    one exceeds `level` (5σ, family-wise over the leaf).

    Example:
        >>> from genvi.training.comparison import z_threshold
        >>> z_threshold(1), round(z_threshold(10**6), 1)
        (5.0, 7.2)
    """
    if entries <= 1:
        return level
    tail = math.erfc(level / math.sqrt(2)) / entries
    lo, hi = level, 50.0
    for _ in range(80):  # bisection on the two-sided normal tail
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erfc(mid / math.sqrt(2)) > tail else (lo, mid)
    return hi


@dataclass(frozen=True)
class EstimatorComparison:
    """What `gv.compare_estimators` measured. Per estimator label and leaf name:

    * `mean[label][leaf]`, `stderr[label][leaf]`: per-entry mean gradient and its
      standard error (arrays shaped like the leaf);
    * `variance[label][leaf]`: the leaf's total variance (sum over its entries, the
      trace of the estimator's covariance);
    * `seconds[label]`: median seconds per gradient estimate;
    * `work_variance[label][leaf]`: variance × seconds (lower is better: the
      variance of the average of one second's worth of estimates, times 1 s²);
    * `max_z[label][leaf]`: the largest abs(z) of the mean over the leaf's entries,
      against `exact` when it was given, else against the other estimators (the
      lower median over the others, so an estimator is flagged only when it
      disagrees with more than half of them);
    * `biased[label][leaf]`: `max_z` above `threshold[leaf]` (see `z_threshold`).

    `print(result)` prints `result.table()`; `result.plot(path)` saves a figure.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.expectation
        ... def e(mu):
        ...     x = gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
        ...     return x * x
        >>> lab = gv.compare_estimators({"pathwise": e}, jax.random.key(0), 0.5, samples=2000,
        ...                             rounds=1, exact=1.0)
        >>> lab
        <EstimatorComparison of pathwise on 1 leaf (mu), 2000 samples, 0 flagged>
        >>> round(lab.variance["pathwise"]["mu"])   # Var[2 (mu + eps)] = 4
        4
    """

    labels: tuple[str, ...]
    leaves: tuple[str, ...]
    samples: int
    mean: dict
    stderr: dict
    variance: dict
    seconds: dict
    max_z: dict
    threshold: dict
    against: str  # "exact" or "others"
    exact: dict | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        n = len(self.leaves)
        shown = ", ".join(self.leaves[:4]) + (", ..." if n > 4 else "")
        return (f"<EstimatorComparison of {', '.join(self.labels)} on {n} "
                f"lea{'f' if n == 1 else 'ves'} ({shown}), {self.samples} samples, "
                f"{len(self.flagged)} flagged>")

    @property
    def work_variance(self) -> dict:
        return {a: {f: self.variance[a][f] * self.seconds[a] for f in self.leaves}
                for a in self.labels}

    @property
    def biased(self) -> dict:
        # a NaN (non-finite gradients) is flagged too
        return {a: {f: not self.max_z[a][f] <= self.threshold[f] for f in self.leaves}
                for a in self.labels}

    @property
    def flagged(self) -> list[tuple[str, str]]:
        """`(label, leaf)` pairs whose mean disagrees (see `biased`)."""
        return [(a, f) for a in self.labels for f in self.leaves if self.biased[a][f]]

    def _rows(self, leaves: Sequence[str] | None) -> tuple[list[str], list[str]]:
        shown = list(self.leaves if leaves is None else
                     [f for f in self.leaves if any(f.startswith(p) for p in leaves)])
        return shown + (["(all)"] if len(self.leaves) > 1 else []), list(self.leaves)

    def _total(self, label: str, names: list[str]) -> tuple[float, float, bool]:
        var = sum(self.variance[label][f] for f in names)
        ratio = max(self.max_z[label][f] / self.threshold[f] for f in names)
        return var, ratio, any(self.biased[label][f] for f in names)

    def table(self, leaves: Sequence[str] | None = None) -> str:
        """A markdown table, one row per (leaf, estimator); `leaves` keeps the leaves
        whose names start with one of the given prefixes. "relative" is the
        work-normalized variance over the smallest among estimators (1.00: the most
        efficient); "(all)" sums the variance over every measured leaf.

        Example: see `gv.compare_estimators`.
        """
        rows, names = self._rows(leaves)
        ref = "the exact gradient" if self.against == "exact" else "the other estimators"
        header = ("| leaf | estimator | mean ± s.e. | variance | time / estimate | "
                  "variance × time | relative | max abs z | bias? |")
        intro = (f"{self.samples} gradient estimates per estimator; means checked against "
                 f"{ref} (flagged: |z| > 5, family-wise over a leaf's entries).")
        lines = [intro, "", header, "|---|---|---|---|---|---|---|---|---|"]
        for row in rows:
            stats = {}
            for a in self.labels:
                if row == "(all)":
                    var, ratio, flag = self._total(a, names)
                    z = f"{ratio:.2f} × limit"
                    mean = "–"
                else:
                    var, flag = self.variance[a][row], self.biased[a][row]
                    z = f"{self.max_z[a][row]:.1f}"
                    m, s = self.mean[a][row], self.stderr[a][row]
                    mean = f"{float(m.reshape(-1)[0]):.4g} ± {float(s.reshape(-1)[0]):.2g}" \
                        if m.size == 1 else "–"
                stats[a] = (mean, var, var * self.seconds[a], z, flag)
            finite = [w for *_, w, _, _ in stats.values() if np.isfinite(w)]
            best = min(finite) if finite else float("nan")
            for a, (mean, var, work, z, flag) in stats.items():
                rel = work / best if best > 0 else (1.0 if work == 0 else float("inf"))
                lines.append(f"| {row} | {a} | {mean} | {var:.3g} | {_time(self.seconds[a])} | "
                             f"{work:.3g} | {rel:.2f} | {z} | {_flag(flag, z)} |")
        return "\n".join(lines)

    def plot(self, path: str, leaves: Sequence[str] | None = None, title: str = "") -> str:
        """Save a PNG: per leaf, grouped bars of variance, variance × time and
        max abs(z) over its flag threshold (above 1: flagged), one bar per estimator.

        Example: see `gv.compare_estimators`.
        """
        plt = _pyplot()
        rows, names = self._rows(leaves)

        def value(panel: int, a: str, f: str) -> float:
            var, ratio = (self._total(a, names)[:2] if f == "(all)" else
                          (self.variance[a][f], self.max_z[a][f] / self.threshold[f]))
            return (var, var * self.seconds[a], ratio)[panel]

        titles = ("variance", "variance × seconds", "max |z| / flag threshold")
        fig, axes = plt.subplots(1, 3, figsize=(min(18.0, max(9.0, 3.0 * len(rows))), 3.4))
        width = 0.8 / len(self.labels)
        x = np.arange(len(rows))
        for panel, (ax, what) in enumerate(zip(axes, titles)):
            for i, a in enumerate(self.labels):
                ax.bar(x + (i - (len(self.labels) - 1) / 2) * width,
                       [value(panel, a, f) for f in rows], width, label=a)
            if panel < 2:
                ax.set_yscale("log")
            else:
                ax.axhline(1.0, color="k", lw=0.8, ls="--")
            ax.set_xticks(x, rows, rotation=30, ha="right", fontsize=7)
            ax.set_title(what, fontsize=9)
        axes[0].legend(fontsize=7)
        if title:
            fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        return path

    def __str__(self) -> str:
        return self.table()


def _flag(flag: bool, z: str) -> str:
    return "" if not flag else "**non-finite**" if "nan" in z else "**biased**"


def _time(seconds: float) -> str:
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds / 1e-9:.3g} ns"
