"""Replays asked for by sites inside a `scan` body, evaluated after the scan.

A rule that asks for a weighted sum of replays (`Deferred.plus_replays`) inside a scan
body does not replay the objective at every step inside the loop: each step emits
the site's value and the replays' arrays as scan outputs, and `Pending.resolve`
replays the objective at every (step, alternative, lane) after the scan, several
steps per `vmap` (lane by lane where it can, `genvi.replays.lanes`).

Example:
    >>> from genvi.adev.pending import Pending
    >>> Pending(depth=2).sites
    []
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from genvi.adev import dual as d
from genvi.adev.continuation import Deferred, Replays, replay_sum, replays_total
from genvi.adev.explain import note_markov, note_replays
from genvi.replays.engine import AtLocation, EveryStep, Exact, Replay, replay_values
from genvi.core import jaxpr as jx


class Pending:
    """The replays that sites in one scan body asked for (`Deferred.plus_replays`).

    Each step emits, per site, the sampled value and the replays' arrays as scan
    outputs; after the scan, `resolve` replays the objective at every (step,
    alternative, lane), several steps per `vmap` (see `_replay_width`), instead of
    once per step inside the loop: fewer, larger operations for the same arithmetic."""

    def __init__(self, depth: int):
        self.depth = depth  # len(steps) at the body: (..., scan eqn, step index)
        self.sites: list[tuple] = []  # per site: its location below the step index
        self._step: list = []

    def start(self) -> None:
        self.sites, self._step = [], []

    def add(self, here: tuple, res: Deferred) -> None:
        self.sites.append(here[self.depth:])
        self._step.append((res.value, res.replays))

    def arrays(self, i: Any) -> tuple:
        return tuple((i, x, r.alternatives, r.weights, r.live) for x, r in self._step)

    def resolve(self, replay: Replay, replay_with: Callable[[tuple], Any], at: tuple,
                deferred: tuple) -> Any:
        """The sum of every step's replays: `replay` is the run's replay context,
        `replay_with(override)` the objective's value with one more site overridden."""
        total = None
        for below, arrays in zip(self.sites, deferred):
            _, x, alternatives, weights, live = arrays
            # every step's replays at once, where a step's value reaches nearby steps only
            got = replay_values(replay, EveryStep(at, below), x, alternatives)
            if isinstance(got, Exact):
                total = d.add(total, replays_total(jnp.moveaxis(got.values, 0, 1),
                                                   Replays(alternatives, weights, live)))
                note_markov(below[-1], alternatives[0], jx.ScanEqn.of(at[-1]).length,
                            max(got.windows), sorted(set(got.coupled)))
                continue
            why_not = (f"; not Markov-local: {got.reason}"
                       if got.reason != "whole-objective replays asked for" else "")
            coupled: list = []

            def at_step(arrays, below=below, coupled=coupled):
                i, x, *replays = arrays
                replays = Replays(*replays)
                if jnp.size(x) > 1:  # a batched site: lane-local replays, O(lanes)
                    got = replay_values(replay, AtLocation(at + (i,) + below), x,
                                        replays.alternatives)
                    if isinstance(got, Exact):
                        coupled.append(got.coupled)
                        return replays_total(got.values, replays)
                return replay_sum(lambda v: replay_with((at + (i,) + below, v)), x, replays)
            # lane-local replays cost one evaluation per alternative, whatever the lanes
            steps, per_step = alternatives.shape[0], alternatives.shape[1]
            group = max(1, _replay_width() // per_step)  # steps per vmap
            values = (jax.vmap(at_step)(arrays) if group >= steps
                      else jax.lax.map(at_step, arrays, batch_size=group))
            total = d.add(total, jnp.sum(values))
            if coupled:
                named = sorted({p for c in coupled for p in c})
                note_replays(below[-1], alternatives[0], "lane-local, after the scan" + (
                    f" (lanes coupled at {', '.join(named)})" if named else "") + why_not,
                    lane_local=True)
            else:
                note_replays(below[-1], alternatives[0],
                             "whole-objective replays, after the scan" + why_not,
                             lane_local=False)
        return total


def _replay_width() -> int:
    """How many replays (steps × alternatives × lanes) to evaluate under one vmap.
    On CPU, AIR's replays measured fastest in groups of about 4 (one group of 3
    single-lane steps: 8% faster than one replay per step inside the scan; groups of
    6 two-particle replays: 9% slower, out of cache); accelerators take them all."""
    return 4 if jax.default_backend() == "cpu" else 1 << 30
