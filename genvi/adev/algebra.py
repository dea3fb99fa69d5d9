"""The expected-value algebra: estimators of combinations of expected values.

Each combinator takes forward-mode estimators — functions `(key, args, targs) ->
Dual` (`targs=None`: no tangents), unbiased for E[X] and its derivative — and returns
one for the combination (`genvi.adev.expectation` wraps them as `Expectation`s):

* `affine(f, a, b)`: a·E[X] + b.
* `product(fs)`: ∏ E[X_i] from independent estimates; the tangent Σ_i dX_i ∏_{j≠i} X_j
  is unbiased because the factors are independent.
* `power(f, n)`: E[X]ⁿ from n independent estimates, drawn under one `vmap`.
* `average(f, n)`: E[X], the mean of n independent estimates under one `vmap`.
* `exp(f, rate, shift)`: exp(E[X]) by the Poisson estimator: N ~ Poisson(rate) and
  exp(shift + rate) ∏_{i ≤ N} (X_i − shift) / rate, unbiased because
  Σ_n e^{−rate} rateⁿ/n! ((E[X] − shift)/rate)ⁿ = e^{−rate} exp(E[X] − shift).
  Its derivative: by exchangeability, E[Σ_{i≤N} dY_i ∏_{j≠i} Y_j] = E[N dY_1 ∏_{j≥2} Y_j],
  so only the first inner estimate carries a tangent and the other N − 1 run in a
  `while_loop` for their values alone: no tangent flows through the loop, so JAX can
  linearize and transpose the estimator (reverse mode).

Every combinator splits its key into independent keys for its parts.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from genvi.adev.dual import Dual
    >>> from genvi.adev.algebra import product
    >>> def noisy(key, args, targs):       # X = θ + ε, dX = dθ
    ...     return Dual(args[0] + jax.random.normal(key), None if targs is None else targs[0])
    >>> out = product([noisy, noisy])(jax.random.key(0), (2.0,), (1.0,))
    >>> out.primal.shape, out.tangent.shape
    ((), ())
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from genvi.adev import dual as d
from genvi.adev.dual import Dual

Estimator = Callable[[Any, tuple, "tuple | None"], Dual]


def affine(f: Estimator, scale: Any, offset: Any = None) -> Estimator:
    """`scale · E[X] + offset` (constants; `offset=None`: none added)."""
    def run(key, args, targs):
        x = f(key, args, targs)
        primal = scale * x.primal
        return Dual(primal if offset is None else primal + offset, d.mul(scale, x.tangent))
    return run


def _exclusive_products(xs: jax.Array) -> jax.Array:
    """`∏_{j≠i} xs[j]` for each i, without dividing (a factor may be zero)."""
    ones = jnp.ones_like(xs[:1])
    before = jnp.cumprod(jnp.concatenate([ones, xs[:-1]]))
    after = jnp.cumprod(jnp.concatenate([ones, xs[:0:-1]]))[::-1]
    return before * after


def _product_of(primals: jax.Array, tangents: Any) -> Dual:
    """The product of stacked independent estimates and its tangent."""
    tangent = None if tangents is None else jnp.sum(tangents * _exclusive_products(primals))
    return Dual(jnp.prod(primals), tangent)


def _stack(duals: Sequence[Dual]) -> tuple[jax.Array, Any]:
    primals = jnp.stack([x.primal for x in duals])
    if all(x.tangent is None for x in duals):
        return primals, None
    return primals, jnp.stack([jnp.zeros_like(x.primal) if x.tangent is None else x.tangent
                               for x in duals])


def product(fs: Sequence[Estimator]) -> Estimator:
    """`∏ E[X_i]` from one independent estimate of each factor."""
    def run(key, args, targs):
        keys = jax.random.split(key, len(fs))
        return _product_of(*_stack([f(k, args, targs) for f, k in zip(fs, keys)]))
    return run


def _draws(f: Estimator, key: Any, n: int, args: tuple, targs: Any) -> tuple[jax.Array, Any]:
    """`n` independent estimates of `f` under one `vmap`: (primals, tangents or None)."""
    def one(k):
        x = f(k, args, targs)
        tangent = x.tangent
        if targs is not None and tangent is None:
            tangent = jnp.zeros_like(x.primal)
        return x.primal, tangent
    return jax.vmap(one)(jax.random.split(key, n))


def power(f: Estimator, n: int) -> Estimator:
    """`E[X]ⁿ` from `n` independent estimates."""
    def run(key, args, targs):
        return _product_of(*_draws(f, key, n, args, targs))
    return run


def average(f: Estimator, n: int) -> Estimator:
    """`E[X]` as the mean of `n` independent estimates."""
    def run(key, args, targs):
        primals, tangents = _draws(f, key, n, args, targs)
        return Dual(jnp.mean(primals), None if tangents is None else jnp.mean(tangents))
    return run


def exp(f: Estimator, rate: float, shift: float) -> Estimator:
    """`exp(E[X])` by the Poisson estimator (see the module docstring)."""
    def run(key, args, targs):
        k_count, k_first, k_rest = jax.random.split(key, 3)
        count = jax.random.poisson(k_count, rate)
        first = f(k_first, args, targs)
        y_first = (first.primal - shift) / rate

        def body(carry):  # the other inner estimates, for their values alone
            i, prod = carry
            x = f(jax.random.fold_in(k_rest, i), args, None).primal
            return i + 1, prod * (x - shift) / rate

        _, rest = jax.lax.while_loop(lambda c: c[0] < count, body,
                                     (jnp.ones((), count.dtype), jnp.ones_like(y_first)))
        scale = jnp.exp(shift + rate)
        primal = scale * jnp.where(count > 0, y_first * rest, 1.0)
        tangent = None
        if first.tangent is not None:
            tangent = scale * count.astype(y_first.dtype) * rest * first.tangent / rate
        return Dual(primal, tangent)
    return run
