"""The replay engine's door: weighted sums of replays, each evaluated the fastest way
that is exact, the chain lane-local → Markov-local → whole-objective owned here.

A strategy that needs the rest of an objective at other values of a site (ENUM, MVD,
RLOO, a user's antithetic REINFORCE) asks for `Replays` of the site: Σ over live
(j, lane) of `weights[j, lane] ×` (the objective with that lane set to
`alternatives[j, lane]`). The ADEV interpreter hands them to the engine:

* `total_at_site(replay, location, x, replays, after)` for one site, lane-local when
  it is a batched site at the objective's top level, else whole-objective;
* `ScanReplays` collects the replays of the sites in a scan body, step by step, and
  `ScanReplays.totals` evaluates every step's after the scan: Markov-local, else
  lane-local step by step, else whole-objective, several steps per `vmap`.

Each answer is a `Total`: the sum and how it was evaluated (`path`, `coupled`,
`window`, `reason`: the fields `explain` shows). A whole-objective replay re-runs
the objective with sites overridden through `Replay.whole`, the interpreter's own
evaluation, so its draws are the run's. Below the chain, `replay_values(replay,
where, x, alternatives)` evaluates replays lane by lane, where `where` says which
evaluation is wanted:

* `AfterSite(jaxpr, index, site, env, keys, steps)`: a batched site met at the objective's
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
`Fallback(reason)`: this evaluation cannot be lane by lane (a `cond` holding the
site itself, a carry that keeps a step's value, whole-objective replays asked for),
and the caller replays the whole objective per lane and step. The engine depends only
on `genvi.core`; `genvi.inference`'s enumeration uses its lane values and
rules (`Local`, `Perturbed`, `rule_for`) through this package's public names.

Example:
    >>> from genvi.replays.engine import Fallback
    >>> Fallback("a scan inside another scan").reason
    'a scan inside another scan'
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from genvi.core.context import using
from genvi.core.walk import env_of
from genvi.replays.lane_rules import rule_for
from genvi.replays.lanes import LaneEval
from genvi.replays.replay import Replay, draw, same_site, split_keys
from genvi.replays.values import Coupled, Local, Perturbed, Tracked, is_tracked

#: the engine's public names: its door, and the lane values and rules it is built on
__all__ = ["AfterSite", "AtLocation", "Coupled", "EveryStep", "Exact",
           "Fallback", "Local", "Perturbed", "Replay", "Replays", "ScanReplays",
           "Total", "Tracked", "is_tracked", "draw", "lanes_couple", "replay_values", "replays_total", "rule_for",
           "same_site", "split_keys", "total_at_site", "whole_objective_replays"]

def whole_objective_replays() -> contextlib.AbstractContextManager:
    """Inside this block, objectives *traced* here replay the whole objective per lane
    (the O(B²) general path) instead of lane-local replays: for comparisons and tests
    (the run context's `lane_local`, which a run hands the engine in its `Replay`).
    Public as `gv.whole_objective_replays()`: what the lane-local and Markov-local
    replays are measured against.

    Returns:
        a context manager: objectives traced inside it replay the whole objective.

    Example:
        >>> import genvi as gv
        >>> with gv.whole_objective_replays():
        ...     pass   # build and run a fresh objective here
    """
    return using(lane_local=False)


class Exact(NamedTuple):
    """Every replay's value, evaluated lane by lane.

    `values`: `[J, *lanes]` (after a site, at a location) or `[J, T, *lanes]` (every
    step); `coupled`: the primitives where lanes coupled (evaluated once per lane
    there); `windows`: per scan over the steps, how many steps a step's value reaches;
    `work`: (elements written once per lane, elements one evaluation of the same
    equations writes), per alternative (after a site only)."""

    values: Any
    coupled: tuple = ()
    windows: tuple = ()
    work: tuple = (0, 0)


class Fallback(NamedTuple):
    """The replays cannot be evaluated lane by lane here, and why (`explain` shows it):
    the caller replays the whole objective per lane (and step)."""

    reason: str


class AfterSite(NamedTuple):
    """The rest of a run after the site `site`, the `index`-th equation of `jaxpr` (a
    top-level site): `env` holds the values (duals, whose primals are read) before it,
    `keys` its level's site keys, `steps` its location."""

    jaxpr: Any
    index: int  # type: ignore[assignment]  # a field that shadows tuple.index on purpose
    site: Any
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


def replay_values(replay: Replay, where: Any, x: Any, alternatives: Any,
                  lane_axes: int | None = None) -> Exact | Fallback:
    """The values of a site's replays, lane by lane, or why not (see the module
    docstring). `x`: the site's values (`[T, *lanes]` for `EveryStep`);
    `alternatives`: `[J, *x.shape]` (`[T, J, *lanes]` for `EveryStep`). After a site,
    `lane_axes` may make a lane a slice of x (its leading axes index the lanes).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from genvi.replays.engine import EveryStep, Replay, replay_values
        >>> closed = jax.make_jaxpr(lambda: 0.0)()
        >>> replay = Replay(closed, None, [], (), None, None, lane_local=True)
        >>> replay_values(replay, EveryStep((0,), ()), jnp.zeros(3), jnp.zeros((3, 1)))
        Fallback(reason='a scan inside another scan')
    """
    if not replay.lane_local:
        return Fallback("whole-objective replays asked for")
    if isinstance(where, EveryStep) and not all(hasattr(s, "primitive") for s in where.scan):
        return Fallback("a scan inside another scan")
    grouped = lane_axes is not None and lane_axes < jnp.ndim(x)
    if grouped and not isinstance(where, AfterSite):
        return Fallback("lanes of several elements are replayed lane-locally after a "
                        "top-level site only")
    try:
        if isinstance(where, AfterSite):
            return _after_site(replay, where, x, alternatives,
                               jnp.ndim(x) if lane_axes is None else lane_axes)
        if isinstance(where, AtLocation):
            return _from_the_start(replay, jnp.shape(x), alternatives, 0, lambda alt: LaneEval(
                replay, jnp.shape(x), target=(where.location, alt)))
        if isinstance(where, EveryStep):
            return _from_the_start(replay, jnp.shape(x), alternatives, 1, lambda alt: LaneEval(
                replay, jnp.shape(x), every_step=(where.scan, where.below, alt)))
    except Coupled as why:
        return Fallback(str(why))
    raise TypeError(f"replay_values: {where!r} is not AfterSite, AtLocation or EveryStep")


def _after_site(replay: Replay, where: AfterSite, x: Any, alternatives: Any,
                lane_axes: int) -> Exact:
    (outvar,) = where.site.outvars
    start = {v: d.primal for v, d in where.env.items()}
    lanes = jnp.shape(x)[:lane_axes]
    evaluator = LaneEval(replay, lanes)

    def one(alt):
        local = dict(start)
        local[outvar] = Local(x, alt.astype(x.dtype), tuple(range(lane_axes)))
        (out,) = evaluator.level(where.jaxpr, where.index + 1, local, where.keys, where.steps)
        return evaluator.materialize(out).values.reshape(lanes)

    values = jax.vmap(one)(alternatives)
    return Exact(values, tuple(evaluator.coupled),
                 work=(evaluator.per_lane_elements, evaluator.once_elements))


def lanes_couple(replay: Replay, after: AfterSite | None, x: Any,
                 lane_axes: int | None = None) -> bool:
    """Whether replaying the site met at `after` lane by lane (each lane at another
    value, the others kept) costs more than two evaluations of the rest of the
    objective: the rest carries an array per lane (more than a number: the lanes meet
    before the rest is reduced to one) through more elements than one evaluation of it
    writes (a decoder reading every lane of a latent vector), or cannot be evaluated
    lane by lane at all. A strategy with a whole-site form (one replay with every lane
    changed, as DisARM's and RELAX's papers write them) takes it there. False for a
    single lane, and where `after` is None (a site in a scan or cond body, whose
    replays are evaluated after the scan). Traces the rest under `jax.eval_shape`:
    nothing of it is left in the estimator. `lane_axes`: lanes that are slices of x
    (its leading axes), as `Replays.lane_axes`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from genvi.replays.engine import Replay, lanes_couple
        >>> replay = Replay(None, None, [], (), None, None)
        >>> lanes_couple(replay, None, jnp.zeros(3))
        False
    """
    if after is None or math.prod(jnp.shape(x)[:lane_axes]) <= 1:
        return False
    probe = replay._replace(lane_local=True)  # the objective's form, not the run's path
    found: list = []

    def lane_by_lane():
        got = replay_values(probe, after, x, jnp.asarray(x)[None], lane_axes)
        found.append(got)
        return got.values if isinstance(got, Exact) else None

    jax.eval_shape(lane_by_lane)
    got = found[0]
    if not isinstance(got, Exact):
        return True
    per_lane, once = got.work
    return per_lane > once


def _from_the_start(replay: Replay, shape: tuple, alternatives: Any, axis: int,
                    evaluator: Any) -> Exact:
    """The whole objective evaluated lane-tracked from its start by `evaluator(alt)`,
    once per alternative (`alternatives`' axis `axis`), each replay's value in the
    site's `shape`; with the notes the evaluators took. Raises `Coupled`."""
    closed = replay.closed
    start = env_of(closed, replay.primals)
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


# -- weighted sums of replays: the chain lane-local → Markov-local → whole-objective --


@dataclass
class Replays:
    """Σ over live (j, lane) of `weights[j, lane] × k(x with lane set to
    alternatives[j, lane])`: a linear combination of the continuation's values at
    alternatives (see `Deferred.plus_replays`). `alternatives` has shape
    `[J, *x.shape]`; `weights` and `live` (boolean) `[J, *lanes]`, the lanes being the
    leading `lane_axes` axes of x: all of them (one element a lane), or fewer (a lane
    is a slice, a datapoint's latent vector, replaced whole)."""

    alternatives: Any
    weights: Any
    live: Any

    @property
    def lane_axes(self) -> int:
        return jnp.ndim(self.weights) - 1


class Total(NamedTuple):
    """A sum of replays and how it was evaluated: `path` is "lane-local",
    "Markov-local" or "whole-objective"; `after_scan` whether a scan body's replays
    ran after the scan; `coupled` the primitives where lanes coupled; `window` how
    many steps a step's value reaches (Markov-local); `reason` why a faster path was
    not taken ("" when none was possible or none was refused)."""

    value: Any
    path: str
    after_scan: bool = False
    coupled: tuple = ()
    window: int = 0
    reason: str = ""


def replays_total(values: jax.Array, replays: Replays) -> jax.Array:
    """Σ `weights × values` over the live replays, `values[j, lane]` being the
    continuation's value at `alternatives[j, lane]`."""
    values = jnp.where(replays.live, values.reshape(replays.weights.shape), 0.0)
    return jnp.sum(replays.weights * values)  # dead ones zeroed first: 0 × inf is NaN


def _lanes_set(x: jax.Array, lane: jax.Array, value: jax.Array, n: int) -> jax.Array:
    """`x`, seen as `n` lanes (each a slice of its trailing elements), with its `lane`-th
    lane (flat index) replaced by `value`."""
    return x.reshape(n, -1).at[lane].set(value.astype(x.dtype)).reshape(x.shape)


def lane_replacements(pure: Any, x: jax.Array, alternatives: jax.Array,
                      lane_axes: int | None = None) -> jax.Array:
    """`pure(v)` at `x` with lane `l` set to `alternatives[j, l]`, for every (j, l):
    one trace of `pure` under `vmap`, O(lanes) evaluations of it. The lanes are the
    leading `lane_axes` axes of x (default all)."""
    n = math.prod(x.shape[:x.ndim if lane_axes is None else lane_axes])
    alts = alternatives.reshape(alternatives.shape[0], n, -1)

    def one(lane, alt):
        return pure(_lanes_set(x, lane, alt, n))

    over_lanes = jax.vmap(one, in_axes=(0, 0))
    return jax.vmap(lambda a: over_lanes(jnp.arange(n), a))(alts)


def whole_objective(replay: Replay, location: tuple, x: jax.Array, replays: Replays) -> Any:
    """The sum by replaying the whole objective once per alternative and lane, the site
    at `location` overridden (the general path: always exact, O(lanes) objectives)."""
    pure = lambda v: replay.whole(((location, v),))  # noqa: E731
    return replays_total(lane_replacements(pure, x, replays.alternatives, replays.lane_axes),
                         replays)


def total_at_site(replay: Replay, location: tuple, x: jax.Array, replays: Replays,
                  after: AfterSite | None = None) -> Total:
    """The replays of the site at `location` (its enclosing equations and scan steps,
    then its equation): lane-local when `after` (a batched site at the objective's top
    level) allows, else whole-objective."""
    if after is None or jnp.size(x) <= 1:
        return Total(whole_objective(replay, location, x, replays), "whole-objective")
    got = replay_values(replay, after, x, replays.alternatives, replays.lane_axes)
    if isinstance(got, Exact):
        return Total(replays_total(got.values, replays), "lane-local",
                     coupled=tuple(sorted(set(got.coupled))))
    return Total(whole_objective(replay, location, x, replays), "whole-objective",
                 reason=got.reason)


class ScanReplays:
    """The replays that sites in one scan body ask for, evaluated after the scan.

    Each step emits, per site, the sampled value and the replays' arrays as scan
    outputs (`start`, `add`, `arrays` inside the body); after the scan, `total`
    evaluates every (step, alternative, lane) at once where it can, else several
    steps per `vmap`: fewer, larger operations than one replay per step inside the
    loop, for the same arithmetic.

    Example:
        >>> ScanReplays(depth=2).sites
        []
    """

    def __init__(self, depth: int):
        self.depth = depth  # len(steps) at the body: (..., scan eqn, step index)
        self.sites: list[tuple] = []  # per site: its location below the step index
        self._step: list = []

    def start(self) -> None:
        self.sites, self._step = [], []

    def add(self, location: tuple, value: Any, replays: Replays) -> None:
        self.sites.append(location[self.depth:])
        self._step.append((value, replays))

    def arrays(self, i: Any) -> tuple:
        return tuple((i, x, r.alternatives, r.weights, r.live) for x, r in self._step)

    def totals(self, replay: Replay, at: tuple, emitted: tuple) -> list[tuple[tuple, Any, Total]]:
        """Per site of the body: (its location below the step, one step's
        weights `[J, *lanes]`, its `Total` over every step). `at` locates the scan (its
        enclosing equations, then the scan's); `emitted` is what `arrays` emitted,
        stacked over the steps."""
        return [(below, arrays[3][0], _every_step(replay, at, below, arrays))
                for below, arrays in zip(self.sites, emitted)]


def _every_step(replay: Replay, at: tuple, below: tuple, arrays: tuple) -> Total:
    _, x, alternatives, weights, live = arrays
    # every step's replays at once, where a step's value reaches nearby steps only
    # the steps and each step's lanes: weights are [T, J, *lanes]
    got = replay_values(replay, EveryStep(at, below), x, alternatives, jnp.ndim(weights) - 1)
    if isinstance(got, Exact):
        value = replays_total(jnp.moveaxis(got.values, 0, 1), Replays(alternatives, weights, live))
        return Total(value, "Markov-local", True, tuple(sorted(set(got.coupled))),
                     max(got.windows))
    coupled: list = []

    def at_step(arrays):
        i, x, *replays = arrays
        replays = Replays(*replays)
        location = at + (i,) + below
        if jnp.size(x) > 1:  # a batched site: lane-local replays, O(lanes)
            got = replay_values(replay, AtLocation(location), x, replays.alternatives,
                                replays.lane_axes)
            if isinstance(got, Exact):
                coupled.append(got.coupled)
                return replays_total(got.values, replays)
        return whole_objective(replay, location, x, replays)
    # lane-local replays cost one evaluation per alternative, whatever the lanes
    steps, per_step = alternatives.shape[0], alternatives.shape[1]
    group = max(1, _replay_width() // per_step)  # steps per vmap
    values = (jax.vmap(at_step)(arrays) if group >= steps
              else jax.lax.map(at_step, arrays, batch_size=group))
    path = "lane-local" if coupled else "whole-objective"
    return Total(jnp.sum(values), path, True, tuple(sorted({p for c in coupled for p in c})),
                 reason=got.reason)


def _replay_width() -> int:
    """How many replays (steps × alternatives × lanes) to evaluate under one vmap.
    On CPU, AIR's replays measured fastest in groups of about 4 (one group of 3
    single-lane steps: 8% faster than one replay per step inside the scan; groups of
    6 two-particle replays: 9% slower, out of cache); accelerators take them all."""
    return 4 if jax.default_backend() == "cpu" else 1 << 30

