"""What the statistical tests of gradient strategies share: the mean and standard error
of many independent value and gradient estimates, the within-k-standard-errors check
(and `biased_parts`, which applies it to a value and every leaf of a gradient), and
exact values and θ-derivatives by enumerating every joint value of a few discrete
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


def estimates(e, params, *data, seed: int = 0, n: int = N):
    """`n` value estimates [n] and gradient estimates (a pytree like `params`, leaves
    [n, ...]) of `e` at `(params, *data)`, in float64, keys split from `seed`."""
    keys = jax.random.split(jax.random.key(seed), n)
    v, g = jax.jit(jax.vmap(lambda k: e.value_and_grad_estimate(k, params, *data)))(keys)
    return np.asarray(v, np.float64), jax.tree_util.tree_map(lambda x: np.asarray(x, np.float64), g)


def biased_parts(e, exact, params, *data, seed: int = 0) -> list[str]:
    """What of `e`'s estimates at `(params, *data)` lies beyond 5 standard errors of
    `exact(params)` and its gradient: "value" and the paths of `params`' leaves; [] for
    an unbiased estimator."""
    v, g = estimates(e, params, *data, seed=seed)
    out = [] if within(v.mean(), v.std() / math.sqrt(len(v)), float(exact(params))) else ["value"]
    want = jax.tree_util.tree_leaves_with_path(jax.grad(exact)(params))
    for (path, leaf), got in zip(want, jax.tree_util.tree_leaves(g)):
        if not within(got.mean(0), got.std(0) / math.sqrt(len(got)), np.asarray(leaf)):
            out.append(jax.tree_util.keystr(path))
    return out


def exact_by_enumeration(value_of, theta: float, sites: int, size: int = 2):
    """E f and its θ-derivative (central differences) over every joint value of `sites`
    sites of `size` values each; `value_of(theta, z)` -> (probabilities of z's
    values, f(z))."""
    def expectation(th):
        return sum(np.prod(p) * f for p, f in
                   (value_of(th, np.array(z)) for z in itertools.product(range(size), repeat=sites)))
    eps = 1e-5
    return expectation(theta), (expectation(theta + eps) - expectation(theta - eps)) / (2 * eps)
