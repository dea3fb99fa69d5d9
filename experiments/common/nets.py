"""Small MLPs as plain parameter pytrees (shared by genvi and hand-written baselines,
so both sides of a benchmark run exactly the same network code)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def mlp_init(key: jax.Array, sizes: list[int]) -> list[dict]:
    """Glorot-uniform layers `[{"w": (m, n), "b": (n,)}, ...]`."""
    layers = []
    for k, (m, n) in zip(jax.random.split(key, len(sizes) - 1), zip(sizes[:-1], sizes[1:])):
        lim = jnp.sqrt(6.0 / (m + n))
        layers.append({"w": jax.random.uniform(k, (m, n), minval=-lim, maxval=lim),
                       "b": jnp.zeros(n)})
    return layers


def mlp(layers: list[dict], x: jax.Array) -> jax.Array:
    """tanh hidden layers, linear output."""
    for layer in layers[:-1]:
        x = jnp.tanh(x @ layer["w"] + layer["b"])
    return x @ layers[-1]["w"] + layers[-1]["b"]


def vae_init(key: jax.Array, pixels: int = 784, hidden: int = 400, latent: int = 10) -> dict:
    """Encoder pixels→hidden→2·latent (mean, log-scale), decoder latent→hidden→pixels."""
    k1, k2 = jax.random.split(key)
    return {"enc": mlp_init(k1, [pixels, hidden, 2 * latent]),
            "dec": mlp_init(k2, [latent, hidden, pixels])}


def encode(params: dict, x: jax.Array) -> tuple[jax.Array, jax.Array]:
    out = mlp(params["enc"], x)
    mu, log_scale = jnp.split(out, 2, axis=-1)
    return mu, log_scale
