"""Objectives over flip sites with their exact values and θ-derivatives, shared by the
statistical tests of the binary estimators (DisARM, RELAX, RLOO): one site with a score
part and a pathwise part, one site's five lanes coupled through their sum, and a Markov
chain of flips in a `jax.lax.scan`. Each takes the site's strategy; its exact twin
enumerates every joint value (`estimates.exact_by_enumeration`)."""

import jax
import jax.numpy as jnp
import numpy as np

import genvi as gv
from estimates import exact_by_enumeration

THETA = 0.4  # where every test measures
C = np.array([1.0, -2.0, 0.5, 3.0, -1.0])  # per-lane weights of `coupled_lanes`
T = 4  # steps of `markov_chain`


def sig(x):
    return 1 / (1 + np.exp(-x))


def single_flip_value(theta, z):
    """(3z − 1)² + θ z: a score part and a pathwise part."""
    return (3.0 * z - 1.0) ** 2 + theta * z


def single_flip(strategy: gv.Strategy) -> gv.Expectation:
    """E[(3z − 1)² + θ z], z ~ flip(σ(θ))."""
    @gv.expectation
    def f(theta):
        return single_flip_value(theta, gv.sample(gv.flip(jax.nn.sigmoid(theta), grad=strategy)))
    return f


def exact_single_flip(theta: float) -> tuple[float, float]:
    return exact_by_enumeration(
        lambda th, z: ([sig(th) if z[0] else 1 - sig(th)], single_flip_value(th, z[0])), theta, 1)


def coupled_lanes(strategy: gv.Strategy, offset: float = 0.0) -> gv.Expectation:
    """Five lanes of one flip site, coupled through (Σ z)² as well as summed through C·z,
    plus `offset`."""
    @gv.expectation
    def f(theta):
        z = gv.sample(gv.flip(jax.nn.sigmoid(theta + jnp.arange(5.0) / 4), grad=strategy))
        return jnp.sum(jnp.asarray(C) * z) + 0.3 * jnp.sum(z) ** 2 + offset
    return f


def exact_coupled_lanes(theta: float, offset: float = 0.0) -> tuple[float, float]:
    def value_of(th, z):
        q = sig(th + np.arange(5.0) / 4)
        return np.where(z == 1, q, 1 - q), C @ z + 0.3 * z.sum() ** 2 + offset
    return exact_by_enumeration(value_of, theta, 5)


def markov_chain(strategy: gv.Strategy) -> gv.Expectation:
    """T flips in a scan, each step's probability reading the last step's draw, each
    step's cost reading both."""
    @gv.expectation
    def f(theta):
        def step(prev, t):
            z = gv.sample(gv.flip(jax.nn.sigmoid(theta + 1.2 * prev - 0.3 * t), grad=strategy))
            z = z * 1.0
            return z, (2.0 * z - prev) ** 2 + theta * z
        _, costs = jax.lax.scan(step, 0.0, jnp.arange(float(T)))
        return jnp.sum(costs)
    return f


def exact_markov_chain(theta: float) -> tuple[float, float]:
    def value_of(th, z):
        probs, total, prev = [], 0.0, 0.0
        for t in range(T):
            q = sig(th + 1.2 * prev - 0.3 * t)
            probs.append(q if z[t] else 1 - q)
            total += (2 * z[t] - prev) ** 2 + th * z[t]
            prev = z[t]
        return probs, total
    return exact_by_enumeration(value_of, theta, T)
