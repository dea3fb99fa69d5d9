"""What a tuning measured and chose: `Measured` (one candidate at one site) and
`Tuning` (`gv.tune`'s result: the choices, every measurement, and the table that
`print` and `explain` show).

Example:
    >>> import genvi as gv
    >>> t = Tuning(((("b",), gv.MVD),), (Measured("b", gv.MVD, 0.5, 0.001, 32),))
    >>> t.choice("b"), t.measured[0].work
    (gv.MVD, 0.0005)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from genvi.adev.expectation import Expectation
from genvi.auto import choices as auto
from genvi.core.address import Address


@dataclass(frozen=True)
class Measured:
    """One candidate at one site: its gradient variance (summed over entries), the
    seconds per estimate (its fastest batch's), their product, the estimates taken, and
    why it was ruled out (None: it was not)."""

    site: str
    strategy: Any
    variance: float = math.nan
    seconds: float = math.nan
    estimates: int = 0
    refused: str | None = None

    @property
    def work(self) -> float:
        """Variance × seconds: what the choice minimizes."""
        return self.variance * self.seconds


@dataclass(frozen=True)
class Tuning:
    """What `gv.tune` chose: `choices` ((address, strategy) pairs), every candidate
    `measured`, the `step` of a fit whose parameters it was measured at, the step
    training took the choices from (`applied`; None: not in a fit, or the fit ended
    before) and `notes` (a site where only REINFORCE applies says so).
    `apply(objective)` is the objective with the choices; `print` it for the table.

    Example:
        >>> import genvi as gv
        >>> t = Tuning(((("b",), gv.MVD),), ())
        >>> t.choice("b")
        gv.MVD
    """

    choices: tuple
    measured: tuple
    step: int = 0
    notes: tuple = ()
    applied: int | None = None
    before: tuple = ()

    def choice(self, addr: str | tuple) -> Any:
        """The strategy chosen at `addr` ("outer/inner" or a tuple)."""
        key = Address.parse(addr)
        for where, strategy in self.choices:
            if where == key:
                return strategy
        raise KeyError(f"no gv.AUTO site at {addr!r}; the tuned sites: "
                       + ", ".join(str(Address(a)) for a, _ in self.choices))

    def apply(self, objective: Expectation) -> Expectation:
        """`objective` with its `gv.AUTO` sites at these choices (an `Expectation`
        whose `explain` also prints this table)."""
        return auto.Tuned(objective, self.choices, str(self))

    def __str__(self) -> str:
        chosen = {(str(Address(a)), repr(s)) for a, s in self.choices}
        rows = [("site", "candidate", "variance", "seconds/estimate", "variance × seconds",
                 "estimates", "")]
        for m in self.measured:
            mark = "chosen" if (m.site, repr(m.strategy)) in chosen else (
                f"refused: {m.refused}" if m.refused else "")
            rows.append((m.site, repr(m.strategy), _num(m.variance), _num(m.seconds),
                         _num(m.work), str(m.estimates), mark))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        before = ", ".join(f"{'/'.join(map(str, a))} {s!r}" for a, s in self.before)
        if self.applied is None:   # outside a fit, or a fit that ended before the switch
            applied = f", not applied: the fit ended first, training with {before}" if (
                self.before) else ""
        else:
            applied = ("" if self.applied == self.step
                       else f", trained with from step {self.applied}")
            if applied and self.before and self.before != self.choices:
                applied += f" (before it: {before})"
        lines = [f"gv.AUTO, measured at step {self.step}{applied} (gradient variance × time "
                 "per estimate):"]
        for j, r in enumerate(rows):
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
            if j == 0:
                lines.append("  " + "  ".join("-" * w for w in widths[:-1]))
        return "\n".join(lines + [f"  {n}" for n in self.notes])

    __repr__ = __str__


def _num(x: float) -> str:
    return "—" if not math.isfinite(x) else f"{x:.3g}"
