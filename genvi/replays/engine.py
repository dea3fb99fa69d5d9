"""The replay engine's door: one entry point, one result type.

A strategy that needs the rest of an objective at other values of a site (ENUM, MVD,
RLOO, a user's antithetic REINFORCE) asks for `Replays` of the site; the ADEV
interpreter asks the engine for their values, `replay_values(replay, where, x,
alternatives)`, where `where` says which evaluation is wanted:

* `AfterSite(jaxpr, index, env, keys, steps)`: a batched site met at the objective's
  top level; the rest of the run (after equation `index`) evaluated once per
  alternative with every lane tracked: lane-local, O(lanes);
* `AtLocation(location)`: a batched site at a traced location (a scan step); the
  whole objective evaluated lane-tracked from its start, the site becoming
  lane-tracked where and when it is sampled;
* `EveryStep(scan, below)`: a site at every step of the scan at `scan` (`below`: its
  place in the body); every step's replays from one evaluation, where a step's value
  reaches only nearby steps: Markov-local.

The answer is `Exact(values, coupled, windows)`: `values[j, ...]` is the objective with
lane l (of step t) set to alternative j, and the notes `explain` shows; or
`Fallback(reason)`: this evaluation cannot be lane by lane (control flow holding
sites after the site, a carry that keeps a step's value, whole-objective replays
asked for), and the caller replays the whole objective per lane and step. The engine
depends only on `genvi.core`; `genvi.inference`'s enumeration uses its lane values and
rules (`Local`, `Perturbed`, `RULES`) through this package's public names.

Example:
    >>> from genvi.replays.engine import Fallback
    >>> Fallback("a scan inside another scan").reason
    'a scan inside another scan'
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from genvi.replays.lane_rules import ELEMENTWISE, RULES, elementwise
from genvi.replays.lanes import LaneEval
from genvi.replays.replay import Replay, draw, same_site, split_keys
from genvi.replays.values import Coupled, Local, Perturbed

#: the engine's public names: its door, and the lane values and rules it is built on
__all__ = ["AfterSite", "AtLocation", "Coupled", "ELEMENTWISE", "EveryStep", "Exact",
           "Fallback", "Local", "Perturbed", "RULES", "Replay", "draw", "elementwise",
           "replay_values", "same_site", "split_keys", "whole_objective_replays"]

_ENABLED = contextvars.ContextVar("genvi_lane_local_replays", default=True)


@contextlib.contextmanager
def whole_objective_replays():
    """Inside this block, objectives *traced* here replay the whole objective per lane
    (the O(B²) general path) instead of lane-local replays: for comparisons and tests.

    Example:
        >>> from genvi.replays.engine import whole_objective_replays
        >>> with whole_objective_replays():
        ...     pass   # build and run a fresh objective here
    """
    token = _ENABLED.set(False)
    try:
        yield
    finally:
        _ENABLED.reset(token)


class Exact(NamedTuple):
    """Every replay's value, evaluated lane by lane.

    `values`: `[J, *lanes]` (after a site, at a location) or `[J, T, *lanes]` (every
    step); `coupled`: the primitives where lanes coupled (evaluated once per lane
    there); `windows`: per scan over the steps, how many steps a step's value reaches."""

    values: Any
    coupled: tuple = ()
    windows: tuple = ()


class Fallback(NamedTuple):
    """The replays cannot be evaluated lane by lane here, and why (`explain` shows it):
    the caller replays the whole objective per lane (and step)."""

    reason: str


class AfterSite(NamedTuple):
    """The rest of a run after `jaxpr.eqns[index]` (a top-level site): `env` holds the
    values (duals, whose primals are read) before it, `keys` its level's site keys,
    `steps` its location."""

    jaxpr: Any
    index: int
    env: dict
    keys: dict
    steps: tuple


class AtLocation(NamedTuple):
    """A site at `location` (its enclosing equations and traced scan steps)."""

    location: tuple


class EveryStep(NamedTuple):
    """A site at every step of the scan at `scan` (its enclosing equations); `below`:
    the site's place in the scan's body."""

    scan: tuple
    below: tuple


def replay_values(replay: Replay, where: Any, x: Any, alternatives: Any) -> Exact | Fallback:
    """The values of a site's replays, lane by lane, or why not (see the module
    docstring). `x`: the site's values (`[T, *lanes]` for `EveryStep`);
    `alternatives`: `[J, *x.shape]` (`[T, J, *lanes]` for `EveryStep`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from genvi.replays.engine import EveryStep, Replay, replay_values
        >>> closed = jax.make_jaxpr(lambda: 0.0)()
        >>> replay = Replay(closed, None, [], (), None)
        >>> replay_values(replay, EveryStep((0,), ()), jnp.zeros(3), jnp.zeros((3, 1)))
        Fallback(reason='a scan inside another scan')
    """
    if not _ENABLED.get():
        return Fallback("whole-objective replays asked for")
    if isinstance(where, EveryStep) and not all(hasattr(s, "primitive") for s in where.scan):
        return Fallback("a scan inside another scan")
    try:
        if isinstance(where, AfterSite):
            return _after_site(replay, where, x, alternatives)
        if isinstance(where, AtLocation):
            return _from_the_start(replay, jnp.shape(x), alternatives, 0, lambda alt: LaneEval(
                replay, jnp.shape(x), target=(where.location, alt)))
        if isinstance(where, EveryStep):
            return _from_the_start(replay, jnp.shape(x), alternatives, 1, lambda alt: LaneEval(
                replay, jnp.shape(x), every_step=(where.scan, where.below, alt)))
    except Coupled as why:
        return Fallback(str(why))
    raise TypeError(f"replay_values: {where!r} is not AfterSite, AtLocation or EveryStep")


def _after_site(replay: Replay, where: AfterSite, x: Any, alternatives: Any) -> Exact:
    site = where.jaxpr.eqns[where.index]
    (outvar,) = site.outvars
    start = {v: d.primal for v, d in where.env.items()}
    evaluator = LaneEval(replay, jnp.shape(x))

    def one(alt):
        local = dict(start)
        local[outvar] = Local(x, alt.astype(x.dtype), tuple(range(jnp.ndim(x))))
        (out,) = evaluator.level(where.jaxpr, where.index + 1, local, where.keys, where.steps)
        return evaluator.materialize(out).values.reshape(x.shape)

    values = jax.vmap(one)(alternatives)
    return Exact(values, tuple(evaluator.coupled))


def _from_the_start(replay: Replay, shape: tuple, alternatives: Any, axis: int,
                    evaluator: Any) -> Exact:
    """The whole objective evaluated lane-tracked from its start by `evaluator(alt)`,
    once per alternative (`alternatives`' axis `axis`), each replay's value in the
    site's `shape`; with the notes the evaluators took. Raises `Coupled`."""
    closed = replay.closed
    start = dict(zip(closed.jaxpr.constvars, closed.consts))
    start.update(zip(closed.jaxpr.invars, replay.primals))
    keys = split_keys(closed.jaxpr, replay.key)
    coupled: list = []
    windows: list = []

    def one(alt):
        ev = evaluator(alt)
        (out,) = ev.level(closed.jaxpr, 0, dict(start), keys, ())
        coupled.extend(ev.coupled)
        windows.extend(ev.windows)
        return ev.materialize(out).values.reshape(shape)

    values = jax.vmap(one, in_axes=axis)(alternatives)
    return Exact(values, tuple(coupled), tuple(windows))

