"""Vectorized time series: a whole path as one site, so a model of a latent path
(stochastic volatility, a local level) needs no `gv.scan`, and its draw and density
are one vectorized computation of the path (a cumulative sum, differences).

`gv.gaussian_random_walk(scale, num_steps=T)`: x_0 ~ Normal(0, scale), x_t = x_{t−1} +
Normal(0, scale), a value of shape `scale.shape + (T,)` (NumPyro's
`GaussianRandomWalk`). REPARAM draws it as the cumulative sum of scaled normal
increments; REINFORCE scores it (its support, the real line, does not move).

Example:
    >>> import genvi as gv, jax
    >>> @gv.gen
    ... def model():
    ...     return gv.gaussian_random_walk(0.1, num_steps=5, grad=gv.REPARAM) @ "path"
    >>> model.simulate(jax.random.key(0)).choices["path"].shape
    (5,)
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from genvi.distributions.base import DistCall, Distribution


class GaussianRandomWalk(Distribution):
    """A Gaussian random walk of `num_steps` steps starting at 0 (the last axis of the
    value is time; `scale` is the increments' standard deviation, its shape the batch
    shape). `gv.gaussian_random_walk(scale, num_steps=T)` makes one.

    Example:
        >>> import genvi as gv
        >>> gv.gaussian_random_walk(1.0, num_steps=3).dist.name
        'gaussian_random_walk[3]'
    """

    domain = "real"
    reparameterized = True
    param_names = ("scale",)
    param_event_ndims = (0,)
    value_event_ndim = 1

    def __init__(self, num_steps: int | None = None):
        self.num_steps = num_steps
        self.name = ("gaussian_random_walk" if num_steps is None
                     else f"gaussian_random_walk[{num_steps}]")

    # narrower than Distribution.__call__ on purpose: one parameter, and num_steps=
    def __call__(self, scale: Any, *, num_steps: int | None = None,  # type: ignore[override]
                 grad: Any = None) -> DistCall:
        """The walk of `num_steps` steps (a positive int) with increments' scale `scale`.

        Example:
            >>> import genvi as gv
            >>> call = gv.gaussian_random_walk(0.5, num_steps=10, grad=gv.REPARAM)
        """
        steps = self.num_steps if num_steps is None else num_steps
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError("gv.gaussian_random_walk(scale, num_steps=T): num_steps is the "
                             f"number of steps, a positive int; got {steps!r}")
        walk = self if steps == self.num_steps else GaussianRandomWalk(steps)
        return Distribution.__call__(walk, scale, grad=grad)

    def sample(self, key: jax.Array, scale: jax.Array) -> jax.Array:
        assert self.num_steps is not None  # __call__ gives the walk it samples its steps
        dtype = jnp.result_type(float, scale)
        shape = jnp.shape(scale) + (self.num_steps,)
        steps = jax.random.normal(key, shape, dtype) * jnp.asarray(scale, dtype)[..., None]
        return jnp.cumsum(steps, axis=-1)

    def lane_log_prob(self, x: jax.Array, scale: jax.Array) -> jax.Array:
        steps = jnp.diff(x, axis=-1, prepend=jnp.zeros_like(x[..., :1]))
        scale = jnp.asarray(scale)[..., None]
        z = steps / scale
        return jnp.sum(-0.5 * z * z - jnp.log(scale) - 0.5 * math.log(2 * math.pi), axis=-1)

    def check_params(self, scale: jax.Array) -> list:
        return [(jnp.all(scale > 0), "scale must be > 0")]

    def check_value(self, x: jax.Array, scale: jax.Array) -> list:
        return [(jnp.all(jnp.isfinite(x), -1), "must be finite")]

    def __eq__(self, other: Any) -> bool:
        return isinstance(other, GaussianRandomWalk) and other.num_steps == self.num_steps

    def __hash__(self) -> int:
        return hash(("gaussian_random_walk", self.num_steps))
