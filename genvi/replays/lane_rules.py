"""Lane-tracking rules: `eqn` on lane-tracked operands (`Local`, or plain arrays for
lane-free ones) gives lane-tracked outputs, or None where the lanes couple (the
evaluator in `genvi.replays.lanes` then expands to one copy per replay).

Where the lane axes go is the registry's (`genvi.core.axis_rules.lane_axes`: one axis rule
per structure of primitive, which enumeration's evaluator reads too); this module adds
how values are computed: each equation runs on the operands' base values and on their
alternatives. Two structures also sum over the lanes, which the axis rules refuse and
a replay can still compute without a copy per lane: a sum over the lane axes and a
contraction over a lane axis give each lane's replay as the whole plus its own change
(`Perturbed`). `rule_for(eqn)` is the rule of an equation's primitive.

Example:
    >>> import jax, jax.numpy as jnp
    >>> eqn = jax.make_jaxpr(lambda x: x * 2.0)(jnp.ones(3)).eqns[0]
    >>> out, = rule_for(eqn)(eqn, [Local(jnp.ones(3), jnp.zeros(3), (0,)), 2.0])
    >>> out.base.tolist(), out.alt.tolist(), out.axes
    ([2.0, 2.0, 2.0], [0.0, 0.0, 0.0], (0,))
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from genvi.replays.values import Local, Perturbed
from genvi.core import jaxpr as jx
from genvi.core.axis_rules import Operand, dot_roles, lane_axes
from genvi.core.rules import REDUCE_SUM, STRUCTURE, Structure, structure_of


def lane_rule(eqn: Any, ins: list) -> list | None:
    """`eqn` on lane-tracked operands: each output's base and alternative, along the
    lane axes the registry gives; None where the lanes couple."""
    if any(isinstance(x, Perturbed) for x in ins) or not any(isinstance(x, Local) for x in ins):
        return None
    axes = lane_axes(eqn, [Operand(jnp.shape(x.base), x.axes) if isinstance(x, Local)
                           else Operand(jnp.shape(x), None) for x in ins])
    if axes is not None:
        return _on_base_and_alt(eqn, ins, axes)
    if eqn.primitive is REDUCE_SUM:
        return _sum_over_lanes(eqn, ins)
    if structure_of(eqn) is Structure.DOT_GENERAL:
        return _contracted_over_lanes(eqn, ins)
    return None


def _on_base_and_alt(eqn: Any, ins: list, axes: tuple) -> list:
    """`eqn` on the operands' base values and on their alternatives (lane-free operands
    as they are), the outputs lane-tracked along `axes`."""
    base = jx.eval_eqn(eqn, [x.base if isinstance(x, Local) else x for x in ins])
    if all(x.alt is x.base for x in ins if isinstance(x, Local)):
        # one copy: every lane at one value (enumeration's sums), the alternative is
        # the base, so the equation runs once, not twice for XLA to merge
        return [Local(b, b, axes) for b in base]
    alt = jx.eval_eqn(eqn, [x.alt if isinstance(x, Local) else x for x in ins])
    return [Local(b, a, axes) for b, a in zip(base, alt)]


def _sum_over_lanes(eqn: Any, ins: list) -> list | None:
    """A sum over every lane axis (and perhaps others): each lane's replay's sum."""
    (v,) = ins
    axes = jx.reduced_axes(eqn)
    if not set(v.axes) <= set(axes):
        return None  # a partial sum over the lanes
    return [Perturbed(_swap_sums(eqn, v, axes))]


def _swap_sums(eqn: Any, v: Local, axes: tuple) -> Any:
    """Σ over `axes` with lane l's slice swapped for its alternative, for every l:
    the full sum plus (alt − base) summed over the non-lane reduced axes. Infinite
    parts are handled exactly (−inf base, finite alternative: the sum without it)."""
    other = tuple(a for a in axes if a not in v.axes)
    nd = jnp.ndim(v.base)
    base, alt = v.base, v.alt
    finite = jnp.isfinite(base)
    total_finite = jnp.sum(jnp.where(finite, base, 0.0), axis=axes)
    n_neg = jnp.sum(base == -jnp.inf, axis=axes)
    n_pos = jnp.sum(base == jnp.inf, axis=axes)
    n_nan = jnp.sum(jnp.isnan(base), axis=axes)
    # per lane: the lane's own contributions (finite part and counts), summed over `other`
    lane_first = list(v.axes) + [a for a in range(nd) if a not in v.axes]
    def per_lane(x):
        x = jnp.sum(x, axis=other) if other else x
        keep = [a for a in range(nd) if a not in other]
        order = [keep.index(a) for a in lane_first if a in keep]
        x = jnp.transpose(x, order)
        return x.reshape((-1,) + x.shape[len(v.axes):])
    own_finite = per_lane(jnp.where(finite, base, 0.0))
    alt_finite = per_lane(jnp.where(jnp.isfinite(alt), alt, 0.0))
    neg = n_neg[None] - per_lane((base == -jnp.inf).astype(n_neg.dtype)) + per_lane(
        (alt == -jnp.inf).astype(n_neg.dtype))
    pos = n_pos[None] - per_lane((base == jnp.inf).astype(n_pos.dtype)) + per_lane(
        (alt == jnp.inf).astype(n_pos.dtype))
    nan = n_nan[None] - per_lane(jnp.isnan(base).astype(n_nan.dtype)) + per_lane(
        jnp.isnan(alt).astype(n_nan.dtype))
    value = total_finite[None] - own_finite + alt_finite
    value = jnp.where(neg > 0, -jnp.inf, value)
    value = jnp.where(pos > 0, jnp.where(neg > 0, jnp.nan, jnp.inf), value)
    value = jnp.where(nan > 0, jnp.nan, value)
    return value.astype(eqn.outvars[0].aval.dtype)


def _contracted_over_lanes(eqn: Any, ins: list) -> list | None:
    """A product contracting one operand's single lane axis: the base product plus
    each lane's own change."""
    lhs, rhs = ins
    if isinstance(lhs, Local) == isinstance(rhs, Local):
        return None
    swap = isinstance(rhs, Local)
    v, other = (rhs, lhs) if swap else (lhs, rhs)
    vc, oc, vb, ob = dot_roles(eqn, swap)
    if len(v.axes) != 1 or v.axes[0] not in vc:
        return None
    (a,) = v.axes
    nd_v, nd_o = jnp.ndim(v.base), jnp.ndim(other)
    j = list(vc).index(a)
    b = oc[j]
    vc2, oc2 = tuple(c for c in vc if c != a), tuple(c for c in oc if c != b)
    dims = ((vc2, oc2), (tuple(vb) + (a,), tuple(ob) + (b,)))
    diff = v.alt - v.base
    delta = jax.lax.dot_general(diff, other, dims, preferred_element_type=eqn.outvars[0].aval.dtype)
    delta = jnp.moveaxis(delta, len(vb), 0)  # the lane axis first
    base = jx.eval_eqn(eqn, [other, v.base] if swap else [v.base, other])[0]
    if swap:  # output order: batch, lhs (other) free, rhs (v) free — same as v-first
        o_free = [d for d in range(nd_o) if d not in oc and d not in ob]
        v_free = [d for d in range(nd_v) if d not in vc and d not in vb]
        nb = len(vb)
        order = list(range(nb)) + list(range(nb + len(v_free), nb + len(v_free) + len(o_free))) \
            + list(range(nb, nb + len(v_free)))
        delta = jnp.transpose(delta, [0] + [1 + i for i in order])
    return [Perturbed(base[None] + delta.astype(base.dtype))]


#: structure -> its lane-tracking rule: every structure the registry knows
RULES = {structure: lane_rule for structure in set(STRUCTURE.values())}


def rule_for(eqn: Any) -> Any:
    """The lane-tracking rule of `eqn`'s primitive, or None (its lanes couple)."""
    return RULES.get(structure_of(eqn))
