"""Where an automatic guide starts: one rule per way of choosing its first location.

A rule is a function `rule(site, draws, key) -> location`: from a latent site (its
address, shape and support), `PRIOR_DRAWS` draws of it from the model's prior
(constrained values, a leading axis of draws) and a key, the guide's starting
location for that site in the unconstrained space (shape `site.ushape`). Every
automatic guide takes one as `init=` (NumPyro's `init_loc_fn`):

    auto = gv.auto_normal(model, init=gv.init_to_uniform())

- `init_to_uniform(radius=2)` (the default, as NumPyro's automatic guides): uniform
  in (−radius, radius) in the unconstrained space. On stochastic volatility the prior
  median starts the random walk's scale so small that the path cannot move, and a
  mean-field fit stops about 11,000 nats below the one from this start
  (docs/benchmarks/peers.md, "Where the automatic guides start").
- `init_to_median()`: the median of the prior draws (Pyro's default).
- `init_to_sample()`: one prior draw.
- `init_to_value(values, fallback=init_to_uniform())`: the given constrained values
  at their addresses, `fallback` elsewhere.

A joint family's flat location (`auto_mvn`, `auto_low_rank`) puts the sites'
unconstrained locations one after another in the order `auto.layout()` lists.

Example:
    >>> import genvi as gv, jax
    >>> @gv.gen
    ... def model(params):
    ...     gv.gamma(2.0, 1.0) @ "rate"
    >>> auto = gv.auto_delta(model, init=gv.init_to_value({"rate": 3.0}))
    >>> params = {"guide": auto.init(jax.random.key(0), {})}
    >>> round(float(auto.median(params)["rate"]), 4)
    3.0
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp

from genvi.core.scopes import assume_continuous
from genvi.guides.discover import Site
from genvi.core.address import Address

#: rule(site, prior draws [n, *site.shape], key) -> unconstrained location [*site.ushape]
InitRule = Callable[[Site, jax.Array, jax.Array], jax.Array]


def unconstrained(site: Site, y: jax.Array) -> jax.Array:
    """The flat unconstrained value (leading axes kept) of a constrained value `y`."""
    with assume_continuous():  # bijector inverses are continuous (their `where`s are guards)
        u = site.bijector().inverse(y)
    return u.reshape(u.shape[:u.ndim - len(site.ushape)] + (site.size,))


def init_to_median() -> InitRule:
    """Start each site at the median of its prior draws (unconstrained, coordinate by
    coordinate; draws outside the support are left out).

    Returns:
        an initialization rule for an automatic guide's `init=`.

    Example:
        >>> import genvi as gv
        >>> rule = gv.init_to_median()
    """
    def rule(site: Site, draws: jax.Array, key: jax.Array) -> jax.Array:
        z = unconstrained(site, draws)
        z = jnp.where(jnp.isfinite(z), z, jnp.nan)
        return jnp.nan_to_num(jnp.nanmedian(z, axis=0)).reshape(site.ushape)
    return rule


def init_to_sample() -> InitRule:
    """Start each site at one draw from its prior.

    Returns:
        an initialization rule for an automatic guide's `init=`.

    Example:
        >>> import genvi as gv
        >>> rule = gv.init_to_sample()
    """
    def rule(site: Site, draws: jax.Array, key: jax.Array) -> jax.Array:
        z = unconstrained(site, draws[0])
        return jnp.where(jnp.isfinite(z), z, 0.0).reshape(site.ushape)
    return rule


def init_to_uniform(radius: float = 2.0) -> InitRule:
    """Start each unconstrained coordinate uniformly in (−radius, radius).

    Args:
        radius: the half-width of the interval, in the unconstrained space.

    Returns:
        an initialization rule for an automatic guide's `init=`.

    Example:
        >>> import genvi as gv
        >>> rule = gv.init_to_uniform(radius=1.0)
    """
    if not radius > 0:
        raise ValueError(f"gv.init_to_uniform: radius must be positive, got {radius}")

    def rule(site: Site, draws: jax.Array, key: jax.Array) -> jax.Array:
        return jax.random.uniform(key, site.ushape, minval=-radius, maxval=radius)
    return rule


def init_to_value(values: Mapping[Any, Any], fallback: InitRule | None = None) -> InitRule:
    """Start the sites named in `values` (address → constrained value; an address is
    "a/b" or a tuple) at those values, the others by `fallback` (the default rule,
    `init_to_uniform()`).
    A value outside its site's support, or of another shape, is an error naming the
    site.

    Args:
        values: address → constrained starting value.
        fallback: the rule for the other sites (`gv.init_to_uniform()` by default).

    Returns:
        an initialization rule for an automatic guide's `init=`.

    Example:
        >>> import genvi as gv
        >>> rule = gv.init_to_value({"trans": [[0.9, 0.1], [0.2, 0.8]]})
    """
    given = {_name(k): v for k, v in values.items()}
    other = fallback if fallback is not None else init_to_uniform()

    def rule(site: Site, draws: jax.Array, key: jax.Array) -> jax.Array:
        if site.name not in given:
            return other(site, draws, key)
        value = jnp.asarray(given[site.name], site.dtype)
        if value.shape != tuple(site.shape):
            raise ValueError(f"gv.init_to_value: the value for {site.name!r} ({site.dist.label}) "
                             f"has shape {value.shape}; the site has shape {tuple(site.shape)}")
        return unconstrained(site, value).reshape(site.ushape)
    # checked against the model's sites by the guide (which reads it with getattr)
    rule.addresses = frozenset(given)  # type: ignore[attr-defined]  # a function's attribute
    return rule


def _name(address: Any) -> str:
    return str(Address(address)) if isinstance(address, tuple) else str(address)


def check_values(rule: InitRule, sites: list[Site], z0: dict, who: str) -> None:
    """Refuse an `init_to_value` that names addresses the model has no latent site at,
    or gives a value outside a site's support (its location is not finite)."""
    names = {s.name for s in sites}
    unknown = sorted(getattr(rule, "addresses", frozenset()) - names)
    if unknown:
        raise ValueError(f"gv.{who}: gv.init_to_value names {unknown}, which are not latent "
                         f"sites of the model (its sites: {sorted(names)})")
    for s in sites:
        if s.name in getattr(rule, "addresses", ()) and not bool(jnp.all(jnp.isfinite(z0[s.name]))):
            raise ValueError(f"gv.{who}: the starting value for {s.name!r} ({s.dist.label}) "
                             "is outside its support; give a value inside it")
