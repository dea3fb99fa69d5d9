"""`gv.exp` and `gv.average`: new expectations from independent estimates of one,
unbiased in value and gradient (the estimators are `genvi.adev.algebra`'s).

Example:
    >>> import genvi as gv, jax
    >>> @gv.expectation
    ... def x(mu):
    ...     return gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
    >>> print(gv.average(x, 4).name)
    gv.average(x, 4)
"""

from __future__ import annotations

import numpy as np

from genvi.adev import algebra
from genvi.adev.expectation import Composed, Expectation


def exp(e: Expectation, rate: float = 2.0, shift: float = 0.0) -> Expectation:
    """`exp(E[e])`, estimated without bias in value and gradient by the Poisson
    estimator: N ~ Poisson(`rate`), then exp(`shift` + `rate`) ∏_{i ≤ N} (X_i −
    `shift`) / `rate` over independent estimates X_i of `e` (`genvi.adev.algebra.exp`).
    Its second moment is exp(2 `shift` + `rate` + E[(X − `shift`)²] / `rate`), so the
    best shift for a given rate is E[e] − `rate`, where the variance is
    exp(2 E[e]) (exp(Var[X] / `rate`) − 1); each estimate costs 1 + `rate` estimates
    of `e` on average (docs/algebra.md measures it).
    Nests (`gv.exp(gv.exp(e))`) and composes (`gv.exp(e1) * e2`).

    Args:
        e: the expectation X whose exponential is estimated.
        rate: the Poisson rate: the mean number of extra estimates of `e` per estimate.
        shift: a constant subtracted from each X_i; E[e] − `rate` minimizes the
            variance.

    Returns:
        an `Expectation` of `e`'s arguments, unbiased for exp(E[e]) and its gradient.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.expectation
        ... def x(mu):
        ...     return gv.sample(gv.normal(mu, 0.5, grad=gv.REPARAM))
        >>> value = gv.exp(x, rate=1.0, shift=1.0).estimate(jax.random.key(0), 1.0)  # ≈ e
    """
    if not isinstance(e, Expectation):
        raise TypeError(f"gv.exp takes an Expectation (an @gv.expectation objective or a "
                        f"combination of them); got {e!r}. For exp of a value inside an "
                        "objective program use jnp.exp.")
    if not float(rate) > 0:
        raise ValueError(f"gv.exp: rate is the mean number of inner estimates, > 0; got {rate}")
    return Composed(f"gv.exp({e._label})", algebra.exp(e.dual_estimate, float(rate), float(shift)))


def average(e: Expectation, n: int) -> Expectation:
    """`E[e]` as the mean of `n` independent estimates, drawn under one `vmap`.

    Args:
        e: the expectation to estimate.
        n: the number of independent estimates (≥ 1).

    Returns:
        an `Expectation` of `e`'s arguments.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.expectation
        ... def x(mu):
        ...     return gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
        >>> value = gv.average(x, 100).estimate(jax.random.key(0), 2.0)   # ≈ 2, sd 0.1
    """
    if not isinstance(e, Expectation):
        raise TypeError(f"gv.average takes an Expectation; got {e!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"gv.average: n is a positive int, the number of estimates; got {n!r}")
    return Composed(f"gv.average({e._label}, {int(n)})", algebra.average(e.dual_estimate, int(n)))
