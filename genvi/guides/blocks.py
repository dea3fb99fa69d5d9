"""A site of an automatic guide as a distribution: the family's flat unconstrained draw
(`Flat`) mapped onto the site's support by its bijector (`Block`).

`Block` declares `pushforward`, so the handlers that sample it score a draw at the
unconstrained value itself (log q(u) − log |det ∂y/∂u|); a value given to
`log_density` is scored at its inverse.

Example:
    >>> import genvi as gv, jax
    >>> @gv.gen
    ... def model(params):
    ...     gv.beta(2.0, 2.0) @ "p"
    >>> auto = gv.auto_normal(model)
    >>> _ = auto.init(jax.random.key(0), {})
    >>> tr = auto.simulate(jax.random.key(1), {"guide": _})
    >>> bool(abs(tr.log_density - auto.log_density(tr.choices, {"guide": _})) < 1e-4)
    True
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from genvi.distributions.base import Distribution
from genvi.guides import supports
from genvi.guides.discover import Site


class Flat(Distribution):
    """A family's flat unconstrained draw of `site.size` numbers for one guide site
    (the base of a `Block`'s pushforward); leading axes are lanes."""

    reparameterized = True
    value_event_ndim = 1

    def __init__(self, family: Any, site: Site, event_ndims: tuple):
        self.family, self.site = family, site
        self.param_event_ndims = tuple(event_ndims)
        self.lane_shared_params = tuple(getattr(family, "shared_params", ()))
        self.name = f"{family.name}[{site.name}, unconstrained]"

    def sample(self, key, *params):
        return self.family.sample_flat(key, self.site, *params)

    def lane_log_prob(self, z, *params):
        return self.family.log_prob_flat(z, self.site, *params)

    def __eq__(self, other):
        return (isinstance(other, Flat) and other.family is self.family
                and other.site is self.site and other.param_event_ndims == self.param_event_ndims)

    def __hash__(self):
        return hash(("flat", id(self.family), id(self.site), self.param_event_ndims))


class Block(Distribution):
    """A guide site: a family's flat unconstrained draw of `site.size` numbers,
    reshaped and mapped onto the site's support. Leading axes of the parameters
    (particles under `jax.vmap`) are independent lanes. The log density is the
    family's at the unconstrained value minus the bijector's log-Jacobian: at the
    draw itself where the guide samples (`pushforward`), at the inverse of the value
    where a value is given (`log_density`).
    """

    reparameterized = True

    def __init__(self, family: Any, site: Site, event_ndims: tuple):
        self.family, self.site = family, site
        self.param_event_ndims = tuple(event_ndims)
        self.lane_shared_params = tuple(getattr(family, "shared_params", ()))
        self.value_event_ndim = len(site.shape)
        self.name = f"{family.name}[{site.name}]"

    def _split(self, params: tuple) -> tuple[tuple, tuple]:
        n = len(params) - len(self.site.bounds)
        return tuple(params[:n]), tuple(params[n:])

    def sample(self, key, *params):
        fam, bounds = self._split(params)
        return self._forward(bounds, self.family.sample_flat(key, self.site, *fam))[0]

    def _forward(self, bounds: tuple, z: jax.Array) -> tuple[jax.Array, jax.Array]:
        """A flat draw `z` (*lanes, size) mapped onto the support, and the bijector's
        log |det| at it, per lane."""
        u = z.reshape(z.shape[:-1] + self.site.ushape)
        bij = self.site.bijector(bounds)
        y = supports.inside(self.site.domain, bij.forward(u), bounds)
        ldj = supports.forward_log_det(self.site.domain, bij, u, self.site.shape,
                                       len(self.site.ushape))
        return y, ldj

    def pushforward(self, *params) -> tuple[Flat, tuple, Any] | None:
        """`(base, base parameters, forward)`: the family's flat draw, and the map of a
        draw onto the support with its log-Jacobian, so the handlers that sample this
        site score it at the draw (`genvi.gen.handlers`); None for a point mass."""
        if getattr(self.family, "point", False):
            return None
        fam, bounds = self._split(params)
        base = Flat(self.family, self.site, self.param_event_ndims[:len(fam)])
        return base, fam, lambda z: self._forward(bounds, z)

    def lane_log_prob(self, y, *params):
        fam, bounds = self._split(params)
        if getattr(self.family, "point", False):  # a point mass: log 1 at its point
            at = self.sample(None, *params)
            event = tuple(range(y.ndim - len(self.site.shape), y.ndim))
            return jnp.where(jnp.all(y == at, axis=event), 0.0, -jnp.inf)
        bij = self.site.bijector(bounds)
        u = bij.inverse(y)
        batch = u.shape[:u.ndim - len(self.site.ushape)]
        z = u.reshape(batch + (self.site.size,))
        ldj = supports.forward_log_det(self.site.domain, bij, u, self.site.shape,
                                       len(self.site.ushape))
        return self.family.log_prob_flat(z, self.site, *fam) - ldj

    def __eq__(self, other):
        return (isinstance(other, Block) and other.family is self.family
                and other.site is self.site and other.param_event_ndims == self.param_event_ndims)

    def __hash__(self):
        return hash((id(self.family), id(self.site), self.param_event_ndims))
