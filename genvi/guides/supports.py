"""Constrained supports as TFP bijectors from an unconstrained space.

Every genvi distribution declares its `domain` (a class attribute): "real",
"positive", "unit_interval", "interval" (bounds = the first two parameters, as for
`gv.uniform`), "simplex" (last axis), "own" (a wrapped TFP or NumPyro distribution: its own
event-space bijector, `dist.event_bijector(*params)`) or None (unknown: automatic guides refuse it, naming
the site). Discrete distributions are recognized by their integer or boolean values.

`bijector(domain, bounds)` gives the TFP JAX bijector (imported lazily, as
`genvi.interop.tfp` does) from the unconstrained space onto that domain; the
automatic guides (`genvi.guides.auto`) and the constrained parameters
(`genvi.guides.params`) both use it, so a constrained value's density carries the
exact log-Jacobian TFP computes.

Example:
    >>> from genvi.guides.supports import bijector
    >>> import jax.numpy as jnp
    >>> float(bijector("positive").forward(jnp.log(2.0)))
    2.0
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

# domain -> what a value in it is, for messages
DOMAINS = {"real": "a real number", "positive": "positive", "unit_interval": "in (0, 1)",
           "interval": "in (low, high)", "simplex": "on the simplex (last axis sums to 1)",
           "lower_cholesky": "a lower-triangular matrix with a positive diagonal"}


@functools.lru_cache(maxsize=None)
def _tfb():
    from tensorflow_probability.substrates.jax import bijectors as tfb  # noqa: PLC0415
    return tfb


def bijector(domain: str, bounds: tuple = ()) -> Any:
    """The TFP bijector from unconstrained values onto `domain`.

    `bounds` = (low, high) for "interval". "simplex" maps K − 1 unconstrained
    numbers onto K probabilities (`SoftmaxCentered`); "lower_cholesky" maps
    d(d + 1)/2 numbers onto a d × d Cholesky factor (`FillScaleTriL`, exp diagonal).

    Example:
        >>> import jax.numpy as jnp
        >>> [round(float(v), 3) for v in bijector("simplex").forward(jnp.zeros(2))]
        [0.333, 0.333, 0.333]
    """
    tfb = _tfb()
    if domain == "real":
        return tfb.Identity()
    if domain == "positive":
        return tfb.Exp()
    if domain == "unit_interval":
        return tfb.Sigmoid()
    if domain == "interval":
        low, high = bounds
        return tfb.Sigmoid(low=jnp.asarray(low), high=jnp.asarray(high))
    if domain == "simplex":
        return tfb.SoftmaxCentered()
    if domain == "lower_cholesky":
        return tfb.FillScaleTriL(diag_bijector=tfb.Exp(), diag_shift=None)
    raise ValueError(f"unknown domain {domain!r}; one of {sorted(DOMAINS)}")


def site_bijector(domain: str, dist: Any, support_params: tuple) -> Any:
    """The bijector onto the support of a site of `dist` with `domain`:
    `support_params` are its bounds ("interval") or all its parameters ("own")."""
    if domain == "own":
        return dist.event_bijector(*support_params)
    return bijector(domain, tuple(support_params))


#: the domains whose bijector reads the site's parameters (`support_params`)
WITH_PARAMS = ("interval", "own")


def support_params(dist: Any, params: tuple) -> tuple:
    """The parameters a site's bijector depends on: an interval's bounds (the first two),
    what a distribution with its own bijector says (`own_support_params`, default all)."""
    if getattr(dist, "domain", None) == "interval":
        return tuple(params[:2])
    own = getattr(dist, "own_support_params", None)
    return tuple(params) if own is None else tuple(own(*params))


def unconstrained_shape(bij: Any, shape: tuple, dtype: Any = jnp.float32) -> tuple:
    """The shape of the unconstrained values that `bij` maps onto values of `shape`.

    Example:
        >>> unconstrained_shape(bijector("simplex"), (2, 3))
        (2, 2)
    """
    out = jax.eval_shape(bij.inverse, jax.ShapeDtypeStruct(tuple(shape), dtype))
    return tuple(out.shape)


def inside(domain: str, y: jax.Array, bounds: tuple = ()) -> jax.Array:
    """`y` moved into the open support where float rounding put it on the boundary
    (a sigmoid of 20 is 1.0 in float32, where a beta's log density is −inf), with the
    derivative of `y` itself (straight through), as genvi's own samplers do."""
    if domain not in ("positive", "unit_interval", "interval", "simplex"):
        return y
    info = jnp.finfo(y.dtype)
    if domain == "positive":
        low, high = info.tiny, info.max
    elif domain == "interval":
        low, high = bounds
        width = jnp.asarray(high) - jnp.asarray(low)
        low, high = low + width * info.eps, high - width * info.eps
    else:
        low, high = info.tiny, 1 - info.epsneg
    return y + jax.lax.stop_gradient(jnp.clip(y, low, high) - y)


def domain_of(dist: Any, value: Any) -> str | None:
    """The declared domain of a distribution (see the module docstring); "discrete"
    for integer or boolean values, None where the distribution declares none."""
    if not jnp.issubdtype(jnp.result_type(value), jnp.floating):
        return "discrete"
    return getattr(dist, "domain", None)


def forward_log_det(domain: str, bij: Any, u: jax.Array, shape: tuple,
                    event_ndims: int | None = None) -> jax.Array:
    """log |det ∂y/∂u| of a site's bijector at `u` (`event_ndims`: the number of
    trailing event axes of `u`, default `len(shape)`; leading axes are lanes), in the
    convention of genvi's densities.

    On the simplex genvi's dirichlet density is with respect to the first K − 1
    coordinates (as everywhere), while TFP's `SoftmaxCentered` measures volume on the
    simplex itself, √K times larger: ½ log K per probability vector is taken off.

    Example:
        >>> import jax.numpy as jnp
        >>> b = bijector("simplex")
        >>> round(float(forward_log_det("simplex", b, jnp.zeros(1), (2,))), 4)  # y1 = σ(u)
        -1.3863
    """
    event = len(shape) if event_ndims is None else event_ndims
    ldj = bij.forward_log_det_jacobian(u, event_ndims=event)
    if domain == "simplex":
        ldj = ldj - 0.5 * math.log(shape[-1]) * math.prod(shape[:-1])
    return ldj
