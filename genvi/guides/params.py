"""Constrained parameters: leaves stored unconstrained, read constrained.

`gv.positive(1.0)`, `gv.unit_interval(0.3)`, `gv.interval(x, low, high)`,
`gv.simplex(p)` and `gv.lower_cholesky(L)` make a `Constrained` pytree node holding
the *unconstrained* array (the TFP bijector of `genvi.guides.supports` inverted at the
given value). optax, `gv.fit`, `jit` and checkpoints see only that array, so any
optimizer steps in the unconstrained space and the value can never leave its domain.
Inside a program, `gv.constrain(params)` returns the same pytree with every
`Constrained` node replaced by its constrained value (other leaves unchanged).

Example:
    >>> import genvi as gv, jax
    >>> params = {"m": 0.0, "s": gv.positive(2.0)}
    >>> round(float(gv.constrain(params)["s"]), 4)            # read constrained
    2.0
    >>> [round(float(x), 4) for x in jax.tree_util.tree_leaves(params)]  # stored unconstrained
    [0.0, 0.6931]

A guide reads `p = gv.constrain(params)` once at its top, then uses `p["s"]` as a
plain positive number; `gv.fit(..., params, ...)` returns `Constrained` leaves too.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from genvi.guides.supports import bijector


def _bounds_key(bounds: tuple) -> tuple:
    """Interval bounds as hashable static data (Python floats)."""
    return tuple(float(b) for b in bounds)


@jax.tree_util.register_pytree_node_class
class Constrained:
    """A parameter stored unconstrained (`.raw`) and read constrained (`.value`).

    Make one with `gv.positive`, `gv.unit_interval`, `gv.interval`, `gv.simplex` or
    `gv.lower_cholesky`; read a whole pytree with `gv.constrain(params)`.

    Example:
        >>> import genvi as gv
        >>> c = gv.unit_interval(0.5)
        >>> float(c.raw), float(c.value)
        (0.0, 0.5)
    """

    __slots__ = ("raw", "domain", "bounds")

    def __init__(self, raw: Any, domain: str, bounds: tuple = ()):
        self.raw, self.domain, self.bounds = raw, domain, tuple(bounds)

    @property
    def bijector(self) -> Any:
        return bijector(self.domain, self.bounds)

    @property
    def value(self) -> jax.Array:
        """The constrained value."""
        return self.bijector.forward(self.raw)

    def tree_flatten(self):
        return (self.raw,), (self.domain, self.bounds)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux)

    def __repr__(self) -> str:
        extra = f", bounds={self.bounds}" if self.bounds else ""
        return f"Constrained({self.domain}{extra}, raw={self.raw!r})"


def _make(value: Any, domain: str, bounds: tuple = ()) -> Constrained:
    value = jnp.asarray(value, jnp.result_type(float, value))
    raw = bijector(domain, bounds).inverse(value)
    if not bool(jnp.all(jnp.isfinite(raw))):
        raise ValueError(f"gv.{domain}({value!r}): the initial value must lie strictly "
                         f"inside the domain (open), where its unconstrained value is "
                         f"finite; got unconstrained {raw!r}")
    return Constrained(raw, domain, bounds)


def positive(value: Any) -> Constrained:
    """A positive parameter (stored as its log: `tfb.Exp`).

    Example:
        >>> import genvi as gv
        >>> round(float(gv.constrain({"s": gv.positive(0.5)})["s"]), 4)
        0.5
    """
    return _make(value, "positive")


def unit_interval(value: Any) -> Constrained:
    """A parameter in (0, 1) (stored as its logit: `tfb.Sigmoid`).

    Example:
        >>> import genvi as gv
        >>> round(float(gv.constrain(gv.unit_interval(0.25))), 4)
        0.25
    """
    return _make(value, "unit_interval")


def interval(value: Any, low: float, high: float) -> Constrained:
    """A parameter in (low, high) (`tfb.Sigmoid(low, high)`); the bounds are static.

    Example:
        >>> import genvi as gv
        >>> round(float(gv.constrain(gv.interval(1.5, 1.0, 3.0))), 4)
        1.5
    """
    return _make(value, "interval", _bounds_key((low, high)))


def simplex(value: Any) -> Constrained:
    """A probability vector on the last axis (K − 1 unconstrained numbers:
    `tfb.SoftmaxCentered`).

    Example:
        >>> import genvi as gv, jax.numpy as jnp
        >>> [round(float(v), 4) for v in gv.constrain(gv.simplex(jnp.array([0.2, 0.3, 0.5])))]
        [0.2, 0.3, 0.5]
    """
    return _make(value, "simplex")


def lower_cholesky(value: Any) -> Constrained:
    """A lower-triangular matrix with a positive diagonal (a Cholesky factor;
    `tfb.FillScaleTriL` with an exp diagonal).

    Example:
        >>> import genvi as gv, jax.numpy as jnp
        >>> gv.constrain(gv.lower_cholesky(2.0 * jnp.eye(2))).round(4).tolist() == [[2, 0], [0, 2]]
        True
    """
    return _make(value, "lower_cholesky")


def constrain(params: Any) -> Any:
    """`params` with every `Constrained` node replaced by its constrained value.

    Use it at the top of a program (or on `gv.fit`'s result); other leaves pass
    through, so it is a no-op on pytrees without constrained parameters.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp
        >>> @gv.gen
        ... def guide(params, y):
        ...     p = gv.constrain(params)
        ...     gv.normal(p["m"], p["s"], grad=gv.REPARAM) @ "z"
        >>> params = {"m": 0.0, "s": gv.positive(1.0)}
        >>> tr = guide.simulate(jax.random.key(0), params, 0.0)
    """
    return jax.tree_util.tree_map(lambda c: c.value if isinstance(c, Constrained) else c,
                                  params, is_leaf=lambda c: isinstance(c, Constrained))
