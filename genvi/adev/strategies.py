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
class Deferred:
    """What a rule hands back for the interpreter to continue with."""

    value: Any
    tangent: Any = None
    score: Any = None
    offset: Any = None

    def plus(self, score: Any = None, tangent: Any = None) -> "Deferred":
        """Add `score × final + tangent` to the final tangent."""
        return Deferred(self.value, self.tangent, d.add(self.score, score),
                        d.add(self.offset, tangent))


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


def lane_replacements(k, x: jax.Array, alternatives: jax.Array) -> jax.Array:
    """`k.pure` at `x` with lane `l` set to `alternatives[j, l]`, for every (j, l).

    Vectorized with `vmap`: one trace of the continuation, O(lanes) evaluations.
    """
    n = x.size
    alts = alternatives.reshape(alternatives.shape[0], n)

    def one(lane, alt):
        return k.pure(_lanes_set(x, lane, alt))

    over_lanes = jax.vmap(one, in_axes=(0, 0))
    return jax.vmap(lambda a: over_lanes(jnp.arange(n), a))(alts)


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
    alternative values, lane by lane (each lane of a batched site separately)."""

    kind = "MVD"

    def jvp(self, dist, key, primals, tangents, k):
        x = dist.sample(key, *primals)
        if all(t is None for t in tangents):
            return k.dual(x)
        terms = dist.mvd_terms(jax.random.fold_in(key, 1), x, primals, tangents)
        if not terms:
            return k.dual(x)
        alts = jnp.stack([jnp.broadcast_to(a, x.shape).astype(x.dtype) for a, _ in terms])
        weights = jnp.stack([jnp.broadcast_to(w, x.shape) for _, w in terms])
        values = lane_replacements(k, x, alts)
        return k.dual(x).plus(tangent=jnp.sum(weights.reshape(values.shape) * values))


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
            logp, dlogp = d.jvp(lambda *p: jax.vmap(lambda v: dist.log_prob(v, *p))(values),
                                primals, tangents)
            p = jnp.exp(logp)
            branches = k.dual_map(values)
            primal = jnp.sum(p * branches.primal)
            tangent = d.add(None if branches.tangent is None else jnp.sum(p * branches.tangent),
                            None if dlogp is None else jnp.sum(p * dlogp * branches.primal))
            return d.Dual(primal, tangent)
        if all(t is None for t in tangents):
            return k.dual(x)

        def lane_logp(*p):
            return jax.vmap(lambda v: dist.lane_log_prob(jnp.full(x.shape, v, x.dtype), *p))(support)

        logp, dlogp = d.jvp(lane_logp, primals, tangents)  # [V, lanes...]
        if dlogp is None:
            return k.dual(x)
        dp = jnp.exp(logp) * dlogp
        alts = jnp.broadcast_to(support.reshape((-1,) + (1,) * x.ndim), dp.shape).astype(x.dtype)
        values = lane_replacements(k, x, alts)
        return k.dual(x).plus(tangent=jnp.sum(dp.reshape(values.shape) * values))


REPARAM = Reparam()
REINFORCE = Reinforce()
MVD_ = MVD()
ENUM = Enum()

STRATEGIES = {"REPARAM": REPARAM, "REINFORCE": REINFORCE, "MVD": MVD_, "ENUM": ENUM}


def check_strategy(dist: Any, strategy: Any, addr: Any) -> None:
    """Raise a clear error if `strategy` is not a strategy `dist` supports."""
    where = f" at address {'/'.join(map(str, addr))!r}" if addr else ""
    if not isinstance(strategy, Strategy):
        raise TypeError(f"grad={strategy!r}{where} is not a gradient strategy; use one of "
                        f"{', '.join('gv.' + s for s in dist.strategies)}")
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
