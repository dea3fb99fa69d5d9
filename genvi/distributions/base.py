"""The `Distribution` base class and `DistCall`, a distribution applied to parameters.

A distribution is a stateless, hashable object (it is a static parameter of genvi's
primitives). Subclasses define `sample` and `lane_log_prob`; parameters of any
shape make a product of independent components ("lanes"), whose log densities are
summed. Optional capabilities enable strategies:

* `reparameterized = True`: `sample` is differentiable in the parameters (REPARAM).
* `support(*params)`: the finite support of one lane (ENUM).
* `mvd_terms(key, value, params, tangents)`: measure-valued derivative terms (MVD).

Example: a new distribution in one small class (see docs/extending.md)::

    class Exponential(gv.Distribution):
        name = "exponential"
        strategies = ("REPARAM", "REINFORCE")
        reparameterized = True
        def sample(self, key, rate):
            return jax.random.exponential(key, jnp.shape(rate)) / rate
        def lane_log_prob(self, x, rate):
            return jnp.log(rate) - rate * x
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp


class Distribution:
    """Base class of genvi distributions. Call it to get a `DistCall`."""

    name: str = "distribution"
    strategies: tuple[str, ...] = ("REINFORCE",)
    reparameterized: bool = False
    param_names: tuple[str, ...] = ()
    # Trailing event axes of each parameter and of a value (0 = elementwise); used
    # to keep parameters aligned when `vmap` adds batch axes.
    param_event_ndims: tuple[int, ...] = ()
    value_event_ndim: int = 0

    def sample(self, key: jax.Array, *params: Any) -> jax.Array:
        raise NotImplementedError

    def lane_log_prob(self, value: jax.Array, *params: Any) -> jax.Array:
        """Log density of each independent component (broadcast shape)."""
        raise NotImplementedError

    def lane_prob(self, value: jax.Array, *params: Any) -> jax.Array:
        """Probability of each component (discrete distributions; ENUM uses it).
        Override where exp(log p) has an unsafe derivative (p = 0)."""
        return jnp.exp(self.lane_log_prob(value, *params))

    def log_prob(self, value: jax.Array, *params: Any) -> jax.Array:
        """Log density of `value`: the sum over independent components."""
        return jnp.sum(self.lane_log_prob(value, *params))

    def check_params(self, *params: Any) -> list[tuple[jax.Array, str]]:
        """(condition that must hold, what it means) pairs for validation mode."""
        return []

    def value_shape(self, *params: Any) -> tuple:
        return jax.eval_shape(lambda *p: self.sample(jax.random.key(0), *p), *params).shape

    def supports(self, kind: str) -> bool:
        return kind in self.strategies

    def __call__(self, *params: Any, grad: Any = None) -> "DistCall":
        return DistCall(self, tuple(jnp.asarray(p) if not isinstance(p, jax.Array) else p
                                    for p in params), grad)

    def __repr__(self) -> str:
        return f"gv.{self.name}"


class DistCall:
    """A distribution applied to parameters, with an optional gradient strategy.

    `dist_call @ "addr"` samples it at an address inside a `@gv.gen` program;
    `gv.observe(dist_call, value)` scores a value; `gv.sample(dist_call)` draws an
    unnamed value inside an `@gv.expectation`.

    Example:
        >>> import genvi as gv
        >>> call = gv.normal(0.0, 1.0, grad=gv.REPARAM)
        >>> call.dist.name, len(call.params)
        ('normal', 2)
    """

    __slots__ = ("dist", "params", "strategy")

    def __init__(self, dist: Distribution, params: Sequence[Any], strategy: Any):
        self.dist = dist
        self.params = tuple(params)
        self.strategy = strategy  # checked where the site gets its address

    def __matmul__(self, addr: str) -> Any:
        from genvi.gen.language import sample_at
        return sample_at(self, addr)

    def sample(self, key: jax.Array) -> jax.Array:
        """Draw a value (plain JAX; no address, no gradient strategy)."""
        return self.dist.sample(key, *self.params)

    def log_prob(self, value: Any) -> jax.Array:
        return self.dist.log_prob(value, *self.params)

    def __repr__(self) -> str:
        return f"{self.dist!r}(...{', grad=' + repr(self.strategy) if self.strategy else ''})"
