"""MVD: the measure-valued derivative, lane by lane."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from genvi.core.primitives import register_masked_hook
from genvi.core.strategy import Strategy, register_built_in


class MeasureValued(Strategy):
    """Measure-valued derivative: weighted differences of the continuation at
    alternative values, lane by lane (each lane of a batched site separately).

    A term whose alternative *is* the sampled value (`alt is x`) needs no replay: the
    continuation there is the final result, so its weight joins the score.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp
        >>> @gv.expectation
        ... def e(p):
        ...     x = gv.sample(gv.flip(p, grad=gv.MVD))
        ...     return jnp.where(x, 1.0, 3.0)
        >>> float(e.grad_estimate(jax.random.key(0), 0.3))    # f(1) − f(0), exact here
        -2.0
    """

    kind = "MVD"
    needs = ("sample", "mvd_terms", "lane_log_prob")

    def jvp(self, dist: Any, key: jax.Array, primals: tuple, tangents: tuple, k: Any) -> Any:
        x = dist.sample(key, *primals)
        if all(t is None for t in tangents):
            return k.dual(x)
        terms = dist.mvd_terms(jax.random.fold_in(key, 1), x, primals, tangents)
        if not terms:
            return k.dual(x)
        here = [w for a, w in terms if a is x]
        away = [(a, w) for a, w in terms if a is not x]
        score = sum(jnp.sum(w) for w in here) if here else None
        if not away:
            return k.dual(x).plus(score=score)
        alts = jnp.stack([jnp.broadcast_to(a, x.shape).astype(x.dtype) for a, _ in away])
        weights = jnp.stack([jnp.broadcast_to(w, x.shape) for _, w in away])
        return k.dual(x).plus(score=score).plus_replays(alts, weights,
                                                        _in_support(dist, primals, alts))


def _in_support(dist, primals, alts: jax.Array) -> jax.Array:
    """Whether each alternative has positive probability.

    At a boundary of the parameter space (a probability forced to exactly 0 or 1,
    e.g. AIR's presence after an absent object) the alternative outside the support
    has weight zero in every direction that stays in the space, but its continuation
    may be −inf (its own log density), and 0 × −inf would poison the estimate."""
    logp = jax.vmap(lambda a: dist.lane_log_prob(a, *primals))(alts)
    return logp.reshape(alts.shape) > -jnp.inf


MVD = MeasureValued()
register_built_in(MVD, rank=3)  # after REPARAM, ENUM and REINFORCE
# at a masked site (an untaken branch of a batched cond) the masked lanes weigh nothing
register_masked_hook("mvd_terms", lambda terms, keep: [(alt, jnp.where(keep(w), w, 0.0))
                                                       for alt, w in terms])
