"""The covariance structures of the Gaussian automatic guides: how a site's flat
unconstrained block is drawn and scored given the parameters of its Gaussian
conditional. `DIAG` (independent normals: `gv.auto_normal`), `TRIL` (a Cholesky block:
`gv.auto_mvn`) and `LOWRANK` (low rank plus diagonal, scored by the Woodbury identity:
`gv.auto_low_rank`); `genvi.guides.gaussian` computes each site's conditional.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from types import SimpleNamespace
    >>> from genvi.guides.covariance import DIAG
    >>> site = SimpleNamespace(size=2)
    >>> z = DIAG.sample_flat(jax.random.key(0), site, jnp.zeros(2), jnp.ones(2))
    >>> round(float(DIAG.log_prob_flat(jnp.zeros(2), site, jnp.zeros(2), jnp.ones(2))), 4)
    -1.8379
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.scipy.linalg import solve_triangular


class _Diag:
    """Independent normals over a site's flat block: params (loc, scale)."""

    name = "auto_normal"

    def sample_flat(self, key, site, loc, scale):
        shape = jnp.broadcast_shapes(jnp.shape(loc), jnp.shape(scale))
        return loc + scale * jax.random.normal(key, shape, jnp.result_type(float, loc))

    def log_prob_flat(self, z, site, loc, scale):
        e = (z - loc) / scale
        return jnp.sum(-0.5 * e * e - jnp.log(scale) - 0.5 * math.log(2 * math.pi), -1)


class _TriL:
    """A site's Gaussian conditional: params (conditional mean, Cholesky block)."""

    name = "auto_mvn"

    def sample_flat(self, key, site, m, chol):
        batch = jnp.broadcast_shapes(jnp.shape(m)[:-1], jnp.shape(chol)[:-2])
        eps = jax.random.normal(key, batch + (site.size,), jnp.result_type(float, m))
        return m + jnp.einsum("...ij,...j->...i", chol, eps)

    def log_prob_flat(self, z, site, m, chol):
        d = z - m
        batch = jnp.broadcast_shapes(d.shape[:-1], chol.shape[:-2])
        eps = solve_triangular(jnp.broadcast_to(chol, batch + chol.shape[-2:]),
                               jnp.broadcast_to(d, batch + d.shape[-1:])[..., None],
                               lower=True)[..., 0]
        half_logdet = jnp.sum(jnp.log(jnp.diagonal(chol, axis1=-2, axis2=-1)), -1)
        return -0.5 * jnp.sum(eps * eps, -1) - half_logdet - 0.5 * site.size * math.log(2 * math.pi)


class _LowRank:
    """A site's Gaussian conditional given the earlier sites, low rank plus diagonal:
    params (conditional mean m (n,), the site's rows W_B (n, r) of the factor, scale d
    (n,), L⁻ᵀ and L'⁻¹ (r, r), log det K' − log det K), where L, L' are the Cholesky
    factors of the capacitance K = I + Σ Wᵀ D⁻² W over the earlier sites and of K' =
    K + W_Bᵀ D_B⁻² W_B. The covariance is W_B K⁻¹ W_Bᵀ + diag(d²); the Woodbury
    identity and the determinant lemma reduce its density to an r-vector product:
    (z − m)ᵀ C⁻¹ (z − m) = |x|² − |L'⁻¹ W_Bᵀ D_B⁻¹ x|² for x = D_B⁻¹ (z − m), and
    log det C = 2 Σ log d + log det K' − log det K. The r × r maps depend on the
    parameters only, so particles share them (products, not per-particle solves):
    O(n r) per site and draw, one r × r Cholesky per site and step."""

    name = "auto_low_rank"
    shared_params = (1, 3, 4, 5)   # W_B and the r × r maps: one copy for all particles

    def sample_flat(self, key, site, m, w, d, sample_map, score_map, log_det_ratio):
        batch = jnp.broadcast_shapes(jnp.shape(m)[:-1], jnp.shape(w)[:-2], jnp.shape(d)[:-1],
                                     jnp.shape(sample_map)[:-2])
        k1, k2 = jax.random.split(key)
        dtype = jnp.result_type(float, m)
        e1 = jax.random.normal(k1, batch + (w.shape[-1],), dtype)
        e2 = jax.random.normal(k2, batch + (site.size,), dtype)
        c = _apply(sample_map, e1)                                  # L⁻ᵀ e1 ~ N(0, K⁻¹)
        return m + _apply(w, c) + d * e2

    def log_prob_flat(self, z, site, m, w, d, sample_map, score_map, log_det_ratio):
        x = (z - m) / d
        g = _apply(w, x / d, transpose=True)                        # W_Bᵀ D_B⁻² (z − m)
        v = _apply(score_map, g)                                    # L'⁻¹ g
        maha = jnp.sum(x * x, -1) - jnp.sum(v * v, -1)
        logdet = 2 * jnp.sum(jnp.log(jnp.abs(d)), -1) + log_det_ratio
        return -0.5 * (maha + logdet + site.size * math.log(2 * math.pi))


def _apply(mat: jax.Array, vec: jax.Array, transpose: bool = False) -> jax.Array:
    """mat @ vec (matᵀ @ vec with `transpose`) over leading axes that broadcast; one
    matrix product when `mat` has no lanes of its own (size-1 leading axes)."""
    if all(n == 1 for n in mat.shape[:-2]):
        m = mat.reshape(mat.shape[-2:])
        out = vec @ m if transpose else vec @ m.T
        return out.reshape(jnp.broadcast_shapes(vec.shape[:-1], mat.shape[:-2]) + out.shape[-1:])
    return jnp.einsum("...ki,...k->...i" if transpose else "...ij,...j->...i", mat, vec)



DIAG, TRIL, LOWRANK = _Diag(), _TriL(), _LowRank()
