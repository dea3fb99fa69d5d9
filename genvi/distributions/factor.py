"""`Factor` and `Deterministic`: the "distributions" that `gv.factor(log_weight)` and
`gv.deterministic(name, value)` observe.

`gv.factor(w)` multiplies a program's density by exp(w), as Pyro's `factor` does. It
is an observation (of a placeholder value) under a distribution whose log density is
the weight itself, so every handler treats it as it treats `gv.observe`: it is scored
by `simulate`, `log_density` and objectives, scaled inside a subsampled `gv.plate`,
and it makes a program unnormalized (a guide may not contain one).

`gv.deterministic(name, value)` is a named observation of a placeholder under a
law that puts all its mass on `value` and whose log density is 0: it changes no
density and no gradient, the handlers that return choices (`simulate`,
`gv.predictive`) record `value` at its address, and `sample` returns `value`.

Example:
    >>> from genvi.distributions.factor import DETERMINISTIC, FACTOR
    >>> float(FACTOR.log_prob(0.0, -1.5)), float(DETERMINISTIC.log_prob(0.0, 2.5))
    (-1.5, 0.0)
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


class Deterministic(Distribution):
    """A point mass at `value` that scores 0 everywhere (see `gv.deterministic`)."""

    name = "deterministic"
    scorable = False  # nothing is drawn: the value is computed from the program's choices
    param_names = ("value",)

    def sample(self, key: jax.Array, value: Any) -> jax.Array:
        return jnp.asarray(value)

    def lane_log_prob(self, value: Any, recorded: Any) -> jax.Array:
        return jnp.zeros(jnp.broadcast_shapes(jnp.shape(value), jnp.shape(recorded)),
                         jnp.result_type(float))

    def check_value(self, value: Any, recorded: Any) -> list:
        return []  # a placeholder, never read


DETERMINISTIC = Deterministic()
