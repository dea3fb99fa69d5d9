"""The continuation a strategy's rule receives (`SiteContinuation`, the ADEV
interpreter's `gv.Continuation`) and what the rule hands back: `Deferred`, a value, its
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

import jax
import jax.numpy as jnp

from genvi.adev import dual as d
from genvi.adev.dual import Dual
from genvi.core.primitives import SiteEqn
from genvi.replays.engine import AfterSite, Replays, lanes_couple, total_at_site
from genvi.core.address import Address

__all__ = ["Deferred", "Replays", "SiteContinuation"]


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


class SiteContinuation:
    """The rest of the program after one site: the ADEV interpreter's implementation of
    `gv.Continuation` (`genvi.core.continuation`), over one run (`run`, the
    interpreter's `_Run`) at the site's equation `eqn`, the `index`-th of `jaxpr`."""

    def __init__(self, run: Any, jaxpr: Any, index: int, eqn: Any, env: dict, keys: dict,
                 steps: tuple, top: bool):
        # `steps` locates the site: the enclosing control-flow equations and scan steps;
        # `eqn` is the site's equation, at `index` in `jaxpr`
        self._run, self._jaxpr, self._index, self._eqn = run, jaxpr, index, eqn
        self._env, self._keys, self._steps = env, keys, steps
        self.can_branch = top and not run.replay
        self._top = top

    def dual(self, value: Any, tangent: Any = None) -> Deferred:
        return Deferred(value, tangent)

    def pure(self, value: Any) -> Any:
        return self._run.replay_with((self.location, value))

    def resolved(self, res: Deferred) -> Deferred:
        """`res` with its replays (if any) evaluated now (by the replay engine) and
        added to its offset."""
        if res.replays is None:
            return res
        total = total_at_site(self._run.replay_context(), self.location, res.value,
                              res.replays, self._after())
        self._run.context.observer.total(self._eqn,
                   res.replays.weights, total)   # [J, *lanes]
        return Deferred(res.value, res.tangent, res.score, d.add(res.offset, total.value))

    def _after(self) -> AfterSite | None:
        """A site at the top level: the rest of the run after it (lane by lane)."""
        if self._top and not self._run.replay:
            return AfterSite(self._jaxpr, self._index, self._eqn, self._env, self._keys,
                             self._steps)
        return None

    def lanes_couple(self, value: Any, lane_axes: int | None = None) -> bool:
        """Whether replays of this site lane by lane (`plus_replays`) would cost more
        than two evaluations of the rest of the objective, its lanes meeting in work
        done once per lane (a decoder reading a latent vector); False inside a scan or
        cond body (see `genvi.replays.engine.lanes_couple`). A strategy with a
        whole-site form takes it where this is True. `lane_axes`: lanes that are
        slices of the value (its leading axes), as `Deferred.plus_replays` takes them."""
        return lanes_couple(self._run.replay_context(), self._after(), value, lane_axes)

    def replay_units(self, value: Any) -> int | None:
        """How many leading axes of the site's value a strategy's lane-local replays
        should take as lanes (`plus_replays(..., lane_axes=)`): all of them where
        replays lane by lane are cheap; the batch axes where the rest couples each
        datapoint's lanes but not the datapoints (a plate of latent vectors, an IWELBO's
        particles), so that each datapoint's slice is replaced whole; None where the
        rest couples them all, and a strategy with a whole-site form takes it."""
        if not self.lanes_couple(value):
            return jnp.ndim(value)
        plates = self.batch_axes
        if 0 < plates < jnp.ndim(value) and not self.lanes_couple(value, plates):
            return plates
        return None

    @property
    def batch_axes(self) -> int:
        """How many leading axes of the site's value are lanes of the `vmap` transformations around it
        (a plate's datapoints, particles) rather than the site's own."""
        return SiteEqn.of(self._eqn).batch_axes

    @property
    def address(self) -> str:
        """The site's address as written ("outer/inner"; "(gv.sample)" for an unnamed
        draw), for a rule's error messages."""
        addr = SiteEqn.of(self._eqn).addr
        assert addr is not None  # a sampled site's: () for an unnamed draw
        return Address(addr).shown()

    @property
    def location(self) -> tuple:
        """Where the site is: the enclosing control-flow equations and scan steps,
        then the site's equation (what a replay's override names)."""
        return self._steps + (self._eqn,)

    def state(self, strategy: Any) -> Any:
        """The run's `RunState` of `strategy` (its `run_state` class): what the
        strategy keeps across the run (see `genvi.core.strategy.RunState`)."""
        return self._run.states[strategy.run_state]

    def note(self, path: str) -> None:
        """Say how this site's gradient terms are evaluated (`explain`'s replays column)."""
        self._run.context.observer.path(self._eqn, path)

    def dual_map(self, values: Any) -> Dual:
        if not self.can_branch:
            raise RuntimeError("this continuation cannot branch (inside scan/cond)")
        eqn = self._eqn
        (outvar,) = eqn.outvars

        def branch(v):
            env = dict(self._env)
            env[outvar] = Dual(v, None)
            run = self._run.with_override((self._steps + (eqn,), v))
            out = run.level(self._jaxpr, self._index + 1, env, None, self._steps, True,
                            keys=self._keys)
            return out.primal, out.tangent

        self._run.context.observer.enumeration(eqn, jnp.shape(values)[0])
        primal, tangent = jax.vmap(branch)(values)
        return Dual(primal, tangent)
