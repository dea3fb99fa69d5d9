"""What a strategy's rule hands back to the ADEV interpreter: `Deferred`, a value, its
tangent, score and offset terms, and `Replays` left for the replay engine to evaluate.

A rule continues the program with `k.dual(v, dv)`, which returns a `Deferred`; the
replay engine (`genvi.replays.engine`) decides how to evaluate the replays it asks
for (lane by lane, Markov-locally after a scan, or by whole-objective replays).

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

import jax.numpy as jnp

from genvi.adev import dual as d
from genvi.replays.engine import Replays

__all__ = ["Deferred", "Replays"]


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

    def plus_replays(self, alternatives: Any, weights: Any, live: Any = True,
                     lane_axes: int | None = None) -> "Deferred":
        """Add Σ_{j, lane} `weights[j, lane] × k.pure(x with lane := alternatives[j, lane])`
        over the `live` terms (a dead term contributes 0 even where its replay is
        ±inf). The interpreter picks when to run the replays: a site inside `scan`
        has its replays evaluated after the scan, several steps per `vmap`.

        `lane_axes`: how many leading axes of the value index the lanes (default: all,
        one element a lane); with fewer, a lane is a slice (a datapoint's latent
        vector), replaced whole, and `weights` and `live` are `[J, *x.shape[:lane_axes]]`."""
        if self.replays is not None:
            raise ValueError("a rule can add one set of replays; stack the alternatives")
        x = jnp.asarray(self.value)
        shape = (-1,) + x.shape
        alts = jnp.asarray(alternatives, x.dtype).reshape(shape)
        weights = jnp.reshape(weights, shape[:1 + (x.ndim if lane_axes is None else lane_axes)])
        live = jnp.broadcast_to(live, weights.shape)
        return Deferred(self.value, self.tangent, self.score, self.offset,
                        Replays(alts, weights, live))


def reduce_to_lanes(x: Any, lane_axes: int, reduce: Any = jnp.sum) -> Any:
    """A per-element array reduced over each lane's slice (`reduce(..., axis=-1)`), to
    `x.shape[:lane_axes]`, as `Deferred.plus_replays(..., lane_axes=)` takes weights
    and `live`; `x` itself where every element is a lane.

    Example:
        >>> import jax.numpy as jnp
        >>> reduce_to_lanes(jnp.ones((2, 3)), 1).tolist()
        [3.0, 3.0]
    """
    x = jnp.asarray(x)
    if lane_axes == x.ndim:
        return x
    return reduce(x.reshape(x.shape[:lane_axes] + (-1,)), axis=-1)

