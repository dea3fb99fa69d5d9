"""Plain training loops shared by experiments: SGD/Adam ascent inside `lax.scan`,
optionally averaging several independent gradient estimates per step."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

import genvi as gv


def ascend(objective: gv.Expectation, params: Any, *data: Any, optimizer: optax.GradientTransformation,
           steps: int, key: jax.Array, estimates_per_step: int = 1) -> Any:
    """Maximize `objective(params, *data)`; each step uses the mean of
    `estimates_per_step` independent gradient estimates. One compiled scan."""

    def grad(params, key):
        keys = jax.random.split(key, estimates_per_step)
        grads = jax.vmap(lambda k: objective.grad_estimate(k, params, *data))(keys)
        return jax.tree_util.tree_map(lambda g: jnp.mean(g, 0), grads)

    def step(carry, key):
        params, state = carry
        g = grad(params, key)
        updates, state = optimizer.update(jax.tree_util.tree_map(jnp.negative, g), state, params)
        return (optax.apply_updates(params, updates), state), None

    run = jax.jit(lambda p, k: jax.lax.scan(step, (p, optimizer.init(p)),
                                             jax.random.split(k, steps))[0][0])
    return run(params, key)


def mean_estimate(objective: gv.Expectation, params: Any, *data: Any, n: int,
                  key: jax.Array) -> tuple[float, float]:
    """Mean and standard error of `n` independent estimates."""
    values = jax.jit(jax.vmap(lambda k: objective.estimate(k, params, *data)))(
        jax.random.split(key, n))
    return float(jnp.mean(values)), float(jnp.std(values) / jnp.sqrt(n))


def chunked_mean(objective: gv.Expectation, params: Any, x: jax.Array, key: jax.Array,
                 chunk: int) -> float:
    """Mean over the rows of `x` of a `gv.batch_mean` objective, evaluated `chunk`
    rows at a time so that many-particle evaluations fit in memory (a host loop over
    data blocks, like a data loader: each block is one call of the jitted estimator)."""
    n = x.shape[0]
    keys = jax.random.split(key, -(-n // chunk))
    total = sum(float(objective.estimate(k, params, x[i:i + chunk])) * len(x[i:i + chunk])
                for k, i in zip(keys, range(0, n, chunk)))
    return total / n
