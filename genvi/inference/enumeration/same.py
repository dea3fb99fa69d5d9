"""Values the same in every lane of a summed site (`Same`), and their rule table.

A `Same` holds the value once, so what depends on the site alone (a component's mean,
an HMM's transition row) is computed once per value, as NumPyro broadcasts a value of
shape (K, 1) against its plate. Where the lanes go is the registry's
(`genvi.core.axis_rules.lane_axes`, which the replay engine's lane rules read too).

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
    with each lane axis (`axes`, in the site's order) of size 1, of sizes `lanes`."""

    value: Any
    axes: tuple
    lanes: tuple
    plain: bool = False  # a broadcast that does not depend on the site

    @property
    def shape(self) -> tuple:
        lanes = dict(zip(self.axes, self.lanes))
        return tuple(lanes.get(d, n) for d, n in enumerate(jnp.shape(self.value)))

    def local(self) -> Local:
        """The value in every lane, as the lane rules track it (one copy)."""
        full = jnp.broadcast_to(self.value, self.shape)
        return Local(full, full, self.axes)

    def materialized(self) -> Any:
        """The value broadcast: an array where `plain`, else a `Local`."""
        return jnp.broadcast_to(self.value, self.shape) if self.plain else self.local()


def every_lane(value: Any, lanes: tuple, dtype: Any, plain: bool = False) -> Any:
    """`value` in every lane of `lanes`, held once (a `Same`; `plain`: not tracked, so
    what reads it alone is computed once and no lanes are followed)."""
    if not lanes:
        return jnp.asarray(value, dtype)
    one = jnp.full((1,) * len(lanes), value, dtype)
    return Same(one, tuple(range(len(lanes))), tuple(lanes), plain=plain)


_ARRAYS = (jax.Array, np.ndarray, np.generic, int, float, bool)
#: the structures whose equations a `Same` passes through as one value
SAME_STRUCTURES = frozenset({Structure.ELEMENTWISE, Structure.REDUCE, Structure.ALONG_AXIS,
                             Structure.BROADCAST, Structure.TRANSPOSE, Structure.SQUEEZE,
                             Structure.RESHAPE, Structure.GATHER, Structure.CONCATENATE})


def _holds_one_value(eqn: Any, ins: list, structure: Structure) -> bool:
    """Whether the outputs are one value for every lane: the operands are `Same`s of one
    set of lanes, or scalars; or a gather reads by `Same` indices a `Same` table, or a
    lane-free one that no lane reads at its own position."""
    same = [x for x in ins if isinstance(x, Same)]
    if any(x.lanes != same[0].lanes for x in same):
        return False
    if structure is Structure.GATHER:
        table, indices = ins
        return isinstance(indices, Same) and (isinstance(table, Same) or (
            isinstance(table, _ARRAYS) and not gather_reads_by_lane(eqn, indices.axes)))
    return all(isinstance(x, Same) or (isinstance(x, _ARRAYS) and jnp.ndim(x) == 0) for x in ins)


def same_rule(eqn: Any, ins: list) -> list | None:
    """`eqn` on operands some of which are `Same`: its outputs computed once on the size-1
    lanes, or None where the lanes must be broadcast (it meets lane data, reshapes them)."""
    structure = structure_of(eqn)
    if structure is Structure.BROADCAST and len(ins) == 1 and ins[0].plain:
        return lazy_broadcast(eqn, ins)
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


#: the most rows of a table read at a site's value by a select (`_selected`), not a gather
SELECT_ROWS = 64


def _selected(params: dict, table: Any, indices: Any) -> list | None:
    """A gather of `table` rows at `indices` (a site's values: a mixture's means) as a
    sum of a select over the rows, or None where it is not of that form. On a CPU the
    gather and its transpose (a scatter) cost several microseconds a step where the
    select costs a fraction of one (`genvi_experiments/bench/enumeration_peers.py`)."""
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
    if (rows > SELECT_ROWS or sizes[a] != 1 or not collapsed <= {a}
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


def lazy_broadcast(eqn: Any, ins: list) -> list | None:
    """A broadcast of a value that does not depend on the sites, held unbroadcast: a
    plain `Same` along the axes it repeats the value (and a plain `Same`'s own, so it
    stays one value where it meets values of more plates); None for anything else."""
    if len(ins) != 1:
        return None
    (x,), shape = ins, eqn.outvars[0].aval.shape
    if isinstance(x, Same):
        mapped = lane_axes(eqn, [Operand(x.shape, x.axes)])
        if mapped is None:
            return None
        axes, x = tuple(sorted(set(mapped) | set(repeated_axes(eqn, x.shape)))), x.value
    else:
        axes = repeated_axes(eqn, jnp.shape(x))
        if not axes or 0 in shape:
            return None
    (value,) = jx.eval_eqn_with(eqn, [x], with_lanes_of_size_one(eqn, axes))
    return [Same(value, axes, tuple(shape[d] for d in axes), plain=True)]
