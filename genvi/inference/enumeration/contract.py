"""Stage 3 of enumeration: the contraction, log Σ over discrete sites of a product of
factors over plates, by variable elimination in log space.

A `Factor` is a tensor of log values with one axis per summed site it depends on (the
site's value, per lane) and one axis per plate it lies in (lanes). The density is
the product of every factor, with the sites summed over their supports lane by lane
and the plates multiplied over their lanes. `contract` computes its logarithm as
Pyro's tensor variable elimination does:

* the factors are grouped by their plates; a group with the most plates goes first
  (no other group lies inside it);
* its sites that lie in exactly those plates are summed out, one at a time, each time
  the site whose sum makes the smallest intermediate (as `opt_einsum`'s greedy path
  chooses): by a `logsumexp` of the factors' join where the join is no larger than
  the factors (one site in one plate: a mixture), else by an `einsum` of their
  shifted exponentials (`_sum_out_of`, a matrix product that never builds the join),
  with the logsumexp of their join taken instead wherever the einsum would lose
  digits (`_guarded`: decided from the shapes, so it costs nothing where no einsum
  runs);
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

import jax
import jax.numpy as jnp
from jax.custom_batching import custom_vmap
from jax.scipy.special import logsumexp

from genvi.core.scopes import density_scope
from genvi.inference.enumeration.sites import NotSummable


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


def _sum_out_of(hits: list, site: Any) -> tuple[Factor, Any]:
    """log Σ over `site` of the product of `hits` (two or more factors that have it),
    by Pyro's log-space einsum, and where that is exact.

    Each factor is shifted by its maximum over the site and exponentiated, the product
    is summed over the site by one `einsum` (a matrix product; the joined tensor is
    never exponentiated: 2-3× faster than a logsumexp of the join on CPU), and the
    shifts are added back to its log. An entry is exact unless the sum fell to where
    float products lose digits (the factors' likeliest values of the site disagree by
    about 87 nats in float32); `contract` recomputes such a contraction from the joins.
    """
    sizes: dict = {}
    for f in hits:
        for d, n in zip(f.sites + f.plates, jnp.shape(f.values)):
            sizes[d] = max(sizes.get(d, 1), n)
    sites = tuple(dict.fromkeys(s for f in hits for s in f.sites if s != site))
    plates = tuple(dict.fromkeys(p for f in hits for p in f.plates))
    out = sites + plates
    symbol = {d: chr(ord("a") + i) if i < 26 else chr(ord("A") + i - 26)
              for i, d in enumerate((site,) + out)}
    operands, specs, shift = [], [], 0.0
    for f in hits:
        own, values = f.sites + f.plates, f.values
        held = tuple(i for i, d in enumerate(own) if jnp.shape(values)[i] == 1 < sizes[d])
        values = jnp.squeeze(values, held)   # one value for every lane: einsum broadcasts it
        own = tuple(d for i, d in enumerate(own) if i not in held)
        axis = own.index(site)
        top = jax.lax.stop_gradient(jnp.max(values, axis=axis, keepdims=True))
        top = jnp.where(jnp.isfinite(top), top, 0.0)   # an impossible row stays 0 below
        operands.append(jnp.exp(values - top))
        specs.append("".join(symbol[d] for d in own))
        rest = tuple(d for d in own if d != site)
        shift = shift + _aligned(Factor(jnp.squeeze(top, axis), rest, ()), out, ())
    total = jnp.einsum(",".join(specs) + "->" + "".join(symbol[d] for d in out), *operands)
    info = jnp.finfo(total.dtype)
    exact = jax.lax.stop_gradient(total) >= sizes[site] * info.tiny / info.eps
    # where inexact, log 1 (not log 0): the entry is replaced, and its derivative must
    # stay finite for the transposed branch that discards it
    return Factor(jnp.log(jnp.where(exact, total, 1.0)) + shift, sites, plates), exact


@custom_vmap
def _anywhere(flags: Any) -> Any:
    """Whether any entry of `flags` is true: one answer for every lane of a `vmap`
    (particles), so that a `lax.cond` on it stays a branch instead of both."""
    return jnp.any(flags)


@_anywhere.def_vmap
def _anywhere_batched(axis_size: int, in_batched: list, flags: Any) -> tuple:
    return jnp.any(flags), False


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
             sizes: dict | None = None, keep: tuple = ()) -> tuple[Any, Plan]:
    """log of the product of `factors` summed over every site (see the module).

    Args:
        factors: the `Factor`s; every site a factor has lies in plates the factor has.
        site_plates: each site's plates (a frozenset of plate labels).
        scales: each plate's scale (missing: 1), by which its lanes' logs are summed.
        names: how `Plan` names sites and plates (default: `str`).
        sizes: each plate's lanes, where a factor holds one value for all of them (an
            axis of size 1); missing: the axis's size.
        keep: plates not multiplied out (a batch of chains' sequences, whose lanes the
            forward algorithm sums one by one).

    Returns:
        The scalar log of the contracted product, and the `Plan` of its steps; with
        `keep`, the log as (a scalar, an array over the kept plates, in their order)
        whose sum over the kept plates' lanes is the contraction.

    Example:
        >>> import jax.numpy as jnp
        >>> f = Factor(jnp.log(jnp.full((2, 3), 0.25)), ("z",), ("lanes",))
        >>> total, plan = contract([f], {"z": frozenset({"lanes"})}, {})
        >>> round(float(total), 4), plan.steps[0]
        (-2.0794, 'sum out z per lane of {lanes}: 1 factor, 6 entries')
    """
    name = (names or {}).get
    plan = Plan()

    def run(values: list, fast: bool, plan: Plan | None = None) -> tuple[Any, list]:
        """The contraction of the factors with these `values`: (its log, the flags of
        where an einsum lost digits); `fast`: einsums (`_sum_out_of`), else logsumexps of
        joins, exact at any values."""
        note = plan.note if plan is not None else (lambda *_: None)
        pending = [Factor(v, f.sites, f.plates) for v, f in zip(values, factors)]
        total, inexact = 0.0, []
        per_lane = jnp.zeros([(sizes or {})[p] for p in keep], values[0].dtype)
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
                size = _joined_size(group, site)
                note(f"sum out {name(site, site)} {where}: {len(hits)} factor"
                     f"{'s' if len(hits) > 1 else ''}, {size:,} entries", size)
                if fast and _contracts(hits, size):
                    summed, exact = _sum_out_of(hits, site)
                    inexact.append(jnp.any(~exact))
                else:
                    summed = _sum_out(join(hits), site)
                group = [f for f in group if site not in f.sites] + [summed]
                local.discard(site)
            for f in group:
                f = _multiplied(f, site_plates, scales, sizes or {}, name, note, keep)
                if f.sites or not set(f.plates) <= set(keep):
                    pending.append(f)
                elif f.plates:   # over kept plates only: its lanes' own terms, scaled back
                    scale = math.prod(scales.get(p, 1.0) for p in f.plates)
                    per_lane = per_lane + scale * _aligned(f, (), keep)
                else:
                    total = total + f.values
        return ((total, per_lane) if keep else total), inexact

    values = [f.values for f in factors]
    # the plan, and whether any site is summed by an einsum: one pass on shapes only
    shapes = [jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v)) for v in values]
    einsums = jax.eval_shape(lambda v: run(v, fast=True, plan=plan)[1], shapes)
    # a log density: its choices among equal values are not discontinuities of it
    with density_scope():
        if not einsums:   # every site summed from one factor: logsumexps, exact already
            return run(values, fast=True)[0], plan
        guarded = _guarded(lambda v: run(v, fast=True), lambda v: run(v, fast=False)[0])
        return guarded(values), plan


def _guarded(fast: Any, exact: Any) -> Any:
    """`fast(values)` = (value, flags), with its derivative; where a flag is set, the
    value and derivative of `exact(values)` instead, computed only then (for every
    particle at once under `vmap`: `_anywhere`)."""
    @jax.custom_jvp
    def guarded(values: list) -> Any:
        value, flags = fast(values)
        return jax.lax.cond(_anywhere(jnp.stack(flags)), exact, lambda _: value, values)

    @guarded.defjvp
    def guarded_jvp(primals: tuple, tangents: tuple) -> tuple:
        (values,), (dvalues,) = primals, tangents
        value, dvalue, flags = jax.jvp(fast, (values,), (dvalues,), has_aux=True)
        slow = jax.checkpoint(lambda v, dv: jax.jvp(exact, (v,), (dv,)))
        return jax.lax.cond(_anywhere(jnp.stack(flags)), lambda vd: slow(*vd),
                            lambda _: (value, dvalue), (values, dvalues))
    return guarded


def _multiplied(f: Factor, site_plates: dict, scales: dict, sizes: dict, name: Any,
                note: Any, keep: tuple = ()) -> Factor:
    """`f` multiplied over its plates that none of its sites lies in (but `keep`)."""
    target = frozenset().union(*(site_plates[s] for s in f.sites))
    if any(not site_plates[s] <= site_plates[t] and not site_plates[t] <= site_plates[s]
           for s in f.sites for t in f.sites):
        raise NotSummable(
            "sites of different plates (" + ", ".join(
                f"{name(s, s)!s}" for s in f.sites) + ") meet in one term that lies in "
            "plates neither of them encloses, so the plates cannot be multiplied out "
            "one at a time (Pyro refuses such models too): sum them in one plate, or "
            "keep one of them")
    drop = [p for p in f.plates if p not in target and p not in keep]
    if drop:
        f = _multiply_over(f, drop, scales, sizes)
        note(f"multiply over {{{', '.join(str(name(p, p)) for p in drop)}}}", f.size)
    return f


def _contracts(hits: list, joined: int) -> bool:
    """Whether an einsum of `hits` saves work over their join's logsumexp: their
    product is larger than the factors together (a matrix product, not a broadcast)."""
    return len(hits) > 1 and joined > sum(f.size for f in hits)


def _joined_size(group: list, site: Any) -> int:
    """Entries of the product of the factors of `group` that have `site`."""
    dims: dict = {}
    for f in group:
        if site in f.sites:
            for d, n in zip(f.sites + f.plates, jnp.shape(f.values)):
                dims[d] = max(dims.get(d, 1), n)   # an axis of size 1: one value per lane
    return math.prod(dims.values())
