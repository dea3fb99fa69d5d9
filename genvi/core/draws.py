"""One draw of an expectation's estimator inside an objective program: `draw_p`.

Calling an `Expectation` (a composite such as `gv.exp(e)`, `e1 * e2`,
`gv.average(e, n)`, or one of a user's own) inside an `@gv.expectation` program binds
`draw_p`: the value there is one draw of the expectation's unbiased estimator at the
call's arguments, independent of every other call. The ADEV interpreter runs its
forward estimator, `dual_estimate`, with the draw's own key and the arguments'
tangents, so the caller's estimator stays unbiased in value and gradient (the draw
is unbiased given its arguments, and so is its tangent for theirs); replays of the
caller draw it again with the same key. Under `jax.vmap` every lane is an
independent draw: the first operand is a placeholder that carries the batch axes
(`lanes` of them, in front of every operand).

Example:
    >>> import jax, genvi as gv
    >>> @gv.expectation
    ... def x(mu):
    ...     return gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
    >>> twice = 2.0 * x                         # a composite
    >>> @gv.expectation
    ... def outer(mu):
    ...     return twice(mu) + 1.0              # one draw of 2·x's estimator
    >>> g = outer.grad_estimate(jax.random.key(0), 0.5)   # unbiased for 2
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp

from genvi.core import jaxpr as jx
from genvi.core.context import RunObserver, using
from genvi.core.tracing import merge_args, split_args


def _draw_aval(lanes_of, *avals, expectation, static, treedef, mask, lanes):
    inner = [jax.ShapeDtypeStruct(a.shape[lanes:], a.dtype) for a in avals]
    with using(observer=RunObserver()):  # a shape, not a run: nothing for explain to record
        out = jax.eval_shape(lambda *leaves: expectation.dual_estimate(
            jax.random.key(0), merge_args(list(leaves), list(static), treedef, mask),
            None).primal, *inner)
    return jx.shaped(tuple(lanes_of.shape) + tuple(out.shape), out.dtype)


draw_p = jx.make_primitive("genvi_draw", _draw_aval)


def _batch(axis_data, args, dims, **params):
    # every operand gains the batch axis in front (shared ones broadcast): each lane
    # is its own draw, with its own key, also where the arguments are shared
    size = axis_data.size
    moved = [jnp.moveaxis(a, d, 0) if d is not None else jnp.broadcast_to(a, (size,) + a.shape)
             for a, d in zip(args, dims)]
    return draw_p.bind(*moved, **{**params, "lanes": params["lanes"] + 1}), 0


jx.register_fancy_batching(draw_p, _batch)


def bind_draw(expectation: Any, args: tuple) -> Any:
    """Bind one draw of `expectation`'s estimator at `args` (a pytree)."""
    dyn, static, treedef, mask = split_args(args)
    return draw_p.bind(jnp.zeros((), jnp.int8), *dyn, expectation=expectation,
                       static=tuple(static), treedef=treedef, mask=mask, lanes=0)


@dataclasses.dataclass(frozen=True)
class DrawEqn:
    """A typed view of a `draw_p` equation: the expectation, how its operands make its
    arguments, and its leading batch axes (operand 0 is the placeholder carrying them).

    Example:
        >>> import jax, genvi as gv
        >>> @gv.expectation
        ... def x(mu):
        ...     return gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
        >>> (eqn,) = jax.make_jaxpr(lambda m: bind_draw(2.0 * x, (m,)))(0.0).jaxpr.eqns[-1:]
        >>> DrawEqn.of(eqn).lanes, DrawEqn.of(eqn).label
        (0, '2.0 * x')
    """

    expectation: Any
    static: tuple
    treedef: Any
    mask: tuple
    lanes: int

    @staticmethod
    def of(eqn: Any) -> "DrawEqn":
        p = eqn.params
        return DrawEqn(p["expectation"], p["static"], p["treedef"], p["mask"], p["lanes"])

    @property
    def label(self) -> str:
        return getattr(self.expectation, "_label", "expectation")

    def _args(self, leaves: list, static: list) -> tuple:
        return merge_args(list(leaves), static, self.treedef, self.mask)

    def estimate(self, key: Any, operands: list, tangents: list | None = None) -> tuple:
        """`(value, tangent or None)`: one draw per lane of the estimator at the
        equation's `operands` (with their `tangents`, None for none); the lanes' keys
        are split from `key`."""
        primals = list(operands[1:])
        tangents = None if tangents is None else list(tangents[1:])
        which = [i for i, t in enumerate(tangents or []) if t is not None]

        def one(k, ps, ts):
            targs = None
            if which:
                leaves = [None] * len(primals)
                for i, t in zip(which, ts):
                    leaves[i] = t
                targs = self._args(leaves, [None] * len(self.static))
            out = self.expectation.dual_estimate(k, self._args(ps, list(self.static)), targs)
            tangent = out.tangent
            if which and tangent is None:
                tangent = jnp.zeros_like(out.primal)
            return out.primal, tangent

        live = [] if tangents is None else [tangents[i] for i in which]
        if not self.lanes:
            return one(key, primals, live)
        batch = tuple(jnp.shape(operands[0])[:self.lanes])
        count = math.prod(batch)
        flat = [jnp.reshape(x, (count,) + jnp.shape(x)[self.lanes:]) for x in primals]
        flat_t = [jnp.reshape(t, (count,) + jnp.shape(t)[self.lanes:]) for t in live]
        value, tangent = jax.vmap(one)(jax.random.split(key, count), flat, flat_t)
        value = jnp.reshape(value, batch + jnp.shape(value)[1:])
        if tangent is not None:
            tangent = jnp.reshape(tangent, batch + jnp.shape(tangent)[1:])
        return value, tangent

