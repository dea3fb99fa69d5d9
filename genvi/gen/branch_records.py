"""A site recorded again in another branch of a batched `cond`: each lane executes one
branch, as the unbatched program does, so the choice holds, lane by lane, the value of
the branch that lane took (`rejoined`). Anything else recorded twice is an error.

Example:
    >>> import jax.numpy as jnp
    >>> first = (jnp.array([True, False]), (((7, 0),),))   # lane 0 took cond 7's branch 0
    >>> value, (mask, paths) = rejoined(("x",), jnp.array([1.0, 0.0]), first,
    ...                                 jnp.array([0.0, 2.0]), (~first[0], (((7, 1),),)))
    >>> value.tolist(), mask.tolist()
    ([1.0, 2.0], [True, True])
"""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp

from genvi.core.mistakes import addr_name


def exclusive(a: tuple, b: tuple) -> bool:
    """Whether two branch paths part at one batched cond, in different branches."""
    for (token_a, branch_a), (token_b, branch_b) in zip(a, b):
        if token_a != token_b:
            return False
        if branch_a != branch_b:
            return True
    return False


def _lanes(mask: Any, ndim: int) -> Any:
    """`mask` with trailing axes, to broadcast against a value of `ndim` axes."""
    return jnp.reshape(mask, jnp.shape(mask) + (1,) * max(0, ndim - jnp.ndim(mask)))


def rejoined(addr: tuple, old: Any, prev: tuple | None, value: Any,
             masked: tuple | None) -> tuple[Any, tuple]:
    """The choice at `addr` recorded again with `value`: allowed only for a masked site
    (`masked` = (mask, branch paths)) in another branch of a batched cond than every
    earlier record (`old`, whose record is `prev`). Returns the value filling the new
    record's lanes, and the joined (mask, branch paths)."""
    if masked is None or prev is None or not all(
            exclusive(p, q) for p in masked[1] for q in prev[1]):
        raise ValueError(f"address {addr_name(addr)!r} is used twice in one execution; "
                         "give each sampling site its own address")
    if (jnp.shape(old), jnp.result_type(old)) != (jnp.shape(value), jnp.result_type(value)):
        raise ValueError(f"address {addr_name(addr)!r} has different shapes in the "
                         "branches of a cond; use one shape or different addresses")
    mask, ndim = masked[0], jnp.ndim(value)
    joined = jnp.logical_or(_lanes(prev[0], max(ndim, jnp.ndim(mask))), _lanes(mask, ndim))
    return jnp.where(_lanes(mask, ndim), value, old), (joined, prev[1] + masked[1])
