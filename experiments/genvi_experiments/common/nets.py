"""Networks shared by the experiments and by every side of a benchmark (genvi,
hand-written JAX, NumPyro's `flax_module`), so all run exactly the same Flax code.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from genvi_experiments.common.nets import MLP
    >>> net = MLP((32, 4))
    >>> params = net.init(jax.random.key(0), jnp.zeros(8))["params"]
    >>> net.apply({"params": params}, jnp.zeros((5, 8))).shape
    (5, 4)
"""

from __future__ import annotations

from typing import Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp


class MLP(nn.Module):
    """Dense layers of sizes `features`; ReLU between them, linear output."""

    features: Sequence[int]

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for i, size in enumerate(self.features):
            x = nn.Dense(size, name=f"dense{i}")(x)
            if i < len(self.features) - 1:
                x = nn.relu(x)
        return x


def init_params(net: nn.Module, key: jax.Array, in_size: int) -> dict:
    """The module's `params` collection (what NumPyro's `flax_module` stores)."""
    return net.init(key, jnp.zeros(in_size))["params"]


def apply(net: nn.Module, params: dict, x: jax.Array) -> jax.Array:
    return net.apply({"params": params}, x)


def gaussian_head(out: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Split a network output into a mean and a positive scale (exp of the second half)."""
    mean, log_scale = jnp.split(out, 2, axis=-1)
    return mean, jnp.exp(log_scale)


class VAENets:
    """Encoder pixels→hidden→2·latent and decoder latent→hidden→pixels (logits)."""

    def __init__(self, pixels: int, hidden: int, latent: int):
        self.pixels, self.hidden, self.latent = pixels, hidden, latent
        self.encoder = MLP((hidden, 2 * latent))
        self.decoder = MLP((hidden, pixels))

    def init(self, key: jax.Array) -> dict:
        k1, k2 = jax.random.split(key)
        return {"enc": init_params(self.encoder, k1, self.pixels),
                "dec": init_params(self.decoder, k2, self.latent)}

    def encode(self, params: dict, x: jax.Array) -> tuple[jax.Array, jax.Array]:
        return gaussian_head(apply(self.encoder, params["enc"], x))

    def decode(self, params: dict, z: jax.Array) -> jax.Array:
        return apply(self.decoder, params["dec"], z)
