"""Dual numbers with symbolic zeros, and forward-mode helpers used by strategies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import jax


@dataclass
class Dual:
    """A primal value and its tangent; `tangent=None` is a symbolic zero."""

    primal: Any
    tangent: Any = None


def add(a: Any, b: Any) -> Any:
    """Sum of tangents where `None` is zero."""
    if a is None:
        return b
    if b is None:
        return a
    return a + b


def mul(a: Any, t: Any) -> Any:
    """Primal coefficient times tangent (None stays None)."""
    return None if t is None else a * t


def jvp(fn: Callable, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, Any]:
    """`jax.jvp(fn)` differentiating only arguments whose tangent is not None.

    Returns `(out, out_tangent)` with `out_tangent=None` when nothing is
    differentiated.
    """
    idx = [i for i, t in enumerate(tangents) if t is not None]
    if not idx:
        return fn(*primals), None

    def f(*diff):
        args = list(primals)
        for i, d in zip(idx, diff):
            args[i] = d
        return fn(*args)

    return jax.jvp(f, [primals[i] for i in idx], [tangents[i] for i in idx])
