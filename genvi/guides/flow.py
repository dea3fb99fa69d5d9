"""`gv.auto_flow`: an inverse autoregressive flow (IAF) guide built with flax.

In the unconstrained space of the model's D continuous latent coordinates (program
order), z = μ(ε) + σ(ε) ⊙ ε with ε ~ N(0, I), where μ_i and σ_i depend on ε_<i only:
a MADE network (Germain et al. 2015; masked dense layers, flax linen) gives them, so
sampling is one network pass (Kingma et al. 2016). Each site is sampled from its
conditional given the earlier sites: its block of ε is drawn with the earlier sites'
ε as context; its density inverts the block (one pass per coordinate of the site,
exact after that many passes by the autoregressive structure) so that every site's
log density is exact, and each value is mapped onto its support by its TFP bijector.

`num_layers` > 1 stacks IAF layers (parameters with a leading layer axis), reversing
each site's coordinates between layers: the log-determinant is the sum over layers.
The reversal stays inside site blocks because a permutation across sites would make
an earlier site depend on a later one, whose conditional density is intractable.

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

from genvi.core.scopes import assume_continuous
from genvi.guides import auto as base
from genvi.guides.init_rules import InitRule, unconstrained


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
    (context (D,), *the MADE's leaves; with several layers each leaf has a leading
    layer axis).

    Layer l maps its input a to b = μ_l(a) + σ_l(a) ⊙ a; between layers each site's
    block is reversed (`perm`), so the flow stays block-triangular in site order: a
    site's block depends on the ε of its own and earlier sites only, and its
    conditional density given them is exact."""

    name = "auto_flow"

    def __init__(self, made: Any, treedef: Any, offsets: dict, leaf_ndims: tuple,
                 num_layers: int = 1, perm: np.ndarray | None = None):
        self.made, self.treedef, self.offsets = made, treedef, offsets
        self.leaf_ndims = leaf_ndims   # unbatched: more leading axes are lanes
        self.num_layers, self.perm = num_layers, perm

    def _net(self, leaves, e, layer=0):
        if self.num_layers > 1:   # stacked parameters: this layer's slice
            leaves = [v[layer] for v in leaves]
        mu, s = self.made.apply(jax.tree_util.tree_unflatten(self.treedef, list(leaves)), e)
        return mu, jax.nn.softplus(s)

    def _inputs(self, leaves, a):
        """The input of every layer for the flow's input `a` (the first is `a`)."""
        inputs = [a]
        for layer in range(self.num_layers - 1):
            mu, sigma = self._net(leaves, a, layer)
            a = (mu + sigma * a)[self.perm]
            inputs.append(a)
        return inputs

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
            # later sites' blocks of ctx are zeros: they never reach this block
            a = self._inputs(leaves, ctx.at[blk].set(eps))[-1]
            mu, sigma = self._net(leaves, a, self.num_layers - 1)
            return mu[blk] + sigma[blk] * a[blk]
        return self._lanes(one, ctx, leaves, eps)

    def invert(self, z, site, ctx, leaves):
        """(ε of the site's block, Σ over layers of log σ of the block) with z the
        flow of ε: layer by layer from the last, one network pass per coordinate of the
        block (exact, by the autoregressive structure), then one for σ. The earlier
        blocks of every layer's input come from one forward pass of the context."""
        blk = self._block(site)

        def one(ctx, leaves, z):
            inputs = self._inputs(leaves, ctx)
            target, log_sigma = z, None
            for layer in reversed(range(self.num_layers)):
                base_in = inputs[layer]

                def step(_, u, base_in=base_in, target=target, layer=layer):
                    mu, sigma = self._net(leaves, base_in.at[blk].set(u), layer)
                    return (target - mu[blk]) / sigma[blk]
                u = jax.lax.fori_loop(0, site.size, step, jnp.zeros_like(z))
                _, sigma = self._net(leaves, base_in.at[blk].set(u), layer)
                ls = jnp.log(sigma[blk])   # the order within the block: only its sum counts
                log_sigma = ls if log_sigma is None else log_sigma + ls
                target = u[::-1]      # the block of the previous layer's output (reversed)
            return u, log_sigma
        return self._lanes(one, ctx, leaves, z)

    def log_prob_flat(self, z, site, ctx, *leaves):
        eps, log_sigma = self.invert(z, site, ctx, leaves)
        return jnp.sum(-0.5 * eps * eps - log_sigma - 0.5 * math.log(2 * math.pi), -1)


def block_reversal(sizes: Sequence[int]) -> np.ndarray:
    """The permutation reversing each consecutive block of `sizes` coordinates.

    Example:
        >>> block_reversal([2, 3]).tolist()
        [1, 0, 4, 3, 2]
    """
    out: list[int]
    out, i = [], 0
    for n in sizes:
        out.extend(range(i + n - 1, i - 1, -1))
        i += n
    return np.asarray(out, dtype=np.int32)


class AutoFlow(base.AutoGuide):
    """An IAF guide in the unconstrained space; see `gv.auto_flow`."""

    kind = "auto_flow"

    def __init__(self, model, *, hidden: Sequence[int] = (32, 32), num_layers: int = 1, **kw):
        super().__init__(model, **kw)
        if int(num_layers) != num_layers or num_layers < 1:
            raise ValueError(f"gv.auto_flow: num_layers must be a positive integer; "
                             f"got {num_layers!r}")
        self.hidden = tuple(int(h) for h in hidden)
        self.num_layers = int(num_layers)
        self._families: dict = {}

    def _made(self) -> Any:
        assert self.sites is not None  # the guide's sites are found before its family is made
        return made(sum(s.size for s in self.sites), self.hidden)

    def family_init(self, key, sites, z0):
        self._families = {}
        net = self._made()
        loc = jnp.concatenate([z0[s.name].reshape(-1) for s in sites])
        pre = math.log(math.expm1(self.init_scale))           # softplus⁻¹(init_scale)
        if self.num_layers == 1:   # one layer: parameters and draws as before stacking
            variables = net.init(key, jnp.zeros((net.dim,)))
            bias = jnp.concatenate([loc, jnp.full(loc.shape, pre)])
            variables = jax.tree_util.tree_map(lambda x: x, variables)
            variables["params"]["bias_out"] = bias.astype(variables["params"]["bias_out"].dtype)
            return {"made": variables}
        # Stacked layers (leading axis num_layers): all but the last start as the
        # identity (μ = 0, σ = 1), so the guide starts as the same Gaussian.
        layers = []
        for i, k in enumerate(jax.random.split(key, self.num_layers)):
            variables = net.init(k, jnp.zeros((net.dim,)))
            last = i == self.num_layers - 1
            bias = jnp.concatenate([loc if last else jnp.zeros_like(loc),
                                    jnp.full(loc.shape, pre if last else math.log(math.e - 1))])
            variables["params"]["bias_out"] = bias.astype(variables["params"]["bias_out"].dtype)
            layers.append(variables)
        return {"made": jax.tree_util.tree_map(lambda *x: jnp.stack(x), *layers)}

    def _family(self, treedef, leaves) -> _IAF:
        ndims = tuple(jnp.ndim(v) for v in leaves)
        if (treedef, ndims) not in self._families:
            assert self.sites is not None  # found before a family is made
            offsets, i = {}, 0
            for s in self.sites:
                offsets[s.name], i = i, i + s.size
            perm = block_reversal([s.size for s in self.sites])
            self._families[treedef, ndims] = _IAF(self._made(), treedef, offsets, ndims,
                                                  self.num_layers, perm)
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
            with assume_continuous():  # tanh / softplus networks: continuous
                eps, _ = family.invert(unconstrained(s, y), s, ctx, leaves)
            blk = family._block(s)
            ctx = ctx.at[blk].set(eps)
        return values


def auto_flow(model: Any, *, hidden: Sequence[int] = (32, 32), num_layers: int = 1,
              params_key: str = "guide", exclude: Sequence = (),
              init_scale: float = 0.1, init: InitRule | None = None) -> AutoFlow:
    """An inverse autoregressive flow guide (`num_layers` IAF layers, each a flax MADE
    with `hidden` tanh layers) for `model`'s continuous latents; parameters {"made":
    flax variables} (with a leading layer axis on every leaf when `num_layers` > 1).
    It starts as a Gaussian at the `init` rule's locations (see `gv.auto_normal`)
    with scale `init_scale` (the output
    layers start at zero; all but the last layer start as the identity). Summaries
    (`median`, `quantiles`) are Monte Carlo.

    Between layers the coordinates of each site are reversed, so within a site every
    coordinate depends on every other; across sites the order stays the program's
    (a site depends on the earlier sites), which keeps every site's conditional
    density exact. The log-determinant is the exact sum over layers.

    Args:
        model: the model whose continuous latents the guide covers.
        hidden: the widths of each MADE's hidden layers.
        num_layers: the number of IAF layers.
        params_key: the entry of the parameters the guide reads.
        exclude: addresses left to a hand-written guide.
        init_scale: the starting scale of the Gaussian the flow starts as.
        init: the rule choosing the starting locations.

    Returns:
        an `AutoFlow` guide: `auto.init(key, *args)` gives its parameters.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.gen
        ... def model(params):
        ...     gv.gamma(2.0, 1.0) @ "r"
        >>> auto = gv.auto_flow(model, hidden=(8,))
        >>> params = {"guide": auto.init(jax.random.key(0), {})}
        >>> sorted(params["guide"]["made"]["params"])
        ['bias_0', 'bias_out', 'kernel_0', 'kernel_out']
        >>> deep = gv.auto_flow(model, hidden=(8,), num_layers=3)
        >>> deep.init(jax.random.key(0), {})["made"]["params"]["kernel_0"].shape
        (3, 1, 8)
    """
    return AutoFlow(model, hidden=hidden, num_layers=num_layers, params_key=params_key,
                    exclude=exclude, init_scale=init_scale, init=init)
