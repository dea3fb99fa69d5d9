"""The common priors of hierarchical models: lognormal, halfnormal, exponential,
student_t, halfcauchy and laplace, each a reparameterized transform of simple draws.

Every one supports REPARAM (a differentiable sampler: `student_t` through the implicit
gradient of its gamma draw) and REINFORCE (their supports do not move with the
parameters), and declares its `domain` for the automatic guides: "positive" for
lognormal, halfnormal, exponential and halfcauchy, "real" for student_t and laplace.

Example:
    >>> import genvi as gv, jax
    >>> @gv.gen
    ... def model():
    ...     tau = gv.halfcauchy(1.0) @ "tau"
    ...     return gv.student_t(4.0, 0.0, tau, grad=gv.REPARAM) @ "theta"
    >>> trace = model.simulate(jax.random.key(0))
    >>> bool(trace.choices["tau"] > 0)
    True
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy import special

from genvi.distributions.base import Distribution
from genvi.distributions.continuous import _shape
from genvi.distributions.gamma_sampler import log_gamma

_LOG_2PI = math.log(2 * math.pi)


def _dtype(*params):
    return jnp.result_type(float, *params)


def _log_max(dtype):
    """An exponent just below log(largest float) of `dtype`: exp of log(max) itself,
    rounded to `dtype`, overflows."""
    info = jnp.finfo(dtype)
    return math.log(float(info.max)) * (1 - 4 * float(info.eps))


def _clip(x, low, high):
    """`x` clipped into [low, high] with the derivative of `x` itself (straight through),
    as `genvi.distributions.continuous._inside`, but also where a draw overflowed to
    ±inf (there `x + (clip(x) - x)` is NaN): such a draw gets the bound, derivative 0."""
    finite = jnp.where(jnp.isfinite(x), x, 0.0)
    return jax.lax.stop_gradient(jnp.clip(x, low, high)) + (finite - jax.lax.stop_gradient(finite))


def _positive(x):
    """A draw inside [smallest normal float, largest float]: one that rounds to 0 or
    overflows stays in the open support that the automatic guides map onto."""
    info = jnp.finfo(x.dtype)
    return _clip(x, info.tiny, info.max)


def _finite(x):
    """A draw inside the finite floats (heavy tails and a small df may overflow)."""
    info = jnp.finfo(x.dtype)
    return _clip(x, -info.max, info.max)


def _on_half_line(x, log_density):
    """`log_density(x)` for x >= 0 and -inf below, with no NaN in either branch's
    derivative (the density is evaluated at 0 where x < 0)."""
    inside = x >= 0
    return jnp.where(inside, log_density(jnp.where(inside, x, 0.0)), -jnp.inf)


class _Transformed(Distribution):
    """What the six share: elementwise, a differentiable sampler (REPARAM) whose
    support does not move with the parameters (REINFORCE)."""

    lanewise = True
    reparameterized = True


class _HalfLineScale(_Transformed):
    """A distribution on [0, ∞) with one parameter, its scale (halfnormal, halfcauchy)."""

    domain = "positive"
    param_names = ("scale",)

    def check_params(self, scale):
        return [(jnp.all(scale > 0), "scale must be > 0")]

    def check_value(self, x, scale):
        return [((x >= 0) & jnp.isfinite(x), "must be >= 0 and finite")]


class LogNormal(_Transformed):
    """LogNormal(loc, scale): exp of a Normal(loc, scale), elementwise.

    Example:
        >>> import genvi as gv, jax
        >>> x = gv.lognormal(0.0, 0.5).sample(jax.random.key(0))
        >>> bool(x > 0), gv.lognormal.domain
        (True, 'positive')
    """

    name = "lognormal"
    domain = "positive"
    param_names = ("loc", "scale")

    def sample(self, key, loc, scale):
        z = jax.random.normal(key, _shape(loc, scale), _dtype(loc, scale))
        # the exponent capped where exp overflows: an infinite draw would make the
        # reverse-mode derivative 0 · inf = NaN, the capped one has derivative 0 there
        return _positive(jnp.exp(jnp.minimum(loc + scale * z, _log_max(z.dtype))))

    def lane_log_prob(self, x, loc, scale):
        inside = x > 0
        log_x = jnp.log(jnp.where(inside, x, 1.0))
        z = (log_x - loc) / scale
        return jnp.where(inside, -0.5 * z * z - jnp.log(scale) - log_x - 0.5 * _LOG_2PI,
                         -jnp.inf)

    def check_params(self, loc, scale):
        return [(jnp.all(scale > 0), "scale must be > 0"),
                (jnp.all(jnp.isfinite(loc)), "loc must be finite")]

    def check_value(self, x, loc, scale):
        return [((x > 0) & jnp.isfinite(x), "must be > 0 and finite")]


class HalfNormal(_HalfLineScale):
    """HalfNormal(scale): abs(Normal(0, scale)), elementwise; a common prior for scales.

    Example:
        >>> import genvi as gv
        >>> round(float(gv.halfnormal(1.0).log_prob(0.0)), 4)   # log √(2/π)
        -0.2258
    """

    name = "halfnormal"

    def sample(self, key, scale):
        z = jax.random.normal(key, jnp.shape(scale), _dtype(scale))
        return _positive(scale * jnp.abs(z))

    def lane_log_prob(self, x, scale):
        def inside(x):
            z = x / scale
            return -0.5 * z * z - jnp.log(scale) + 0.5 * math.log(2 / math.pi)
        return _on_half_line(x, inside)


class Exponential(_Transformed):
    """Exponential(rate), mean 1 / rate, elementwise.

    Example:
        >>> import genvi as gv
        >>> round(float(gv.exponential(2.0).log_prob(0.5)), 4)   # log 2 − 2 · 0.5
        -0.3069
    """

    name = "exponential"
    domain = "positive"
    param_names = ("rate",)

    def sample(self, key, rate):
        e = jax.random.exponential(key, jnp.shape(rate), _dtype(rate))
        # × (1 / rate), not / rate, as gv.gamma: the transpose of `/` overflows at a small rate
        return _positive(e * (1 / rate))

    def lane_log_prob(self, x, rate):
        return _on_half_line(x, lambda x: jnp.log(rate) - rate * x)

    def check_params(self, rate):
        return [(jnp.all(rate > 0), "rate must be > 0")]

    def check_value(self, x, rate):
        return [((x >= 0) & jnp.isfinite(x), "must be >= 0 and finite")]


class StudentT(_Transformed):
    """StudentT(df, loc, scale), elementwise: loc + scale · Z / √(G / df) with
    Z ~ Normal(0, 1) and G ~ Chi²(df) = 2 · Gamma(df / 2); REPARAM differentiates in
    df through the gamma draw's implicit gradient (as gv.gamma does).

    Example:
        >>> import genvi as gv, jax
        >>> gv.student_t(3.0, 0.0, 1.0).sample(jax.random.key(0)).shape
        ()
    """

    name = "student_t"
    domain = "real"
    param_names = ("df", "loc", "scale")

    def sample(self, key, df, loc, scale):
        shape, dtype = _shape(df, loc, scale), _dtype(df, loc, scale)
        k_normal, k_gamma = jax.random.split(key)
        z = jax.random.normal(k_normal, shape, dtype)
        df = jnp.broadcast_to(df, shape).astype(dtype)
        # in log space: a Gamma(df / 2) draw underflows float32 for a small df
        log_g = log_gamma(k_gamma, df / 2)
        # √(df / 2G), capped where it overflows (a tiny df), as lognormal's exponent
        stretch = jnp.exp(jnp.minimum(0.5 * (jnp.log(df / 2) - log_g), _log_max(dtype)))
        return _finite(loc + scale * z * stretch)

    def lane_log_prob(self, x, df, loc, scale):
        z = (x - loc) / scale
        return (special.gammaln((df + 1) / 2) - special.gammaln(df / 2)
                - 0.5 * jnp.log(df * math.pi) - jnp.log(scale)
                - (df + 1) / 2 * jnp.log1p(z * z / df))

    def check_params(self, df, loc, scale):
        return [(jnp.all(df > 0), "df must be > 0"),
                (jnp.all(scale > 0), "scale must be > 0"),
                (jnp.all(jnp.isfinite(loc)), "loc must be finite")]

    def check_value(self, x, df, loc, scale):
        return [(jnp.isfinite(x), "must be finite")]


class HalfCauchy(_HalfLineScale):
    """HalfCauchy(scale): abs(Cauchy(0, scale)) = scale · tan(πU / 2), elementwise; the
    heavy-tailed prior for scales (no mean: summarize it by quantiles).

    Example:
        >>> import genvi as gv
        >>> round(float(gv.halfcauchy(1.0).log_prob(1.0)), 4)   # log(2 / π) − log 2
        -1.1447
    """

    name = "halfcauchy"

    def sample(self, key, scale):
        u = jax.random.uniform(key, jnp.shape(scale), _dtype(scale))
        return _positive(scale * jnp.tan(0.5 * math.pi * u))

    def lane_log_prob(self, x, scale):
        def inside(x):
            z = x / scale
            return math.log(2 / math.pi) - jnp.log(scale) - jnp.log1p(z * z)
        return _on_half_line(x, inside)


class Laplace(_Transformed):
    """Laplace(loc, scale): density exp(−|x − loc| / scale) / (2 scale), elementwise.

    Example:
        >>> import genvi as gv
        >>> round(float(gv.laplace(0.0, 1.0).log_prob(0.0)), 4)   # −log 2
        -0.6931
    """

    name = "laplace"
    domain = "real"
    param_names = ("loc", "scale")

    def sample(self, key, loc, scale):
        e = jax.random.laplace(key, _shape(loc, scale), _dtype(loc, scale))
        return loc + scale * e

    def lane_log_prob(self, x, loc, scale):
        return -jnp.abs(x - loc) / scale - jnp.log(2 * scale)

    def check_params(self, loc, scale):
        return [(jnp.all(scale > 0), "scale must be > 0"),
                (jnp.all(jnp.isfinite(loc)), "loc must be finite")]

    def check_value(self, x, loc, scale):
        return [(jnp.isfinite(x), "must be finite")]
