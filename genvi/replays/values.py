"""The values of lane-local replays (see `genvi.replays.lanes`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class Tracked:
    """A value an evaluator follows in place of an array: the replay engine's lane
    values here, enumeration's (`genvi.inference.enumeration.evaluate`) too. What is not a
    `Tracked` is an array (or a Python scalar) that JAX computes as it is.

    Example:
        >>> isinstance(Local(0.0, 0.0, (0,)), Tracked)
        True
    """


def is_tracked(x: Any) -> bool:
    """Whether `x` is an evaluator's value (a `Tracked`) rather than an array."""
    return isinstance(x, Tracked)


@dataclass
class Local(Tracked):
    """A value whose slice l along `axes` depends only on lane l of the site: at the
    sampled values (`base`) and with every lane at its alternative (`alt`)."""

    base: Any
    alt: Any
    axes: tuple  # the value's axes that index the site's lanes, in the site's order


@dataclass
class Perturbed(Tracked):
    """A value in each lane's replay, stacked on a leading axis."""

    values: Any  # [lanes, *shape]: the value in each lane's replay


class Coupled(Exception):
    """The rest of the objective cannot be evaluated lane by lane here (a scan carry
    that keeps a step's change for good, a `cond` holding the replayed site itself):
    whole-objective replays are used instead."""
