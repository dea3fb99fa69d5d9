"""Gaussian automatic guides: `gv.auto_normal`, `gv.auto_mvn` and `gv.auto_low_rank`
(the point mass `gv.auto_delta` is in `genvi.guides.delta`).

Each lives in the unconstrained space of the model's continuous latents (flattened
and concatenated in program order, D numbers in all) and is mapped onto each site's
support by its TFP bijector (`genvi.guides.supports`). The full-rank and low-rank
families sample the sites one after another from their Gaussian conditionals, so
each site's density is exact. Full rank uses the global Cholesky factor L: the
unconstrained block of site k is m_k + L[k, <k] ε_<k + L[k, k] ε_k, where ε_<k are
recovered from the earlier sites' values. Low rank keeps every conditional low rank
plus diagonal and scores it with the Woodbury identity (O(D r²), no D × D matrix).

Example:
    >>> import genvi as gv, jax
    >>> @gv.gen
    ... def model(params, y):
    ...     p = gv.beta(10.0, 10.0) @ "p"
    ...     gv.observe(gv.flip(p), y)
    >>> auto = gv.auto_mvn(model)
    >>> params = {"guide": auto.init(jax.random.key(0), {}, True)}
    >>> sorted(params["guide"])
    ['loc', 'scale_tril']
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.linalg import solve_triangular
from jax.scipy.special import ndtri

from genvi.guides import auto as base
from genvi.guides.covariance import DIAG, LOWRANK, TRIL
from genvi.guides.init_rules import InitRule, unconstrained
from genvi.guides.params import constrain, lower_cholesky, positive


class _Gaussian(base.AutoGuide):
    """Shared by the Gaussian families: `loc_scale_tril(p)` gives (loc, L) of the
    whole unconstrained vector; sites are sampled from their conditionals."""

    def loc_scale_tril(self, p: Any) -> tuple[jax.Array, jax.Array]:
        raise NotImplementedError

    def run(self, params, sites):
        loc, chol = self.loc_scale_tril(params)
        values, eps, i = {}, [], 0
        for s in sites:
            block = slice(i, i + s.size)
            m = loc[block]
            if eps:
                m = m + chol[block, :i] @ jnp.concatenate(eps)
            c = chol[block, block]
            y = base.sample_site(TRIL, s, (m, c))
            values[s.name] = y
            z = unconstrained(s, y)
            eps.append(solve_triangular(c, (z - m)[:, None], lower=True)[:, 0])
            i += s.size
        return values

    def marginals(self, params: Any) -> tuple[jax.Array, jax.Array]:
        """Unconstrained marginal (mean, standard deviation) of every coordinate."""
        loc, chol = self.loc_scale_tril(self.guide_params(params))
        return loc, jnp.sqrt(jnp.sum(chol * chol, -1))

    def quantiles(self, params: Any, qs: Sequence[float] | jax.Array, *,
                  key: jax.Array | None = None, num_samples: int = 4000) -> dict:
        """Per-site quantiles (constrained space): {address: array with a leading axis
        len(qs)}.

        Exact for every site whose bijector acts elementwise (real, positive, interval
        sites, and TFP or NumPyro sites whose own event-space bijector has
        `forward_min_event_ndims == 0`, such as `Exp` or `Softplus`): each coordinate's
        marginal is normal in the unconstrained space and an elementwise bijector is
        monotone, so the quantile is the bijector of the normal quantile (of the
        mirrored level 1 − q where the bijector decreases). Monte Carlo (`num_samples`
        draws with `key`, default key 0) for the rest: simplex sites and TFP or NumPyro
        sites whose bijector mixes coordinates, where a coordinate's marginal is not a
        monotone map of one normal. `median` is the 0.5 quantile in both cases.

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params):
            ...     gv.gamma(2.0, 1.0) @ "r"
            >>> auto = gv.auto_mvn(model)
            >>> params = {"guide": auto.init(jax.random.key(0), {})}
            >>> q = auto.quantiles(params, [0.05, 0.5, 0.95])["r"]
            >>> q.shape, bool(q[1] == auto.median(params)["r"])
            ((3,), True)
        """
        sites = self._check_ready()
        loc, sd = self.marginals(params)
        qs = jnp.asarray(qs, loc.dtype)
        mc = [s for s in sites if not elementwise(s)]
        out = (super().quantiles(params, qs, key=key, num_samples=num_samples)
               if mc else {})
        for s, m, d in zip(sites, base.split_flat(sites, loc).values(),
                           base.split_flat(sites, sd).values()):
            if s not in mc:
                out[s.name] = monotone_quantiles(s, m, d, qs)
        return out

    def median(self, params: Any, *, key: jax.Array | None = None,
               num_samples: int = 4000) -> dict:
        """Per-site median (constrained space): the bijector of the unconstrained mean
        where the bijector is elementwise; elsewhere the Monte Carlo 0.5 quantile of
        `quantiles` (same `key` and `num_samples`), so the two always agree.

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params):
            ...     gv.gamma(2.0, 1.0) @ "r"
            >>> auto = gv.auto_low_rank(model, rank=1)
            >>> params = {"guide": auto.init(jax.random.key(0), {})}
            >>> bool(auto.median(params)["r"] > 0)
            True
        """
        sites = self._check_ready()
        if any(not elementwise(s) for s in sites):
            return {k: v[0] for k, v in self.quantiles(params, [0.5], key=key,
                                                       num_samples=num_samples).items()}
        loc, _ = self.marginals(params)
        return {s.name: s.bijector().forward(m.reshape(s.ushape))
                for s, m in zip(sites, base.split_flat(sites, loc).values())}


def elementwise(site: Any) -> bool:
    """Whether `site`'s bijector maps each unconstrained coordinate to one value
    coordinate (then it is monotone in it: a continuous bijection of the line)."""
    if site.domain == "simplex":
        return False
    if site.domain != "own":
        return True
    ndims = site.bijector().forward_min_event_ndims
    return isinstance(ndims, int) and ndims == 0 and tuple(site.ushape) == tuple(site.shape)


def monotone_quantiles(site: Any, loc: jax.Array, sd: jax.Array, qs: jax.Array) -> jax.Array:
    """Exact quantiles at levels `qs` of an elementwise bijector applied to independent
    normal coordinates (`loc`, `sd`, flat): f(loc + sd Φ⁻¹(q)) where f increases,
    f(loc + sd Φ⁻¹(1 − q)) where it decreases (found by comparing f(1) with f(−1))."""
    bij = site.bijector()
    shape = (len(qs),) + tuple(site.ushape)
    z = ndtri(qs)[:, None]
    up = bij.forward((loc + sd * z).reshape(shape))
    down = bij.forward((loc - sd * z).reshape(shape))
    one = jnp.ones(site.ushape, loc.dtype)
    return jnp.where(bij.forward(one) >= bij.forward(-one), up, down)


def _flat_loc(sites, z0):
    return jnp.concatenate([z0[s.name].reshape(-1) for s in sites])


class AutoNormal(_Gaussian):
    """Mean-field Gaussian in the unconstrained space; see `gv.auto_normal`."""

    kind = "auto_normal"

    def family_init(self, key, sites, z0):
        return {"loc": {s.name: z0[s.name].reshape(s.ushape) for s in sites},
                "scale": {s.name: positive(jnp.full(s.ushape, self.init_scale)) for s in sites}}

    def run(self, params, sites):
        p = constrain(params)
        return {s.name: base.sample_site(DIAG, s, (p["loc"][s.name].reshape(-1),
                                                   p["scale"][s.name].reshape(-1)))
                for s in sites}

    def _flat(self, params):
        p = constrain(params)
        return (jnp.concatenate([p["loc"][s.name].reshape(-1) for s in self.sites]),
                jnp.concatenate([p["scale"][s.name].reshape(-1) for s in self.sites]))

    def loc_scale_tril(self, params):
        loc, scale = self._flat(params)
        return loc, jnp.diag(scale)

    def marginals(self, params):
        return self._flat(self.guide_params(params))


class AutoMVN(_Gaussian):
    """Full-rank Gaussian in the unconstrained space; see `gv.auto_mvn`."""

    kind = "auto_mvn"

    def family_init(self, key, sites, z0):
        loc = _flat_loc(sites, z0)
        return {"loc": loc, "scale_tril": lower_cholesky(self.init_scale * jnp.eye(loc.size))}

    def loc_scale_tril(self, params):
        p = constrain(params)
        return p["loc"], p["scale_tril"]


class AutoLowRank(_Gaussian):
    """Gaussian with covariance W Wᵀ + diag(d²) in the unconstrained space; see
    `gv.auto_low_rank`."""

    kind = "auto_low_rank"

    def __init__(self, model, rank: int, **kw):
        is_int = isinstance(rank, (int, np.integer)) and not isinstance(rank, bool)
        if not is_int or rank < 1:
            error = ValueError if is_int else TypeError
            raise error(
                f"gv.auto_low_rank(model, rank={rank!r}): rank is the number of columns of "
                "the covariance factor W (D × rank), a positive int; got "
                f"{type(rank).__name__} {rank!r}. Fix: pass e.g. rank=2 (rank=1 is the "
                "cheapest correlated guide; gv.auto_normal has no correlations, "
                "gv.auto_mvn full ones).")
        super().__init__(model, **kw)
        self.rank = int(rank)

    def call_args(self) -> str:
        return f", rank={self.rank}"

    def family_init(self, key, sites, z0):
        # NumPyro's start: no correlation, and a factor relative to the scale
        loc = _flat_loc(sites, z0)
        return {"loc": loc, "cov_factor": jnp.zeros((loc.size, self.rank), loc.dtype),
                "scale": positive(jnp.full(loc.shape, self.init_scale))}

    @staticmethod
    def factors(params: Any) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(loc, W, d) of constrained parameters: `cov_factor` F is relative to the
        scale, W = diag(d) F, so the covariance is diag(d) (F Fᵀ + I) diag(d)."""
        p = constrain(params)
        d = p["scale"]
        return p["loc"], p["cov_factor"] * d[:, None], d

    def loc_scale_tril(self, params):
        """(loc, Cholesky factor of the D × D covariance): O(D³), for checks only;
        sampling, densities and summaries never form it."""
        loc, w, d = self.factors(params)
        return loc, jnp.linalg.cholesky(w @ w.T + jnp.diag(d * d))

    def run(self, params, sites):
        # Given the earlier sites' block A, site B's conditional is Gaussian with mean
        # m_B + W_B K⁻¹ Σ_A W_Aᵀ D_A⁻² (z_A − m_A) and covariance W_B K⁻¹ W_Bᵀ + D_B²,
        # K = I + W_Aᵀ D_A⁻² W_A (r × r): low rank again, with factor W_B L⁻ᵀ (K = L Lᵀ),
        # sampled and scored with L⁻ᵀ and the next factor's inverse L'⁻¹ (`_LowRank`).
        # K, its factors and the projection accumulate site by site: O(D r² + sites · r³).
        loc, w, d = self.factors(params)
        eye = jnp.eye(w.shape[-1], dtype=w.dtype)
        cap, chol, inv = eye, eye, eye               # K = I, its factor and inverse factor
        proj = jnp.zeros(w.shape[-1], w.dtype)
        values, i = {}, 0
        for n, s in enumerate(sites):
            blk = slice(i, i + s.size)
            mean = loc[blk] + w[blk] @ (inv.T @ (inv @ proj)) if n else loc[blk]
            a = w[blk] / d[blk][:, None]
            cap = cap + a.T @ a
            chol_next = jnp.linalg.cholesky(cap)
            inv_next = solve_triangular(chol_next, eye, lower=True)       # L'⁻¹
            ratio = 2 * jnp.sum(jnp.log(jnp.diagonal(chol_next)) - jnp.log(jnp.diagonal(chol)))
            y = base.sample_site(LOWRANK, s, (mean, w[blk], d[blk], inv.T, inv_next, ratio))
            values[s.name] = y
            if n + 1 < len(sites):
                proj = proj + a.T @ ((unconstrained(s, y) - loc[blk]) / d[blk])
            chol, inv, i = chol_next, inv_next, i + s.size
        return values

    def marginals(self, params):
        loc, w, d = self.factors(self.guide_params(params))
        return loc, jnp.sqrt(jnp.sum(w * w, -1) + d * d)


def auto_normal(model: Any, *, params_key: str = "guide", exclude: Sequence = (),
                init_scale: float = 0.1, init: InitRule | None = None) -> AutoNormal:
    """A mean-field Gaussian guide for `model`'s continuous latents (in the
    unconstrained space; each site mapped onto its support by a TFP bijector).

    Parameters: {"loc": {address: ...}, "scale": {address: gv.positive(...)}} from
    `auto.init(key, *args)`; the guide reads them from its first argument's
    `params_key` entry. `exclude` leaves sites to a hand-written guide (`inline`).
    `init` chooses the starting locations (`gv.init_to_uniform()` unless given; see
    `gv.init_to_value`, `gv.init_to_median`, `gv.init_to_sample`).

    Args:
        model: the model whose continuous latents the guide covers.
        params_key: the entry of the parameters the guide reads.
        exclude: addresses left to a hand-written guide.
        init_scale: the starting scale of every coordinate.
        init: the rule choosing the starting locations.

    Returns:
        an `AutoNormal` guide: `auto.init(key, *args)` gives its parameters.

    Example:
        >>> import genvi as gv, jax, optax
        >>> @gv.gen
        ... def model(params, y):
        ...     p = gv.beta(10.0, 10.0) @ "p"
        ...     gv.observe(gv.flip(p), y)
        >>> auto = gv.auto_normal(model)
        >>> params = {"guide": auto.init(jax.random.key(0), {}, True)}
        >>> result = gv.fit(gv.elbo(model, auto), params, True, optimizer=optax.adam(0.05),
        ...                 steps=200, key=jax.random.key(1), progress=False)
        >>> med = auto.median(result.params)["p"]
    """
    return AutoNormal(model, params_key=params_key, exclude=exclude, init_scale=init_scale,
                      init=init)


def auto_mvn(model: Any, *, params_key: str = "guide", exclude: Sequence = (),
             init_scale: float = 0.1, init: InitRule | None = None) -> AutoMVN:
    """A full-rank Gaussian guide (unconstrained space): parameters {"loc": (D,),
    "scale_tril": gv.lower_cholesky((D, D))}, D the number of unconstrained latent
    coordinates, the sites' one after another as `auto.layout()` lists them. O(D²)
    parameters, O(D³) per step. `init` chooses the starting location (see
    `gv.auto_normal`).

    Args:
        model: the model whose continuous latents the guide covers.
        params_key: the entry of the parameters the guide reads.
        exclude: addresses left to a hand-written guide.
        init_scale: the starting scale of every coordinate.
        init: the rule choosing the starting location.

    Returns:
        an `AutoMVN` guide: `auto.init(key, *args)` gives its parameters.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.gen
        ... def model(params):
        ...     gv.gamma(2.0, 1.0) @ "r"
        >>> auto = gv.auto_mvn(model)
        >>> params = {"guide": auto.init(jax.random.key(0), {})}
        >>> params["guide"]["scale_tril"].value.shape
        (1, 1)
    """
    return AutoMVN(model, params_key=params_key, exclude=exclude, init_scale=init_scale,
                   init=init)


def auto_low_rank(model: Any, rank: int, *, params_key: str = "guide",
                  exclude: Sequence = (), init_scale: float = 0.1,
                  init: InitRule | None = None) -> AutoLowRank:
    """A Gaussian guide with covariance W Wᵀ + diag(d²), W = diag(d) F of shape (D, rank
    ≥ 1): parameters {"loc", "cov_factor": F, "scale": gv.positive d}, the D
    unconstrained coordinates in the order `auto.layout()` lists, so the covariance is
    diag(d) (F Fᵀ + I) diag(d) and F starts at zero (as NumPyro's
    `AutoLowRankMultivariateNormal`); `init` chooses the starting location (see
    `gv.auto_normal`). O(D · rank) parameters
    and O(D · rank²) per draw and density: each site's conditional given the earlier
    sites is again low rank plus diagonal, scored with the Woodbury identity and the
    matrix determinant lemma (an r × r Cholesky; no D × D matrix is formed).

    Args:
        model: the model whose continuous latents the guide covers.
        rank: the rank of the covariance's low-rank part (≥ 1).
        params_key: the entry of the parameters the guide reads.
        exclude: addresses left to a hand-written guide.
        init_scale: the starting scale of every coordinate.
        init: the rule choosing the starting location.

    Returns:
        an `AutoLowRank` guide: `auto.init(key, *args)` gives its parameters.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.gen
        ... def model(params):
        ...     gv.gamma(2.0, 1.0) @ "r"
        >>> auto = gv.auto_low_rank(model, rank=1)
        >>> params = {"guide": auto.init(jax.random.key(0), {})}
        >>> params["guide"]["cov_factor"].shape
        (1, 1)
    """
    return AutoLowRank(model, rank, params_key=params_key, exclude=exclude,
                       init_scale=init_scale, init=init)
