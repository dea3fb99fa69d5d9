"""How `jax.vmap` batches genvi's sites (`register_batching_by_broadcasting`) and,
while genvi traces, a `cond` with a batched index (`genvi_conds`: each branch run with
its sites masked per lane; JAX's own rule is put back on leaving)."""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Sequence

import jax
import jax.extend.core as jcore
from jax.interpreters import batching

from genvi.core.jaxpr.basics import ClosedJaxpr



def register_batching_by_broadcasting(prim: jcore.Primitive,
                                     event_ndims: Callable[..., Sequence[int]] | None = None,
                                     shared: Callable[..., Sequence[int]] | None = None,
                                     unpadded: Callable[..., Sequence[int]] | None = None,
                                     counted: str | None = None) -> None:
    """Make `jax.vmap` turn `prim` into one site whose parameters gained a leading
    axis (a product of independent components): every batch axis moves to the
    front and unbatched operands are broadcast.

    `event_ndims(**params)` gives each operand's number of trailing event axes
    (default 0): the batch part of each operand is padded with singleton axes so
    operands of different ranks broadcast per lane as they did before batching
    (a vector loc with a scalar scale stays a valid pair).

    The rule is registered as a "fancy" batcher because JAX calls those even when
    no operand is batched: a sampling site under `vmap` must draw one independent
    value per lane even if its parameters are shared (plain batching rules would
    silently draw a single value and broadcast it).

    `shared(**params)` names operands that, when unbatched, get a leading axis of
    size 1 instead of a copy per lane (the primitive's own rule broadcasts them: a
    guide's covariance factor stays one matrix under a particle `vmap`, so its
    products are matrix products rather than one matrix-vector product per lane).

    `unpadded(count, **params)` names, of the `count` operands, those that are not
    lane-shaped (a strategy's learned parameters): they gain the batch axis only, never
    the singleton axes that align the others with the site's lanes, so their leading
    axes are exactly the batch axes.

    `counted` names a parameter that counts the batch axes the rule has added (a
    site's `batch_axes`: how many leading axes of its value are lanes of `vmap` transformations).
    """

    def rule(axis_data, args, dims, **params):
        size = axis_data.size
        keep = set(shared(**params)) if shared else set()
        moved = [jax.numpy.moveaxis(a, d, 0) if d is not None
                 else jax.numpy.expand_dims(a, 0) if i in keep
                 else jax.numpy.broadcast_to(a, (size,) + jax.numpy.shape(a))
                 for i, (a, d) in enumerate(zip(args, dims))]
        events = list(event_ndims(**params)) if event_ndims else []
        events += [0] * (len(moved) - len(events))
        own = set(unpadded(len(moved), **params)) if unpadded else set()
        batch_ranks = [a.ndim - 1 - e for a, e in zip(moved, events)]
        top = max((r for i, r in enumerate(batch_ranks) if i not in own), default=0)
        moved = [a if i in own else a.reshape(a.shape[:1] + (1,) * (top - r) + a.shape[1:])
                 for i, (a, r) in enumerate(zip(moved, batch_ranks))]
        if counted:
            params = {**params, counted: params.get(counted, 0) + 1}
        out = prim.bind(*moved, **params)
        if prim.multiple_results:
            return out, [0] * len(out)
        return out, 0

    batching.fancy_primitive_batchers[prim] = rule


def register_fancy_batching(prim: jcore.Primitive, rule: Callable) -> None:
    """`jax.vmap`'s rule for one of genvi's own primitives, called even where no operand
    is batched: `rule(axis_data, args, dims, **params) -> (out, out_dim)`, with
    `axis_data.size` the batch size."""
    batching.fancy_primitive_batchers[prim] = rule


_COND_TOKENS = itertools.count()


def cond_token() -> int:
    """A fresh integer naming one batched `cond` (its branches' masked sites carry
    it, so records from different branches of the same cond can be told apart).

    Example:
        >>> cond_token() != cond_token()
        True
    """
    return next(_COND_TOKENS)


class _CondBatching:
    """How genvi batches a `cond` whose index is batched, in force only while genvi
    traces a program or objective (`trace`) or runs an interpreter that emits conds
    (`genvi_conds`): JAX's own rule for `cond` is put back on leaving, so a user's
    `jax.vmap` of a `cond` outside genvi runs JAX's code, and importing genvi
    changes no rule of JAX's.

    JAX evaluates every branch and selects; for branches that sample, every site
    would then be sampled *and scored* in every lane. With genvi's rule each branch
    `b` runs as `run_branch(branch, mask, ops, (token, b))` under `vmap` with
    `mask = (index == b)` per lane, so its sites can be masked, and the outputs are
    selected by the index. `token` (from `cond_token`) is shared by the branches of
    this cond: two sites of one address with the same token and different `b` are
    never both executed. Conds where `applies(branches)` is False go to JAX's rule.

    Why a scoped rule and not a primitive of genvi's own: a user's `jax.lax.cond`
    under the user's own `jax.vmap` (in a program or an objective's body) is batched
    by JAX when it is bound, through this table, before genvi sees any jaxpr, so no
    wrapper or rewrite can reach it. While the rule is in force, every cond that
    holds no genvi site and is not traced for an objective goes to JAX's rule
    (`applies`), so other code, on this thread or another, sees JAX's behaviour.
    """

    def __init__(self) -> None:
        self.applies: Callable[[tuple], bool] | None = None
        self.run_branch: Callable | None = None
        self.depth = 0
        self.saved: Any = None
        self.lock = threading.Lock()

    def rule(self, axis_data, args, dims, *, branches, **params):
        jax_rule = self.saved
        if dims[0] is None or not self.applies(branches):
            return jax_rule(axis_data, args, dims, branches=branches, **params)
        size = axis_data.size
        index = jax.numpy.clip(jax.numpy.moveaxis(args[0], dims[0], 0), 0, len(branches) - 1)
        ops = [jax.numpy.moveaxis(a, d, 0) if d is not None else a
               for a, d in zip(args[1:], dims[1:])]
        in_axes = [0 if d is not None else None for d in dims[1:]]
        token = cond_token()
        run_branch = self.run_branch
        outs = [jax.vmap(lambda m, *o, br=br, b=b: run_branch(br, m, list(o), (token, b)),
                         in_axes=[0] + in_axes, axis_size=size)(index == b, *ops)
                for b, br in enumerate(branches)]
        selected = [jax.lax.select_n(jax.numpy.broadcast_to(
                        index.reshape(index.shape + (1,) * (cases[0].ndim - 1)), cases[0].shape),
                        *cases) for cases in zip(*outs)]
        return selected, [0] * len(selected)

    def __enter__(self) -> None:
        if self.applies is None:
            return
        with self.lock:  # traces on several threads share one count
            if self.depth == 0:
                cond_p = jcore.primitives.cond_p
                self.saved = batching.fancy_primitive_batchers[cond_p]
                batching.fancy_primitive_batchers[cond_p] = self.rule
            self.depth += 1

    def __exit__(self, *exc: Any) -> None:
        if self.applies is None:
            return
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                batching.fancy_primitive_batchers[jcore.primitives.cond_p] = self.saved
                self.saved = None


#: enter it (`with genvi_conds:`) where genvi traces or interprets programs
genvi_conds = _CondBatching()


def set_cond_batching(applies: Callable[[tuple], bool],
                      run_branch: Callable[[Any, Any, list, tuple], list]) -> None:
    """Say how `genvi_conds` batches a `cond` with a batched index (see `_CondBatching`):
    for the conds where `applies(branches)` holds, each branch runs as
    `run_branch(branch, mask, ops, (token, b))`. Installs nothing in JAX."""
    genvi_conds.applies, genvi_conds.run_branch = applies, run_branch


def trace(fn: Callable, flat_args: Sequence[Any]) -> ClosedJaxpr:
    """Trace `fn(*flat_args)` (flat arrays in, flat list out) to a closed jaxpr, with
    genvi's batching of conds that hold sampling sites (`genvi_conds`) in force."""
    with genvi_conds:
        return jax.make_jaxpr(fn)(*flat_args)
