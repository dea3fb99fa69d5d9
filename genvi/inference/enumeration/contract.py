"""Stage 3: log Σ over discrete sites of a product of factors over plates, by variable
elimination in log space (Pyro's tensor variable elimination).

`contract` takes the group of factors with the most plates first; sums out its sites
that lie in exactly those plates, each time the site whose sum makes the smallest
intermediate (a `logsumexp` of the factors' join, or an `einsum` where that is a real
matrix product, guarded against lost digits); multiplies what is left over the plates
its sites do not lie in; and goes on with the plates that remain.

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
    order, target = f.sites + f.plates, tuple(sites) + tuple(plates)
    values = jnp.transpose(f.values, [order.index(d) for d in target if d in order])
    it = iter(jnp.shape(values))
    return jnp.reshape(values, [next(it) if d in order else 1 for d in target])


def join(factors: list) -> Factor:
    """The product of factors (a sum of log values), over the union of their axes."""
    if len(factors) == 1:
        return factors[0]
    sites = tuple(dict.fromkeys(s for f in factors for s in f.sites))
    plates = tuple(dict.fromkeys(p for f in factors for p in f.plates))
    return Factor(sum(_aligned(f, sites, plates) for f in factors), sites, plates)


def _sizes(factors: list) -> dict:
    """Each axis's size among `factors` (an axis of size 1: one value per lane)."""
    sizes: dict = {}
    for f in factors:
        for d, n in zip(f.sites + f.plates, jnp.shape(f.values)):
            sizes[d] = max(sizes.get(d, 1), n)
    return sizes


def _sum_out_of(hits: list, site: Any) -> tuple[Factor, Any]:
    """log Σ over `site` of the product of `hits`, by one `einsum` of the factors shifted
    by their maxima over the site and exponentiated (no join: 2-3× faster than its
    logsumexp on a CPU), and where each entry is exact: not where float products lose
    digits (the factors' likeliest values disagree by about 87 nats in float32)."""
    sizes = _sizes(hits)
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
        keep: plates not multiplied out (a batch of chains' sequences).

    Returns:
        The log of the contracted product and the `Plan` of its steps; with `keep`, the
        log as (a scalar, an array over the kept plates in their order) adding up to it.

    Example:
        >>> import jax.numpy as jnp
        >>> f = Factor(jnp.log(jnp.full((2, 3), 0.25)), ("z",), ("lanes",))
        >>> total, plan = contract([f], {"z": frozenset({"lanes"})}, {})
        >>> round(float(total), 4), plan.steps[0]
        (-2.0794, 'sum out z per lane of {lanes}: 1 factor, 6 entries')
    """
    name = (names or {}).get
    plan = Plan()

    def run(values: list, fast: bool, note: Any = lambda *_: None) -> tuple[Any, list]:
        """(The contraction at these `values`, the flags of where an einsum lost digits);
        not `fast`: logsumexps of joins only, exact at any values."""
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
                joined = {s: math.prod(_sizes([f for f in group if s in f.sites]).values())
                          for s in local}
                # joined holds every site of local (mypy: dict.get may give None)
                site = min(sorted(local, key=str), key=joined.get)  # type: ignore[arg-type]
                hits, size = [f for f in group if site in f.sites], joined[site]
                note(f"sum out {name(site, site)} {where}: {len(hits)} factor"
                     f"{'s' if len(hits) > 1 else ''}, {size:,} entries", size)
                # an einsum saves work where it is a matrix product, not a broadcast
                if fast and len(hits) > 1 and size > sum(f.size for f in hits):
                    summed, exact = _sum_out_of(hits, site)
                    inexact.append(jnp.any(~exact))
                else:   # a logsumexp of the join
                    product = join(hits)
                    axis = product.sites.index(site)
                    summed = Factor(logsumexp(product.values, axis=axis),
                                    product.sites[:axis] + product.sites[axis + 1:], product.plates)
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
    einsums = jax.eval_shape(lambda v: run(v, fast=True, note=plan.note)[1], shapes)
    # a log density: its choices among equal values are not discontinuities of it
    with density_scope():
        if not einsums:   # every site summed from one factor: logsumexps, exact already
            return run(values, fast=True)[0], plan
        guarded = _guarded(lambda v: run(v, fast=True), lambda v: run(v, fast=False)[0])
        return guarded(values), plan


def _guarded(fast: Any, exact: Any) -> Any:
    """`fast(values)` = (value, flags) and its derivative, or where a flag is set those of
    `exact(values)`, computed only then (for every particle at once: `_anywhere`)."""
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
    """`f` multiplied over its plates that none of its sites lies in (but `keep`): a sum
    of logs, scaled per plate; an axis of size 1 holds one value for every lane."""
    if any(not site_plates[s] <= site_plates[t] and not site_plates[t] <= site_plates[s]
           for s in f.sites for t in f.sites):
        names = ", ".join(str(name(s, s)) for s in f.sites)
        raise NotSummable(f"sites of different plates ({names}) meet in one term that lies in "
                          "plates neither of them encloses, so the plates cannot be multiplied "
                          "out one at a time (Pyro refuses such models too): sum them in one "
                          "plate, or keep one of them")
    target = frozenset().union(*(site_plates[s] for s in f.sites))
    drop = [p for p in f.plates if p not in target and p not in keep]
    if not drop:
        return f
    values, axes = f.values, tuple(len(f.sites) + f.plates.index(p) for p in drop)
    for axis, p in zip(axes, drop):
        held = jnp.shape(values)[axis]
        values = jnp.sum(values, axis=axis, keepdims=True) * (
            scales.get(p, 1.0) * sizes.get(p, held) / held)
    f = Factor(jnp.squeeze(values, axes), f.sites, tuple(p for p in f.plates if p not in drop))
    note(f"multiply over {{{', '.join(str(name(p, p)) for p in drop)}}}", f.size)
    return f
