"""The enumeration evaluator's rule table for values the same in every lane (`Same`).

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

One rule per structure of primitive (the registry `genvi.core.rules`, keyed by
primitive objects, which the lane rules of `genvi.replays.lane_rules` read too),
registered in `SAME_RULES`, each reading the parameters of its own primitives.

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
from genvi.core.rules import Structure, structure_of
from genvi.replays.engine import Local
from genvi.replays.lane_rules import reshaped_axes


@dataclass
class Same:
    """A lane-tracked value whose lanes all hold one value: `value` has the full shape
    with each lane axis (`axes`, in the site's order) of size 1; `lanes` are their
    sizes."""

    value: Any
    axes: tuple
    lanes: tuple
    plain: bool = False  # a broadcast that does not depend on the site
    enum_marker = True

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


def _alike(ins: list) -> Same | None:
    """The first `Same` operand, where every `Same` has its lanes at the same axes."""
    same = [x for x in ins if isinstance(x, Same)]
    first = same[0]
    if any((x.axes, x.lanes) != (first.axes, first.lanes) for x in same):
        return None
    return first


def _on_values(eqn: Any, ins: list, axes: tuple, lanes: tuple, params: dict | None = None
               ) -> list:
    vals = [x.value if isinstance(x, Same) else x for x in ins]
    outs = jx.eval_eqn(eqn, vals) if params is None else jx.eval_eqn_with(eqn, vals, params)
    plain = all(x.plain for x in ins if isinstance(x, Same))
    return [Same(o, axes, lanes, plain) for o in outs]


def _elementwise(eqn: Any, ins: list) -> list | None:
    """Scalars are the only lane data an elementwise equation may meet (any other
    plain operand has the lanes' extent, so it may differ between lanes)."""
    first = _alike(ins)
    if first is None or any(not isinstance(x, Same) and not (_plain(x) and jnp.ndim(x) == 0)
                            for x in ins):
        return None
    return _on_values(eqn, ins, first.axes, first.lanes)


def _only(ins: list) -> Same | None:
    """The single operand, when it is a `Same` and the others are absent."""
    return ins[0] if len(ins) == 1 and isinstance(ins[0], Same) else None


def _reduce(eqn: Any, ins: list) -> list | None:
    v = _only(ins)
    if v is None:
        return None
    axes = tuple(eqn.params["axes"])
    if set(axes) & set(v.axes):
        return None  # across lanes: a sum becomes per-lane terms (`Additive`) as a `Local`
    kept = [a for a in range(jnp.ndim(v.value)) if a not in axes]
    return _on_values(eqn, ins, tuple(kept.index(a) for a in v.axes), v.lanes)


def _along_axis(eqn: Any, ins: list) -> list | None:
    first = _alike(ins)
    if first is None or not all(isinstance(x, Same) for x in ins):
        return None
    axis = eqn.params.get("axis", eqn.params.get("dimension"))
    return None if axis in first.axes else _on_values(eqn, ins, first.axes, first.lanes)


def _broadcast_in_dim(eqn: Any, ins: list) -> list | None:
    v = _only(ins)
    if v is None:
        return None
    dims = tuple(eqn.params["broadcast_dimensions"])
    shape = list(eqn.params["shape"])
    axes = tuple(dims[a] for a in v.axes)
    if any(shape[b] != n for b, n in zip(axes, v.lanes)):
        return None  # a lane axis of size 1 broadcast: not lane-wise
    for b in axes:
        shape[b] = 1
    params = dict(eqn.primitive.get_bind_params(eqn.params), shape=tuple(shape))
    return _on_values(eqn, ins, axes, v.lanes, params)


def _transpose(eqn: Any, ins: list) -> list | None:
    v = _only(ins)
    if v is None:
        return None
    perm = list(eqn.params["permutation"])
    return _on_values(eqn, ins, tuple(perm.index(a) for a in v.axes), v.lanes)


def _squeeze(eqn: Any, ins: list) -> list | None:
    v = _only(ins)
    if v is None:
        return None
    dims = set(eqn.params["dimensions"])
    if dims & set(v.axes):
        return None
    kept = [a for a in range(jnp.ndim(v.value)) if a not in dims]
    return _on_values(eqn, ins, tuple(kept.index(a) for a in v.axes), v.lanes)


def _reshape(eqn: Any, ins: list) -> list | None:
    """A reshape that keeps each lane axis as one axis of the same size with the same
    number of elements before it (size-1 axes added or dropped, other axes merged or
    split): the same reshape with those axes of size 1."""
    v = _only(ins)
    if v is None or eqn.params.get("dimensions") is not None:
        return None
    new = list(eqn.params["new_sizes"])
    axes = reshaped_axes(v.shape, new, v.axes)
    if axes is None or list(axes) != sorted(axes) or list(v.axes) != sorted(v.axes):
        return None
    for b in axes:
        new[b] = 1
    params = dict(eqn.primitive.get_bind_params(eqn.params), new_sizes=tuple(new))
    return _on_values(eqn, ins, tuple(axes), v.lanes, params)


def _gather(eqn: Any, ins: list) -> list | None:
    """Indexing by a `Same` (`means[z]`, `trans[z_prev]`, a categorical's log density
    of its value): the gather of the value's size-1 lanes, where the operand is the
    same in every lane (lane-free, or a `Same` read by its own lanes)."""
    operand, indices = ins
    if not isinstance(indices, Same):
        return None
    dn = eqn.params["dimension_numbers"]
    if len(jnp.shape(indices.value)) - 1 in indices.axes:
        return None  # the index vector runs across lanes
    paired = {i: o for o, i in zip(dn.operand_batching_dims, dn.start_indices_batching_dims)}
    if isinstance(operand, Same):
        if (operand.lanes != indices.lanes
                or tuple(paired.get(a) for a in indices.axes) != operand.axes):
            return None
    elif not _plain(operand) or any(a in paired for a in indices.axes):
        return None  # an operand that differs between lanes
    offset = set(dn.offset_dims)
    out_ndim = len(eqn.outvars[0].aval.shape)
    batch_positions = [d for d in range(out_ndim) if d not in offset]
    return _on_values(eqn, ins, tuple(batch_positions[a] for a in indices.axes),
                      indices.lanes)


def _concatenate(eqn: Any, ins: list) -> list | None:
    first = _alike(ins)
    if first is None or not all(isinstance(x, Same) for x in ins) \
            or eqn.params["dimension"] in first.axes:
        return None
    return _on_values(eqn, ins, first.axes, first.lanes)


SAME_RULES = {
    Structure.ELEMENTWISE: _elementwise,
    Structure.REDUCE: _reduce,
    Structure.ALONG_AXIS: _along_axis,
    Structure.BROADCAST: _broadcast_in_dim,
    Structure.TRANSPOSE: _transpose,
    Structure.SQUEEZE: _squeeze,
    Structure.RESHAPE: _reshape,
    Structure.GATHER: _gather,
    Structure.CONCATENATE: _concatenate,
}


def lazy_broadcast(eqn: Any, ins: list) -> list | None:
    """A broadcast of a value that does not depend on the site, held unbroadcast
    (a plain `Same` along the axes it broadcasts); None for anything else."""
    if structure_of(eqn) is not Structure.BROADCAST or len(ins) != 1:
        return None
    dims = tuple(eqn.params["broadcast_dimensions"])
    shape = list(eqn.params["shape"])
    old = jnp.shape(ins[0])
    axes = tuple(d for d in range(len(shape))
                 if shape[d] > 1 and (d not in dims or old[dims.index(d)] == 1))
    if not axes or 0 in shape:
        return None
    lanes = tuple(shape[d] for d in axes)
    for d in axes:
        shape[d] = 1
    params = dict(eqn.primitive.get_bind_params(eqn.params), shape=tuple(shape))
    (value,) = jx.eval_eqn_with(eqn, ins, params)
    return [Same(value, axes, lanes, plain=True)]


def same_rule(eqn: Any, ins: list) -> list | None:
    """`eqn` on operands of which some are `Same`: its outputs, or None where the
    lanes must be broadcast (the equation meets lane data)."""
    rule = SAME_RULES.get(structure_of(eqn))
    return None if rule is None else rule(eqn, ins)
