"""Tracing user functions with pytree arguments into cached closed jaxprs.

Array-like leaves of the arguments are traced; any other leaf (a string, a flax
module, a Python function) is static: it is baked into the trace and part of the
cache key, so it must be hashable.
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable

import jax
import numpy as np

from genvi.core import jaxpr as jx
from genvi.core import mistakes
from genvi.core.validation import enabled as validating

_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic, float, int, bool, complex)


def is_dynamic(leaf: Any) -> bool:
    return isinstance(leaf, _ARRAY_TYPES) or hasattr(leaf, "aval")


def split_args(args: tuple) -> tuple[list, list, Any, tuple]:
    """(dynamic leaves, static leaves, treedef, mask of which leaves are dynamic)."""
    leaves, treedef = jax.tree_util.tree_flatten(args)
    mask = tuple(is_dynamic(x) for x in leaves)
    dyn = [x for x, m in zip(leaves, mask) if m]
    static = [x for x, m in zip(leaves, mask) if not m]
    return dyn, static, treedef, mask


def merge_args(dyn: list, static: list, treedef: Any, mask: tuple) -> tuple:
    dyn_it, static_it = iter(dyn), iter(static)
    leaves = [next(dyn_it) if m else next(static_it) for m in mask]
    return jax.tree_util.tree_unflatten(treedef, leaves)


def _aval_key(x: Any) -> tuple:
    a = jax.typeof(x)
    return (a.shape, str(a.dtype), getattr(a, "weak_type", False))


def shapes_key(args: tuple) -> tuple:
    """A hashable key of `args` for caches of traces: the structure, the dynamic
    leaves' shapes and dtypes, and the static leaves (by identity where unhashable).

    Example:
        >>> import jax.numpy as jnp
        >>> from genvi.core.tracing import shapes_key
        >>> shapes_key((jnp.zeros(3), 2)) == shapes_key((jnp.ones(3), 2))
        True
    """
    dyn, static, treedef, mask = split_args(args)
    return (treedef, mask, tuple(_aval_key(x) for x in dyn), tuple(map(_static_key, static)))


class TracedFn:
    """A traced function: its closed jaxpr and how to rebuild its outputs."""

    def __init__(self, closed: Any, out_tree: Any):
        self.closed, self.out_tree = closed, out_tree


def trace_cached(cache: dict, fn: Callable, args: tuple,
                 context: Callable[[], Any] = contextlib.nullcontext,
                 name: tuple | None = None) -> tuple[TracedFn, list]:
    """Trace `fn(*args)`; returns the cached `TracedFn` and the dynamic leaves.

    `name` = (kind, name, the user's function) words errors: a key missing from a
    dict argument, a distribution returned without `@ "addr"`."""
    dyn, static, treedef, mask = split_args(args)
    # validation adds run-time checks to what is traced: a trace is valid in one state
    key = shapes_key(args) + (validating(),)
    hit = cache.get(key)
    if hit is None:
        out_tree_box = []

        def flat_fn(*flat):
            out = fn(*merge_args(list(flat), static, treedef, mask))
            leaves, tree = jax.tree_util.tree_flatten(out)
            out_tree_box.append(tree)
            if name is not None:
                mistakes.check_returned(leaves, *name[:2])
            return leaves

        try:
            with context():
                closed = jx.trace(flat_fn, dyn)
        except KeyError as err:
            better = None if name is None else mistakes.missing_key_error(
                err, f"the {name[0]} {name[1]!r}", name[1], args, mistakes.arg_names(name[2]))
            if better is None:
                raise
            raise better from err
        hit = cache[key] = TracedFn(closed, out_tree_box[0])
    return hit, dyn


def _static_key(x: Any) -> Any:
    try:
        hash(x)
        return x
    except TypeError:
        return id(x)


class Flag:
    """A context-local boolean with a context manager to set it."""

    def __init__(self, name: str):
        self._var = contextvars.ContextVar(name, default=False)

    def __bool__(self) -> bool:
        return self._var.get()

    @contextlib.contextmanager
    def set(self, value: bool = True):
        token = self._var.set(value)
        try:
            yield
        finally:
            self._var.reset(token)


IN_OBJECTIVE = Flag("genvi_in_objective")
PLAIN = Flag("genvi_plain")  # objective-style code run only for its values (no gradients)
GENVI_CONDS = Flag("genvi_conds")  # batch every cond with genvi's rule (primitives.py)
