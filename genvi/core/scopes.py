"""Name scopes that mark code for the smoothness check (`genvi.adev.smoothness`).

The scopes are written low (a distribution's log density, validation's support
checks, the interpreters, automatic guides) and read high, by the check that a
REPARAM value reaches only continuous uses. They are plain JAX name scopes, so they
cost nothing at run time and this module depends on nothing but JAX.

* `density_scope()`: code computing a log density (its support tests are not uses
  of the value).
* `assume_continuous()`: the user's opt-out (`gv.assume_continuous`).

Example:
    >>> import jax
    >>> from genvi.core import jaxpr as jx
    >>> from genvi.core.scopes import DENSITY_SCOPE, density_scope
    >>> def log_p(x):
    ...     with density_scope():
    ...         return -x * x
    >>> DENSITY_SCOPE in jx.name_stack(jax.make_jaxpr(log_p)(0.0).eqns[0])
    True
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax

DENSITY_SCOPE = "genvi_density"
CONTINUOUS_SCOPE = "genvi_assume_continuous"


def density_scope() -> Any:
    """The name scope under which genvi computes log densities (not uses)."""
    return jax.named_scope(DENSITY_SCOPE)


class assume_continuous(contextlib.ContextDecorator):
    """Opt out of the smoothness check for the code inside: you assert that it is
    continuous in the REPARAM values it reads (e.g. `jnp.where(x > 0, x, 0.0)`,
    a hand-written relu), or that its discontinuities do not move with the
    parameters. A context manager and a decorator; free at run time (a JAX name
    scope).

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp
        >>> @gv.expectation
        ... def relu_mean(mu):
        ...     x = gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
        ...     with gv.assume_continuous():       # continuous at 0: REPARAM is unbiased
        ...         return jnp.where(x > 0, x, 0.0)
        >>> g = relu_mean.grad_estimate(jax.random.key(0), 0.0)
    """

    def __enter__(self):
        self._scope = jax.named_scope(CONTINUOUS_SCOPE)
        return self._scope.__enter__()

    def __exit__(self, *exc):
        return self._scope.__exit__(*exc)
