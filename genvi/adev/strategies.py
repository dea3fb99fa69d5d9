"""Gradient strategies: one small rule per strategy, registered by name.

A strategy turns a sampling site into a piece of a forward-mode estimator. Its rule
reads like a JAX JVP rule with a continuation::

    rule(dist, key, primals, tangents, k) -> k.dual(value, value_tangent).plus(...)

* `primals`, `tangents`: the distribution's parameters and their tangents (`None`
  is a symbolic zero).
* `k`, the continuation (the rest of the program after the site):
  `k.dual(v, dv)` continues with value `v`; `.plus(score=s, tangent=d)` adds
  `s × (final result) + d` to the final tangent (REINFORCE's score term, MVD's
  difference terms). `k.pure(v)` is the final *value* of the rest of the program
  with the site's value replaced by `v` (an unbiased estimate; used by MVD and
  ENUM). Where `k.can_branch`, `k.dual_map(vs)` evaluates the whole dual
  continuation at each of several values (exact enumeration).

Every rule is linear in the tangents and draws no randomness that depends on them,
so JAX can linearize and transpose the estimator into reverse mode.

Example: a new strategy is one class::

    class ScoreOnly(gv.Strategy):
        kind = "REINFORCE"
        def jvp(self, dist, key, primals, tangents, k):
            x = dist.sample(key, *primals)
            _, score = gv.dual.jvp(lambda *p: dist.log_prob(x, *p), primals, tangents)
            return k.dual(x).plus(score=score)
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


class Strategy:
    """Base class of gradient strategies.

    Subclasses set `kind` (the name distributions list as supported) and define
    `jvp`. Strategies are static (hashable); dynamic data such as a baseline value
    travels as operands through `split`/`join`.
    """

    kind: str = "?"

    def jvp(self, dist, key, primals, tangents, k):  # pragma: no cover - abstract
        raise NotImplementedError

    def split(self) -> tuple["Strategy", tuple]:
        return self, ()

    def join(self, operands: tuple, tangents: tuple | None = None) -> "Strategy":
        return self

    def __repr__(self) -> str:
        return f"gv.{self.kind}"


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


class Reparam(Strategy):
    """Pathwise gradient through a differentiable sampler."""

    kind = "REPARAM"

    def jvp(self, dist, key, primals, tangents, k):
        x, dx = d.jvp(lambda *p: dist.sample(key, *p), primals, tangents)
        return k.dual(x, dx)


class Reinforce(Strategy):
    """Score-function estimator: f(x) ∂log p(x) + ∂f, optionally with a baseline.

    Example:
        >>> import genvi as gv
        >>> gv.REINFORCE.with_baseline(0.5).kind
        'REINFORCE'
    """

    kind = "REINFORCE"

    def jvp(self, dist, key, primals, tangents, k):
        x = dist.sample(key, *primals)
        _, score = d.jvp(lambda *p: dist.log_prob(x, *p), primals, tangents)
        return k.dual(x).plus(score=score)

    def with_baseline(self, baseline: Any) -> "ReinforceBaseline":
        """REINFORCE with a control variate `baseline`: (f − b) ∂log p + ∂f.

        `baseline` is any value computed in the program: a constant, a decaying
        average you pass in (see `gv.decaying_average`), or a learned function of
        parameters. When it depends on differentiated parameters, those receive the
        gradient of −½ (f − b)², so a learned baseline trains with the objective
        (its parameters do not affect the objective itself).
        """
        return ReinforceBaseline(jnp.asarray(baseline))


@dataclass(frozen=True, eq=False)
class ReinforceBaseline(Strategy):
    """REINFORCE with a baseline (see `Reinforce.with_baseline`)."""

    baseline: Any = None
    baseline_tangent: Any = None
    kind = "REINFORCE"

    def split(self):
        return ReinforceBaseline(None), (self.baseline,)

    def join(self, operands, tangents=None):
        return ReinforceBaseline(operands[0], None if tangents is None else tangents[0])

    def __hash__(self):
        return hash(ReinforceBaseline)

    def __eq__(self, other):
        return isinstance(other, ReinforceBaseline)

    def jvp(self, dist, key, primals, tangents, k):
        b = self.baseline
        x = dist.sample(key, *primals)
        if jnp.ndim(b) == 0:
            _, score = d.jvp(lambda *p: dist.log_prob(x, *p), primals, tangents)
            offset = d.mul(-b, score)
        else:  # one baseline per lane
            _, lane_score = d.jvp(lambda *p: dist.lane_log_prob(x, *p), primals, tangents)
            score = None if lane_score is None else jnp.sum(lane_score)
            offset = None if lane_score is None else -jnp.sum(b * lane_score)
        db = self.baseline_tangent
        if db is not None:  # learned baseline: ascend −½ (f − b)²
            score = d.add(score, jnp.sum(db))
            offset = d.add(offset, -jnp.sum(b * db))
        return k.dual(x).plus(score=score, tangent=offset)


class MVD(Strategy):
    """Measure-valued derivative: weighted differences of the continuation at
    alternative values, lane by lane (each lane of a batched site separately).

    A term whose alternative *is* the sampled value (`alt is x`) needs no replay: the
    continuation there is the final result, so its weight joins the score."""

    kind = "MVD"

    def jvp(self, dist, key, primals, tangents, k):
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


class Enum(Strategy):
    """Enumeration over a finite support.

    A single-lane site whose continuation can branch is enumerated exactly: the
    primal and tangent are Σ_v p(v) k(v) and Σ_v [p(v) ∂k(v) + ∂p(v) k(v)]. A
    batched site (or one inside `scan`/`cond`) enumerates lane by lane: the score
    term of each lane is summed exactly over its support while the other lanes keep
    their sampled values — unbiased, with O(lanes × support) continuation
    evaluations, never support^lanes.
    """

    kind = "ENUM"

    def jvp(self, dist, key, primals, tangents, k):
        x = dist.sample(key, *primals)
        support = dist.support(*primals)
        if x.size == 1 and k.can_branch and not getattr(dist, "is_masked", False):
            values = support.reshape((-1,) + x.shape).astype(x.dtype)
            p, dp = d.jvp(lambda *q: jax.vmap(lambda v: jnp.prod(dist.lane_prob(v, *q)))(values),
                          primals, tangents)
            live = p > 0  # values of probability 0 contribute nothing (k may be −inf there)
            # ... and are run at the most probable value instead: their own continuation
            # can be NaN (log p − log q = −inf + inf), and reverse mode would multiply
            # the masked branch's zero cotangent by its non-finite derivatives.
            alive = live.reshape((-1,) + (1,) * x.ndim)
            branches = k.dual_map(jnp.where(alive, values, values[jnp.argmax(p)]))
            k_p = jnp.where(live, branches.primal, 0.0)
            primal = jnp.sum(p * k_p)
            tangent = d.add(
                None if branches.tangent is None else jnp.sum(jnp.where(live, p * branches.tangent, 0.0)),
                None if dp is None else jnp.sum(dp * k_p))
            return d.Dual(primal, tangent)
        if all(t is None for t in tangents):
            return k.dual(x)

        def lane_probs(*p):
            return jax.vmap(lambda v: dist.lane_prob(jnp.full(x.shape, v, x.dtype), *p))(support)

        probs, dp = d.jvp(lane_probs, primals, tangents)  # [V, lanes...]
        if dp is None:
            return k.dual(x)
        # Σ_v ∂p(v) k(v): the term at the sampled value is the final result (a score
        # term); only the V − 1 other values of each lane are replayed.
        at = jnp.searchsorted(support, x)  # index of x in the (sorted) support
        n = support.shape[0]
        others = jnp.arange(n - 1).reshape((-1,) + (1,) * x.ndim)
        others = others + (others >= at)  # [V − 1, lanes...]: support indices ≠ x
        dp_here = jnp.take_along_axis(dp, at[None], 0)
        dp_away = jnp.take_along_axis(dp, others, 0)
        alts = support[others].astype(x.dtype)
        # values of probability 0 (a boundary, e.g. p forced to 0) contribute nothing
        live = jnp.take_along_axis(probs, others, 0) > 0
        return k.dual(x).plus(score=jnp.sum(dp_here)).plus_replays(alts, dp_away, live)


@dataclass(frozen=True, eq=False)
class SwitchStrategy(Strategy):
    """The strategy `strategies[index]`, chosen by a traced index (see `gv.switch`)."""

    strategies: tuple = ()
    index: Any = None
    operands: tuple = ()

    @property
    def kind(self) -> str:  # the kinds must agree for `check_strategy`
        return self.strategies[0].kind if self.strategies else "?"

    def split(self):
        parts = [s.split() for s in self.strategies]
        static = SwitchStrategy(tuple(p[0] for p in parts), None, tuple(len(p[1]) for p in parts))
        return static, (self.index,) + tuple(x for _, ops in parts for x in ops)

    def join(self, operands, tangents=None):
        index, rest = operands[0], list(operands[1:])
        rest_t = None if tangents is None else list(tangents[1:])
        joined = []
        for s, n in zip(self.strategies, self.operands):
            ops, rest = tuple(rest[:n]), rest[n:]
            ts = None
            if rest_t is not None:
                ts, rest_t = tuple(rest_t[:n]), rest_t[n:]
            joined.append(s.join(ops, ts))
        return SwitchStrategy(tuple(joined), index, self.operands)

    def __hash__(self):
        return hash((SwitchStrategy, self.strategies))

    def __eq__(self, other):
        return isinstance(other, SwitchStrategy) and self.strategies == other.strategies

    def __repr__(self):
        return f"gv.switch(index, {list(self.strategies)})"

    def jvp(self, dist, key, primals, tangents, k):
        out_dtype = jnp.result_type(float)

        def outcome(strategy):
            res = strategy.jvp(dist, key, primals, tangents, k)
            if not isinstance(res, Deferred):
                raise TypeError("gv.switch: a strategy that enumerates the whole rest "
                                "of the program cannot be switched; use it directly")
            return res

        # Replays leave the switch (to be deferred like any rule's) when every rule
        # asking for them asks for the same shapes; a rule without replays pads with
        # dead terms. Otherwise each branch evaluates its own replays.
        shapes = [jax.eval_shape(lambda s=s: _replay_arrays(outcome(s))) for s in self.strategies]
        asked = [[(a.shape, a.dtype) for a in sh] for sh in shapes if sh is not None]
        shared = asked[0] if asked and all(sh == asked[0] for sh in asked) else None

        def branch(strategy):
            def run():
                res = outcome(strategy)
                if shared is None:
                    res, replays = k.resolved(res), ()
                else:
                    replays = _replay_arrays(res) or tuple(jnp.zeros(*a) for a in shared)
                zero = jnp.zeros((), out_dtype)
                tangent = res.tangent
                if tangent is None and jnp.issubdtype(jnp.result_type(res.value), jnp.floating):
                    tangent = jnp.zeros_like(res.value)
                return (res.value, tangent, zero if res.score is None else res.score,
                        zero if res.offset is None else res.offset, replays)
            return run

        index = jnp.clip(jnp.asarray(self.index, jnp.int32), 0, len(self.strategies) - 1)
        value, tangent, score, offset, replays = jax.lax.switch(
            index, [branch(s) for s in self.strategies])
        return Deferred(value, tangent, score, offset, Replays(*replays) if replays else None)


def _replay_arrays(res: Deferred) -> tuple | None:
    r = res.replays
    return None if r is None else (r.alternatives, r.weights, r.live)


def switch(index: Any, strategies: Any) -> Strategy:
    """The gradient strategy `strategies[index]` for a site whose strategy depends on
    a traced index, e.g. the step of a `gv.scan` (AIR's "hybrid" estimator: MVD for
    the first steps, ENUM for the last). Only the chosen rule runs, as `lax.switch`.
    All strategies must be of one kind of site (each must be supported by the
    distribution). Strategies that enumerate the whole rest of a top-level program
    (ENUM on a scalar site outside scan/cond) cannot be switched.

    Example:
        >>> import genvi as gv, jax.numpy as jnp
        >>> s = gv.switch(jnp.int32(2), [gv.MVD, gv.MVD, gv.ENUM])
        >>> s.kind
        'MVD'
    """
    strategies = tuple(strategies)
    if not strategies or not all(isinstance(s, Strategy) for s in strategies):
        raise TypeError(f"gv.switch needs a non-empty list of gradient strategies, got {strategies!r}")
    if any(s.kind == "SD" for s in strategies):  # its pruning pool spans the whole run
        raise TypeError("gv.switch cannot hold gv.SD: SD prunes across the whole objective; "
                        "give the site gv.SD directly, or switch between other strategies")
    return SwitchStrategy(strategies, index, tuple(len(s.split()[1]) for s in strategies))


REPARAM = Reparam()
REINFORCE = Reinforce()
MVD_ = MVD()
ENUM = Enum()

STRATEGIES = {"REPARAM": REPARAM, "REINFORCE": REINFORCE, "MVD": MVD_, "ENUM": ENUM}
from genvi.adev.stochastic_derivatives import SD_ as SD  # noqa: E402 - subclasses Strategy
STRATEGIES["SD"] = SD


def check_strategy(dist: Any, strategy: Any, addr: Any) -> None:
    """Raise a clear error if `strategy` is not a strategy `dist` supports."""
    where = f" at address {'/'.join(map(str, addr))!r}" if addr else ""
    if not isinstance(strategy, Strategy):
        raise TypeError(f"grad={strategy!r}{where} is not a gradient strategy; use one of "
                        f"{', '.join('gv.' + s for s in dist.strategies)}")
    if isinstance(strategy, SwitchStrategy):
        for inner in strategy.strategies:
            check_strategy(dist, inner, addr)
        return
    if not dist.supports(strategy.kind):
        raise ValueError(
            f"gv.{dist.name} does not support the {strategy.kind} gradient strategy{where}; "
            f"it supports: {', '.join('gv.' + s for s in dist.strategies)}")


def missing_strategy_error(dist: Any, addr: Any) -> ValueError:
    return ValueError(
        f"the sampling site {'/'.join(map(str, addr)) if addr else '(gv.sample)'!r} "
        f"(gv.{dist.name}) is sampled inside an objective but has no gradient strategy. "
        f"Pass grad= with one of: {', '.join('gv.' + s for s in dist.strategies)}, "
        f"e.g. gv.{dist.name}(..., grad=gv.{dist.strategies[0]}).")


def decaying_average(average: Any, value: Any, decay: float = 0.9) -> Any:
    """One step of an exponentially decaying average, for REINFORCE baselines.

    Example:
        >>> import genvi as gv
        >>> round(float(gv.decaying_average(0.0, 1.0, decay=0.9)), 6)
        0.1
    """
    return decay * jnp.asarray(average) + (1 - decay) * jnp.asarray(value)
