"""`gv.RELAX`'s pieces (see `genvi.adev.strategies.relax`): how the surrogate's terms
enter the estimate (`Terms`), and the relaxations of a binary and a categorical site
(`BinaryRelaxation`, `CategoricalRelaxation`: the noise given the drawn value, the
reparameterized relaxed draw, the score of the logits).

Example:
    >>> import jax.numpy as jnp
    >>> r = BinaryRelaxation(jnp.array([1, 0]))
    >>> [round(float(x), 4) for x in r.log_prob(jnp.zeros(2))]
    [-0.6931, -0.6931]
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from genvi.adev.continuation import reduce_to_lanes
from genvi.adev.finite import at_each_value


class Terms:
    """How the surrogate's pieces enter the estimate, per logit of the site: the score
    weights on f(b) and on each lane's replay, and the tangent's offset r · ∂ℓ."""

    def __init__(self, relax, logits, running, replayed):
        self.logits, self.replayed = logits, replayed
        self.whole = replayed is None
        self.per_lane = relax.per_lane
        self.live = self.lanes(running)
        self.score_logits = jax.grad(lambda ell: jnp.sum(relax.log_prob(ell)))(logits)

    def lanes(self, x):
        """A per-plate-lane value against the logits' axes."""
        return x.reshape(x.shape + (1,) * (self.logits.ndim - x.ndim))

    def on_f(self, weights):
        """[logits' shape] weights of ∂ℓ on f(b): (score, replay weights per unit or
        None)."""
        if self.whole:
            return jnp.sum(weights), None
        per_unit = reduce_to_lanes(self.per_lane(weights), self.replayed.ndim)
        per_unit = jnp.where(self.replayed, per_unit, 0.0)
        return jnp.sum(per_unit), -per_unit

    def baseline(self, at_z_tilde, swapped):
        """Per logit: what multiplies ∂ℓ log p(b) in r."""
        out = -self.lanes(at_z_tilde)
        return out if swapped is None else out + self.lanes(swapped)

    def along_logits(self, cv, dlogits):
        """(score, replay weights, offset) of the estimate's tangent along the logits."""
        if dlogits is None:
            return None, None, None
        grad_cv, c_tilde, c_swapped = cv
        score_terms = self.score_logits * dlogits * self.live
        score, replay = self.on_f(score_terms)
        offset = (jnp.sum(self.baseline(c_tilde, c_swapped) * score_terms)
                  + jnp.sum(grad_cv * dlogits))
        return score, replay, offset

    def along_phi(self, cv, d_cv):
        """(score, replay weights, offset) of −½ ∂φ |ĝ|², linear in the final value f.

        ĝ = F ∂ℓ log p(b) + r, r = (c(z̃ with lane := z̃') − c(z̃)) ∂ℓ log p(b) +
        ∂ℓ (c(z) − c(z̃)), F per lane f(b) (less the lane's replay): its tangent along
        phi is dr, so −½ ∂φ |ĝ|² = −(F ∂ℓ log p(b) + r) · dr."""
        grad_cv, c_tilde, c_swapped = cv
        d_grad_cv, d_c_tilde, d_c_swapped = d_cv
        if d_c_swapped is None and c_swapped is not None:
            d_c_swapped = jnp.zeros_like(c_swapped)
        r = (self.baseline(c_tilde, c_swapped) * self.score_logits + grad_cv) * self.live
        dr = (self.baseline(d_c_tilde, d_c_swapped) * self.score_logits + d_grad_cv) * self.live
        score, replay = self.on_f(-self.score_logits * dr)
        return score, replay, -jnp.sum(r * dr)


def site_logits(dist: Any, b: jax.Array, binary: bool, *params: Any) -> jax.Array:
    """Per lane: binary, the logit log p(1) − log p(0) [lanes...]; otherwise the
    log-probabilities of the support's values [lanes..., K]."""
    logp = at_each_value(dist.lane_log_prob, dist.support(*params), b, *params)
    if binary:
        return logp[1] - logp[0]
    return jnp.moveaxis(logp, 0, -1)


class BinaryRelaxation:
    """The logistic relaxation of a binary site: z = ℓ + log u − log(1 − u), b = 1[z > 0],
    handed to the surrogate as σ(z)."""

    simplex_axes = 0  # a relaxed draw's trailing axes that are not lanes

    def __init__(self, b):
        self.on = jnp.asarray(b).astype(bool)

    @staticmethod
    def uniforms(key, ell):
        return jax.random.uniform(key, ell.shape, ell.dtype, minval=jnp.finfo(ell.dtype).tiny)

    def noise(self, ell, v):
        """(log u, log(1 − u)) of a u uniform given b, held: the draw's noise."""
        return jax.lax.stop_gradient(self._given_b(ell, v))

    def _given_b(self, ell, v):
        # b = 1: u = 1 − σ(ℓ)(1 − v); b = 0: u = v σ(−ℓ); in logs, without cancellation
        log_on, log_off = jax.nn.log_sigmoid(ell), jax.nn.log_sigmoid(-ell)
        one_minus_v = 1 - v
        log_u = jnp.where(self.on, jnp.log1p(-jnp.exp(log_on) * one_minus_v),
                          jnp.log(v) + log_off)
        log_1mu = jnp.where(self.on, log_on + jnp.log(one_minus_v),
                            jnp.log1p(-v * jnp.exp(log_off)))
        return log_u, log_1mu

    def reparameterized(self, ell, noise):
        return ell + noise[0] - noise[1]

    def given_b(self, ell, v):
        log_u, log_1mu = self._given_b(ell, v)
        return ell + log_u - log_1mu

    @staticmethod
    def relaxed(z):
        return jax.nn.sigmoid(z)

    @staticmethod
    def per_lane(x):
        """A [lanes...] quantity of the logits' shape, per lane."""
        return x

    def log_prob(self, ell):
        return jnp.where(self.on, jax.nn.log_sigmoid(ell), jax.nn.log_sigmoid(-ell))


class CategoricalRelaxation:
    """The Gumbel-max relaxation of a categorical site: z = log θ + g, b = argmax z,
    handed to the surrogate as softmax(z) on the last axis."""

    simplex_axes = 1  # a relaxed draw's trailing axes that are not lanes: the simplex

    def __init__(self, b):
        self.b = jnp.asarray(b, jnp.int32)

    def _onehot(self, ell):
        return jax.nn.one_hot(self.b, ell.shape[-1], dtype=bool)

    uniforms = staticmethod(BinaryRelaxation.uniforms)

    def noise(self, ell, v):
        """The Gumbels g = z − log θ of a draw z given b, held: the draw's noise."""
        z = self.given_b(ell, v)
        logp = jax.nn.log_softmax(ell, axis=-1)
        alive = jnp.isfinite(logp)
        return jax.lax.stop_gradient(jnp.where(alive, z - jnp.where(alive, logp, 0.0), 0.0))

    def given_b(self, ell, v):
        """z given argmax z = b (Grathwohl et al. 2018, appendix): z_b = −log(−log v_b),
        z_i = −log(−log v_i / θ_i − log v_b); a value of probability 0 stays at −∞."""
        logp = jax.nn.log_softmax(ell, axis=-1)
        alive = jnp.isfinite(logp)
        top = self._onehot(ell)
        neg_log_v = -jnp.log(v)
        top_neg_log_v = jnp.sum(jnp.where(top, neg_log_v, 0.0), axis=-1, keepdims=True)
        safe_logp = jnp.where(alive, logp, 0.0)
        # −log(−log v_i / θ_i − log v_b) in log space: 1/θ_i overflows where θ_i < e^−88
        other = -jnp.logaddexp(jnp.log(neg_log_v) - safe_logp, jnp.log(top_neg_log_v))
        z = jnp.where(top, -jnp.log(top_neg_log_v), other)
        return jnp.where(alive | top, z, -jnp.inf)

    def reparameterized(self, ell, g):
        logp = jax.nn.log_softmax(ell, axis=-1)
        return jnp.where(jnp.isfinite(logp), logp + g, -jnp.inf)

    @staticmethod
    def relaxed(z):
        return jax.nn.softmax(z, axis=-1)

    @staticmethod
    def per_lane(x):
        """A [lanes..., K] quantity of the logits' shape, summed per lane."""
        return jnp.sum(x, axis=-1)

    def log_prob(self, ell):
        logp = jax.nn.log_softmax(ell, axis=-1)
        return jnp.sum(jnp.where(self._onehot(ell), logp, 0.0), axis=-1)
