"""The combinators: generative function in, generative function out.

They are trace-time sugar: `gv.vmap` is `jax.vmap` of the body, `gv.repeat` a `vmap`
over particles, `gv.scan` is `jax.lax.scan` of the body, so nothing is unrolled; each
records its nesting on the sites it traces (`genvi.core.addressing.nested`), so
choices are laid out in nesting order.

Example:
    >>> import genvi as gv, jax, jax.numpy as jnp
    >>> @gv.gen
    ... def point(mu):
    ...     return gv.normal(mu, 1.0) @ "x"
    >>> gv.repeat(gv.vmap(point), 2).simulate(jax.random.key(0), jnp.zeros(3)).choices["x"].shape
    (2, 3)
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from genvi.core.addressing import nested
from genvi.core.program_mistakes import require_program
from genvi.gen.language import GenFn


class Vmap(GenFn):
    def __init__(self, inner: GenFn, in_axes: Any):
        super().__init__()
        self.inner, self.in_axes = inner, in_axes
        self.name = f"vmap({inner.name})"

    def body(self, *args):
        return jax.vmap(nested("vmap", self.inner.body), in_axes=self.in_axes)(*args)


class Repeat(GenFn):
    def __init__(self, inner: GenFn, n: int):
        super().__init__()
        self.inner, self.n = inner, int(n)
        self.name = f"repeat({inner.name}, {n})"

    def body(self, *args):
        return jax.vmap(nested("vmap", lambda _: self.inner.body(*args)))(jnp.arange(self.n))


class Scan(GenFn):
    def __init__(self, inner: GenFn, length: int | None):
        super().__init__()
        self.inner, self.length = inner, length
        self.name = f"scan({inner.name})"

    def body(self, carry, xs=None):
        return jax.lax.scan(nested("scan", self.inner.body), carry, xs, length=self.length)


def vmap(g: GenFn, in_axes: Any = 0) -> GenFn:
    """`g` mapped over a batch of arguments; choices stacked on a leading axis.

    Args:
        g: the generative function.
        in_axes: the mapped axes of `g`'s arguments, as `jax.vmap` takes them.

    Returns:
        a generative function whose choices are stacked on a leading axis.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp
        >>> @gv.gen
        ... def point(mu):
        ...     return gv.normal(mu, 1.0) @ "x"
        >>> tr = gv.vmap(point).simulate(jax.random.key(0), jnp.zeros(5))
        >>> tr.choices["x"].shape
        (5,)
    """
    require_program(g, "program", "gv.vmap(g, in_axes)")
    return Vmap(g, in_axes)


def repeat(g: GenFn, n: int) -> GenFn:
    """`n` independent runs of `g` on the same arguments (particles).

    Args:
        g: the generative function.
        n: the number of independent runs.

    Returns:
        a generative function whose choices are `g`'s stacked on a leading axis of size
        `n`.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.gen
        ... def point():
        ...     return gv.normal(0.0, 1.0) @ "x"
        >>> gv.repeat(point, 4).simulate(jax.random.key(0)).choices["x"].shape
        (4,)
    """
    require_program(g, "program", "gv.repeat(g, n)")
    return Repeat(g, n)


def scan(g: GenFn, length: int | None = None) -> GenFn:
    """`g(carry, x) -> (carry, y)` iterated as `jax.lax.scan`; choices stacked.

    Args:
        g: a generative function `(carry, x) -> (carry, y)`.
        length: the number of steps where there is no `xs` to scan over.

    Returns:
        a generative function `(carry, xs) -> (carry, ys)` whose choices are stacked
        over the steps.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp
        >>> @gv.gen
        ... def step(z, _):
        ...     z = gv.normal(z, 1.0) @ "z"
        ...     return z, z
        >>> tr = gv.scan(step, length=3).simulate(jax.random.key(0), 0.0)
        >>> tr.choices["z"].shape
        (3,)
    """
    require_program(g, "program", "gv.scan(g, length)")
    return Scan(g, length)
