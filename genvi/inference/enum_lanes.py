"""The lane-tracked evaluator of `gv.enumeration`: a log density on values that are the
same in every lane of a discrete site, or depend on each lane's value alone.

A model's log density, traced with a batched discrete site's value as an input, is
evaluated with that value set to v in every lane at once (a `Same` of
`genvi.inference.enum_same_rules`, broadcast to a `Local` of `genvi.replays.values`
where it meets lane data, carried through by the lane rules of
`genvi.replays.lane_rules`: slice l depends on lane l of the site only). Anything that
mixes the lanes (a sum over lanes used nonlinearly, a max across lanes, a scan or
cond on the site) raises `NotSummable`, naming the primitive. The factor engine
(`genvi.inference.enum_factors`) evaluates each term of the density this way, and the
forward algorithm over a batch of sequences (`genvi.inference.enum_scan`) turns a
step's density summed over the sequences into an `Additive`: a lane-free part plus
one term per sequence.

Example:
    >>> from genvi.inference.enum_lanes import Additive
    >>> import jax.numpy as jnp
    >>> a = Additive(jnp.float32(1.0), jnp.array([0.5, -0.5]))
    >>> float(a.free), a.lanes.shape
    (1.0, (2,))
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np

from genvi.replays.engine import Local, Perturbed, rule_for
from genvi.core import jaxpr as jx
from genvi.core.rules import REDUCE_SUM, primitives
from genvi.core.walk import env_of, walk
from genvi.inference.enum_same_rules import Same, lazy_broadcast, same_rule
from genvi.inference.sum_product import NotSummable


_PER_LANE = ("; the log density must be a sum of one term per lane, each depending on that "
             "lane's discrete values only: compute each lane's terms inside the "
             "gv.vmap/gv.plate body and let the plate add them")


@dataclass
class Additive:
    """A scalar equal to `free` + Σ_l `lanes[l]`, where lane l's term depends on lane l
    of the enumerated sites only and `free` on none of them."""

    free: Any
    lanes: Any  # [L]


def is_tracked(x: Any) -> bool:
    """Whether `x` is an evaluator's value rather than an array (markers of
    `genvi.inference.enum_scan` say so with `enum_marker`)."""
    return isinstance(x, (Local, Additive, Perturbed, Same)) or getattr(x, "enum_marker", False)


def evaluate(closed: Any, inputs: list, other: Any = None, lazy: bool = False) -> list:
    """Evaluate a closed jaxpr on values that may be `Local` or `Additive`; `other(eqn,
    ins)` handles equations the lane rules do not (None: refuse). Broadcasts that do
    not depend on the sites stay unbroadcast inside (`enum_same`); outputs are
    broadcast unless `lazy`."""
    outs = walk(closed.jaxpr, env_of(closed, inputs),
                lambda i, eqn, ins: evaluate_eqn(eqn, ins, other))
    if lazy:
        return outs
    return [x.materialized() if isinstance(x, Same) and x.plain else x for x in outs]


def evaluate_eqn(eqn: Any, ins: list, other: Any) -> list:
    """One equation of `evaluate`: on arrays as JAX computes it, on lane-tracked values
    by the lane rules (`other(eqn, ins)` first, where given)."""
    if not any(is_tracked(x) for x in ins):
        return lazy_broadcast(eqn, ins) or jx.eval_eqn(eqn, ins)
    site = any(is_tracked(x) and not (isinstance(x, Same) and x.plain) for x in ins)
    # what replaces the equation keeps its source line and name scopes (a call's, for
    # the equations of its body): the smoothness check reads a log density's support
    # tests as such (density scope). Without the sites, only plain calls are opened (a
    # custom derivative rule stays with its equation)
    view = jx.view(eqn)
    body = (view.body if isinstance(view, jx.CallEqn)
            and (site or not isinstance(view, jx.CustomEqn)) else None)
    if body is not None and len(body.jaxpr.invars) == len(ins):
        with jx.emitted_as(eqn):
            return evaluate(body, ins, other, lazy=True)
    with jx.emitted_as(eqn):
        raw = ins
        if any(isinstance(x, Same) for x in ins):
            # every lane at one value: computed once where the equation allows, else
            # broadcast to the lanes for the lane rules
            outs = same_rule(eqn, ins)
            if outs is not None:
                return outs
            ins = [x.materialized() if isinstance(x, Same) else x for x in ins]
            if not site:
                return jx.eval_eqn(eqn, ins)
        # `other` broadcasts what it reads (a scan's first step reads its initial carry
        # unbroadcast)
        outs = other(eqn, raw) if other is not None else None
        if outs is None:
            outs = _tracked(eqn, ins)
    if any(isinstance(x, Perturbed) for x in outs):
        raise NotSummable(f"their lanes couple at `{jx.name_of(eqn)}` "
                          f"({jx.source_line(eqn)})" + _PER_LANE)
    return outs


def sum_used(where: str) -> NotSummable:
    """The refusal of a sum over a site's lanes used at `where` other than added up."""
    return NotSummable(f"a sum over lanes is used by {where}, so the log density is not a "
                       "sum of per-lane terms; score each lane inside the gv.vmap/gv.plate "
                       "body (gv.observe, gv.factor) instead of using their sum")


def _tracked(eqn: Any, ins: list) -> list:
    where = f"`{jx.name_of(eqn)}` ({jx.source_line(eqn)})"
    if any(isinstance(x, Additive) for x in ins):
        out = _additive(eqn, ins)
        if out is None:
            raise sum_used(where)
        return [out]
    if jx.view(eqn) is not None:
        raise NotSummable(f"a {jx.name_of(eqn)} at {jx.source_line(eqn)} depends on them; a "
                          "branch or loop chosen by a summed site is not summed lane by lane: "
                          "select values with jnp.where instead, or keep the site")
    if eqn.primitive is REDUCE_SUM:
        out = _sum_over_lanes(eqn, ins)
        if out is not None:
            return [out]
    rule = rule_for(eqn)
    out = None if rule is None else rule(eqn, ins)
    if out is None:
        raise NotSummable(f"their lanes couple at {where}" + _PER_LANE)
    return out


def _sum_over_lanes(eqn: Any, ins: list) -> Additive | None:
    (v,) = ins
    axes = jx.reduced_axes(eqn)
    if not set(v.axes) & set(axes):
        return None  # along other axes: the lane rules keep it lane-local
    if not set(v.axes) <= set(axes) or eqn.outvars[0].aval.shape != ():
        raise NotSummable(f"a partial sum over their lanes ({jx.source_line(eqn)})")
    nd = jnp.ndim(v.base)
    rest = tuple(a for a in range(nd) if a not in v.axes)
    per_lane = jnp.sum(v.base, axis=rest) if rest else v.base
    if len(v.axes) > 1:  # the remaining axes ascend; put the site's lane axes in order
        ascending = sorted(v.axes)
        per_lane = jnp.transpose(per_lane, [ascending.index(a) for a in v.axes])
    dtype = eqn.outvars[0].aval.dtype
    return Additive(jnp.zeros((), dtype), per_lane.reshape(-1).astype(dtype))


#: the primitives that keep a sum a sum (`Additive` here, `enum_factors.Terms`): adding,
#: subtracting, negating, scaling by a constant (a product or a quotient), and those
#: that pass a scalar on
ADD, SUB, NEG, SCALE = (primitives(names) for names in (["add", "add_any"], ["sub"],
                                                        ["neg"], ["mul", "div"]))
DIV = primitives(["div"])
TO_SCALAR = primitives(["convert_element_type", "copy", "copy_p", "reduce_sum", "reshape",
                        "broadcast_in_dim", "squeeze"])


def _additive(eqn: Any, ins: list) -> Additive | None:
    """Rules that keep `free + Σ lanes`: adding, negating, scaling by a constant."""
    def parts(x):
        return (x.free, x.lanes) if isinstance(x, Additive) else (x, 0.0)
    if any(isinstance(x, Local) or (not isinstance(x, Additive) and jnp.ndim(x) != 0)
           for x in ins):
        return None
    prim = eqn.primitive
    if prim in ADD or prim in SUB:
        (fa, la), (fb, lb) = parts(ins[0]), parts(ins[1])
        sign = -1.0 if prim in SUB else 1.0
        return Additive(fa + sign * fb, la + sign * lb)
    if prim in NEG:
        return Additive(-ins[0].free, -ins[0].lanes)
    if prim in SCALE:   # a product or a quotient
        a, b = ins
        if isinstance(b, Additive) and prim not in DIV:
            a, b = b, a
        if isinstance(b, Additive):
            return None
        op = jnp.divide if prim in DIV else jnp.multiply
        return Additive(op(a.free, b), op(a.lanes, b))
    if prim in TO_SCALAR and eqn.outvars[0].aval.shape == ():
        dtype = eqn.outvars[0].aval.dtype
        return Additive(ins[0].free.astype(dtype), ins[0].lanes.astype(dtype))
    return None


def joint_values(sites: list) -> list:
    """Every joint value of `sites`, each over its support: one array [C] per site.

    Example:
        >>> from types import SimpleNamespace as S
        >>> import numpy as np
        >>> a = S(support=np.array([0, 1]), dtype=np.int32)
        >>> [v.tolist() for v in joint_values([a, a])]
        [[0, 0, 1, 1], [0, 1, 0, 1]]
    """
    combos = list(itertools.product(*[range(len(s.support)) for s in sites]))
    return [jnp.asarray(np.array([s.support[c[i]] for c in combos]), s.dtype)
            for i, s in enumerate(sites)]
