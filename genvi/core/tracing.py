"""Tracing user functions with pytree arguments into cached closed jaxprs.

Array-like leaves of the arguments (arrays, Python floats) are traced; any other leaf
(a Python int or bool, a string, a flax module, a Python function) is static: it is
baked into the trace and part of the cache key, so it must be hashable.

While a program or objective is traced, `TraceNotes` collect what its Python code
did that the jaxpr cannot show: distribution calls made and never used (a forgotten
`@ "addr"`), the values of its sites (to name the latent a Python `if` tests), and,
in an objective, which programs were only scored at sites that carry a `grad=`.

Example:
    >>> import jax.numpy as jnp
    >>> from genvi.core.tracing import trace_cached
    >>> traced, dyn = trace_cached({}, lambda x: 2.0 * x, (jnp.ones(3),))
    >>> [e.primitive.name for e in traced.closed.jaxpr.eqns]
    ['mul']
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from types import FrameType
from typing import Any, Callable

import jax
import numpy as np

from genvi.core import jaxpr as jx
from genvi.core import mistakes, program_mistakes
from genvi.core.context import current, using
from genvi.core.validation import enabled as validating

_ARRAY_TYPES = (jax.Array, np.ndarray, np.generic, float, complex)


def is_dynamic(leaf: Any) -> bool:
    """Whether an argument's leaf is traced: arrays and floats are; a Python int or
    bool is a constant, as NumPyro's `svi.run` makes it (a width, a count, a
    `subsample_size`: a program may use it as a shape), and a new value traces anew."""
    return isinstance(leaf, _ARRAY_TYPES) or hasattr(leaf, "aval")


@jax.tree_util.register_pytree_node_class
class Constant:
    """A Python int or bool argument carried through a `jax.jit` as part of the
    arguments' structure (no leaf), so that the program it reaches sees the number
    itself (`as_constants` wraps, `trace_cached` unwraps).

    Example:
        >>> jax.tree_util.tree_leaves(as_constants((1.0, 5)))
        [1.0]
    """

    def __init__(self, value: Any):
        self.value = value

    def tree_flatten(self) -> tuple[tuple, Any]:
        return (), self.value

    @classmethod
    def tree_unflatten(cls, value: Any, children: tuple) -> "Constant":
        return cls(value)


def as_constants(tree: Any) -> Any:
    """`tree` with its Python int and bool leaves as `Constant`s (before a `jax.jit`)."""
    return jax.tree_util.tree_map(
        lambda x: Constant(x) if isinstance(x, (int, bool)) and not is_dynamic(x) else x, tree)


def _unwrapped(tree: Any) -> Any:
    return jax.tree_util.tree_map(lambda x: x.value if isinstance(x, Constant) else x, tree,
                                  is_leaf=lambda x: isinstance(x, Constant))


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
    dict argument, a distribution returned without `@ "addr"`, or made and never
    sampled, a Python `if` on a traced value. With a `name` the trace keeps its own
    `TraceNotes` (see the module docstring).

    Example:
        >>> import jax.numpy as jnp
        >>> def twice(x):
        ...     if x > 0:
        ...         return 2.0 * x
        >>> try:
        ...     trace_cached({}, twice, (1.0,), name=("program", "twice", twice))
        ... except TypeError as err:
        ...     print(type(err).__name__)
        TracedConditionError
    """
    dyn, static, treedef, mask = split_args(args)
    # validation adds run-time checks to what is traced: a trace is valid in one state
    key = shapes_key(args) + (validating(),)
    hit = cache.get(key)
    if hit is None:
        out_tree_box = []

        def flat_fn(*flat):
            out = fn(*_unwrapped(merge_args(list(flat), static, treedef, mask)))
            leaves, tree = jax.tree_util.tree_flatten(out)
            out_tree_box.append(tree)
            if name is not None:
                mistakes.check_returned(leaves, *name[:2])
            return leaves

        # code traced without a name (genvi's own helpers) notes nothing
        notes = None if name is None else TraceNotes(*name[:2])
        try:
            with using(notes=notes), context():
                closed = jx.trace(flat_fn, dyn)
        except KeyError as err:
            better = None if name is None else mistakes.missing_key_error(
                err, f"the {name[0]} {name[1]!r}", name[1], args, mistakes.arg_names(name[2]))
            if better is None:
                raise
            raise better from err
        except jax.errors.TracerBoolConversionError as err:
            if notes is None:
                raise
            raise program_mistakes.traced_condition_error(
                err, notes.kind, notes.name, notes.site_values) from err
        except jax.errors.NonConcreteBooleanIndexError as err:
            if notes is None:
                raise
            raise program_mistakes.boolean_index_error(
                err, notes.kind, notes.name, notes.site_values) from err
        except (TypeError, IndexError) as err:
            if notes is None or not program_mistakes.is_static_use(err):
                raise
            raise program_mistakes.static_use_error(
                err, notes.kind, notes.name, notes.site_values) from err
        if notes is not None:
            notes.finish()
        hit = cache[key] = TracedFn(closed, out_tree_box[0])
    return hit, dyn


class TraceNotes:
    """What the Python code of one program or objective did while it was traced.

    * `calls`: the distribution calls it made, each with its "file:line": one that is
      never used (sampled, observed, drawn, read) is a forgotten `@ "addr"`.
    * `site_values`: `id(value) -> (value, address)` of the sites it bound, to name
      the latent that a Python `if` tests.
    * (objectives) `scored`: programs whose log density it computed at given values,
      with their sites that carry a `grad=`; `sampled`: programs it sampled. A
      `grad=` of a program only scored is unused: `finish` warns.
    """

    def __init__(self, kind: str, name: str):
        self.kind, self.name = kind, name
        self.calls: list = []
        self.site_values: dict = {}
        self.scored: dict = {}  # id(program) -> (program's name, {address: strategy})
        self.sampled: set = set()  # id(program)
        self.sampled_strategies: set = set()  # (address, grad) of the sampled programs' sites

    def finish(self) -> None:
        """Raise for a distribution call never used; warn for an unused `grad=`."""
        unused = [(call.genvi_unsampled()[0], line) for call, line in self.calls
                  if not call.genvi_used]
        if unused:
            raise program_mistakes.unaddressed_error(self.kind, self.name, unused)
        for pid, (program, strategies) in self.scored.items():
            # a grad= that the sampled site at the same address also carries misleads no one
            unused_grads = {a: s for a, s in strategies.items()
                            if (a, _strategy_key(s)) not in self.sampled_strategies}
            if pid not in self.sampled and unused_grads:
                warnings.warn(program_mistakes.unused_strategy_message(
                    self.name, program, sorted(unused_grads.items(), key=lambda kv: str(kv[0]))),
                    program_mistakes.UnusedStrategyWarning,
                    stacklevel=mistakes.user_stacklevel(skip=(jx.GENVI_DIR + os.sep, jx.JAX_DIR)))


# where distribution calls are made on a user's behalf (gv.normal(...), gv.from_tfp)
_LIBRARY_CALL_DIRS = tuple(os.path.join(jx.GENVI_DIR, d) + os.sep
                           for d in ("core", "distributions"))


def _caller_line() -> str:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_LIBRARY_CALL_DIRS):
        frame = frame.f_back
    if frame is None:
        return "an unknown line"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} ({frame.f_code.co_name})"


def note_dist_call(call: Any) -> None:
    """A distribution call was made (`call.genvi_used` says later whether it was used)."""
    notes = current().notes
    if notes is not None:
        notes.calls.append((call, _caller_line()))


def note_site_value(value: Any, addr: tuple) -> None:
    """A site at `addr` was bound and returned `value` to the program's code."""
    notes = current().notes
    if notes is not None:
        notes.site_values[id(value)] = (value, addr)


def note_scored(program: Any, strategies: dict) -> None:
    """An objective scored `program` at given values; `strategies`: `{address: grad}` of
    the scored sites that carry one (only a model's: a program that observes)."""
    notes = current().notes
    if notes is not None and notes.kind == "objective" and strategies:
        _, known = notes.scored.setdefault(id(program), (program.name, {}))
        known.update(strategies)


def note_sampled(program: Any, strategies: dict) -> None:
    """An objective sampled `program` (`sim`, `generate`, `dream`): its `grad=` are used;
    `strategies`: `{address: grad}` of its sites, so that a scored site with the same
    strategy as the sampled site at its address (a sub-program both share) is not
    reported."""
    notes = current().notes
    if notes is not None and notes.kind == "objective":
        notes.sampled.add(id(program))
        notes.sampled_strategies.update((a, _strategy_key(s)) for a, s in strategies.items()
                                        if s is not None)


def _strategy_key(strategy: Any) -> Any:
    """A strategy as a set member: itself, or its identity if it is unhashable."""
    try:
        hash(strategy)
    except TypeError:
        return id(strategy)
    return strategy


def _static_key(x: Any) -> Any:
    try:
        hash(x)
        return x
    except TypeError:
        return id(x)


class Flag:
    """A boolean field of the run context (`genvi.core.context.RunContext`), read with
    `bool(flag)` and set for a block with `flag.set()`."""

    def __init__(self, field: str):
        self.field = field

    def __bool__(self) -> bool:
        return getattr(current(), self.field)

    def set(self, value: bool = True):
        return using(**{self.field: value})


IN_OBJECTIVE = Flag("in_objective")
PLAIN = Flag("plain")  # objective-style code run only for its values (no gradients)
GENVI_CONDS = Flag("genvi_conds")  # batch every cond with genvi's rule (primitives.py)
