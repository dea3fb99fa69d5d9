"""Keyword arguments of a program's data, carried through genvi as one trailing argument.

NumPyro's programs take their data by keyword (`svi.run(key, n, X=X, Y=Y)`), and so do
genvi's entry points (`simulate`, `log_density`, an objective's estimates, `gv.fit`,
`gv.predictive`): `takes_keywords` packs the keywords a method does not name itself
into a `Keywords` pytree after the positional arguments; objectives pass it on to
their programs like any argument (it is traced like one: its arrays are inputs, its
names part of the trace's key), and the function the user wrote is called with them
as keywords again (`call_with_keywords`).

Example:
    >>> args = pack_keywords((1.0,), {"Y": None})
    >>> call_with_keywords(lambda X, Y=2.0: (X, Y), args)
    (1.0, None)
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, TypeVar

import jax

F = TypeVar("F", bound=Callable[..., Any])


@jax.tree_util.register_pytree_node_class
class Keywords:
    """Keyword arguments, as the last positional argument (a pytree: the values are its
    children, the names its structure).

    Example:
        >>> jax.tree_util.tree_leaves(Keywords({"X": 1.0, "Y": None}))
        [1.0]
    """

    def __init__(self, values: dict):
        self.values = dict(values)

    def tree_flatten(self) -> tuple[tuple, tuple]:
        names = tuple(sorted(self.values))
        return tuple(self.values[n] for n in names), names

    @classmethod
    def tree_unflatten(cls, names: tuple, children: Any) -> "Keywords":
        return cls(dict(zip(names, children)))

    def __repr__(self) -> str:
        return "Keywords(" + ", ".join(f"{k}=..." for k in sorted(self.values)) + ")"


def pack_keywords(args: tuple, keywords: dict) -> tuple:
    """`args`, followed by `Keywords(keywords)` if there are any."""
    return args + (Keywords(keywords),) if keywords else args


def split_keywords(args: tuple) -> tuple[tuple, dict]:
    """(positional arguments, keyword arguments) of `args` packed by `pack_keywords`."""
    if args and isinstance(args[-1], Keywords):
        return args[:-1], args[-1].values
    return args, {}


def call_with_keywords(fn: Callable, args: tuple) -> Any:
    """`fn` called with `args`, a trailing `Keywords` as keyword arguments."""
    positional, keywords = split_keywords(args)
    return fn(*positional, **keywords)


def takes_keywords(method: F) -> F:
    """Decorate an entry point whose `*args` are a program's arguments: keyword
    arguments it does not name itself are packed after them (`pack_keywords`).

    Example:
        >>> @takes_keywords
        ... def run(key, *args, argnums=0):
        ...     return args, argnums
        >>> run(0, 1.0, Y=2.0, argnums=1)
        ((1.0, Keywords(Y=...)), 1)
    """
    own = {name for name, p in inspect.signature(method).parameters.items()
           if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}

    @functools.wraps(method)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        data = {k: kwargs.pop(k) for k in list(kwargs) if k not in own}
        return method(*pack_keywords(args, data), **kwargs)
    return wrapped  # type: ignore[return-value]
