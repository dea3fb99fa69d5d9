"""Gradient strategies: one small rule per strategy, a class each (the protocol is
`genvi.core.strategy.Strategy`; `gv.switch` is in `genvi.adev.switch`).

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
        kind, needs = "REINFORCE", ("sample", "lane_log_prob", "scorable")
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
from genvi.core.strategy import Strategy, register_built_in


class Reparam(Strategy):
    """Pathwise gradient through a differentiable sampler."""

    kind = "REPARAM"
    needs = ("sample", "reparameterized")

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
    needs = ("sample", "lane_log_prob", "scorable")

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
    needs = Reinforce.needs

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


@dataclass(frozen=True)
class RLOO(Strategy):
    """REINFORCE with leave-one-out baselines (Kool et al. 2019): `num_samples` draws
    x₁…xₙ, the rest of the objective f evaluated at each, and each draw's score
    weighted by f(xᵢ) minus the mean of the others:

        (1/n) Σᵢ (f(xᵢ) − mean_{j≠i} f(xⱼ)) ∂log p(xᵢ)  =  Σᵢ f(xᵢ) (sᵢ − s̄) / (n − 1)

    with sᵢ = ∂log p(xᵢ). Unbiased (each baseline is independent of its draw), and
    unchanged by a constant added to f. The right-hand form is linear in the f(xᵢ):
    at a batched site (a plate, particles) each lane keeps its own n draws and the
    f(xᵢ) are lane-local replays, as MVD's are (O(lanes) where the rest of the
    objective is a sum over lanes). A single-lane site whose continuation can branch
    also averages the value over the n draws. Sites that support REINFORCE support it.

    Example:
        >>> import genvi as gv
        >>> gv.RLOO(4)
        gv.RLOO(4)
    """

    num_samples: int = 2
    kind = "REINFORCE"
    needs = Reinforce.needs

    def __post_init__(self):
        n = self.num_samples
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ValueError(f"gv.RLOO(num_samples) needs an int num_samples >= 2 (one draw "
                             f"and at least one other for its baseline); got {n!r}")

    def __repr__(self) -> str:
        return f"gv.RLOO({self.num_samples})"

    def jvp(self, dist, key, primals, tangents, k):
        n = self.num_samples
        # the first draw is the one a replay draws with this key, so replays of the
        # objective see the run's own value at every step and lane they do not change
        x = dist.sample(key, *primals)
        others = jax.vmap(lambda kk: dist.sample(kk, *primals))(
            jax.random.split(jax.random.fold_in(key, 1), n - 1))
        xs = jnp.concatenate([x[None], others])
        if all(t is None for t in tangents):
            return k.dual(x)
        _, scores = d.jvp(lambda *p: jax.vmap(lambda v: dist.lane_log_prob(v, *p))(xs),
                          primals, tangents)
        if scores is None:
            return k.dual(x)
        weights = (scores - jnp.mean(scores, axis=0)) / (n - 1)  # [n, lanes...]
        lanewise = jnp.shape(weights)[1:] == x.shape
        if k.can_branch and (jnp.ndim(weights) == 1 or not lanewise):
            # the site as one lane (a vector value: whole draws): every draw's dual value
            weights = jnp.sum(weights.reshape(n, -1), axis=1)
            branches = k.dual_map(xs)
            tangent = d.add(None if branches.tangent is None else jnp.mean(branches.tangent),
                            jnp.sum(weights * branches.primal))
            return d.Dual(jnp.mean(branches.primal), tangent)
        if not lanewise:
            raise ValueError(
                f"gv.RLOO at a gv.{dist.name} site whose values are vectors (shape {x.shape}), "
                "batched inside a scan or cond: its draws would replay whole events lane by "
                "lane, which genvi does not do. Use gv.REINFORCE.with_baseline(...) there, "
                "or move the site out of the loop.")
        weights = jnp.broadcast_to(weights, xs.shape)
        return k.dual(x).plus(score=jnp.sum(weights[0])).plus_replays(xs[1:], weights[1:])


class MVD(Strategy):
    """Measure-valued derivative: weighted differences of the continuation at
    alternative values, lane by lane (each lane of a batched site separately).

    A term whose alternative *is* the sampled value (`alt is x`) needs no replay: the
    continuation there is the final result, so its weight joins the score."""

    kind = "MVD"
    needs = ("sample", "mvd_terms", "lane_log_prob")

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
    needs = ("sample", "support", "lane_prob")

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
        # index of x in the (sorted) support; by comparisons, not a loop of bisections
        at = jnp.searchsorted(support, x, method="compare_all")
        index = jnp.arange(support.shape[0]).reshape((-1,) + (1,) * x.ndim)
        # the V − 1 other values of each lane, by selects rather than gathers: inside a
        # scan a gather's transpose is a scatter, which XLA:CPU does not compile into
        # the loop's kernel (HMM bench, 2 states, T = 400: 17% faster step)
        skip = index[:-1] >= at  # [V − 1, lanes...]: past x, the next value

        def others(a):
            a = jnp.broadcast_to(a, (support.shape[0],) + jnp.shape(a)[1:])
            return jnp.where(skip, a[1:], a[:-1])

        dp_here = jnp.sum(jnp.where(index == at, dp, 0.0))
        alts = others(support.reshape(index.shape)).astype(x.dtype)
        # values of probability 0 (a boundary, e.g. p forced to 0) contribute nothing
        live = others(probs) > 0
        return k.dual(x).plus(score=dp_here).plus_replays(alts, others(dp), live)


REPARAM = Reparam()
REINFORCE = Reinforce()
MVD_ = MVD()
ENUM = Enum()
# the order messages offer them in: pathwise, then exact, then the unbiased others
for _rank, _strategy in enumerate((REPARAM, ENUM, REINFORCE, MVD_)):
    register_built_in(_strategy, _rank)


def decaying_average(average: Any, value: Any, decay: float = 0.9) -> Any:
    """One step of an exponentially decaying average, for REINFORCE baselines.

    Example:
        >>> import genvi as gv
        >>> round(float(gv.decaying_average(0.0, 1.0, decay=0.9)), 6)
        0.1
    """
    return decay * jnp.asarray(average) + (1 - decay) * jnp.asarray(value)
