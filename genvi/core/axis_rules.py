"""Where each structural primitive moves its operands' lane axes: one axis rule per
structure of primitive (`genvi.core.rules.Structure`), in `AXIS_RULES`, written once
against a small interface: each operand's whole shape and its lane axes (`Operand`)
in, the outputs' lane axes out, or None where the equation acts across a lane
(`lane_axes`). The lane-tracked evaluator of replays (`genvi.replays.lane_rules`) and
enumeration's evaluator of values the same in every lane
(`genvi.inference.enumeration.same`) both read it, and the parameters of JAX's
structural primitives are read here only (a parameter JAX renames is fixed here).

Example:
    >>> import jax
    >>> t = jax.make_jaxpr(lambda x: x.T)(jax.numpy.ones((4, 3))).eqns[0]
    >>> lane_axes(t, [Operand((4, 3), (0,))])       # the lanes of axis 0 move to axis 1
    (1,)
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple, Protocol, Sequence

import jax
import jax.numpy as jnp

from genvi.core import jaxpr as jx
from genvi.core.rules import Structure, structure_of


class Operand(NamedTuple):
    """An equation's operand as the axis rules see it: its whole shape (every lane
    axis at its size) and its lane axes, None where it is the same in every lane."""

    shape: tuple
    lanes: tuple | None


def lane_axes(eqn: Any, operands: Sequence[Operand]) -> tuple | None:
    """The lane axes of `eqn`'s outputs (every output has the same), given its
    operands' (at least one with lanes); None where the equation acts across a lane
    (it couples the lanes) or its operands' lanes disagree.

    Args:
        eqn: a JAX equation of a structural primitive (`structure_of(eqn)` is not None).
        operands: one `Operand` per input of `eqn`, in order.

    Returns:
        The outputs' lane axes, or None.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> eqn = jax.make_jaxpr(lambda x: x.sum(axis=1))(jnp.ones((4, 3))).eqns[0]
        >>> lane_axes(eqn, [Operand((4, 3), (0,))]), lane_axes(eqn, [Operand((4, 3), (1,))])
        ((0,), None)
    """
    structure = structure_of(eqn)
    rule = None if structure is None else AXIS_RULES.get(structure)
    return None if rule is None else rule(eqn, list(operands))


def reshaped_axes(old: Sequence[int], new: Sequence[int], axes: tuple) -> tuple | None:
    """The lane axes after reshaping `old` to `new`, where each lane axis stays one axis
    of the same size with the same number of elements before it (so the flat layout of
    lanes is unchanged); None where one does not.

    Example:
        >>> reshaped_axes((4, 2, 3), (4, 6), (0,)), reshaped_axes((4, 2, 3), (8, 3), (0,))
        ((0,), None)
    """
    out = []
    for a in axes:
        before = math.prod(old[:a])
        hits = [b for b in range(len(new)) if new[b] == old[a] and math.prod(new[:b]) == before]
        if not hits:
            return None
        out.append(hits[0])
    return tuple(out)


def _common(ops: list) -> tuple | None:
    """The lane axes every operand with lanes shares, or None where they differ."""
    lanes = [o.lanes for o in ops if o.lanes is not None]
    return lanes[0] if lanes and all(x == lanes[0] for x in lanes) else None


class _WithLanes(Protocol):
    """An `Operand` whose lanes are not None (what `_first_only` gives)."""

    @property
    def shape(self) -> tuple: ...
    @property
    def lanes(self) -> tuple: ...


def _first_only(ops: list) -> _WithLanes | None:
    """The first operand, where it is the only one with lanes."""
    if ops and ops[0].lanes is not None and all(o.lanes is None for o in ops[1:]):
        return ops[0]
    return None


def _kept(lanes: tuple, kept: Sequence[int]) -> tuple | None:
    """Lane axes after keeping the axes `kept` (in order); None where one is dropped."""
    kept = list(kept)
    return tuple(kept.index(a) for a in lanes) if all(a in kept for a in lanes) else None


def _elementwise(eqn: Any, ops: list) -> tuple | None:
    """Lanes stay in place; operands broadcast only as scalars, never along a lane."""
    lanes, out = _common(ops), tuple(eqn.outvars[0].aval.shape)
    if lanes is None:
        return None
    if any(len(o.shape) != len(out) or any(o.shape[a] != out[a] for a in lanes)
           for o in ops if o.lanes is not None):
        return None
    if any(o.lanes is None and len(o.shape) not in (0, len(out)) for o in ops):
        return None
    return lanes


def _dropping(ops: list, dropped: Sequence[int]) -> tuple | None:
    """The lanes of the only operand with lanes, once the axes `dropped` are gone (a
    reduction's, a squeeze's); None where one of them is a lane axis."""
    v = _first_only(ops)
    if v is None:
        return None
    return _kept(v.lanes, [a for a in range(len(v.shape)) if a not in set(dropped)])


def _reduce(eqn: Any, ops: list) -> tuple | None:
    return _dropping(ops, jx.reduced_axes(eqn))


def _along_axis(eqn: Any, ops: list) -> tuple | None:
    lanes = _common(ops)
    axis = eqn.params.get("axis", eqn.params.get("dimension"))
    return None if lanes is None or axis in lanes else lanes


def _broadcast_in_dim(eqn: Any, ops: list) -> tuple | None:
    """Lane axes map through `broadcast_dimensions`; a lane axis of size 1 broadcast to
    more is not lane-wise."""
    if len(ops) != 1 or ops[0].lanes is None:
        return None
    v, dims, shape = ops[0], eqn.params["broadcast_dimensions"], eqn.params["shape"]
    if any(shape[dims[a]] != v.shape[a] for a in v.lanes):
        return None
    return tuple(dims[a] for a in v.lanes)


def _transpose(eqn: Any, ops: list) -> tuple | None:
    v = _first_only(ops)
    perm = list(eqn.params["permutation"])
    return None if v is None else tuple(perm.index(a) for a in v.lanes)


def _squeeze(eqn: Any, ops: list) -> tuple | None:
    return _dropping(ops, eqn.params["dimensions"])


def _reshape(eqn: Any, ops: list) -> tuple | None:
    v = _first_only(ops)
    if v is None or eqn.params.get("dimensions") is not None:
        return None
    return reshaped_axes(v.shape, tuple(eqn.params["new_sizes"]), v.lanes)


def _slice(eqn: Any, ops: list) -> tuple | None:
    """Slicing along other axes (each lane axis taken whole)."""
    v = _first_only(ops)
    if v is None:
        return None
    p = eqn.params
    strides = p.get("strides") or (1,) * len(v.shape)
    if any(p["start_indices"][a] != 0 or p["limit_indices"][a] != v.shape[a] or strides[a] != 1
           for a in v.lanes):
        return None
    return v.lanes


def _rev(eqn: Any, ops: list) -> tuple | None:
    v = _first_only(ops)
    if v is None or any(a in eqn.params["dimensions"] for a in v.lanes):
        return None
    return v.lanes


def _pad(eqn: Any, ops: list) -> tuple | None:
    """Padding (with a value the same in every lane) along other axes."""
    v = _first_only(ops)
    if v is None or any(tuple(eqn.params["padding_config"][a]) != (0, 0, 0) for a in v.lanes):
        return None
    return v.lanes


def dot_roles(eqn: Any, lanes_on_rhs: bool) -> tuple:
    """A `dot_general`'s dimension numbers seen from the operand with lanes:
    (its contracting dims, the other's, its batch dims, the other's).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> eqn = jax.make_jaxpr(jnp.dot)(jnp.ones((2, 3)), jnp.ones(3)).eqns[0]
        >>> dot_roles(eqn, lanes_on_rhs=False), dot_roles(eqn, lanes_on_rhs=True)
        (((1,), (0,), (), ()), ((0,), (1,), (), ()))
    """
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lc, rc, lb, rb = tuple(lc), tuple(rc), tuple(lb), tuple(rb)
    return (rc, lc, rb, lb) if lanes_on_rhs else (lc, rc, lb, rb)


def _dot_general(eqn: Any, ops: list) -> tuple | None:
    """One operand with one lane axis, a batch or free dimension of the product (a
    lane axis contracted sums over the lanes)."""
    lhs, rhs = ops
    if (lhs.lanes is None) == (rhs.lanes is None):
        return None
    swap = rhs.lanes is not None
    v, other = (rhs, lhs) if swap else (lhs, rhs)
    vc, oc, vb, ob = dot_roles(eqn, swap)
    if len(v.lanes) != 1:
        return None
    (a,) = v.lanes
    if a in vb:  # a batch dimension: output axis = its position among batch dims
        return (vb.index(a),)
    if a in vc:
        return None
    v_free = [d for d in range(len(v.shape)) if d not in vc and d not in vb]
    o_free = [d for d in range(len(other.shape)) if d not in oc and d not in ob]
    return (len(vb) + (len(o_free) + v_free.index(a) if swap else v_free.index(a)),)


def _gather(eqn: Any, ops: list) -> tuple | None:
    """Indexing by indices with lanes (`means[z]`), or a table with lanes by indices
    that batch over them (`take_along_axis`): output position b reads the indices at
    b, and the table only in the lanes that the indices' batching dimensions pair with
    b's, so the lane axes carry over."""
    operand, indices = ops
    dn = eqn.params["dimension_numbers"]
    lanes = None  # the lane axes, as dimensions of the indices
    if indices.lanes is not None:
        if len(indices.shape) - 1 in indices.lanes:
            return None  # the index vector runs across lanes
        lanes = indices.lanes
    if operand.lanes is not None:
        if any(a not in dn.operand_batching_dims for a in operand.lanes):
            return None  # a lane read by other lanes' positions
        paired = tuple(dn.start_indices_batching_dims[dn.operand_batching_dims.index(a)]
                       for a in operand.lanes)
        if lanes is not None and paired != lanes:
            return None
        lanes = paired
    offset = set(dn.offset_dims)
    batch_positions = [d for d in range(len(eqn.outvars[0].aval.shape)) if d not in offset]
    assert lanes is not None  # lane_axes's operands: at least one has lanes
    return tuple(batch_positions[a] for a in lanes)


def gather_reads_by_lane(eqn: Any, index_lanes: tuple) -> bool:
    """Whether a gather reads its table at positions paired with the indices' lanes
    `index_lanes` (batching dimensions), so that lanes read different rows.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> rows = jax.vmap(lambda row, j: row[j])          # row i of the table, at j[i]
        >>> eqn = [e for e in jax.make_jaxpr(rows)(jnp.ones((4, 3)), jnp.zeros(4, int)).eqns
        ...        if structure_of(e) is Structure.GATHER][0]
        >>> gather_reads_by_lane(eqn, (0,))
        True
    """
    return any(a in eqn.params["dimension_numbers"].start_indices_batching_dims
               for a in index_lanes)


def gather_by_select(eqn: Any, params: dict | None, table: Any, indices: Any,
                     max_rows: int) -> list | None:
    """`eqn`, a gather of `table`'s rows along one axis at `indices` (with `params` in
    place of its own where given), computed as a select over the rows summed: the same
    values and derivatives (an index out of range clamped, filled or, promised in
    bounds, without a derivative, as the gather's mode says), or None where the gather
    reads otherwise or the axis has more than `max_rows` rows. On a CPU a small gather
    and its transpose (a scatter) cost several microseconds where the select costs a
    fraction of one (enumeration's tables read at a site's value).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> table, at = jnp.arange(6.0).reshape(3, 2), jnp.array([2, 0])
        >>> eqn = [e for e in jax.make_jaxpr(lambda t, i: t[i])(table, at).eqns
        ...        if structure_of(e) is Structure.GATHER][0]
        >>> gather_by_select(eqn, None, table, at[:, None], max_rows=8)[0].tolist()
        [[4.0, 5.0], [0.0, 1.0]]
    """
    params = params or eqn.params
    dn, shape = params["dimension_numbers"], jnp.shape(table)
    mode = jax.lax.GatherScatterMode.from_any(params["mode"])
    fill = mode is jax.lax.GatherScatterMode.FILL_OR_DROP
    # an index of an axis read whole is clamped to 0 (unless filled): not read; a table
    # of one row along its batching axes is the same for every index: read at 0
    read = [j for j, d in enumerate(dn.start_index_map)
            if fill or params["slice_sizes"][d] != shape[d]]
    if len(read) != 1 or any(shape[d] != 1 for d in dn.operand_batching_dims):
        return None
    kept = [d for d in range(len(shape)) if d not in dn.operand_batching_dims]
    table = jnp.reshape(table, [shape[d] for d in kept])
    sizes = [params["slice_sizes"][d] for d in kept]
    a = kept.index(dn.start_index_map[read[0]])
    collapsed = {kept.index(d) for d in dn.collapsed_slice_dims}
    rows = jnp.shape(table)[a]
    if (rows > max_rows or sizes[a] != 1 or not collapsed <= {a}
            or any(sizes[d] != jnp.shape(table)[d] for d in range(len(kept)) if d != a)
            or (fill and not jnp.issubdtype(jnp.result_type(table), jnp.inexact))):
        return None
    index = indices[..., read[0]]
    inside = (index >= 0) & (index < rows)
    if not fill:   # XLA clamps an index out of range
        index = jnp.clip(index, 0, rows - 1)
    table = jnp.moveaxis(table, a, 0)
    if a not in collapsed:
        table = jnp.expand_dims(table, 1 + a)
    hit = (index[..., None] == jnp.arange(rows, dtype=index.dtype))
    hit = hit.reshape(hit.shape + (1,) * (table.ndim - 1))
    out = jnp.sum(jnp.where(hit, table, jnp.zeros((), table.dtype)), axis=index.ndim)
    inside = inside.reshape(index.shape + (1,) * (out.ndim - index.ndim))
    if fill:
        value = jnp.nan if params["fill_value"] is None else params["fill_value"]
        out = jnp.where(inside, out, jnp.asarray(value, out.dtype))
    elif mode is jax.lax.GatherScatterMode.PROMISE_IN_BOUNDS:   # its scatter drops them
        out = jnp.where(inside, out, jax.lax.stop_gradient(out))
    batch = [d for d in range(out.ndim) if d not in dn.offset_dims]
    return [jnp.moveaxis(out, list(range(out.ndim)), batch + list(dn.offset_dims))]


def _concatenate(eqn: Any, ops: list) -> tuple | None:
    """Joining along an axis that is not a lane axis (the index vectors JAX builds for
    `means[z]`)."""
    lanes = _common(ops)
    return None if lanes is None or eqn.params["dimension"] in lanes else lanes


#: structure -> where its equations move lane axes (`lane_axes`)
AXIS_RULES: dict[Structure, Callable[[Any, list], tuple | None]] = {
    Structure.ELEMENTWISE: _elementwise,
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


def with_lanes_of_size_one(eqn: Any, axes: tuple) -> dict | None:
    """`eqn`'s parameters for its outputs' lane axes `axes` at size 1 (a broadcast's
    `shape`, a reshape's `new_sizes`), where the parameters name the output's shape;
    None where they do not (the equation runs on size-1 lanes as it is).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> eqn = jax.make_jaxpr(lambda x: jnp.broadcast_to(x, (4, 3)))(jnp.ones(3)).eqns[0]
        >>> with_lanes_of_size_one(eqn, (0,))["shape"]
        (1, 3)
    """
    names: dict[Structure | None, str] = {Structure.BROADCAST: "shape",
                                          Structure.RESHAPE: "new_sizes"}
    key = names.get(structure_of(eqn))
    if key is None:
        return None
    sizes = list(eqn.params[key])
    for a in axes:
        sizes[a] = 1
    return dict(eqn.primitive.get_bind_params(eqn.params), **{key: tuple(sizes)})


def repeated_axes(eqn: Any, shape: Sequence[int]) -> tuple:
    """The output axes along which a broadcast repeats an operand of `shape` (axes it
    adds, and axes of size 1 it expands); () for any other equation.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> eqn = jax.make_jaxpr(lambda x: jnp.broadcast_to(x, (4, 3)))(jnp.ones((1, 3))).eqns[0]
        >>> repeated_axes(eqn, (1, 3))
        (0,)
    """
    if structure_of(eqn) is not Structure.BROADCAST:
        return ()
    dims, out = tuple(eqn.params["broadcast_dimensions"]), eqn.params["shape"]
    return tuple(d for d in range(len(out))
                 if out[d] > 1 and (d not in dims or shape[dims.index(d)] == 1))

