"""Discrete distributions with their finite supports (ENUM) and measure-valued
derivative terms (MVD): flip, bernoulli, categorical, geometric, poisson, binomial.

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

import warnings
from typing import Any

import jax
import jax.numpy as jnp
from jax.scipy import special

from genvi.core.mistakes import user_stacklevel
from genvi.distributions.base import DistCall, Distribution


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


def _flip_terms(x, dp):
    """∂p E f = f(1) − f(0), per lane: written as ±dp at the other value and ∓dp at
    `x` itself (which MVD takes from the final result, with no replay)."""
    sign = jnp.where(x, -1.0, 1.0).astype(jnp.result_type(dp))
    return [(~x if x.dtype == jnp.bool_ else 1 - x, sign * dp), (x, -sign * dp)]


def _flip_sd(x, p, dp, m):
    """∂E f = ∂p (f(1) − f(0)), carried by the more probable value so that no weight
    is large (abs(w) ≤ 2 abs(∂p)): at p < ½, x = 0 → 1 with w = ∂p / (1 − p); at p ≥ ½,
    x = 1 → 0 with w = −∂p / p. (Carried by x = 0 alone, a flip near p = 1 would put
    the whole derivative on a rare draw with weight 1 / (1 − p): unbiased, but a mean
    of many estimates would miss it.) The magnitude `m` is w per unit of tangent. A
    lane at p = 0 or 1 is dropped: its alternative has probability 0 (as MVD's)."""
    one = jnp.asarray(x).astype(bool)
    low = p < 0.5
    on = jnp.where(low, ~one, one) & (p > 0) & (p < 1)
    q = jnp.where(on, jnp.where(low, 1 - p, p), 1.0)
    w = jnp.where(low, dp, -dp) / q
    return (jnp.logical_not(one).astype(jnp.asarray(x).dtype), jnp.where(on, w, 0.0),
            jnp.where(on, m / q, 0.0))


@jax.custom_jvp
def _bernoulli_log_prob(logits, x):
    """x·l − softplus(l), one `exp` per lane and no logits-sized temporaries: the
    value is written per sign of l, and the JVP is (x − σ(l))·dl with σ from the same
    e = exp(−|l|). (`jax.nn.softplus` is `logaddexp(l, 0)`, whose JVP spends a
    second `exp`; its `max(l, 0)` also makes XLA:CPU materialize the logits and a
    zeros array before the row reduction: together about 2% of a VAE step.)"""
    return jnp.where(logits >= 0, (x - 1) * logits, x * logits) - jnp.log1p(jnp.exp(-jnp.abs(logits)))


def _bernoulli_dlogits(dl, ans, logits, x):
    e = jnp.exp(-jnp.abs(logits))
    return (x - jnp.where(logits >= 0, 1.0, e) / (1.0 + e)) * dl


_bernoulli_log_prob.defjvps(_bernoulli_dlogits, lambda dx, ans, logits, x: logits * dx)


def _one_form(call: str, positional: tuple, probs: Any, logits: Any,
              ways: str = "a probability (positionally, or probs=p) or logits (logits=l)") -> str:
    """Which parameterization a call of `gv.flip` / `gv.bernoulli` gave: "positional",
    "probs" or "logits"; exactly one must be given."""
    given = (["positional"] if positional else []) + [
        name for name, v in (("probs", probs), ("logits", logits)) if v is not None]
    if len(given) != 1 or len(positional) > 1:
        raise TypeError(f"{call} takes one parameterization: {ways}; got "
                        f"{', '.join(given) or 'none'}"
                        + (f" with {len(positional)} positional values" if len(positional) > 1
                           else ""))
    return given[0]


class Flip(Distribution):
    """Bernoulli parameterized by the probability `p` of True; `gv.flip(logits=l)` is
    the same law parameterized by logits (as NumPyro's `probs=` / `logits=`).

    Args:
        p: the probability of True (positionally, or `probs=`); any shape, a lane each.
        logits: instead of `p`, its logits: `gv.flip(logits=l)` is `gv.bernoulli(logits=l)`.
        grad: the gradient strategy where the site is sampled in an objective.

    Example:
        >>> import genvi as gv
        >>> gv.flip(0.3, grad=gv.ENUM).dist.name, gv.flip(logits=0.0).dist.name
        ('flip', 'bernoulli')
    """

    name = "flip"
    lanewise = True
    binary = True
    param_names = ("p",)

    def __call__(self, *params: Any, probs: Any = None, logits: Any = None,
                 grad: Any = None) -> DistCall:
        form = _one_form("gv.flip", params, probs, logits)
        if form == "logits":
            return Distribution.__call__(bernoulli, logits, grad=grad)
        return super().__call__(*(params or (probs,)), grad=grad)

    def sample(self, key, p):
        return jax.random.bernoulli(key, p, jnp.shape(p))

    def lane_log_prob(self, x, p):
        # log p or log(1 − p), with every argument kept at a safe value where it is
        # unused or where the probability is 0 (−inf with derivative 0, not ∞): p = 0
        # is common (AIR's presence after an absent object), and a dead alternative
        # multiplies a zero cotangent by this derivative in reverse mode (0 × ∞ = NaN).
        on = jnp.asarray(x).astype(bool)
        p = jnp.asarray(p, jnp.result_type(float, p))
        ok = jnp.where(on, ~(p <= 0), ~(p >= 1))   # a NaN p stays NaN
        logp = jnp.where(on, jnp.log(jnp.where(on & ok, p, 1.0)),
                         jnp.log1p(-jnp.where(on | ~ok, 0.0, p)))
        return jnp.where(ok, logp, -jnp.inf)

    def lane_prob(self, x, p):
        return jnp.where(jnp.asarray(x).astype(bool), p, 1 - p)

    def support(self, p):
        return jnp.array([False, True])

    def check_params(self, p):
        return [(jnp.all((p >= 0) & (p <= 1)), "p must be a probability in [0, 1]")]

    def check_value(self, x, p):
        return [((x == 0) | (x == 1), "must be True/False (or 1/0)")]

    def mvd_terms(self, key, x, params, tangents):
        (t,) = tangents
        return [] if t is None else _flip_terms(x, _bcast(t, x.shape))

    def sd_terms(self, x, params, tangents):
        """x = 0 → 1, weight ∂p / (1 − p)."""
        (t,) = tangents
        if t is None:
            return None
        p = jnp.broadcast_to(params[0], x.shape)
        return _flip_sd(x, p, _bcast(t, x.shape), jnp.ones_like(p))


class Bernoulli(Distribution):
    """Bernoulli parameterized by logits (any shape: pixels are a product), written
    `gv.bernoulli(logits=l)`; `gv.bernoulli(probs=p)` is the same law parameterized by
    the probability of True (`gv.flip(p)`), as NumPyro's `probs=` / `logits=`.

    A positional value is taken as logits, as in earlier releases, with a
    `DeprecationWarning`: NumPyro and `gv.flip` read a positional value as a
    probability, and `gv.bernoulli` will too, so name the parameterization.

    Args:
        logits: the log-odds of True; any shape, a lane each.
        probs: instead of `logits`, the probability of True (`gv.flip(probs)`).
        grad: the gradient strategy where the site is sampled in an objective.

    Example:
        >>> import genvi as gv, jax.numpy as jnp
        >>> gv.bernoulli(logits=jnp.zeros(4), grad=gv.ENUM).dist.name
        'bernoulli'
        >>> gv.bernoulli(probs=0.3).dist.name
        'flip'
    """

    name = "bernoulli"
    lanewise = True
    binary = True
    param_names = ("logits",)

    def __call__(self, *params: Any, probs: Any = None, logits: Any = None,
                 grad: Any = None) -> DistCall:
        form = _one_form("gv.bernoulli", params, probs, logits,
                         ways="logits (logits=l) or a probability (probs=p)")
        if form == "probs":
            return Distribution.__call__(flip, probs, grad=grad)
        if form == "positional":
            warnings.warn("gv.bernoulli(x) reads x as logits; write gv.bernoulli(logits=x) "
                          "(or gv.bernoulli(probs=p) for a probability): a positional value "
                          "will be read as a probability, as NumPyro and gv.flip read it",
                          DeprecationWarning, stacklevel=user_stacklevel())
        return super().__call__(*(params or (logits,)), grad=grad)

    def sample(self, key, logits):
        return jax.random.bernoulli(key, jax.nn.sigmoid(logits), jnp.shape(logits))

    def lane_log_prob(self, x, logits):
        x = jnp.asarray(x, jnp.result_type(float, logits))
        return _bernoulli_log_prob(logits, x)   # = x log σ(l) + (1 − x) log σ(−l)

    def support(self, logits):
        return jnp.array([False, True])

    def check_params(self, logits):
        return [(jnp.all(~jnp.isnan(logits)), "logits must not be NaN")]

    def check_value(self, x, logits):
        return [((x == 0) | (x == 1), "must be True/False (or 1/0)")]

    def mvd_terms(self, key, x, params, tangents):
        (t,) = tangents
        if t is None:
            return []
        p = jax.nn.sigmoid(jnp.broadcast_to(params[0], x.shape))
        return _flip_terms(x, p * (1 - p) * _bcast(t, x.shape))

    def sd_terms(self, x, params, tangents):
        """The flip's rule with ∂p = σ(l)(1 − σ(l)) ∂l: weight σ(l) ∂l at x = 0."""
        (t,) = tangents
        if t is None:
            return None
        p = jax.nn.sigmoid(jnp.broadcast_to(params[0], x.shape))
        s = p * (1 - p)
        return _flip_sd(x, p, s * _bcast(t, x.shape), s)


#: `gv.flip` and `gv.bernoulli`: one law, two parameterizations, each call taking the
#: other by keyword
flip = Flip()
bernoulli = Bernoulli()


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
        return jnp.take_along_axis(logp, x[..., None], axis=-1)[..., 0]

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
    """Binomial(n, p): successes in `n` trials.

    Example:
        >>> import genvi as gv
        >>> gv.binomial(5, 0.3, grad=gv.MVD).dist.name
        'binomial'
    """

    name = "binomial"
    lanewise = True
    param_names = ("n", "p")

    def sample(self, key, n, p):
        shape = jnp.broadcast_shapes(jnp.shape(n), jnp.shape(p))
        dtype = jnp.result_type(float, p)
        return jax.random.binomial(key, jnp.asarray(n, dtype), p, shape).astype(jnp.int32)

    def lane_log_prob(self, x, n, p):
        dtype = jnp.result_type(float, p)
        x, n = jnp.asarray(x, dtype), jnp.asarray(n, dtype)
        log_choose = special.gammaln(n + 1) - special.gammaln(x + 1) - special.gammaln(n - x + 1)
        return log_choose + _xlogy(x, p) + _xlog1my(n - x, p)   # safe at p = 0 and 1

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
