"""SWOR: the unordered-set estimator with its built-in baseline (Kool, van Hoof and
Welling 2020), `gv.SWOR(k)`, for sites with a finite support (`gv.categorical`, and
`gv.flip` / `gv.bernoulli` with k ≤ 2).

Each lane draws k distinct values S = {s₁, …, s_k} without replacement: s₁ is the
distribution's own draw with the site's key, the others the top k − 1 of Gumbel-
perturbed log-probabilities over the rest of the support (together: sampling without
replacement). With p(T | A) the probability of drawing the set T, in any order,
without replacement from the support less A,

    R(S, s)    = p(S \\ {s} | {s}) / p(S | ∅)
    B(S, s)    = p(s) f(s) + Σ_{s' ≠ s} p(s') · p(S \\ {s, s'} | {s, s'}) / p(S \\ {s} | {s}) · f(s')
    ∇ E f  ≈  Σ_{s ∈ S} ∇p(s) R(S, s) (f(s) − B(S, s))

B(S, s) estimates E f without bias given that s was drawn (the same estimator over the
rest of the set), so the baseline adds no bias; with k equal to the number of values
R = 1 and B = E f: the gradient is exact. Expanded, the gradient is linear in the f(sⱼ):
a weight on f(s₁) (the final result, a score term) and on each other value a lane-
local replay, as MVD's. At a single-lane site whose continuation can branch, the k
values are evaluated as duals and the value is the unordered-set estimate
Σ p(s) R(S, s) f(s) (exact too at k = number of values). Set probabilities sum over
the k! orders of a set, so k is at most 6.

Example:
    >>> import genvi as gv, jax, jax.numpy as jnp
    >>> @gv.expectation
    ... def e(logits):
    ...     return gv.sample(gv.categorical(logits, grad=gv.SWOR(3))) * 1.0
    >>> # exact at k = 3 categories: E x = Σ x softmax(logits)_x
    >>> round(float(e.estimate(jax.random.key(0), jnp.zeros(3))), 5)
    1.0
"""

from __future__ import annotations

import itertools
import numbers
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.scipy.special import gammaln, logsumexp

from genvi.adev import dual as d
from genvi.adev.finite import at_each_value, branches, index_in_support
from genvi.core.strategy import Strategy, register_with_settings

MAX_K = 6  # set probabilities sum over k! orders


@dataclass(frozen=True)
class SWOR(Strategy):
    """The unordered-set estimator with k values drawn without replacement (see the
    module docstring).

    Example:
        >>> import genvi as gv
        >>> gv.SWOR(4)
        gv.SWOR(4)
    """

    k: int = 2
    kind = "SWOR"
    needs = ("sample", "support", "lane_prob")

    def __post_init__(self):
        k = self.k
        if isinstance(k, bool) or not isinstance(k, numbers.Integral) or not 2 <= k <= MAX_K:
            raise ValueError(f"gv.SWOR(k) needs an int k with 2 <= k <= {MAX_K} (its set "
                             f"probabilities sum over the k! orders of a set); got {k!r}. "
                             "At k = the number of values it is exact, as gv.ENUM is at "
                             "any number")
        object.__setattr__(self, "k", int(k))   # a NumPy integer too

    def __repr__(self) -> str:
        return f"gv.SWOR({self.k})"

    def jvp(self, dist: Any, key: jax.Array, primals: tuple, tangents: tuple, k: Any) -> Any:
        x = dist.sample(key, *primals)
        support = dist.support(*primals)
        size = support.shape[0]
        if self.k > size:
            raise ValueError(f"gv.SWOR({self.k}) at the site {k.address!r} (gv.{dist.name}, "
                             f"{size} values): k can be at most the number of values; use "
                             f"gv.SWOR({size}), which is exact, or a smaller k")
        if all(t is None for t in tangents):
            return k.dual(x)

        def probs(*params):  # [values, lanes...], normalized (a masked lane: uniform)
            p = at_each_value(dist.lane_prob, support, x, *params)
            return p / jnp.sum(p, axis=0)

        p_all, dp_all = d.jvp(probs, primals, tangents)
        if dp_all is None:
            return k.dual(x)
        at = index_in_support(support, x)
        index = jnp.arange(size).reshape((-1,) + (1,) * x.ndim)
        gumbel = jax.random.gumbel(jax.random.fold_in(key, 1), p_all.shape, p_all.dtype)
        # values of probability 0 rank below every other value but above x itself, so
        # they are drawn only once the others are exhausted, and x never twice
        keyed = jnp.where(index == at, -jnp.inf,
                          jnp.where(p_all > 0, jnp.log(p_all) + gumbel, jnp.finfo(p_all.dtype).min))
        rest = jax.lax.top_k(jnp.moveaxis(keyed, 0, -1), self.k - 1)[1]   # [lanes..., k − 1]
        chosen = jnp.concatenate([at[None], jnp.moveaxis(rest, -1, 0)])   # [k, lanes...]
        p = jnp.take_along_axis(p_all, chosen, axis=0)
        dp = jnp.take_along_axis(dp_all, chosen, axis=0)
        # the mass of the values not in the set, summed (not 1 minus the set's mass)
        in_set = jnp.any(index[None] == chosen[:, None], axis=0)         # [values, lanes...]
        outside = jnp.sum(jnp.where(in_set, 0.0, p_all), axis=0)
        ratio, coeff = _unordered_set_weights(p, outside)
        # ∇ ≈ Σ_i dp_i R_i (f_i − Σ_j c_ij f_j): the weight of f_j
        weights = dp * ratio - jnp.einsum("i...,ij...->j...", dp * ratio, coeff)
        values = support[chosen].astype(x.dtype)
        live = p > 0  # a value of probability 0 adds nothing (its f may be ±inf)
        if x.size == 1 and k.can_branch and not getattr(dist, "is_masked", False):
            # values of probability 0 (k above the values that can be drawn) run at x
            alive = live.reshape(self.k)
            shaped = values.reshape((self.k,) + x.shape)
            run = branches(k, shaped, alive, shaped[0])
            k.note(f"rest of the program at {self.k} of {size} values, drawn without replacement"
                   + (" (all: exact)" if self.k == size else ""))

            def total(w, f):
                return jnp.sum(jnp.where(alive, w * jnp.where(alive, f, 0.0), 0.0))
            w = (p * ratio).reshape(self.k)
            tangent = d.add(None if run.tangent is None else total(w, run.tangent),
                            total(weights.reshape(self.k), run.primal))
            return d.Dual(total(w, run.primal), tangent)
        return k.dual(x).plus(score=jnp.sum(weights[0])).plus_replays(values[1:], weights[1:],
                                                                     live[1:])


def _orders(m: int) -> jax.Array:
    return jnp.array(list(itertools.permutations(range(m))), jnp.int32).reshape(-1, m)


def _log_set_prob(p: jax.Array, outside: jax.Array) -> jax.Array:
    """The log probability of drawing the values whose probabilities are `p`
    [m, lanes...] as a set, in any order, without replacement from what is left of the
    support once the set's other values were taken out, where `outside` [lanes...] is
    the mass of the values not in the whole set. Each draw's denominator is `outside`
    plus the mass of the values still to come (summed directly, not 1 minus a sum, so
    a value of probability near 1 loses nothing to cancellation), in log space.
    Values of probability 0 (drawn only once the others were exhausted) are left out:
    the set's probability is its other values'."""
    m = p.shape[0]
    if m == 0:
        return jnp.zeros_like(outside)
    ordered = p[_orders(m)]                                       # [m!, m, lanes...]
    still = jnp.cumsum(ordered[:, ::-1], axis=1)[:, ::-1]        # this draw's and later
    live = ordered > 0
    log_factor = jnp.where(live, jnp.log(jnp.where(live, ordered, 1.0))
                           - jnp.log(jnp.where(live, outside + still, 1.0)), 0.0)
    # each order of the positive values appears m! / (m − dead)! times among the m! orders
    dead = jnp.sum(p <= 0, axis=0)
    repeats = gammaln(m + 1.0) - gammaln(m - dead + 1.0)
    return logsumexp(jnp.sum(log_factor, axis=1), axis=0) - repeats


def _unordered_set_weights(p: jax.Array, outside: jax.Array) -> tuple[jax.Array, jax.Array]:
    """For the k values of a set with probabilities `p` [k, lanes...] and the mass
    `outside` of the values not in it: R(S, s_i) [k, ...] and the baseline's
    coefficients c[i, j] [k, k, ...] (B_i = Σ_j c_ij f_j)."""
    kk = p.shape[0]

    def log_set(members):
        taken = jnp.array(members, jnp.int32)
        return _log_set_prob(p[taken], outside)

    log_p_set = log_set(range(kk))
    log_given = [log_set([j for j in range(kk) if j != i]) for i in range(kk)]
    ratio = jnp.exp(jnp.stack(log_given) - log_p_set)
    # the set without i and j, once per unordered pair (its sum over orders is the
    # costly part: (k − 2)! orders each)
    without_pair = {(i, j): log_set([m for m in range(kk) if m not in (i, j)])
                    for i in range(kk) for j in range(i + 1, kk)}
    rows = []
    for i in range(kk):
        row = []
        for j in range(kk):
            if i == j:
                row.append(p[i])
                continue
            rest = without_pair[min(i, j), max(i, j)]
            row.append(p[j] * jnp.exp(rest - log_given[i]))
        rows.append(jnp.stack(row))
    return ratio, jnp.stack(rows)


register_with_settings("SWOR(k)", SWOR.needs)
