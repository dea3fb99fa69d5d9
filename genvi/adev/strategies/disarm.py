"""DisARM (Dong, Mnih and Tucker 2020): the antithetic gradient estimator of binary
sites, `gv.DisARM`, for `gv.flip` and `gv.bernoulli`.

Each lane with logit α = log p(1) − log p(0) draws b = 1[u < σ(α)] and its antithetic
partner b̃ = 1[1 − u < σ(α)] from one uniform u. The estimator of ∂/∂α E f(b) is

    ½ (f(b) − f(b̃)) (−1)^b̃ 1[b ≠ b̃] σ(|α|)

(its mean is σ(α)(1 − σ(α)) (f(1) − f(0)): the pairs that differ have probability
min(σ, 1 − σ) for each order, and σ(|α|) = max(σ, 1 − σ)). In the forward-mode
estimator that is a weight w = ½ (−1)^b̃ 1[b ≠ b̃] σ(|α|) ∂α on the final result at
b (a score term) and −w on a replay at b̃ with the lane's other choices kept, the
same lane-local replay MVD uses: O(lanes) in plates and Markov-local in scans where
the rest of the objective allows. Lanes where b = b̃ weigh nothing and are not
replayed.

b is the value the distribution's own sampler draws with the site's key (replays of
other sites see the run's own b), and u is drawn given b: uniform below σ(α) when
b = 1 and above it when b = 0, which is (b, u)'s joint law, so the pair is exactly
DisARM's. Two evaluations of the continuation per lane, as REINFORCE with RLOO(2).

Example:
    >>> import genvi as gv, jax
    >>> @gv.expectation
    ... def e(p):
    ...     return gv.sample(gv.flip(p, grad=gv.DisARM)) * 1.0
    >>> float(e.estimate(jax.random.key(0), 0.3)) in (0.0, 1.0)
    True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from genvi.adev import dual as d
from genvi.adev.continuation import reduce_to_lanes
from genvi.core.strategy import Strategy, register_built_in


@dataclass(frozen=True)
class AntitheticBinary(Strategy):
    """The DisARM estimator at a binary site (see the module docstring): needs a
    distribution whose lanes take the values 0 and 1 (`binary`), its sampler and its
    per-lane log density. Lane by lane where that is cheap (a plate's datapoints: one
    lane-tracked replay); where the rest of the objective couples the site's lanes
    (a decoder reading a latent vector, where a lane's replay runs it again) every lane
    flips with its partner at once: the paper's multivariate estimator, two
    evaluations of the rest in all; and where it couples each datapoint's lanes but
    not the datapoints (a plate of latent vectors), that estimator datapoint by
    datapoint, one lane-local replay per datapoint. `gv.DisARM.whole_site()` and
    `gv.DisARM.per_lane()` fix the form.

    Example:
        >>> import genvi as gv
        >>> gv.flip(0.3, grad=gv.DisARM).strategy
        gv.DisARM
    """

    # one partner for the whole site: True, False (lane by lane), or None: where the
    # rest of the objective couples the lanes (`k.replay_units`), as `gv.RELAX`'s field
    whole: bool | None = None
    kind = "DisARM"
    needs = ("sample", "lane_log_prob", "binary")

    def jvp(self, dist: Any, key: jax.Array, primals: tuple, tangents: tuple, k: Any) -> Any:
        b, pair = _antithetic(dist, key, primals, tangents)
        if pair is None:
            return k.dual(b)
        partner, differ, weight = pair
        # the lanes of the replays: every element, each datapoint's vector, or None for
        # one partner for the whole site
        units, why = (None if self.whole else b.ndim), ""
        if self.whole is None:
            units = k.replay_units(b)
            why = ": the rest couples the lanes (a lane's replay would run it again)"
        if units is None:
            k.note("1 replay of the rest of the objective, every lane at its antithetic "
                   "partner" + why)
            total = jnp.sum(weight)  # linear in the tangents; f(b̃) is a primal value
            return k.dual(b).plus(score=total, tangent=-total * k.pure(partner))
        # with a datapoint's vector as the lane, it flips to its partner whole, the
        # other datapoints kept: given them, the paper's multivariate estimator of that
        # vector, so the sum is unbiased, without the other datapoints' noise
        return k.dual(b).plus(score=jnp.sum(weight)).plus_replays(
            partner[None], -reduce_to_lanes(weight, units)[None],
            reduce_to_lanes(differ, units, jnp.any)[None], lane_axes=units)

    def whole_site(self) -> "AntitheticBinary":
        """DisARM with one antithetic partner for the whole site, always: the weights
        of every lane multiply f(b) − f(b̃) with all lanes at their partners, so the rest
        of the objective is evaluated twice whatever the number of lanes (the
        multivariate estimator of the DisARM paper, which `gv.DisARM` takes where the
        lanes couple). Across a plate's datapoints each datapoint's difference adds to
        every other's variance, where `gv.DisARM`'s lane-local replays do not.

        Example:
            >>> import genvi as gv
            >>> gv.DisARM.whole_site()
            gv.DisARM.whole_site()
        """
        return dataclasses.replace(self, whole=True)

    def per_lane(self) -> "AntitheticBinary":
        """DisARM lane by lane, always: each lane's weight multiplies f(b) − f(b with
        that lane at its partner), the other lanes kept. Where the rest of the objective
        couples the lanes, each lane's replay runs it again (one evaluation per lane, as
        ENUM and MVD), for less variance than the whole-site form.

        Example:
            >>> import genvi as gv
            >>> gv.DisARM.per_lane()
            gv.DisARM.per_lane()
        """
        return dataclasses.replace(self, whole=False)

    def __repr__(self) -> str:
        return "gv.DisARM" + {None: "", True: ".whole_site()", False: ".per_lane()"}[self.whole]


def _antithetic(dist, key, primals, tangents):
    """The site's value b (the sampler's own draw with `key`) and, where a tangent
    reaches the logits, (partner b̃, lanes where b ≠ b̃, per-lane weight on f(b))."""
    b = dist.sample(key, *primals)
    if all(t is None for t in tangents):
        return b, None
    one, zero = jnp.ones(b.shape, b.dtype), jnp.zeros(b.shape, b.dtype)

    def logit(*params):  # per lane: log p(1) − log p(0)
        return dist.lane_log_prob(one, *params) - dist.lane_log_prob(zero, *params)

    alpha, dalpha = d.jvp(logit, primals, tangents)
    if dalpha is None:
        return b, None
    alpha = jnp.broadcast_to(alpha, b.shape)
    on = b.astype(bool)
    sigma = jax.nn.sigmoid(alpha)
    v = jax.random.uniform(jax.random.fold_in(key, 1), b.shape, sigma.dtype)
    u = jnp.where(on, sigma * v, sigma + (1 - sigma) * v)  # u given b
    partner_on = 1 - u < sigma
    differ = on != partner_on
    sign = jnp.where(partner_on, -1.0, 1.0).astype(sigma.dtype)
    weight = jnp.where(differ, 0.5 * sign * jax.nn.sigmoid(jnp.abs(alpha)) * dalpha, 0.0)
    return b, (partner_on.astype(b.dtype), differ, weight)


DisARM = AntitheticBinary()
# after REPARAM, ENUM, REINFORCE and MVD; before SD, which also evaluates the rest twice
# per site: DisARM's antithetic pairs measured less variance on every binary site of the
# frontier tables (the binary VAE's encoder 13.3 against 16.9, AIR's z_pres 2,930
# against 3,360), so where a fit starts with a cheap step it starts with DisARM
register_built_in(DisARM, rank=4)
