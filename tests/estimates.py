"""What the statistical tests of gradient strategies share: the mean and standard error
of many independent value and gradient estimates, the within-k-standard-errors check,
and exact values and θ-derivatives by enumerating every joint value of a few discrete
sites."""

import itertools
import math

import jax
import numpy as np

N = 20_000  # estimates per check: enough that the biased variants the tests name fail


def moments(e, arg, seed: int = 0, n: int = N):
    """(value mean, its s.e., gradient mean, its s.e., gradient variance) over `n`
    estimates of `e` at `arg`, keys split from `seed`."""
    keys = jax.random.split(jax.random.key(seed), n)
    v, g = jax.jit(jax.vmap(lambda k: e.value_and_grad_estimate(k, arg)))(keys)
    v, g = np.asarray(v, np.float64), np.asarray(g, np.float64)
    return v.mean(0), v.std(0) / math.sqrt(n), g.mean(0), g.std(0) / math.sqrt(n), g.var(0)


def within(mean, se, exact, sigmas: float = 5.0) -> bool:
    """Every entry of `mean` within `sigmas` standard errors of `exact`."""
    return bool(np.all(np.abs(mean - exact) <= sigmas * se + 1e-5))


def exact_by_enumeration(value_of, theta: float, sites: int, size: int = 2):
    """E f and its θ-derivative (central differences) over every joint value of `sites`
    sites of `size` values each; `value_of(theta, z)` -> (probabilities of z's
    values, f(z))."""
    def expectation(th):
        return sum(np.prod(p) * f for p, f in
                   (value_of(th, np.array(z)) for z in itertools.product(range(size), repeat=sites)))
    eps = 1e-5
    return expectation(theta), (expectation(theta + eps) - expectation(theta - eps)) / (2 * eps)
