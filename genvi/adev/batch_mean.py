"""`gv.batch_mean`: the minibatch objective, the mean over a mapped axis of independent
per-datapoint estimates (each datapoint's REINFORCE/MVD/ENUM terms see only its own
datapoint, like a plate), vectorized inside the differentiated function.

Example:
    >>> import genvi as gv, jax, jax.numpy as jnp
    >>> @gv.expectation
    ... def e(mu, x):
    ...     return -(gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM)) - x) ** 2
    >>> g = gv.batch_mean(e).grad_estimate(jax.random.key(0), 0.0, jnp.arange(4.0))
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from genvi.adev.dual import Dual
from genvi.adev.expectation import Expectation
from genvi.core.mistakes import arg_names


class _BatchMean(Expectation):
    def __init__(self, inner: Expectation, in_axes: Any):
        super().__init__()
        self.inner, self.in_axes = inner, in_axes
        self.name = f"batch_mean({inner._label})"

    def dual_estimate(self, key, args, targs):
        in_axes = self.in_axes if isinstance(self.in_axes, (tuple, list)) else (self.in_axes,) * len(args)
        in_axes = tuple(in_axes) + (None,) * (len(args) - len(in_axes))
        sizes = _batch_sizes(self.inner, args, in_axes)
        if not sizes:
            raise ValueError("gv.batch_mean: in_axes maps no argument")
        keys = jax.random.split(key, sizes[0])
        targs = targs if targs is not None else (None,) * len(args)
        t_axes = tuple(None if t is None else ax for t, ax in zip(targs, in_axes))

        def one(k, a, t):
            out = self.inner.dual_estimate(k, tuple(a), None if all(x is None for x in t) else tuple(t))
            return out.primal, out.tangent

        primal, tangent = jax.vmap(one, in_axes=(0, in_axes, t_axes))(keys, tuple(args), tuple(targs))
        return Dual(jnp.mean(primal), None if tangent is None else jnp.mean(tangent))


def _batch_sizes(inner: Expectation, args: tuple, in_axes: tuple) -> list:
    """The size of the mapped axis of each mapped leaf; a ValueError naming the
    argument when a leaf has no such axis (a Python list, a scalar). An argument's
    axis may be a pytree prefix of it, as in `jax.vmap` (`{"w": None, "b": 0}`)."""
    names = arg_names(getattr(inner, "fn", None)) or []
    sizes = []

    def check(ax, part, label, a):
        if ax is None:
            return
        for leaf in jax.tree_util.tree_leaves(part):
            shape = jnp.shape(leaf)
            if not -len(shape) <= ax < len(shape):
                what = ("a Python list" if isinstance(a, list) else
                        f"a value of shape {shape}")
                fix = ("convert it with jnp.asarray(...)" if isinstance(a, list) else
                       "pass an array whose leading axis indexes the datapoints, or map "
                       "it with None in in_axes")
                raise ValueError(
                    f"gv.batch_mean: {label} of the objective is mapped over axis {ax} "
                    f"(in_axes), but it is {what}, which has no axis {ax}. A minibatch is an "
                    f"array with a leading batch axis: {fix}.")
            sizes.append(shape[ax])

    for i, (a, ax) in enumerate(zip(args, in_axes)):
        label = f"argument {i}" + (f" ({names[i]})" if i < len(names) else "")
        try:
            jax.tree_util.tree_map(lambda x, part: check(x, part, label, a), ax, a,
                                   is_leaf=lambda x: x is None)
        except ValueError as err:
            if str(err).startswith("gv.batch_mean"):
                raise
            raise ValueError(f"gv.batch_mean: in_axes for {label} is {ax!r}, which is not a "
                             f"prefix of the argument's structure "
                             f"{jax.tree_util.tree_structure(a)}: give one axis (or None) "
                             "for the whole argument, or a tree of axes shaped like it") from None
    if len(set(sizes)) > 1:
        raise ValueError(f"gv.batch_mean: the mapped axes have different sizes {sizes}; "
                         "every mapped argument needs the same batch size")
    return sizes


def batch_mean(obj: Expectation, in_axes: Any = (None, 0)) -> Expectation:
    """The mean over a mapped axis of independent per-datapoint estimates of `obj`.

    Each datapoint's REINFORCE/MVD/ENUM terms see only its own datapoint (a plate);
    the estimator is vmapped inside the differentiated function, so the gradient
    costs what a hand-written batched gradient costs.

    Args:
        obj: the per-datapoint objective, called as `obj(params, datapoint...)`.
        in_axes: the `vmap` axes of `obj`'s arguments: by default `params` shared and
            the data mapped along their leading axis.

    Returns:
        an `Expectation` of the same arguments whose value is the mean over the mapped
        axis.

    Example:
        >>> import genvi as gv
        >>> # objective(params, x) over a batch xs of shape (B, ...):
        >>> # gv.batch_mean(objective, in_axes=(None, 0)).grad_estimate(key, params, xs)
    """
    return _BatchMean(obj, in_axes)
