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
from genvi.core.axis_rules import (Operand, gather_by_select, gather_reads_by_lane, lane_axes,
                                   repeated_axes, with_lanes_of_size_one)
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


#: the most rows of a table read at a site's value by a select, not a gather
SELECT_ROWS = 64


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
        # a gather's two operands: the table and the indices
        outs = gather_by_select(eqn, params, *vals, max_rows=SELECT_ROWS)  # type: ignore[misc]
    if outs is None:
        outs = jx.eval_eqn(eqn, vals) if params is None else jx.eval_eqn_with(eqn, vals, params)
    plain = all(x.plain for x in ins if isinstance(x, Same))
    return [Same(o, axes, first.lanes, plain) for o in outs]


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
    params = with_lanes_of_size_one(eqn, axes)
    assert params is not None  # a broadcast's (axes are only found on one): its shape
    (value,) = jx.eval_eqn_with(eqn, [x], params)
    return [Same(value, axes, tuple(shape[d] for d in axes), plain=True)]
