"""Sites that NumPyro's effects make and that are no NumPyro distribution, each without
density or gradient term: a subsampling plate's draw of indices (`Subsample`) and
`numpyro.prng_key()`'s key (`KeyDraw`). Each lane draws its own, from its own key.

Example:
    >>> import jax, jax.numpy as jnp
    >>> Subsample(10, 3).sample(jax.random.key(0), jnp.zeros((), jnp.int8)).shape
    (3,)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from genvi.distributions.base import Distribution
from genvi.interop.numpyro_distributions import lane_keys, over_lanes


class Subsample(Distribution):
    """`numpyro.plate(name, size, subsample_size=B)`'s draw of B of the `size` indices,
    uniformly without replacement, as a site: its log density is 0 (NumPyro scores no
    density for it) and it has no parameters but the lanes' placeholder, so every
    strategy's gradient term at it is zero; the plate scales the densities inside it
    by size / B.

    Example:
        >>> law = Subsample(10, 3)
        >>> law.sample(jax.random.key(0), jnp.zeros((), jnp.int8)).shape
        (3,)
    """

    value_event_ndim = 1
    param_event_ndims = (0,)

    def __init__(self, size: int, count: int):
        self.size, self.count = int(size), int(count)
        self.name = f"subsample({self.size}, {self.count})"

    @property
    def label(self) -> str:
        return f"numpyro.plate's subsample of {self.count} of {self.size}"

    def sample(self, key, lanes):
        def one(k):
            return jax.random.permutation(k, self.size)[: self.count].astype(jnp.int32)
        shape = jnp.shape(lanes)
        return over_lanes(shape, one, lane_keys(key, shape))

    def lane_log_prob(self, value, lanes):
        return jnp.zeros(jnp.shape(value)[:-1], jnp.result_type(float))

    def __eq__(self, other):
        return isinstance(other, Subsample) and (other.size, other.count) == (self.size,
                                                                              self.count)

    def __hash__(self):
        return hash(("subsample", self.size, self.count))


class KeyDraw(Distribution):
    """`numpyro.prng_key()`'s draw of a random key (its raw data, `uint32[2]`), as a
    site: randomness with no density (its log density is 0) and no parameters but the
    lanes' placeholder, so every strategy's gradient term at it is zero (dropout's
    mask does not depend on the parameters). Each lane draws its own key.

    Example:
        >>> KeyDraw().sample(jax.random.key(0), jnp.zeros((2,), jnp.int8)).shape
        (2, 2)
    """

    value_event_ndim = 1
    param_event_ndims = (0,)
    name = "prng_key"
    #: no density: a program scoring its choices draws it where it is estimated
    draws_randomness = True

    @property
    def label(self) -> str:
        return "numpyro.prng_key()"

    def sample(self, key, lanes):
        shape = jnp.shape(lanes)
        return over_lanes(shape, lambda k: jax.random.key_data(jax.random.split(k)[0]),
                           lane_keys(key, shape))

    def lane_log_prob(self, value, lanes):
        return jnp.zeros(jnp.shape(value)[:-1], jnp.result_type(float))

    def __eq__(self, other):
        return isinstance(other, KeyDraw)

    def __hash__(self):
        return hash(KeyDraw)
