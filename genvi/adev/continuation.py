"""What a strategy's rule hands back to the ADEV interpreter: `Deferred` (a value, its
tangent, score and offset terms, and replays left for the interpreter to evaluate) and
`Replays`, with the helpers that evaluate a weighted sum of replays.

A rule continues the program with `k.dual(v, dv)`, which returns a `Deferred`; the
interpreter (`genvi.adev.interpreter`) decides when to run the replays it asks for
(at once, lane by lane, or after a scan).

Example:
    >>> import jax.numpy as jnp
    >>> from genvi.adev.continuation import Deferred
    >>> res = Deferred(jnp.zeros(2)).plus(score=1.0).plus_replays(jnp.ones((1, 2)), jnp.ones((1, 2)))
    >>> res.replays.alternatives.shape
    (1, 2)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from genvi.adev import dual as d


@dataclass
class Replays:
    """Σ over live (j, lane) of `weights[j, lane] × k(x with lane set to
    alternatives[j, lane])`: a linear combination of the continuation's values at
    alternatives, left for the interpreter to evaluate (see `Deferred.plus_replays`).
    All three arrays have shape `[J, *x.shape]`; `live` is boolean."""

    alternatives: Any
    weights: Any
    live: Any


@dataclass
class Deferred:
    """What a rule hands back for the interpreter to continue with."""

    value: Any
    tangent: Any = None
    score: Any = None
    offset: Any = None
    replays: Replays | None = None

    def plus(self, score: Any = None, tangent: Any = None) -> "Deferred":
        """Add `score × final + tangent` to the final tangent."""
        return Deferred(self.value, self.tangent, d.add(self.score, score),
                        d.add(self.offset, tangent), self.replays)

    def plus_replays(self, alternatives: Any, weights: Any, live: Any = True) -> "Deferred":
        """Add Σ_{j, lane} `weights[j, lane] × k.pure(x with lane := alternatives[j, lane])`
        over the `live` terms (a dead term contributes 0 even where its replay is
        ±inf). The interpreter picks when to run the replays: a site inside `scan`
        has its replays evaluated after the scan, several steps per `vmap`."""
        if self.replays is not None:
            raise ValueError("a rule can add one set of replays; stack the alternatives")
        x = jnp.asarray(self.value)
        shape = (-1,) + x.shape
        alts = jnp.asarray(alternatives, x.dtype).reshape(shape)
        weights = jnp.reshape(weights, shape)
        live = jnp.broadcast_to(live, weights.shape)
        return Deferred(self.value, self.tangent, self.score, self.offset,
                        Replays(alts, weights, live))


def _lanes_set(x: jax.Array, lane: jax.Array, value: jax.Array) -> jax.Array:
    """`x` with its `lane`-th element (flat index) replaced by `value`."""
    return x.reshape(-1).at[lane].set(value.astype(x.dtype)).reshape(x.shape)


def lane_replacements(pure: Any, x: jax.Array, alternatives: jax.Array) -> jax.Array:
    """`pure(v)` at `x` with lane `l` set to `alternatives[j, l]`, for every (j, l).

    `pure` is a continuation's `k.pure`. Vectorized with `vmap`: one trace of the
    continuation, O(lanes) evaluations.
    """
    n = x.size
    alts = alternatives.reshape(alternatives.shape[0], n)

    def one(lane, alt):
        return pure(_lanes_set(x, lane, alt))

    over_lanes = jax.vmap(one, in_axes=(0, 0))
    return jax.vmap(lambda a: over_lanes(jnp.arange(n), a))(alts)


def replay_sum(pure: Any, x: jax.Array, replays: Replays) -> jax.Array:
    """The value of `replays` (see `Replays`) for the continuation `pure` at `x`."""
    return replays_total(lane_replacements(pure, x, replays.alternatives), replays)


def replays_total(values: jax.Array, replays: Replays) -> jax.Array:
    """Σ `weights × values` over the live replays, `values[j, lane]` being the
    continuation's value at `alternatives[j, lane]`."""
    values = jnp.where(replays.live, values.reshape(replays.weights.shape), 0.0)
    return jnp.sum(replays.weights * values)  # dead ones zeroed first: 0 × inf is NaN
