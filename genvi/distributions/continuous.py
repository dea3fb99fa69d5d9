"""Continuous distributions: normal (with MVD), multivariate normals, uniform, beta,
gamma and dirichlet (implicitly reparameterized through `jax.random`)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy import special

from genvi.distributions.base import Distribution
from genvi.distributions.gamma_sampler import gamma as fast_gamma, log_gamma


def _shape(*params):
    return jnp.broadcast_shapes(*(jnp.shape(p) for p in params))


def _inside(x, low, high):
    """`x` clipped into [low, high], with the derivative of `x` itself (straight
    through): a draw that rounds to the boundary of an open support in float32 (a
    beta draw within 6e-8 of 1: 10% of beta(0.1, 0.1)) has a log density of ±inf, and
    the clip keeps the pathwise (implicit) gradient of the unclipped draw."""
    return x + jax.lax.stop_gradient(jnp.clip(x, low, high) - x)


def _open_unit(x):
    """`_inside` the open interval (0, 1): [smallest normal float, 1 − 2⁻²⁴]."""
    info = jnp.finfo(x.dtype)
    return _inside(x, info.tiny, 1 - info.epsneg)


class Normal(Distribution):
    """Normal(loc, scale), elementwise over broadcast parameters.

    Example:
        >>> import genvi as gv
        >>> gv.normal(0.0, 1.0, grad=gv.REPARAM).dist.name
        'normal'
    """

    name = "normal"
    lanewise = True
    domain = "real"
    reparameterized = True
    param_names = ("loc", "scale")

    def sample(self, key, loc, scale):
        shape = _shape(loc, scale)
        dtype = jnp.result_type(float, loc, scale)
        return loc + scale * jax.random.normal(key, shape, dtype)

    def lane_log_prob(self, x, loc, scale):
        z = (x - loc) / scale
        return -0.5 * z * z - jnp.log(scale) - 0.5 * math.log(2 * math.pi)

    def check_params(self, loc, scale):
        return [(jnp.all(scale > 0), "scale must be > 0"),
                (jnp.all(jnp.isfinite(loc)), "loc must be finite")]

    def check_value(self, x, loc, scale):
        return [(jnp.isfinite(x), "must be finite")]

    def mvd_terms(self, key, x, params, tangents):
        """∂loc: Weibull(2, √2) pair; ∂scale: double-sided Maxwell vs coupled normal."""
        loc, scale = (jnp.broadcast_to(p, x.shape) for p in params)
        t_loc, t_scale = tangents
        k1, k2, k3, k4 = jax.random.split(key, 4)
        terms = []
        if t_loc is not None:
            u = jax.random.uniform(k1, x.shape, x.dtype, minval=1e-12)
            w = jnp.sqrt(2.0) * jnp.sqrt(-jnp.log(u))  # Weibull(shape 2, scale √2)
            c = jnp.broadcast_to(t_loc, x.shape) / (scale * math.sqrt(2 * math.pi))
            terms += [(loc + scale * w, c), (loc - scale * w, -c)]
        if t_scale is not None:
            g = jax.random.normal(k2, (3,) + x.shape, x.dtype)
            sign = jnp.where(jax.random.bernoulli(k3, 0.5, x.shape), 1.0, -1.0)
            m = sign * jnp.sqrt(jnp.sum(g * g, axis=0))  # double-sided Maxwell
            u = jax.random.uniform(k4, x.shape, x.dtype)
            c = jnp.broadcast_to(t_scale, x.shape) / scale
            terms += [(loc + scale * m, c), (loc + scale * u * m, -c)]
        return terms


class MvNormalDiag(Normal):
    """Multivariate normal with diagonal scale: a vector of independent normals.

    Example:
        >>> import genvi as gv, jax.numpy as jnp
        >>> gv.mv_normal_diag(jnp.zeros(3), jnp.ones(3)).dist.name
        'mv_normal_diag'
    """

    name = "mv_normal_diag"
    lanewise = False  # a vector-valued event: replays treat its draw as coupling lanes
    param_names = ("loc", "scale_diag")


class MvNormal(Distribution):
    """Multivariate normal with full covariance (last axis is the event).

    Example:
        >>> import genvi as gv, jax.numpy as jnp
        >>> gv.mv_normal(jnp.zeros(2), jnp.eye(2)).dist.name
        'mv_normal'
    """

    name = "mv_normal"
    domain = "real"
    reparameterized = True
    param_names = ("loc", "covariance")
    param_event_ndims = (1, 2)
    value_event_ndim = 1

    def sample(self, key, loc, cov):
        chol = jnp.linalg.cholesky(cov)
        shape = jnp.broadcast_shapes(jnp.shape(loc), jnp.shape(cov)[:-1])
        eps = jax.random.normal(key, shape, jnp.result_type(float, loc, cov))
        return loc + jnp.einsum("...ij,...j->...i", chol, eps)

    def lane_log_prob(self, x, loc, cov):
        chol = jnp.linalg.cholesky(cov)
        d = x - loc
        shape = jnp.broadcast_shapes(d.shape, chol.shape[:-1])
        z = jax.scipy.linalg.solve_triangular(jnp.broadcast_to(chol, shape + shape[-1:]),
                                              jnp.broadcast_to(d, shape)[..., None],
                                              lower=True)[..., 0]
        k = x.shape[-1]
        half_logdet = jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), -1)
        return -0.5 * jnp.sum(z * z, -1) - half_logdet - 0.5 * k * math.log(2 * math.pi)

    def check_params(self, loc, cov):
        chol = jnp.linalg.cholesky(cov)
        return [(jnp.all(jnp.isfinite(chol)), "covariance must be symmetric positive definite")]

    def check_value(self, x, loc, cov):
        return [(jnp.all(jnp.isfinite(x), -1), "must be finite")]


class Uniform(Distribution):
    """Uniform(low, high).

    Example:
        >>> import genvi as gv
        >>> gv.uniform(0.0, 1.0).dist.name
        'uniform'
    """

    name = "uniform"
    lanewise = True
    domain = "interval"
    # No REINFORCE: the support moves with low/high, so the score function misses
    # the boundary terms and would be biased (the density, 1/(high-low), only sees
    # the width). REPARAM is exact.
    scorable = False
    reparameterized = True
    param_names = ("low", "high")

    def sample(self, key, low, high):
        shape = _shape(low, high)
        u = jax.random.uniform(key, shape, jnp.result_type(float, low, high))
        return low + (high - low) * u

    def lane_log_prob(self, x, low, high):
        inside = (x >= low) & (x <= high)
        return jnp.where(inside, -jnp.log(high - low), -jnp.inf)

    def check_params(self, low, high):
        return [(jnp.all(high > low), "high must be > low")]

    def check_value(self, x, low, high):
        return [((x >= low) & (x <= high), "must lie in [low, high]")]


class Beta(Distribution):
    """Beta(a, b) with implicit reparameterization gradients (a ratio of fast gammas).

    Example:
        >>> import genvi as gv
        >>> gv.beta(2.0, 3.0).dist.name
        'beta'
    """

    name = "beta"
    lanewise = True
    domain = "unit_interval"
    reparameterized = True
    param_names = ("a", "b")

    def sample(self, key, a, b):
        shape = _shape(a, b)
        dtype = jnp.result_type(float, a, b)
        ab = jnp.stack([jnp.broadcast_to(a, shape), jnp.broadcast_to(b, shape)]).astype(dtype)
        g = log_gamma(key, ab)           # one RNG call for both gammas; in log space,
        return _open_unit(jax.nn.sigmoid(g[0] - g[1]))   # as gammas of a, b ≪ 1 underflow

    def lane_log_prob(self, x, a, b):
        return ((a - 1) * jnp.log(x) + (b - 1) * jnp.log1p(-x)
                - (special.gammaln(a) + special.gammaln(b) - special.gammaln(a + b)))

    def check_params(self, a, b):
        return [(jnp.all((a > 0) & (b > 0)), "a and b must be > 0")]

    def check_value(self, x, a, b):
        return [((x >= 0) & (x <= 1), "must lie in [0, 1]")]


class Gamma(Distribution):
    """Gamma(shape, rate) with implicit reparameterization gradients.

    Example:
        >>> import genvi as gv
        >>> gv.gamma(2.0, 1.0).dist.name
        'gamma'
    """

    name = "gamma"
    lanewise = True
    domain = "positive"
    reparameterized = True
    param_names = ("shape", "rate")

    def sample(self, key, conc, rate):
        shape = _shape(conc, rate)
        dtype = jnp.result_type(float, conc, rate)
        # × (1 / rate), not / rate: the transpose of `/` forms ct · rate⁻² first, which
        # overflows for a draw near 0 (its log density's cotangent ~ 1/x) at a small rate
        x = fast_gamma(key, jnp.broadcast_to(conc, shape).astype(dtype)) * (1 / rate)
        return _inside(x, jnp.finfo(dtype).tiny, jnp.finfo(dtype).max)  # 0 for a large rate

    def lane_log_prob(self, x, conc, rate):
        return (conc * jnp.log(rate) + (conc - 1) * jnp.log(x) - rate * x
                - special.gammaln(conc))

    def check_params(self, conc, rate):
        return [(jnp.all((conc > 0) & (rate > 0)), "shape and rate must be > 0")]

    def check_value(self, x, conc, rate):
        return [((x >= 0) & jnp.isfinite(x), "must be >= 0 and finite")]


class Dirichlet(Distribution):
    """Dirichlet(concentration); the last axis is the event.

    Example:
        >>> import genvi as gv, jax.numpy as jnp
        >>> gv.dirichlet(jnp.ones(3)).dist.name
        'dirichlet'
    """

    name = "dirichlet"
    domain = "simplex"
    reparameterized = True
    param_names = ("concentration",)
    param_event_ndims = (1,)
    value_event_ndim = 1

    def sample(self, key, alpha):
        g = log_gamma(key, alpha.astype(jnp.result_type(float, alpha)))
        return _open_unit(jax.nn.softmax(g, axis=-1))  # log space: small alphas underflow

    def lane_log_prob(self, x, alpha):
        return (jnp.sum((alpha - 1) * jnp.log(x), -1) + special.gammaln(jnp.sum(alpha, -1))
                - jnp.sum(special.gammaln(alpha), -1))

    def check_params(self, alpha):
        return [(jnp.all(alpha > 0), "concentration must be > 0")]

    def check_value(self, x, alpha):
        # float32 sums of normalized vectors are off by ~k·6e-8; 1e-3 flags real mistakes
        ok = jnp.all(x >= 0, -1) & (jnp.abs(jnp.sum(x, -1) - 1) <= 1e-3)
        return [(ok, "must be a probability vector (entries >= 0 summing to 1)")]
