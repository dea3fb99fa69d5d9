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


class _FamilySite(Distribution):
    """What `Flat` and `Block` share: a family's distribution at one guide site, equal
    to another of its kind with the same family, site and parameter event axes."""

    reparameterized = True

    def __init__(self, family: Any, site: Site, event_ndims: tuple):
        self.family, self.site = family, site
        self.param_event_ndims = tuple(event_ndims)
        self.lane_shared_params = tuple(getattr(family, "shared_params", ()))

    def __eq__(self, other):
        return (type(other) is type(self) and other.family is self.family
                and other.site is self.site and other.param_event_ndims == self.param_event_ndims)

    def __hash__(self):
        return hash((type(self), id(self.family), id(self.site), self.param_event_ndims))


class Flat(_FamilySite):
    """A family's flat unconstrained draw of `site.size` numbers for one guide site
    (the base of a `Block`'s pushforward); leading axes are lanes."""

    value_event_ndim = 1

    def __init__(self, family: Any, site: Site, event_ndims: tuple):
        super().__init__(family, site, event_ndims)
        self.name = f"{family.name}[{site.name}, unconstrained]"

    def sample(self, key, *params):
        return self.family.sample_flat(key, self.site, *params)

    def lane_log_prob(self, z, *params):
        return self.family.log_prob_flat(z, self.site, *params)


class Block(_FamilySite):
    """A guide site: a family's flat unconstrained draw of `site.size` numbers,
    reshaped and mapped onto the site's support. Leading axes of the parameters
    (particles under `jax.vmap`) are independent lanes. The log density is the
    family's at the unconstrained value minus the bijector's log-Jacobian: at the
    draw itself where the guide samples (`pushforward`), at the inverse of the value
    where a value is given (`log_density`).
    """

    def __init__(self, family: Any, site: Site, event_ndims: tuple):
        super().__init__(family, site, event_ndims)
        self.value_event_ndim = len(site.shape)
        self.name = f"{family.name}[{site.name}]"

    def _split(self, params: tuple) -> tuple[tuple, tuple]:
        n = len(params) - len(self.site.bounds)
        return tuple(params[:n]), tuple(params[n:])

    def sample(self, key, *params):
        fam, bounds = self._split(params)
        z = self.family.sample_flat(key, self.site, *fam)
        return self._onto_support(self.site.bijector(bounds), bounds, z)[1]

    def _onto_support(self, bij: Any, bounds: tuple, z: jax.Array) -> tuple[jax.Array, jax.Array]:
        """A flat draw `z` (*lanes, size) as unconstrained values u and mapped onto the
        support: (u, y)."""
        u = z.reshape(z.shape[:-1] + self.site.ushape)
        return u, supports.inside(self.site.domain, bij.forward(u), bounds)

    def _log_det(self, bij: Any, u: jax.Array) -> jax.Array:
        """The bijector's log |det ∂y/∂u| at unconstrained values `u`, per lane."""
        return supports.forward_log_det(self.site.domain, bij, u, self.site.shape,
                                        len(self.site.ushape))

    def pushforward(self, *params) -> tuple[Flat, tuple, Any] | None:
        """`(base, base parameters, forward)`: the family's flat draw, and the map of a
        draw onto the support with its log-Jacobian, so the handlers that sample this
        site score it at the draw (`genvi.gen.handlers`); None for a point mass."""
        if getattr(self.family, "point", False):
            return None
        fam, bounds = self._split(params)
        bij = self.site.bijector(bounds)

        def forward(z: jax.Array) -> tuple[jax.Array, jax.Array]:
            u, y = self._onto_support(bij, bounds, z)
            return y, self._log_det(bij, u)
        return Flat(self.family, self.site, self.param_event_ndims[:len(fam)]), fam, forward

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
        return self.family.log_prob_flat(z, self.site, *fam) - self._log_det(bij, u)
