"""`Factor`: the "distribution" `gv.factor(log_weight)` observes.

`gv.factor(w)` multiplies a program's density by exp(w), as Pyro's `factor` does. It
is an observation (of a placeholder value) under a distribution whose log density is
the weight itself, so every handler treats it as it treats `gv.observe`: it is scored
by `simulate`, `log_density` and objectives, scaled inside a subsampled `gv.plate`,
and it makes a program unnormalized (a guide may not contain one).

Example:
    >>> from genvi.distributions.factor import FACTOR
    >>> float(FACTOR.log_prob(0.0, -1.5))
    -1.5
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from genvi.distributions.base import Distribution


class Factor(Distribution):
    """A unit weight exp(log_weight) on a placeholder value (see `gv.factor`)."""

    name = "factor"
    scorable = False  # its value is a placeholder, drawn from no law: nothing to score
    param_names = ("log_weight",)

    def sample(self, key: jax.Array, log_weight: Any) -> jax.Array:
        return jnp.zeros(jnp.shape(log_weight), jnp.result_type(float))

    def lane_log_prob(self, value: Any, log_weight: Any) -> jax.Array:
        return jnp.broadcast_to(log_weight, jnp.broadcast_shapes(jnp.shape(value),
                                                                 jnp.shape(log_weight)))

    def check_params(self, log_weight: Any) -> list:
        return [(jnp.all(~jnp.isnan(log_weight)), "log_weight must not be NaN")]


FACTOR = Factor()
