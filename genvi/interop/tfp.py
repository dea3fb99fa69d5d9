"""TensorFlow Probability's JAX distributions as genvi distributions (`gv.from_tfp`): the
only module importing TFP's distributions (`genvi.guides.supports` reads its bijectors).

TFP is imported lazily, on first use: `import genvi` never loads it. The released
`tensorflow-probability` 0.25.0 fails to import under current JAX, so genvi pins a
dated `tfp-nightly` build (see docs/install.md, Dependencies).
"""

from __future__ import annotations

import functools
from typing import Any

import jax.numpy as jnp

from genvi.distributions.base import DistCall, Distribution, static_max


@functools.lru_cache(maxsize=None)
def _tfp():
    from tensorflow_probability.substrates import jax as tfp  # noqa: PLC0415
    return tfp


class TFPDistribution(Distribution):
    """A TFP JAX distribution class as a genvi distribution (REINFORCE always;
    REPARAM when TFP reparameterizes it; ENUM, and summing by `gv.enumeration`, for
    the classes of finite support: Bernoulli, Categorical, Binomial with a static
    total_count)."""

    def __init__(self, cls: Any, names: tuple[str, ...], static: tuple = (),
                 reparameterized: bool = False):
        self.cls, self.param_names, self.static = cls, names, static
        self.domain = "own"  # its own default event-space bijector (automatic guides)
        self.name = f"tfp.{cls.__name__}"
        self.reparameterized = reparameterized
        if cls in _finite():  # ENUM and gv.enumeration sum it over its support
            self.support = self._finite_support

    def instance(self, *params: Any) -> Any:
        """The TFP distribution object with these parameters (automatic guides read
        its event-space bijector)."""
        return self.cls(**dict(zip(self.param_names, params)), **dict(self.static))

    def event_bijector(self, *params: Any) -> Any:
        """TFP's default event-space bijector of the instance (automatic guides; None
        where TFP has none)."""
        return self.instance(*params).experimental_default_event_space_bijector()

    def sample(self, key, *params):
        return self.instance(*params).sample(seed=key)

    def lane_log_prob(self, value, *params):
        return self.instance(*params).log_prob(value)

    def _finite_support(self, *params: Any) -> Any:
        """One lane's support, from the parameters' shapes or static values."""
        given = dict(zip(self.param_names, params), **dict(self.static))
        return _finite()[self.cls](given)

    def __eq__(self, other):
        return (isinstance(other, TFPDistribution) and other.cls is self.cls
                and other.param_names == self.param_names and other.static == self.static
                and other.reparameterized == self.reparameterized)

    def __hash__(self):
        return hash((self.cls, self.param_names, self.static, self.reparameterized))


def _classes(given: dict) -> Any:
    table = given.get("logits", given.get("probs"))
    assert table is not None  # a categorical law has logits or probs
    return jnp.arange(jnp.shape(table)[-1], dtype=jnp.int32)


def _counts(given: dict) -> Any:
    top = static_max(given["total_count"])   # 0..the largest total_count
    if top is None:
        raise TypeError("tfp.Binomial has the finite support 0..total_count only where "
                        "total_count is static (a Python number or a numpy array, or "
                        "passed to gv.from_tfp(tfd.Binomial, total_count=n))")
    return jnp.arange(top + 1, dtype=jnp.float32)


@functools.lru_cache(maxsize=None)
def _finite() -> dict:
    """TFP classes with a finite support known when the program is traced: one lane's
    support from the parameters (by name), keyed by the class itself."""
    tfd = _tfp().distributions
    return {tfd.Bernoulli: lambda given: jnp.array([0, 1], jnp.int32),
            tfd.Categorical: _classes, tfd.Binomial: _counts}


def from_tfp(cls: Any, **static: Any):
    """Wrap a TFP JAX distribution class; parameters are passed by keyword.

    Array parameters are traced; non-array keyword arguments are static.

    Args:
        cls: a `tfp.substrates.jax.distributions` class, e.g. `tfd.VonMises`.
        **static: keyword arguments fixed for every call (non-array ones are static).

    Returns:
        a distribution constructor: `d(loc=..., grad=...)` is a site's call, as
        `gv.normal(...)` is.

    Example:
        >>> import genvi as gv
        >>> from tensorflow_probability.substrates import jax as tfp
        >>> laplace = gv.from_tfp(tfp.distributions.Laplace)
        >>> call = laplace(loc=0.0, scale=1.0, grad=gv.REPARAM)
    """
    def make(grad: Any = None, **params: Any) -> DistCall:
        names = tuple(params)
        values = tuple(jnp.asarray(params[n]) for n in names)
        instance = cls(**dict(zip(names, values)), **static)
        reparam = (instance.reparameterization_type
                   == _tfp().distributions.FULLY_REPARAMETERIZED)
        dist = TFPDistribution(cls, names, tuple(sorted(static.items())), bool(reparam))
        return DistCall(dist, values, grad)

    return make
