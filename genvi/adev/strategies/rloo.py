"""RLOO: REINFORCE with leave-one-out baselines over several draws."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from genvi.adev import dual as d
from genvi.core.strategy import Strategy


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
    needs = ("sample", "lane_log_prob", "scorable")  # REINFORCE's: a sibling module is not imported
    score_function = True

    def __post_init__(self):
        n = self.num_samples
        if isinstance(n, bool) or not isinstance(n, int) or n < 2:
            raise ValueError(f"gv.RLOO(num_samples) needs an int num_samples >= 2 (one draw "
                             f"and at least one other for its baseline); got {n!r}")

    def __repr__(self) -> str:
        return f"gv.RLOO({self.num_samples})"

    def jvp(self, dist: Any, key: jax.Array, primals: tuple, tangents: tuple, k: Any) -> Any:
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
