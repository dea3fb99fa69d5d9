"""The point-mass automatic guide `gv.auto_delta`: MAP estimation.

Each site's value is a parameter, stored unconstrained and mapped onto its support by
its TFP bijector (`genvi.guides.supports`), like the Gaussian families of
`genvi.guides.gaussian`.

Example:
    >>> import genvi as gv, jax
    >>> @gv.gen
    ... def model(params):
    ...     gv.gamma(2.0, 1.0) @ "r"
    >>> auto = gv.auto_delta(model)
    >>> sorted(auto.init(jax.random.key(0), {})["value"])
    ['r']
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from genvi.guides import auto as base
from genvi.guides.init_rules import InitRule


class _Point:
    """A point mass at the constrained value of `v` (see `AutoDelta`)."""

    name = "auto_delta"
    point = True

    def sample_flat(self, key, site, v):
        return v

    def log_prob_flat(self, z, site, v):  # unused: Block scores points in constrained space
        return jnp.zeros(z.shape[:-1])


POINT = _Point()


class AutoDelta(base.AutoGuide):
    """Point masses (MAP / MLE); see `gv.auto_delta`."""

    kind = "auto_delta"

    def family_init(self, key, sites, z0):
        return {"value": {s.name: z0[s.name].reshape(s.ushape) for s in sites}}

    def run(self, params, sites):
        return {s.name: base.sample_site(POINT, s, (params["value"][s.name].reshape(-1),))
                for s in sites}

    def median(self, params: Any, **kw: Any) -> dict:
        """The point estimate of every site (constrained space); exact, so the Monte
        Carlo options of the other guides (`key`, `num_samples`) are accepted and unused.

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params):
            ...     gv.gamma(2.0, 1.0) @ "r"
            >>> auto = gv.auto_delta(model)
            >>> params = {"guide": auto.init(jax.random.key(0), {})}
            >>> bool(auto.median(params)["r"] > 0)      # the point (the MAP once fitted)
            True
        """
        sites = self._check_ready()
        v = self.guide_params(params)["value"]
        return {s.name: s.bijector().forward(v[s.name]) for s in sites}

    def quantiles(self, params: Any, qs: Sequence[float] | jax.Array, **kw: Any) -> dict:
        """Every quantile of a point mass is the point.

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params):
            ...     gv.gamma(2.0, 1.0) @ "r"
            >>> auto = gv.auto_delta(model)
            >>> params = {"guide": auto.init(jax.random.key(0), {})}
            >>> q = auto.quantiles(params, [0.1, 0.9])["r"]
            >>> bool(q[0] == q[1])
            True
        """
        return {k: jnp.stack([v] * len(qs)) for k, v in self.median(params).items()}


def auto_delta(model: Any, *, params_key: str = "guide", exclude: Sequence = (),
               init: InitRule | None = None) -> AutoDelta:
    """Point masses at learned values: MAP estimation (MLE under a flat prior).

    Each site's value is a parameter (stored unconstrained, mapped onto the support)
    drawn with a REPARAM-like rule (the draw is the parameter, so the gradient flows
    through it). A point mass has density 1 at its point (0 in log space: the
    counting measure) and 0 elsewhere, so `gv.elbo(model, auto_delta(model))` is
    exactly log p(z*, x): maximizing it finds the mode of the posterior density *in
    the constrained space* (no Jacobian enters). For a Beta(16, 14) posterior that is
    15/28, not the mean 16/30.

    Args:
        model: the model whose continuous latents the guide covers.
        params_key: the entry of the parameters the guide reads.
        exclude: addresses left to a hand-written guide.
        init: the rule choosing the starting points (`gv.init_to_uniform()` by default).

    Returns:
        an `AutoDelta` guide: `auto.init(key, *args)` gives its parameters.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.gen
        ... def model(params):
        ...     gv.gamma(2.0, 1.0) @ "r"
        >>> auto = gv.auto_delta(model)
        >>> params = {"guide": auto.init(jax.random.key(0), {})}
        >>> elbo = gv.elbo(model, auto).estimate(jax.random.key(1), params)
        >>> log_joint = model.log_density(gv.choices(auto.median(params)), params)
        >>> bool(abs(elbo - log_joint) < 1e-4)                 # the ELBO is log p(z*)
        True
    """
    return AutoDelta(model, params_key=params_key, exclude=exclude, init=init)
