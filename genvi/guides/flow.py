"""`gv.auto_flow`: an inverse autoregressive flow (IAF) guide built with flax.

In the unconstrained space of the model's D continuous latent coordinates (program
order), z = μ(ε) + σ(ε) ⊙ ε with ε ~ N(0, I), where μ_i and σ_i depend on ε_<i only:
a MADE network (Germain et al. 2015; masked dense layers, flax linen) gives them, so
sampling is one network pass (Kingma et al. 2016). Each site is sampled from its
conditional given the earlier sites: its block of ε is drawn with the earlier sites'
ε as context; its density inverts the block (one pass per coordinate of the site,
exact after that many passes by the autoregressive structure) so that every site's
log density is exact, and each value is mapped onto its support by its TFP bijector.

Example:
    >>> import genvi as gv, jax
    >>> @gv.gen
    ... def model(params, y):
    ...     p = gv.beta(10.0, 10.0) @ "p"
    ...     gv.observe(gv.flip(p), y)
    >>> auto = gv.auto_flow(model, hidden=(16,))
    >>> params = {"guide": auto.init(jax.random.key(0), {}, True)}
"""

from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from genvi.guides import auto as base


def _degrees(dim: int, hidden: Sequence[int]) -> list[np.ndarray]:
    """MADE degrees: inputs 1..D, hidden units cycling through 1..max(D − 1, 1)."""
    return [np.arange(1, dim + 1)] + [np.arange(h) % max(dim - 1, 1) + 1 for h in hidden]


@functools.lru_cache(maxsize=None)
def _made_class() -> type:
    """The flax linen MADE class, defined on first use (`import genvi` loads no flax)."""
    import flax.linen as nn  # noqa: PLC0415

    class MADE(nn.Module):
        """Masked autoencoder: (μ, pre-σ) of each coordinate from the ones before it."""

        dim: int
        hidden: tuple = (32, 32)

        @nn.compact
        def __call__(self, x: jax.Array) -> tuple[jax.Array, jax.Array]:
            degrees = _degrees(self.dim, self.hidden)
            h = x
            for i, width in enumerate(self.hidden):
                mask = jnp.asarray(degrees[i + 1][None, :] >= degrees[i][:, None], x.dtype)
                kernel = self.param(f"kernel_{i}", nn.initializers.lecun_normal(),
                                    (h.shape[-1], width))
                bias = self.param(f"bias_{i}", nn.initializers.zeros, (width,))
                h = jnp.tanh(h @ (kernel * mask) + bias)
            out = np.arange(1, self.dim + 1)
            mask = jnp.asarray(out[None, :] > degrees[-1][:, None], x.dtype)
            mask = jnp.concatenate([mask, mask], -1)
            kernel = self.param("kernel_out", nn.initializers.zeros,
                                (h.shape[-1], 2 * self.dim))
            bias = self.param("bias_out", nn.initializers.zeros, (2 * self.dim,))
            y = h @ (kernel * mask) + bias
            return y[..., :self.dim], y[..., self.dim:]

    return MADE


def made(dim: int, hidden: Sequence[int] = (32, 32)) -> Any:
    """A MADE network (flax linen) over `dim` coordinates: `apply(variables, x)` gives
    (μ, pre-σ), coordinate i depending on x_<i only.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> net = made(3, hidden=(8,))
        >>> v = net.init(jax.random.key(0), jnp.zeros(3))
        >>> mu, s = net.apply(v, jnp.ones(3))
    """
    return _made_class()(dim=int(dim), hidden=tuple(int(h) for h in hidden))


class _IAF:
    """A site's block of the IAF given the context ε of the earlier sites: params
    (context (D,), *the MADE's leaves)."""

    name = "auto_flow"

    def __init__(self, made: Any, treedef: Any, offsets: dict, leaf_ndims: tuple):
        self.made, self.treedef, self.offsets = made, treedef, offsets
        self.leaf_ndims = leaf_ndims   # unbatched: more leading axes are lanes

    def _net(self, leaves, e):
        mu, s = self.made.apply(jax.tree_util.tree_unflatten(self.treedef, list(leaves)), e)
        return mu, jax.nn.softplus(s)

    def _block(self, site):
        i = self.offsets[site.name]
        return slice(i, i + site.size)

    def _lanes(self, f, ctx, leaves, *xs):
        """`f(ctx, leaves, *xs)` of one lane, mapped over the leading lane axes that
        `jax.vmap` (particles) gives every parameter of a site."""
        batch = jnp.broadcast_shapes(ctx.shape[:-1], *(x.shape[:-1] for x in xs))
        if not batch:
            return f(ctx, leaves, *xs)
        n = math.prod(batch)

        def flat(x, nd):
            event = x.shape[x.ndim - nd:]
            return jnp.broadcast_to(x, batch + event).reshape((n,) + event)
        out = jax.vmap(f)(flat(ctx, 1), [flat(v, d) for v, d in zip(leaves, self.leaf_ndims)],
                          *(flat(x, 1) for x in xs))
        return jax.tree_util.tree_map(lambda o: o.reshape(batch + o.shape[1:]), out)

    def sample_flat(self, key, site, ctx, *leaves):
        blk = self._block(site)
        eps = jax.random.normal(key, ctx.shape[:-1] + (site.size,), ctx.dtype)

        def one(ctx, leaves, eps):
            mu, sigma = self._net(leaves, ctx.at[blk].set(eps))
            return mu[blk] + sigma[blk] * eps
        return self._lanes(one, ctx, leaves, eps)

    def invert(self, z, site, ctx, leaves):
        """(ε of the site's block, σ of the block) with z = μ + σ ε: one network pass
        per coordinate of the block (exact, by the autoregressive structure), then one
        for σ."""
        blk = self._block(site)

        def one(ctx, leaves, z):
            def step(_, eps):
                mu, sigma = self._net(leaves, ctx.at[blk].set(eps))
                return (z - mu[blk]) / sigma[blk]
            eps = jax.lax.fori_loop(0, site.size, step, jnp.zeros_like(z))
            _, sigma = self._net(leaves, ctx.at[blk].set(eps))
            return eps, sigma[blk]
        return self._lanes(one, ctx, leaves, z)

    def log_prob_flat(self, z, site, ctx, *leaves):
        eps, sigma = self.invert(z, site, ctx, leaves)
        return jnp.sum(-0.5 * eps * eps - jnp.log(sigma) - 0.5 * math.log(2 * math.pi), -1)


class AutoFlow(base.AutoGuide):
    """An IAF guide in the unconstrained space; see `gv.auto_flow`."""

    kind = "auto_flow"

    def __init__(self, model, *, hidden: Sequence[int] = (32, 32), **kw):
        super().__init__(model, **kw)
        self.hidden = tuple(int(h) for h in hidden)
        self._families: dict = {}

    def _made(self) -> Any:
        return made(sum(s.size for s in self.sites), self.hidden)

    def family_init(self, key, sites, z0):
        self._families = {}
        net = self._made()
        variables = net.init(key, jnp.zeros((net.dim,)))
        loc = jnp.concatenate([z0[s.name].reshape(-1) for s in sites])
        pre = math.log(math.expm1(self.init_scale))           # softplus⁻¹(init_scale)
        bias = jnp.concatenate([loc, jnp.full(loc.shape, pre)])
        variables = jax.tree_util.tree_map(lambda x: x, variables)
        variables["params"]["bias_out"] = bias.astype(variables["params"]["bias_out"].dtype)
        return {"made": variables}

    def _family(self, treedef, leaves) -> _IAF:
        ndims = tuple(jnp.ndim(v) for v in leaves)
        if (treedef, ndims) not in self._families:
            offsets, i = {}, 0
            for s in self.sites:
                offsets[s.name], i = i, i + s.size
            self._families[treedef, ndims] = _IAF(self._made(), treedef, offsets, ndims)
        return self._families[treedef, ndims]

    def run(self, params, sites):
        leaves, treedef = jax.tree_util.tree_flatten(params["made"])
        family = self._family(treedef, leaves)
        dim = family.made.dim
        ctx = jnp.zeros((dim,), jnp.result_type(float, *leaves))
        values = {}
        for s in sites:
            y = base.sample_site(family, s, (ctx, *leaves))
            values[s.name] = y
            from genvi.adev.smoothness import assume_continuous  # noqa: PLC0415
            with assume_continuous():  # tanh / softplus networks: continuous
                eps, _ = family.invert(base.unconstrained(s, y), s, ctx, leaves)
            blk = family._block(s)
            ctx = ctx.at[blk].set(eps)
        return values


def auto_flow(model: Any, *, hidden: Sequence[int] = (32, 32), params_key: str = "guide",
              exclude: Sequence = (), init_scale: float = 0.1) -> AutoFlow:
    """An inverse autoregressive flow guide (one IAF layer, a flax MADE with `hidden`
    tanh layers) for `model`'s continuous latents; parameters {"made": flax variables}.
    It starts as a Gaussian at the prior median with scale `init_scale` (the output
    layer starts at zero). Summaries (`median`, `quantiles`) are Monte Carlo.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.gen
        ... def model(params):
        ...     gv.gamma(2.0, 1.0) @ "r"
        >>> auto = gv.auto_flow(model, hidden=(8,))
        >>> params = {"guide": auto.init(jax.random.key(0), {})}
        >>> sorted(params["guide"]["made"]["params"])
        ['bias_0', 'bias_out', 'kernel_0', 'kernel_out']
    """
    return AutoFlow(model, hidden=hidden, params_key=params_key, exclude=exclude,
                    init_scale=init_scale)
