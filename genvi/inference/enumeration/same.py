"""Values the same in every lane of a summed site (`Same`), and their rule table.

Enumeration evaluates a log density with every lane of a discrete site at one value
v. A `Same` holds such a value once, its lane axes of size 1, so what depends on the
site alone (a mixture weight, a component's mean, an HMM's transition row) is
computed once per value instead of once per lane, as NumPyro's enumeration
broadcasts a value of shape (K, 1) against its plate. A broadcast that does not
depend on the site (a plate's parameters, shared by its lanes) is held the same way
(`plain`, `lazy_broadcast`), so a shared table indexed by the site (a categorical's
log probabilities) is read once per value too. Where an equation meets lane data (an
observation) or reshapes the lanes, its rule returns None and the evaluator
broadcasts the value (`Same.materialized`): the lane rules of
`genvi.replays.lane_rules` take over from there.

Where an equation moves the lanes is the registry's (`genvi.core.axis_rules.lane_axes`,
one axis rule per structure of primitive, which the lane rules of
`genvi.replays.lane_rules` read too); this module adds only when the outputs are one
value for every lane (`same_rule`) and runs the equation on the size-1 lanes.

Example:
    >>> import jax.numpy as jnp
    >>> z = Same(jnp.full((1,), 2), axes=(0,), lanes=(4,))
    >>> z.shape, z.local().base.tolist()
    ((4,), [2, 2, 2, 2])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from genvi.core import jaxpr as jx
from genvi.core.axis_rules import (Operand, gather_reads_by_lane, lane_axes, repeated_axes,
                                   with_lanes_of_size_one)
from genvi.core.rules import Structure, structure_of
from genvi.replays.engine import Local, Tracked


@dataclass
class Same(Tracked):
    """A lane-tracked value whose lanes all hold one value: `value` has the full shape
    with each lane axis (`axes`, in the site's order) of size 1; `lanes` are their
    sizes."""

    value: Any
    axes: tuple
    lanes: tuple
    plain: bool = False  # a broadcast that does not depend on the site

    @property
    def shape(self) -> tuple:
        shape = list(jnp.shape(self.value))
        for a, n in zip(self.axes, self.lanes):
            shape[a] = n
        return tuple(shape)

    def local(self) -> Local:
        """The value in every lane, as the lane rules track it (one copy)."""
        full = jnp.broadcast_to(self.value, self.shape)
        return Local(full, full, self.axes)

    def materialized(self) -> Any:
        """The value broadcast: an array where it does not depend on the site, else a
        `Local`."""
        return jnp.broadcast_to(self.value, self.shape) if self.plain else self.local()


def _plain(x: Any) -> bool:
    return isinstance(x, (jax.Array, np.ndarray, np.generic, int, float, bool))


#: the structures whose equations a `Same` passes through as one value
SAME_STRUCTURES = frozenset({Structure.ELEMENTWISE, Structure.REDUCE, Structure.ALONG_AXIS,
                             Structure.BROADCAST, Structure.TRANSPOSE, Structure.SQUEEZE,
                             Structure.RESHAPE, Structure.GATHER, Structure.CONCATENATE})


def _holds_one_value(eqn: Any, ins: list, structure: Structure) -> bool:
    """Whether the outputs are one value for every lane: the operands are `Same`s of
    one set of lanes, or scalars; a gather reads by `Same` indices a table that is the
    same in every lane (a `Same` read by its own lanes, or a lane-free table that no
    lane reads at its own position)."""
    same = [x for x in ins if isinstance(x, Same)]
    if any(x.lanes != same[0].lanes for x in same):
        return False
    if structure is Structure.GATHER:
        table, indices = ins
        return isinstance(indices, Same) and (
            isinstance(table, Same)
            or (_plain(table) and not gather_reads_by_lane(eqn, indices.axes)))
    return all(isinstance(x, Same) or (_plain(x) and jnp.ndim(x) == 0) for x in ins)


def same_rule(eqn: Any, ins: list) -> list | None:
    """`eqn` on operands of which some are `Same`: its outputs, computed once on the
    size-1 lanes, or None where the lanes must be broadcast (the equation meets lane
    data or reshapes the lanes). Where the lanes go is the registry's
    (`genvi.core.axis_rules.lane_axes`, the axis rules the lane rules read too)."""
    structure = structure_of(eqn)
    if structure is Structure.BROADCAST and len(ins) == 1 and ins[0].plain:
        return _widened(eqn, ins[0])
    if structure not in SAME_STRUCTURES or not _holds_one_value(eqn, ins, structure):
        return None
    first = next(x for x in ins if isinstance(x, Same))
    axes = lane_axes(eqn, [Operand(x.shape, x.axes) if isinstance(x, Same)
                           else Operand(jnp.shape(x), None) for x in ins])
    if axes is None:
        return None
    if structure is Structure.RESHAPE and (list(axes) != sorted(axes)
                                          or list(first.axes) != sorted(first.axes)):
        return None  # size-1 lanes reshaped keep their order only where it is kept
    vals = [x.value if isinstance(x, Same) else x for x in ins]
    params = with_lanes_of_size_one(eqn, axes)
    outs = None
    if structure is Structure.GATHER:
        outs = _selected(params or eqn.params, *vals)
    if outs is None:
        outs = jx.eval_eqn(eqn, vals) if params is None else jx.eval_eqn_with(eqn, vals, params)
    plain = all(x.plain for x in ins if isinstance(x, Same))
    return [Same(o, axes, first.lanes, plain) for o in outs]


#: a table read at a site's value is read by a select over its rows up to this many
#: rows (`_selected`), by a gather beyond
SELECT_ROWS = 64


def _selected(params: dict, table: Any, indices: Any) -> list | None:
    """A gather of `table` along one axis at `indices` (a site's values, one per joint
    value: a mixture's means, a transition table's rows), computed as a select over
    the table's rows summed, or None where the gather is not of that form. Both are
    exact; on a CPU the gather and its transpose (a scatter) cost several microseconds
    a step where the select costs a fraction of one (`genvi_experiments/bench/
    enumeration_peers.py`), and enumeration's tables are small."""
    dn = params["dimension_numbers"]
    batching, shape = dn.operand_batching_dims, jnp.shape(table)
    if len(dn.start_index_map) != 1 or any(shape[d] != 1 for d in batching):
        return None
    # a table of one row along its batching axes (one table for every index): those
    # axes dropped, each read at 0
    kept = [d for d in range(len(shape)) if d not in batching]
    table = jnp.reshape(table, [shape[d] for d in kept])
    sizes = [params["slice_sizes"][d] for d in kept]
    a = kept.index(dn.start_index_map[0])
    collapsed = {kept.index(d) for d in dn.collapsed_slice_dims}
    rows, rank = jnp.shape(table)[a], len(kept)
    mode = jax.lax.GatherScatterMode.from_any(params["mode"])
    fill = mode is jax.lax.GatherScatterMode.FILL_OR_DROP
    if (rows > SELECT_ROWS or sizes[a] != 1 or not collapsed <= {a}
            or any(sizes[d] != jnp.shape(table)[d] for d in range(rank) if d != a)
            or (fill and not jnp.issubdtype(jnp.result_type(table), jnp.inexact))):
        return None
    index = indices[..., 0]
    if not fill:   # XLA clamps an index out of range
        index = jnp.clip(index, 0, rows - 1)
    table = jnp.moveaxis(table, a, 0)
    if a not in collapsed:
        table = jnp.expand_dims(table, 1 + a)
    hit = (index[..., None] == jnp.arange(rows, dtype=index.dtype))
    hit = hit.reshape(hit.shape + (1,) * (table.ndim - 1))
    out = jnp.sum(jnp.where(hit, table, jnp.zeros((), table.dtype)), axis=index.ndim)
    if fill:
        inside = ((index >= 0) & (index < rows)).reshape(index.shape + (1,) * (out.ndim - index.ndim))
        value = jnp.nan if params["fill_value"] is None else params["fill_value"]
        out = jnp.where(inside, out, jnp.asarray(value, out.dtype))
    batch = [d for d in range(out.ndim) if d not in dn.offset_dims]
    return [jnp.moveaxis(out, list(range(out.ndim)), batch + list(dn.offset_dims))]


def _widened(eqn: Any, x: Same) -> list | None:
    """A broadcast of a value that does not depend on the sites, held once along its
    axes and along those the broadcast repeats it (so it stays one value where it
    meets values of more plates)."""
    mapped = lane_axes(eqn, [Operand(x.shape, x.axes)])
    if mapped is None:
        return None
    axes = tuple(sorted(set(mapped) | set(repeated_axes(eqn, x.shape))))
    shape = eqn.outvars[0].aval.shape
    (value,) = jx.eval_eqn_with(eqn, [x.value], with_lanes_of_size_one(eqn, axes))
    return [Same(value, axes, tuple(shape[d] for d in axes), plain=True)]


def lazy_broadcast(eqn: Any, ins: list) -> list | None:
    """A broadcast of a value that does not depend on the site, held unbroadcast
    (a plain `Same` along the axes it repeats the value); None for anything else."""
    if len(ins) != 1:
        return None
    axes = repeated_axes(eqn, jnp.shape(ins[0]))
    shape = eqn.outvars[0].aval.shape
    if not axes or 0 in shape:
        return None
    (value,) = jx.eval_eqn_with(eqn, ins, with_lanes_of_size_one(eqn, axes))
    return [Same(value, axes, tuple(shape[d] for d in axes), plain=True)]
