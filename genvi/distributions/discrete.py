"""Discrete distributions with their finite supports (ENUM) and measure-valued
derivative terms (MVD): categorical, geometric, poisson, binomial (flip and bernoulli,
the binary ones, are in `genvi.distributions.binary`).

`mvd_terms` returns `[(alternative values, weights), ...]`, one pair per term, each
array shaped like the sampled value (one entry per independent lane): the derivative
estimate is Σ weight · f(value with that lane replaced by the alternative). Weights
are linear in the parameter tangents.

`sd_terms(x, params, tangents)` returns `(alternative, weight, magnitude)` for
stochastic derivatives (SD), each shaped like `x`: the derivative estimate is
Σ_lanes weight · (f(x with that lane set to its alternative) − f(x)). Weights are
linear in the tangents (one one-sided rule for every tangent sign, so JAX can
transpose them); the magnitude is a tangent-free number ≥ 0, positive wherever
the weight can be nonzero (SD prunes lanes in proportion to it).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from jax.scipy import special

from genvi.distributions.base import Distribution, static_max


def _bcast(t, shape):
    return None if t is None else jnp.broadcast_to(t, shape)


def _whole(x):
    """Whether each entry is a finite whole number (validation of counts, classes)."""
    x = jnp.asarray(x)
    if not jnp.issubdtype(x.dtype, jnp.inexact):
        return jnp.ones(x.shape, bool)
    return jnp.isfinite(x) & (x == jnp.round(x))


def _xlogy(x, y):
    """x·log(y) for counts x ≥ 0: 0 where x = 0, −inf where y = 0 < x, and a finite
    derivative everywhere (0 at y = 0). `special.xlogy`'s derivative is x/y = 0/0 at
    x = y = 0, and an alternative of probability 0 (a dead ENUM/MVD branch, the
    untaken side of a select) multiplies its zero cotangent by it in reverse mode."""
    x = jnp.asarray(x, jnp.result_type(float, y))
    live, pos = x > 0, ~(y <= 0)   # a NaN y stays NaN
    value = x * jnp.log(jnp.where(live & pos, y, 1.0))
    return jnp.where(live, jnp.where(pos, value, -jnp.inf), 0.0)


def _xlog1my(x, p):
    """x·log(1 − p), as `_xlogy` (0 where x = 0, −inf where p = 1 and x > 0)."""
    x = jnp.asarray(x, jnp.result_type(float, p))
    live, pos = x > 0, ~(p >= 1)
    value = x * jnp.log1p(-jnp.where(live & pos, p, 0.0))
    return jnp.where(live, jnp.where(pos, value, -jnp.inf), 0.0)


class Categorical(Distribution):
    """Categorical over `0..K-1` parameterized by logits (last axis).

    Example:
        >>> import genvi as gv, jax.numpy as jnp
        >>> gv.categorical(jnp.zeros(3), grad=gv.ENUM).dist.name
        'categorical'
    """

    name = "categorical"
    param_names = ("logits",)
    param_event_ndims = (1,)

    def sample(self, key, logits):
        return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)

    def lane_log_prob(self, x, logits):
        logp = jax.nn.log_softmax(logits, axis=-1)
        x = jnp.asarray(x, jnp.int32)
        if logp.ndim == 1:  # one table for every value: indexed, not broadcast per value
            return jnp.take(logp, x, mode="fill", fill_value=jnp.nan)
        logp = jnp.broadcast_to(logp, jnp.shape(x) + logp.shape[-1:])
        # a reshape, not a squeeze: where a plate has one lane, JAX's gather keeps that
        # lane on another axis of size 1, which a reshape follows and a squeeze drops
        return jnp.take_along_axis(logp, x[..., None], axis=-1).reshape(jnp.shape(x))

    def support(self, logits):
        return jnp.arange(logits.shape[-1], dtype=jnp.int32)

    def check_params(self, logits):
        return [(jnp.all(~jnp.isnan(logits)), "logits must not be NaN")]

    def check_value(self, x, logits):
        k = logits.shape[-1]
        return [(_whole(x) & (x >= 0) & (x < k),
                 f"must be a class index: an integer in 0..{k - 1}")]

    def mvd_terms(self, key, x, params, tangents):
        """Logit k: p_k (f(k) − E f), with E f estimated at the sampled value."""
        (t,) = tangents
        if t is None:
            return []
        logits = params[0]
        k = logits.shape[-1]
        p = jnp.broadcast_to(jax.nn.softmax(logits, -1), x.shape + (k,))
        w = p * jnp.broadcast_to(t, x.shape + (k,))
        terms = [(jnp.full_like(x, j), w[..., j]) for j in range(k)]
        return terms + [(x, -jnp.sum(w, -1))]

    def sd_terms(self, x, params, tangents):
        """From an inversion coupling over the classes in decreasing order of
        probability (x = c_r iff F_{r−1} < U ≤ F_r, c_0 the likeliest):
        ∂E f = Σ_r ∂F_r (f(c_r) − f(c_{r+1})), so x = c_r → c_{r+1} with weight
        −∂F_r / p(c_r). With ∂F_r = S_r A_r − F_r B_r (A_r = Σ_{j≤r} p ∂l,
        B_r = Σ_{j>r} p ∂l, S_r = 1 − F_r), abs(w) ≤ 2 F_r S_r / p(c_r) · max abs(∂l) and
        S_r ≤ (K − 1) p(c_{r+1}) ≤ (K − 1) p(c_r): every weight is bounded, the
        magnitude F_r S_r / p(c_r) ≤ K − 1. (In the classes' own order a rare class
        below a likely one would carry its boundary's whole term with weight
        ~1 / p: unbiased, but a mean of many estimates would miss it.) The order is
        the primal probabilities' (no tangent), ties by index."""
        (t,) = tangents
        if t is None:
            return None
        logits = params[0]
        k = logits.shape[-1]
        p = jnp.broadcast_to(jax.nn.softmax(logits, -1), x.shape + (k,))
        t = jnp.broadcast_to(t, x.shape + (k,))
        rank = _ranks(p)                                 # each class's place, likeliest first
        xi = jnp.asarray(x, jnp.int32)[..., None]
        r_x = jnp.take_along_axis(rank, xi, -1)          # x's place
        below = rank <= r_x                              # classes up to x in the order
        f_r = jnp.sum(jnp.where(below, p, 0.0), -1)      # F_r
        s_r = jnp.sum(jnp.where(below, 0.0, p), -1)      # S_r = 1 − F_r, accurately
        a_r = jnp.sum(jnp.where(below, p * t, 0.0), -1)
        b_r = jnp.sum(jnp.where(below, 0.0, p * t), -1)
        alt = jnp.argmax(rank == r_x + 1, -1)            # the class after x (0 if none)
        p_x = jnp.take_along_axis(p, xi, -1)[..., 0]
        p_alt = jnp.take_along_axis(p, alt[..., None], -1)[..., 0]
        # the next class has positive probability (after it in the order, none has)
        live = (r_x[..., 0] < k - 1) & (p_alt > 0) & (p_x > 0)
        q = jnp.where(live, p_x, 1.0)
        w = jnp.where(live, -(s_r * a_r - f_r * b_r) / q, 0.0)
        return alt.astype(x.dtype), w, jnp.where(live, f_r * s_r / q, 0.0)


def _ranks(p: jax.Array) -> jax.Array:
    """Each class's place (last axis) in decreasing order of probability, ties by
    index. Few classes: by counting the classes before each, elementwise, which XLA
    fuses into the step (a sort inside a scan's body keeps XLA:CPU from compiling the
    loop whole); many: by sorting."""
    k = p.shape[-1]
    if k > 32:
        return jnp.argsort(jnp.argsort(-p, axis=-1), axis=-1)
    i = jnp.arange(k)
    p_i, p_j = p[..., :, None], p[..., None, :]
    before = (p_i > p_j) | ((p_i == p_j) & (i[:, None] < i[None, :]))
    return jnp.sum(before, axis=-2)


class Geometric(Distribution):
    """Number of failures before the first success (support 0, 1, ...), as TFP.

    Example:
        >>> import genvi as gv
        >>> gv.geometric(0.4, grad=gv.MVD).dist.name
        'geometric'
    """

    name = "geometric"
    lanewise = True
    param_names = ("p",)

    def sample(self, key, p):
        u = jax.random.uniform(key, jnp.shape(p), jnp.result_type(float, p), minval=1e-37)
        return jnp.floor(jnp.log(u) / jnp.log1p(-p)).astype(jnp.int32)

    def lane_log_prob(self, x, p):
        return _xlog1my(x, p) + jnp.log(p)   # finite derivative at p = 1 (x = 0)

    def check_params(self, p):
        return [(jnp.all((p > 0) & (p <= 1)), "p must be a probability in (0, 1]")]

    def check_value(self, x, p):
        return [(_whole(x) & (x >= 0), "must be a count: a whole number >= 0")]

    def mvd_terms(self, key, x, params, tangents):
        """∂p E f = (1/p) E[f(X) − f(1 + X + X′)] (size-biased law)."""
        (t,) = tangents
        if t is None:
            return []
        p = jnp.broadcast_to(params[0], x.shape)
        x2 = self.sample(key, p)
        c = _bcast(t, x.shape) / p
        return [(x, c), (1 + x + x2, -c)]

    def sd_terms(self, x, params, tangents):
        """x > 0 → x − 1 with weight ∂p x / (p (1 − p))."""
        (t,) = tangents
        if t is None:
            return None
        p = jnp.broadcast_to(params[0], x.shape)
        live = (x > 0) & (p < 1)
        m = jnp.where(live, x / jnp.where(live, p * (1 - p), 1.0), 0.0)
        return x - 1, m * _bcast(t, x.shape), m


class Poisson(Distribution):
    """Poisson(rate).

    Example:
        >>> import genvi as gv
        >>> gv.poisson(3.0, grad=gv.MVD).dist.name
        'poisson'
    """

    name = "poisson"
    lanewise = True
    param_names = ("rate",)

    def sample(self, key, rate):
        return jax.random.poisson(key, rate, jnp.shape(rate)).astype(jnp.int32)

    def lane_log_prob(self, x, rate):
        x = jnp.asarray(x, jnp.result_type(float, rate))
        return _xlogy(x, rate) - rate - special.gammaln(x + 1)

    def check_params(self, rate):
        return [(jnp.all(rate > 0), "rate must be > 0")]

    def check_value(self, x, rate):
        return [(_whole(x) & (x >= 0), "must be a count: a whole number >= 0")]

    def mvd_terms(self, key, x, params, tangents):
        """∂λ E f = E[f(X + 1) − f(X)]."""
        (t,) = tangents
        if t is None:
            return []
        c = _bcast(t, x.shape)
        return [(x + 1, c), (x, -c)]

    def sd_terms(self, x, params, tangents):
        """x → x + 1 with weight ∂λ (every lane, magnitude 1)."""
        (t,) = tangents
        if t is None:
            return None
        return x + 1, _bcast(t, x.shape), jnp.ones(x.shape, jnp.result_type(float, params[0]))


class Binomial(Distribution):
    """Binomial(n, p): successes in `n` trials. Where n is static (a Python int or a
    numpy array) its finite support 0..n is known when the program is traced, so the
    site can be summed (`gv.ENUM`, `gv.enumeration()`): the call keeps the largest n
    as a static part of the distribution (`most`), which stays known under `vmap`.

    Example:
        >>> import genvi as gv
        >>> gv.binomial(5, 0.3, grad=gv.MVD).dist.name, gv.binomial(5, 0.3).dist.most
        ('binomial', 5)
    """

    name = "binomial"
    lanewise = True
    param_names = ("n", "p")

    def __init__(self, most: int | None = None):
        self.most = most

    def __eq__(self, other: Any) -> bool:
        return type(other) is type(self) and other.most == self.most

    def __hash__(self) -> int:
        return hash((type(self), self.most))

    def __call__(self, *params: Any, grad: Any = None) -> Any:
        most = static_max(params[0]) if params else None   # n static: bounds the support
        return Distribution.__call__(Binomial(most), *params, grad=grad)

    def sample(self, key, n, p):
        shape = jnp.broadcast_shapes(jnp.shape(n), jnp.shape(p))
        dtype = jnp.result_type(float, p)
        return jax.random.binomial(key, jnp.asarray(n, dtype), p, shape).astype(jnp.int32)

    def lane_log_prob(self, x, n, p):
        dtype = jnp.result_type(float, p)
        x, n = jnp.asarray(x, dtype), jnp.asarray(n, dtype)
        # a count outside 0..n has probability 0 (its support is summed up to the
        # largest n of a batch): computed at 0, then −inf, so no NaN reaches a gradient
        inside = (x >= 0) & (x <= n)
        x = jnp.where(inside, x, 0.0)
        log_choose = special.gammaln(n + 1) - special.gammaln(x + 1) - special.gammaln(n - x + 1)
        log_p = log_choose + _xlogy(x, p) + _xlog1my(n - x, p)   # safe at p = 0 and 1
        return jnp.where(inside, log_p, -jnp.inf)

    def support(self, n, p):
        """0..n (the largest n of a batch), where n is static: a Python int or a numpy
        array, not a traced value."""
        top = self.most if self.most is not None else static_max(n)
        if top is None:
            raise TypeError(
                "gv.binomial(n, p) has the finite support 0..n only where n is static (a "
                "Python int or a numpy array, fixed when the program is traced); here n is "
                "a traced value, computed from the program's inputs. Pass n as a constant, or "
                "keep the site and give it a guide")
        return jnp.arange(top + 1, dtype=jnp.int32)

    def check_params(self, n, p):
        return [(jnp.all((p >= 0) & (p <= 1)), "p must be a probability in [0, 1]"),
                (jnp.all(n >= 0), "n must be >= 0")]

    def check_value(self, x, n, p):
        return [(_whole(x) & (x >= 0) & (x <= n), "must be a count: a whole number in 0..n")]

    def mvd_terms(self, key, x, params, tangents):
        """∂p E f = n E[f(Y + 1) − f(Y)], Y ~ Binomial(n − 1, p)."""
        _, t = tangents
        if t is None:
            return []
        n, p = (jnp.broadcast_to(q, x.shape) for q in params)
        y = self.sample(key, n - 1, p)
        c = jnp.asarray(n, p.dtype) * _bcast(t, x.shape)
        return [(y + 1, c), (y, -c)]

    def sd_terms(self, x, params, tangents):
        """x < n → x + 1 with weight ∂p (n − x) / (1 − p) (∂n is not differentiated)."""
        _, t = tangents
        if t is None:
            return None
        n, p = (jnp.broadcast_to(q, x.shape) for q in params)
        live = (x < n) & (p > 0) & (p < 1)
        m = jnp.where(live, (n - x) / jnp.where(live, 1 - p, 1.0), 0.0)
        return x + 1, m * _bcast(t, x.shape), m
