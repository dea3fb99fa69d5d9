"""Wrapping TensorFlow Probability's JAX distributions. The only module importing TFP.

TFP is imported lazily, on first use: `import genvi` never loads it. The released
`tensorflow-probability` 0.25.0 fails to import under current JAX, so genvi pins a
dated `tfp-nightly` build (see README).
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

from genvi.distributions.base import DistCall, Distribution


@functools.lru_cache(maxsize=None)
def _tfp():
    from tensorflow_probability.substrates import jax as tfp  # noqa: PLC0415
    return tfp


class TFPDistribution(Distribution):
    """A TFP JAX distribution class as a genvi distribution (REINFORCE always;
    REPARAM when TFP reparameterizes it)."""

    def __init__(self, cls: Any, names: tuple[str, ...], static: tuple = ()):
        self.cls, self.param_names, self.static = cls, names, static
        self.name = f"tfp.{cls.__name__}"
        tfp = _tfp()
        # TFP declares reparameterization per class; probe it once on the class.
        self.reparameterized = (getattr(cls, "reparameterization_type", None) is not None
                                and _is_fully_reparameterized(cls))
        self.strategies = ("REPARAM", "REINFORCE") if self.reparameterized else ("REINFORCE",)

    def _make(self, params):
        return self.cls(**dict(zip(self.param_names, params)), **dict(self.static))

    def sample(self, key, *params):
        return self._make(params).sample(seed=key)

    def lane_log_prob(self, value, *params):
        return self._make(params).log_prob(value)

    def __eq__(self, other):
        return (isinstance(other, TFPDistribution) and other.cls is self.cls
                and other.param_names == self.param_names and other.static == self.static)

    def __hash__(self):
        return hash((self.cls, self.param_names, self.static))


def _is_fully_reparameterized(cls: Any) -> bool:
    tfp = _tfp()
    rt = cls.reparameterization_type
    if isinstance(rt, property) or not hasattr(rt, "__eq__"):
        return False
    return rt == tfp.distributions.FULLY_REPARAMETERIZED


def from_tfp(cls: Any, **static: Any):
    """Wrap a TFP JAX distribution class; parameters are passed by keyword.

    Array parameters are traced; non-array keyword arguments are static.

    Example:
        >>> import genvi as gv
        >>> from tensorflow_probability.substrates import jax as tfp
        >>> laplace = gv.from_tfp(tfp.distributions.Laplace)
        >>> call = laplace(loc=0.0, scale=1.0, grad=gv.REPARAM)
    """
    def make(grad: Any = None, **params: Any) -> DistCall:
        names = tuple(params)
        dist = TFPDistribution(cls, names, tuple(sorted(static.items())))
        return DistCall(dist, tuple(jnp.asarray(params[n]) for n in names), grad)

    return make
