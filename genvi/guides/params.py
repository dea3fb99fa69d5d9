"""Constrained parameters: leaves stored unconstrained, read constrained.

`gv.positive(1.0)`, `gv.unit_interval(0.3)`, `gv.interval(x, low, high)`,
`gv.simplex(p)` and `gv.lower_cholesky(L)` make a `Constrained` pytree node holding
the *unconstrained* array (the TFP bijector of `genvi.guides.supports` inverted at the
given value). optax, `gv.fit`, `jit` and checkpoints see only that array, so any
optimizer steps in the unconstrained space and the value can never leave its domain.
Inside a program, `gv.constrain(params)` returns the same pytree with every
`Constrained` node replaced by its constrained value (other leaves unchanged).

**Validation.** A constructor given a concrete value outside its domain (a negative
scale, a probability vector that does not sum to 1, a Cholesky factor with an entry
above the diagonal...) raises a `ValueError` naming the constraint, the offending
entries and the fix: such a value has no exact unconstrained counterpart, and
projecting it silently would give a parameter other than the one written. The stored
array is a fresh copy, not the array TFP's bijector returned: TFP caches the
(unconstrained, constrained) pair of every eager inverse by object identity, so
reading the returned array back eagerly would give the input (even an invalid one)
while `jit` and optimizer steps compute the forward map; the copy makes eager,
compiled and updated code read the same `value`. Called on a *traced* value (inside
`jit` or `vmap`), a constructor cannot raise: an out-of-domain value makes the whole
unconstrained array NaN, so the mistake shows as NaN at its first use rather than as a
silently different parameter.

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
import numpy as np

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
        """The TFP bijector from `raw` onto the domain."""
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


# -- validation ----------------------------------------------------------------------
def _show(x: Any) -> str:
    """A concrete array as a short literal, e.g. 0.0 or [0.1, 0.6, 0.5]."""
    x = np.asarray(x)
    if x.ndim == 0:
        return np.format_float_positional(x, precision=6, trim="0")
    return np.array2string(x, precision=6, separator=", ", threshold=12).replace("\n", "")


def _offending(good: Any, value: Any) -> str:
    """'got -1.0' or 'entries at [(0,), (2,)]: [-1.0, 0.0]' (the first few)."""
    x, bad = np.asarray(value), ~np.asarray(good)
    if x.ndim == 0:
        return f"got {_show(x)}"
    where = [tuple(int(i) for i in ix) for ix in np.argwhere(bad)[:5]]
    more = " ..." if int(bad.sum()) > 5 else ""
    return f"entries at {where}{more}: [{', '.join(_show(x[ix]) for ix in where)}]"


def _rules(domain: str, value: Any, bounds: tuple, xp: Any) -> list[tuple]:
    """(entries that pass, the rule, the offending part as text, the fix) for each
    rule of `domain`, computed with `xp`: numpy for a concrete value (no JAX dispatch),
    jax.numpy for a traced one."""
    if domain == "positive":
        return [(value > 0, "must be positive (> 0; it is stored as its log)", _offending,
                 "pass a positive value (e.g. 1e-3 in place of 0); a parameter that may "
                 "take any sign needs no constraint (use a plain array)")]
    if domain in ("unit_interval", "interval"):
        low, high = bounds if domain == "interval" else (0.0, 1.0)
        return [((value > low) & (value < high),
                 f"must lie strictly inside ({low:g}, {high:g}) (it is stored as its logit)",
                 _offending, f"pass a value strictly between {low:g} and {high:g} (e.g. "
                 f"jnp.clip(x, {low:g} + eps, {high:g} - eps))"
                 + (", or widen the bounds" if domain == "interval" else ""))]
    if domain == "simplex":
        # float rounding of K entries that were meant to sum to 1 (typed decimals, a
        # softmax) stays well inside 16 K epsilons
        tol = 16 * value.shape[-1] * float(jnp.finfo(value.dtype).eps)
        sums = xp.sum(value, -1, keepdims=True)
        return [(value > 0, "must be > 0 in every entry (the open simplex; it is stored "
                            "as log-ratios)", _offending,
                 "replace zeros with a small probability and renormalize"),
                (xp.broadcast_to(xp.abs(sums - 1) <= tol, value.shape),
                 "must sum to 1 along the last axis",
                 lambda good, v: f"it sums to {_show(np.sum(v, -1))} (tolerance {tol:.1e})",
                 "normalize it: gv.simplex(p / p.sum(-1, keepdims=True))")]
    if domain == "lower_cholesky":
        d = value.shape[-1]
        above, diag = np.triu(np.ones((d, d), bool), 1), np.eye(d, dtype=bool)
        return [(~above | (value == 0), "must be zero above the diagonal (a lower-"
                 "triangular Cholesky factor; only the lower triangle is stored)",
                 _offending, "pass jnp.tril(L), or jnp.linalg.cholesky(S) for a covariance S"),
                (~diag | (value > 0), "must be positive on the diagonal (it is stored as "
                 "its log)", _offending, "pass jnp.linalg.cholesky(S) for a covariance S, "
                 "or flip the sign of each column whose diagonal entry is negative")]
    raise ValueError(f"unknown domain {domain!r}")


def _shape_problem(domain: str, value: Any, bounds: tuple) -> str | None:
    if domain == "simplex" and (value.ndim == 0 or value.shape[-1] < 2):
        return f"needs a probability vector of 2 or more entries; got shape {value.shape}"
    if domain == "lower_cholesky" and (value.ndim < 2 or value.shape[-1] != value.shape[-2]):
        return f"needs a square (..., d, d) matrix; got shape {value.shape}"
    if domain == "interval" and not bounds[0] < bounds[1]:
        return f"needs low < high; got low={bounds[0]:g}, high={bounds[1]:g}"
    return None


def _make(value: Any, domain: str, bounds: tuple = ()) -> Constrained:
    value = jnp.asarray(value)
    value = value.astype(jnp.result_type(float, value.dtype))
    traced = isinstance(value, jax.core.Tracer)
    call = (f"gv.{domain}({'value' if traced else _show(value)}"
            f"{''.join(f', {b!r}' for b in bounds)})")
    problem = _shape_problem(domain, value, bounds)
    if problem:
        raise ValueError(f"{call}: {problem}")
    # a fresh array: TFP caches each eager inverse's (raw, value) pair by identity, so
    # the array it returned would read back as `value` eagerly, yet not under jit
    raw = jnp.array(bijector(domain, bounds).inverse(value), copy=True)
    if traced:   # cannot raise: NaN (loud at first use), never a projected value
        ok = jnp.all(jnp.stack([jnp.all(good) for good, *_ in
                                _rules(domain, value, bounds, jnp)]))
        return Constrained(jnp.where(ok, raw, jnp.nan), domain, bounds)
    concrete = np.asarray(value)
    for good, rule, offending, fix in _rules(domain, concrete, bounds, np):
        if not np.all(good):
            raise ValueError(f"{call}: not inside the domain: the value {rule}; "
                             f"{offending(good, concrete)}. "
                             f"Fix: {fix}.")
    if not np.all(np.isfinite(np.asarray(raw))):
        raise ValueError(f"{call}: the value is too close to the boundary of its domain "
                         f"for {value.dtype} (its unconstrained value is {_show(raw)}). "
                         "Fix: move it inside, or use float64.")
    return Constrained(raw, domain, bounds)


def positive(value: Any) -> Constrained:
    """A positive parameter (stored as its log: `tfb.Exp`).

    Args:
        value: the starting value, > 0.

    Returns:
        a `Constrained` parameter; `gv.constrain` gives its value.

    Example:
        >>> import genvi as gv
        >>> round(float(gv.constrain({"s": gv.positive(0.5)})["s"]), 4)
        0.5
        >>> gv.positive(0.0)
        Traceback (most recent call last):
        ValueError: gv.positive(0.0): not inside the domain: the value must be positive (> 0; it is stored as its log); got 0.0. Fix: ...
    """
    return _make(value, "positive")


def unit_interval(value: Any) -> Constrained:
    """A parameter in (0, 1) (stored as its logit: `tfb.Sigmoid`).

    Args:
        value: the starting value, in (0, 1).

    Returns:
        a `Constrained` parameter; `gv.constrain` gives its value.

    Example:
        >>> import genvi as gv
        >>> round(float(gv.constrain(gv.unit_interval(0.25))), 4)
        0.25
    """
    return _make(value, "unit_interval")


def interval(value: Any, low: float, high: float) -> Constrained:
    """A parameter in (low, high) (`tfb.Sigmoid(low, high)`); the bounds are static.

    Args:
        value: the starting value, inside (low, high).
        low: the lower bound.
        high: the upper bound.

    Returns:
        a `Constrained` parameter; `gv.constrain` gives its value.

    Example:
        >>> import genvi as gv
        >>> round(float(gv.constrain(gv.interval(1.5, 1.0, 3.0))), 4)
        1.5
    """
    return _make(value, "interval", _bounds_key((low, high)))


def simplex(value: Any) -> Constrained:
    """A probability vector on the last axis (K − 1 unconstrained numbers:
    `tfb.SoftmaxCentered`). Every entry must be > 0 and each vector must sum to 1 (to
    16 K float epsilons); anything else is refused, not normalized.

    Args:
        value: the starting probability vector(s).

    Returns:
        a `Constrained` parameter; `gv.constrain` gives its value.

    Example:
        >>> import genvi as gv
        >>> [round(float(v), 4) for v in gv.constrain(gv.simplex([0.2, 0.3, 0.5]))]
        [0.2, 0.3, 0.5]
        >>> gv.simplex([0.1, 0.6, 0.5])
        Traceback (most recent call last):
        ValueError: gv.simplex([0.1, 0.6, 0.5]): not inside the domain: the value must sum to 1 along the last axis; it sums to 1.2 ...
    """
    return _make(value, "simplex")


def lower_cholesky(value: Any) -> Constrained:
    """A lower-triangular matrix with a positive diagonal (a Cholesky factor;
    `tfb.FillScaleTriL` with an exp diagonal). A nonzero entry above the diagonal or
    a diagonal entry ≤ 0 is refused (`jnp.tril(L)` drops the upper triangle).

    Args:
        value: the starting Cholesky factor.

    Returns:
        a `Constrained` parameter; `gv.constrain` gives its value.

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

    Args:
        params: a pytree of parameters, some of them `Constrained`.

    Returns:
        the pytree with constrained values in place of `Constrained` nodes.

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
