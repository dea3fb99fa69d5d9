"""Lane-tracking rules, one per structure of primitive (`genvi.core.rules`: the
registry keyed by primitive objects), in `RULES` (read like JAX's batching rules).
Each takes the equation and its operands (`Local`, or plain arrays for lane-free
ones) and returns the outputs, or None where the lanes couple (the evaluator in
`genvi.replays.lanes` then expands to one copy per replay). `rule_for(eqn)` is the
rule of an equation's primitive.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp

from genvi.replays.values import Local, Perturbed
from genvi.core import jaxpr as jx
from genvi.core.rules import REDUCE_SUM, SORT, Structure, structure_of

# -- rules: each returns the outputs, or None where the lanes couple ------------------

def elementwise(eqn: Any, ins: list) -> list | None:
    locals_ = [x for x in ins if isinstance(x, Local)]
    out_shape = eqn.outvars[0].aval.shape
    axes = locals_[0].axes
    if any(x.axes != axes for x in locals_):
        return None
    # operands broadcast (size-1 axes, scalars); a lane axis must not be broadcast
    if any(jnp.ndim(x.base) != len(out_shape)
           or any(jnp.shape(x.base)[a] != out_shape[a] for a in axes) for x in locals_):
        return None
    if any(not isinstance(x, Local) and jnp.ndim(x) not in (0, len(out_shape)) for x in ins):
        return None
    return _on_base_and_alt(eqn, ins, axes)


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


def _only_local(ins: list) -> Local | None:
    """The single (first) operand when it is the only lane-tracked one."""
    if len(ins) >= 1 and isinstance(ins[0], Local) and not any(
            isinstance(x, (Local, Perturbed)) for x in ins[1:]):
        return ins[0]
    return None


def _remap(axes: tuple, kept: Sequence[int]) -> tuple:
    """Lane axes after keeping the value axes `kept` (in order), or () if one is lost."""
    kept = list(kept)
    return tuple(kept.index(a) for a in axes) if all(a in kept for a in axes) else ()


def _same_structure(eqn: Any, v: Local, new_axes: tuple, ins: list) -> list:
    """`eqn` with `v` as its first operand (the others lane-free), lanes at `new_axes`."""
    return _on_base_and_alt(eqn, [v] + list(ins[1:]), new_axes)


def _reduce(eqn: Any, ins: list) -> list | None:
    v = _only_local(ins)
    if v is None:
        return None
    axes = tuple(eqn.params["axes"])
    nd = jnp.ndim(v.base)
    if not set(axes) & set(v.axes):
        kept = [a for a in range(nd) if a not in axes]
        return _same_structure(eqn, v, _remap(v.axes, kept), ins)
    if eqn.primitive is not REDUCE_SUM or not set(v.axes) <= set(axes):
        return None  # a max/min/product across lanes, or a partial sum over them
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


def _along_axis(eqn: Any, ins: list) -> list | None:
    v = _only_local(ins) if eqn.primitive is not SORT or len(ins) == 1 else None
    if v is None:
        return None
    axis = eqn.params.get("axis", eqn.params.get("dimension"))
    if axis in v.axes:
        return None
    return _same_structure(eqn, v, v.axes, ins)


def _broadcast_in_dim(eqn: Any, ins: list) -> list | None:
    v = _only_local(ins)
    if v is None or len(ins) > 1:
        return None
    dims = tuple(eqn.params["broadcast_dimensions"])
    shape = tuple(eqn.params["shape"])
    if any(shape[dims[a]] != jnp.shape(v.base)[a] for a in v.axes):
        return None  # a lane axis of size 1 broadcast: not lane-wise
    return _same_structure(eqn, v, tuple(dims[a] for a in v.axes), ins)


def _transpose(eqn: Any, ins: list) -> list | None:
    v = _only_local(ins)
    perm = list(eqn.params["permutation"])
    return None if v is None else _same_structure(eqn, v, tuple(perm.index(a) for a in v.axes), ins)


def _squeeze(eqn: Any, ins: list) -> list | None:
    v = _only_local(ins)
    if v is None:
        return None
    dims = set(eqn.params["dimensions"])
    kept = [a for a in range(jnp.ndim(v.base)) if a not in dims]
    axes = _remap(v.axes, kept)
    return None if len(axes) != len(v.axes) else _same_structure(eqn, v, axes, ins)


def reshaped_axes(old: Sequence[int], new: Sequence[int], axes: tuple) -> tuple | None:
    """The lane axes after reshaping `old` to `new`, where each lane axis stays one axis
    of the same size with the same number of elements before it (so the flat layout of
    lanes is unchanged); None where one does not."""
    out = []
    for a in axes:
        before = math.prod(old[:a])
        hits = [b for b in range(len(new)) if new[b] == old[a] and math.prod(new[:b]) == before]
        if not hits:
            return None
        out.append(hits[0])
    return tuple(out)


def _reshape(eqn: Any, ins: list) -> list | None:
    """A reshape that keeps each lane axis in place (`reshaped_axes`)."""
    v = _only_local(ins)
    if v is None or eqn.params.get("dimensions") is not None:
        return None
    axes = reshaped_axes(jnp.shape(v.base), tuple(eqn.params["new_sizes"]), v.axes)
    return None if axes is None else _same_structure(eqn, v, axes, ins)


def _slice(eqn: Any, ins: list) -> list | None:
    v = _only_local(ins)
    if v is None:
        return None
    p = eqn.params
    shape = jnp.shape(v.base)
    strides = p.get("strides") or (1,) * len(shape)
    if any(p["start_indices"][a] != 0 or p["limit_indices"][a] != shape[a] or strides[a] != 1
           for a in v.axes):
        return None
    return _same_structure(eqn, v, v.axes, ins)


def _rev(eqn: Any, ins: list) -> list | None:
    """Reversing axes other than the lane axes."""
    v = _only_local(ins)
    if v is None or any(a in eqn.params["dimensions"] for a in v.axes):
        return None
    return _same_structure(eqn, v, v.axes, ins)


def _pad(eqn: Any, ins: list) -> list | None:
    """Padding (with a lane-free value) axes other than the lane axes."""
    v = _only_local(ins)
    if v is None or any(tuple(eqn.params["padding_config"][a]) != (0, 0, 0) for a in v.axes):
        return None
    return _same_structure(eqn, v, v.axes, ins)


def _dot_general(eqn: Any, ins: list) -> list | None:
    lhs, rhs = ins
    if isinstance(lhs, Local) == isinstance(rhs, Local):
        return None  # both lane-tracked (or neither): general
    swap = isinstance(rhs, Local)
    v, other = (rhs, lhs) if swap else (lhs, rhs)
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    vc, oc, vb, ob = (rc, lc, rb, lb) if swap else (lc, rc, lb, rb)
    nd_v, nd_o = jnp.ndim(v.base), jnp.ndim(other)
    if len(v.axes) != 1:
        return None
    (a,) = v.axes
    if a in vb:  # a batch dimension: output axis = its position among batch dims
        return _dot_local(eqn, ins, v, swap, vb.index(a))
    if a not in vc:  # a free dimension of v
        v_free = [d for d in range(nd_v) if d not in vc and d not in vb]
        o_free = [d for d in range(nd_o) if d not in oc and d not in ob]
        pos = len(vb) + (len(o_free) + v_free.index(a) if swap else v_free.index(a))
        return _dot_local(eqn, ins, v, swap, pos)
    # contracted over the lanes: base product plus each lane's own change
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


def _dot_local(eqn: Any, ins: list, v: Local, swap: bool, pos: int) -> list:
    other = ins[0] if swap else ins[1]
    base = jx.eval_eqn(eqn, [other, v.base] if swap else [v.base, other])
    if v.alt is v.base:  # one copy (see `_on_base_and_alt`)
        return [Local(base[0], base[0], (pos,))]
    alt = jx.eval_eqn(eqn, [other, v.alt] if swap else [v.alt, other])
    return [Local(base[0], alt[0], (pos,))]


def _gather(eqn: Any, ins: list) -> list | None:
    """Indexing by lane-local indices (`means[z]`), or a lane-local table by indices
    that batch over its lanes (`take_along_axis`, a categorical's log density of its
    own lanes' logits): output position b reads the indices at b, and the operand only
    in the lanes that the indices' batching dimensions pair with b's, so the lane
    axes carry over."""
    operand, indices = ins
    if isinstance(operand, Perturbed) or isinstance(indices, Perturbed):
        return None
    dn = eqn.params["dimension_numbers"]
    last = len(eqn.invars[1].aval.shape) - 1  # the index vector dimension
    lanes = None  # the lane axes, as dimensions of the indices
    if isinstance(indices, Local):
        if last in indices.axes:
            return None
        lanes = indices.axes
    if isinstance(operand, Local):
        if any(a not in dn.operand_batching_dims for a in operand.axes):
            return None  # a lane read by other lanes' positions
        paired = tuple(dn.start_indices_batching_dims[dn.operand_batching_dims.index(a)]
                       for a in operand.axes)
        if lanes is not None and paired != lanes:
            return None
        lanes = paired
    out_ndim = len(eqn.outvars[0].aval.shape)
    offset = set(dn.offset_dims)
    batch_positions = [d for d in range(out_ndim) if d not in offset]
    axes = tuple(batch_positions[a] for a in lanes)
    return _on_base_and_alt(eqn, ins, axes)


def _concatenate(eqn: Any, ins: list) -> list | None:
    """Joining along an axis that is not a lane axis (the index vectors JAX builds for
    `means[z]`): lane l's slice of the result joins the operands' lane-l slices, and
    lane-free operands have the same extent along the lane axes."""
    if any(isinstance(x, Perturbed) for x in ins):
        return None
    locals_ = [x for x in ins if isinstance(x, Local)]
    axes = locals_[0].axes
    if eqn.params["dimension"] in axes or any(x.axes != axes for x in locals_):
        return None
    return _on_base_and_alt(eqn, ins, axes)


RULES = {
    Structure.ELEMENTWISE: elementwise,
    Structure.REDUCE: _reduce,
    Structure.ALONG_AXIS: _along_axis,
    Structure.BROADCAST: _broadcast_in_dim,
    Structure.TRANSPOSE: _transpose,
    Structure.SQUEEZE: _squeeze,
    Structure.RESHAPE: _reshape,
    Structure.SLICE: _slice,
    Structure.REV: _rev,
    Structure.PAD: _pad,
    Structure.DOT_GENERAL: _dot_general,
    Structure.GATHER: _gather,
    Structure.CONCATENATE: _concatenate,
}


def rule_for(eqn: Any) -> Any:
    """The lane-tracking rule of `eqn`'s primitive, or None (its lanes couple)."""
    return RULES.get(structure_of(eqn))
