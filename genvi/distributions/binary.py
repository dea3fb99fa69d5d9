"""The binary distributions: `gv.flip` (a probability) and `gv.bernoulli` (logits), one
law with two parameterizations, each call taking the other by keyword (`probs=` /
`logits=`, as NumPyro). Both have the finite support {False, True} (ENUM), measure-
valued (MVD) and stochastic-derivative (SD) terms, and are `binary` (DisARM); the
term conventions are those of `genvi.distributions.discrete`.

Example:
    >>> import genvi as gv
    >>> gv.flip(0.3).dist is flip, gv.flip(logits=0.0).dist is bernoulli
    (True, True)
"""

from __future__ import annotations

import warnings
from typing import Any

import jax
import jax.numpy as jnp

from genvi.core.mistakes import user_stacklevel
from genvi.distributions.base import DistCall, Distribution


def _bcast(t, shape):
    return None if t is None else jnp.broadcast_to(t, shape)


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
