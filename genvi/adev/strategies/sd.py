"""Stochastic derivatives with pruning (Arya et al. 2022): the `gv.SD` strategy.

A discrete site gives each lane an alternative value `y` and a weight `w`, linear
in the parameters' tangents (`dist.sd_terms`); the derivative of E f is estimated
by ∂f + Σ_lanes w (f(y) − f(x)), where f(y) is the rest of the program evaluated
at `y` with the same random numbers (a replay: coupled to the primal path).

*Pruning* keeps one alternative path per estimate, over all SD sites, lanes and
scan steps of a run: path i is chosen with probability π_i = m_i / M (m_i ≥ 0 a
tangent-free magnitude per lane, M the total) and its term is scaled by 1 / π_i,
so the estimate is M (w_i / m_i) (f(y_i) − f(x)): unbiased for any downstream f,
at the cost of the primal plus one replay. The choice is a weighted reservoir:
each site offers one candidate lane (chosen ∝ m), which replaces the kept one with
probability M_site / M_so_far; a scan offers one step (chosen ∝ its mass after the
scan) and a `cond` the candidate of its taken branch. At the end of the run
(`Pruning.finish`) the objective is replayed once with an override at the kept
site, step and lane. No choice depends on a tangent, so the estimator stays
linear and JAX transposes it into reverse mode.

SD keeps its pool in the run through the strategy protocol's run-level hooks
(`gv.RunState`): its rule offers its per-lane terms to the run's
`Pruning` (`k.state(self).offer_site(key, k.location, alternatives, weights,
magnitudes)`) and continues with `k.dual(x)`; the interpreter names no strategy.
Pruning costs variance (each term is scaled by 1 / π_i): see
`experiments/genvi_experiments/bench/replays/sd_plate.py` and docs/sharp_edges.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp

from genvi.core.primitives import register_masked_hook
from genvi.core.strategy import RunState, Strategy, register_built_in

_SALT = 0x5D  # fold_in constant of the pruning choices made at scans and conds


class StochasticDerivative(Strategy):
    """Stochastic derivatives (Arya et al. 2022) with pruning, for discrete sites.

    Unbiased for any downstream function; one replay of the objective per estimate
    whatever the number of SD sites, lanes and scan steps (see the module
    docstring). Distributions opt in with `sd_terms`.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp
        >>> @gv.expectation
        ... def e(p):
        ...     b = gv.sample(gv.flip(p, grad=gv.SD))
        ...     return jnp.where(b, 1.0, 3.0)
        >>> g = e.grad_estimate(jax.random.key(0), 0.25)   # unbiased for -2
        >>> gv.SD.kind
        'SD'
    """

    kind = "SD"
    needs = ("sample", "sd_terms", "lane_log_prob")

    def jvp(self, dist: Any, key: jax.Array, primals: tuple, tangents: tuple, k: Any) -> Any:
        x = dist.sample(key, *primals)
        if all(t is None for t in tangents):
            return k.dual(x)
        terms = dist.sd_terms(x, primals, tangents)
        if terms is None:  # no tangent reaches a parameter SD differentiates
            return k.dual(x)
        k.state(self).offer_site(jax.random.fold_in(key, 2), k.location, *terms)
        k.note("one lane's alternative offered to the pruning pool: one replay per estimate, "
               "shared by every SD site")
        return k.dual(x)


@dataclass
class Pool:
    """A weighted reservoir of size one over the candidates offered at one level
    (a run's top level, one scan step's body, one cond branch)."""

    mass: Any = None     # Σ of the offered magnitudes (tangent-free scalar)
    chosen: Any = None   # id of the site whose candidate is kept (int32)
    slots: dict = field(default_factory=dict)  # site id -> (lane, alt, w/m, step ints)

    def offer(self, u: Any, mass: Any, chosen: Any, slots: dict) -> None:
        """Keep the candidate with probability mass / (self.mass + mass), `u` a
        Uniform(0, 1) draw."""
        if self.mass is None:
            self.mass, self.chosen, self.slots = mass, chosen, dict(slots)
            return
        total = self.mass + mass
        take = u * total < mass   # never when mass = 0
        self.chosen = jnp.where(take, chosen, self.chosen)
        self.mass, self.slots = total, {**self.slots, **slots}

    def arrays(self) -> tuple | None:
        return None if self.mass is None else (self.mass, self.chosen, self.slots)


class Pruning(RunState):
    """A run's SD bookkeeping: the sites' locations (by id) and the current pool.

    Its run-level hooks (`RunState`): `enter`/`leave` around scan bodies and cond
    branches give each body its own pool, `after_scan`/`after_cond` keep one step's
    or the taken branch's candidate, and `finish` makes the run's one replay."""

    def __init__(self) -> None:
        self.sites: list[tuple] = []
        self.pool = Pool()

    def offer_site(self, key: Any, where: tuple, alt: Any, weight: Any, magnitude: Any) -> None:
        """One lane of a site, chosen ∝ `magnitude`, offered to the current pool."""
        m = jnp.reshape(magnitude, -1)
        if m.shape[0] == 0:  # an empty plate: no lane to offer
            return
        sid = len(self.sites)
        self.sites.append(where)
        ints = tuple(jnp.asarray(s, jnp.int32) for s in where if not hasattr(s, "primitive"))
        w = jnp.reshape(jnp.broadcast_to(weight, jnp.shape(magnitude)), -1)
        u = jax.random.uniform(key, (2,), jnp.result_type(m))  # one RNG call per site
        lane = _pick(u[0], m)
        m_l = m[lane]
        c = jnp.where(m_l > 0, w[lane] / jnp.where(m_l > 0, m_l, 1.0), 0.0)
        alt = jnp.reshape(alt, -1)[lane].astype(jnp.int32)
        self.pool.offer(u[1], jnp.sum(m), jnp.int32(sid), {sid: (lane, alt, c, ints)})

    def enter(self) -> Pool:
        saved, self.pool = self.pool, Pool()
        return saved

    def leave(self, saved: Pool) -> tuple | None:
        body, self.pool = self.pool, saved
        return body.arrays()

    def after_scan(self, key: Any, stacked: tuple | None) -> None:
        """After a scan: the step whose candidate is kept, chosen ∝ the steps' masses."""
        if stacked is None:
            return
        mass, chosen, slots = stacked
        u = jax.random.uniform(jax.random.fold_in(key, _SALT), (2,), jnp.result_type(mass))
        t = _pick(u[0], mass)
        self.pool.offer(u[1], jnp.sum(mass), chosen[t],
                        jax.tree_util.tree_map(lambda a: a[t], slots))

    def after_cond(self, key: Any, which: Any, branches: list) -> None:
        """After a cond (every branch evaluated): the taken branch's candidate."""
        live = [b for b in branches if b is not None]
        if not live:
            return
        zero = jnp.zeros((), jnp.result_type(live[0][0]))
        masses = [zero if b is None else b[0] for b in branches]
        chosen = [jnp.int32(-1) if b is None else b[1] for b in branches]
        slots = {sid: s for b in live for sid, s in b[2].items()}
        u = jax.random.uniform(jax.random.fold_in(key, _SALT), (), jnp.result_type(zero))
        self.pool.offer(u, jax.lax.select_n(which, *masses),
                        jax.lax.select_n(which, *chosen), slots)

    def finish(self, replay: Callable[[tuple], Any], final: Any) -> Any:
        """M (w/m) (f(y) − f(x)) for the kept path: the one replay of the run
        (`replay(overrides)` is the objective's value with those overrides)."""
        pool = self.pool
        if pool.mass is None:
            return None
        overrides, c = [], None
        for sid, (lane, alt, c_s, ints) in pool.slots.items():
            on = pool.chosen == sid
            overrides.append((_located(self.sites[sid], ints), _LaneSet(on, lane, alt)))
            c_s = jnp.where(on, c_s, 0.0)
            c = c_s if c is None else c + c_s
        assert c is not None  # a pool with a mass holds a site's slot
        live = pool.mass > 0
        diff = jnp.where(live, replay(tuple(overrides)) - final, 0.0)  # 0 × inf is NaN
        return jnp.where(live, pool.mass, 0.0) * c * diff


def _pick(u: Any, m: Any) -> Any:
    """An index chosen with probability ∝ `m` (≥ 0) given u ~ Uniform(0, 1), by
    inverting the cumulative sum: cheaper than a Gumbel draw per entry on thousands
    of lanes. An index with m = 0 is never chosen (unless all are 0: a term of 0)."""
    if m.shape[0] == 1:
        return jnp.int32(0)
    c = jnp.cumsum(m)
    # the first index whose cumulative sum exceeds u·total (a count: no loop)
    return jnp.minimum(jnp.sum(c <= u * c[-1]), m.shape[0] - 1).astype(jnp.int32)


def _located(where: tuple, ints: tuple) -> tuple:
    """`where` (a site location) with its step indices replaced by `ints`."""
    it = iter(ints)
    return tuple(s if hasattr(s, "primitive") else next(it) for s in where)


@dataclass(frozen=True)
class _LaneSet:
    """An override value: the replay's own draw with one lane set, where `on`."""

    on: Any
    lane: Any
    alt: Any

    def __call__(self, value: Any) -> Any:
        flat = jnp.reshape(value, -1)
        new = flat.at[self.lane].set(self.alt.astype(flat.dtype)).reshape(jnp.shape(value))
        return jnp.where(self.on, new, value)


StochasticDerivative.run_state = Pruning  # the pool spans the whole run: kept through RunState's hooks
SD = StochasticDerivative()
register_built_in(SD, rank=5)  # after REPARAM, ENUM, REINFORCE, MVD and DisARM


def _masked_sd_terms(terms: Any, keep: Callable) -> Any:
    """`sd_terms` at a masked site: masked-off lanes get weight and magnitude 0, so the
    pruning never chooses them."""
    if terms is None:
        return None
    alt, weight, magnitude = terms
    return (alt, jnp.where(keep(weight), weight, 0.0),
            jnp.where(keep(magnitude), magnitude, 0.0))


register_masked_hook("sd_terms", _masked_sd_terms)
