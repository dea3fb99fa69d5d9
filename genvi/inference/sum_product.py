"""Sum-product contraction for `gv.enumeration`: log Σ over discrete sites of a
product of factors, over plates, by variable elimination in log space.

A `Factor` is a tensor of log values with one axis per summed site it depends on (the
site's value, per lane) and one axis per plate it lies in (lanes). The density is
the product of every factor, with the sites summed over their supports lane by lane
and the plates multiplied over their lanes. `contract` computes its logarithm as
Pyro's tensor variable elimination does:

* the factors are grouped by their plates; a group with the most plates goes first
  (no other group lies inside it);
* its sites that lie in exactly those plates are summed out (`logsumexp`), one at a
  time, each time the site whose sum makes the smallest intermediate (as
  `opt_einsum`'s greedy path chooses);
* what is left of each factor depends on sites of fewer plates only; it is
  multiplied over the plates those sites do not lie in (a sum of logs over their
  axes, times the plate's scale: a subsampled plate's lanes count `size / lanes`
  times) and joins the group of the plates that remain.

Factors whose remaining sites do not lie in nested plates (a site of one plate and a
site of another in one factor) cannot be contracted plate by plate: `contract`
raises `NotSummable` there (Pyro refuses such models too). `Plan` records each step for
`explain`, with the size of the largest intermediate.

Example:
    >>> import jax.numpy as jnp
    >>> half = Factor(jnp.log(jnp.array([0.25, 0.25])), ("z",), ())   # half the mass
    >>> total, plan = contract([half], {"z": frozenset()}, {})
    >>> round(float(total), 4), plan.largest
    (-0.6931, 2)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import jax.numpy as jnp
from jax.scipy.special import logsumexp


class NotSummable(Exception):
    """The log density is not a sum of terms that can be contracted here."""


@dataclass(frozen=True)
class Factor:
    """Log values with one axis per site of `sites`, then one per plate of `plates`."""

    values: Any
    sites: tuple
    plates: tuple

    @property
    def size(self) -> int:
        return math.prod(jnp.shape(self.values))


@dataclass
class Plan:
    """The contraction's steps, in order, and the largest intermediate's entries."""

    steps: list = field(default_factory=list)
    largest: int = 0

    def note(self, step: str, size: int) -> None:
        self.steps.append(step)
        self.largest = max(self.largest, size)

    def __str__(self) -> str:
        lines = [f"  {i + 1}. {s}" for i, s in enumerate(self.steps)]
        return "\n".join(lines + [f"  largest intermediate: {self.largest:,} entries"])


def _aligned(f: Factor, sites: tuple, plates: tuple) -> Any:
    """`f.values` with its axes placed among (sites, plates), size 1 where it has none."""
    order = list(f.sites) + list(f.plates)
    target = list(sites) + list(plates)
    values = jnp.transpose(f.values, [order.index(d) for d in target if d in order])
    shape, it = [], iter(jnp.shape(values))
    for d in target:
        shape.append(next(it) if d in order else 1)
    return jnp.reshape(values, shape)


def join(factors: list) -> Factor:
    """The product of factors (a sum of log values), over the union of their axes."""
    if len(factors) == 1:
        return factors[0]
    sites = tuple(dict.fromkeys(s for f in factors for s in f.sites))
    plates = tuple(dict.fromkeys(p for f in factors for p in f.plates))
    total = sum(_aligned(f, sites, plates) for f in factors)
    return Factor(total, sites, plates)


def _sum_out(f: Factor, site: Any) -> Factor:
    axis = f.sites.index(site)
    return Factor(logsumexp(f.values, axis=axis), f.sites[:axis] + f.sites[axis + 1:], f.plates)


def _multiply_over(f: Factor, plates: list, scales: dict, sizes: dict) -> Factor:
    """The product over the lanes of `plates` (a sum of logs, scaled per plate); an axis
    of size 1 holds one value for every lane of its plate."""
    values = f.values
    for p in plates:
        axis = len(f.sites) + f.plates.index(p)
        held = jnp.shape(values)[axis]
        values = jnp.sum(values, axis=axis, keepdims=True) * (
            scales.get(p, 1.0) * sizes.get(p, held) / held)
    keep = [i for i, p in enumerate(f.plates) if p not in plates]
    shape = jnp.shape(values)[:len(f.sites)] + tuple(jnp.shape(values)[len(f.sites) + i]
                                                     for i in keep)
    return Factor(jnp.reshape(values, shape), f.sites, tuple(f.plates[i] for i in keep))


def contract(factors: list, site_plates: dict, scales: dict, names: dict | None = None,
             sizes: dict | None = None) -> tuple[Any, Plan]:
    """log of the product of `factors` summed over every site (see the module).

    Args:
        factors: the `Factor`s; every site a factor has lies in plates the factor has.
        site_plates: each site's plates (a frozenset of plate labels).
        scales: each plate's scale (missing: 1), by which its lanes' logs are summed.
        names: how `Plan` names sites and plates (default: `str`).
        sizes: each plate's lanes, where a factor holds one value for all of them (an
            axis of size 1); missing: the axis's size.

    Returns:
        The scalar log of the contracted product, and the `Plan` of its steps.

    Example:
        >>> import jax.numpy as jnp
        >>> f = Factor(jnp.log(jnp.full((2, 3), 0.25)), ("z",), ("lanes",))
        >>> total, plan = contract([f], {"z": frozenset({"lanes"})}, {})
        >>> round(float(total), 4), plan.steps[0]
        (-2.0794, 'sum out z per lane of {lanes}: 1 factor, 6 entries')
    """
    name = (names or {}).get
    plan = Plan()
    pending = list(factors)
    total = 0.0
    while pending:
        leaf = max({frozenset(f.plates) for f in pending}, key=len)
        group = [f for f in pending if frozenset(f.plates) == leaf]
        pending = [f for f in pending if frozenset(f.plates) != leaf]
        where = ("per lane of {" + ", ".join(sorted(str(name(p, p)) for p in leaf)) + "}"
                 if leaf else "globally")
        local = {s for f in group for s in f.sites if site_plates[s] == leaf}
        while local:
            site = min(sorted(local, key=str), key=lambda s: _joined_size(group, s))
            hits = [f for f in group if site in f.sites]
            joined = join(hits)
            plan.note(f"sum out {name(site, site)} {where}: {len(hits)} factor"
                      f"{'s' if len(hits) > 1 else ''}, {joined.size:,} entries", joined.size)
            group = [f for f in group if site not in f.sites] + [_sum_out(joined, site)]
            local.discard(site)
        for f in group:
            target = frozenset().union(*(site_plates[s] for s in f.sites))
            if any(not site_plates[s] <= site_plates[t] and not site_plates[t] <= site_plates[s]
                   for s in f.sites for t in f.sites):
                raise NotSummable(
                    "sites of different plates (" + ", ".join(
                        f"{name(s, s)!s}" for s in f.sites) + ") meet in one term that lies in "
                    "plates neither of them encloses, so the plates cannot be multiplied out "
                    "one at a time (Pyro refuses such models too): sum them in one plate, or "
                    "keep one of them")
            drop = [p for p in f.plates if p not in target]
            if drop:
                f = _multiply_over(f, drop, scales, sizes or {})
                plan.note(f"multiply over {{{', '.join(str(name(p, p)) for p in drop)}}}",
                          f.size)
            if f.plates or f.sites:
                pending.append(f)
            else:
                total = total + f.values
    return total, plan


def _joined_size(group: list, site: Any) -> int:
    """Entries of the product of the factors of `group` that have `site`."""
    dims: dict = {}
    for f in group:
        if site in f.sites:
            dims.update(zip(f.sites + f.plates, jnp.shape(f.values)))
    return math.prod(dims.values())
