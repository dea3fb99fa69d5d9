"""The expected-value algebra (SPEC §8): each combination's value and gradient
estimates against closed forms, 2·10⁴ independent estimates each, within 5 standard
errors; the naive wrong answers (E[X²] for `x * x`, E[exp X] for `gv.exp`) lie far
outside. Nonlinear uses of an `Expectation` are refused with what to write instead."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv

N = 20_000
MU = 0.7


@gv.expectation
def x(mu):  # X ~ N(mu, 1): E[X] = mu, E[X²] = mu² + 1
    return gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))


@gv.expectation
def y(mu):  # Y ~ N(2 mu, 0.5)
    return gv.sample(gv.normal(2.0 * mu, 0.5, grad=gv.REPARAM))


@gv.expectation
def narrow(mu):  # N(mu, 0.5): E[exp X] = exp(mu + 1/8), not exp(mu)
    return gv.sample(gv.normal(mu, 0.5, grad=gv.REPARAM))


def moments(e: gv.Expectation, seed: int = 0, mu: float = MU):
    """Means and standard errors of N independent value and gradient estimates."""
    keys = jax.random.split(jax.random.key(seed), N)
    v, g = jax.jit(jax.vmap(lambda k: e.value_and_grad_estimate(k, mu)))(keys)
    v, g = np.asarray(v, np.float64), np.asarray(g, np.float64)
    return v.mean(), v.std() / math.sqrt(N), g.mean(), g.std() / math.sqrt(N)


def assert_close(mean: float, se: float, exact: float):
    assert abs(mean - exact) <= 5 * se + 1e-5, f"{mean} ± {se} against {exact}"


CASES = {
    # name: (expectation, E value, d/dmu)
    "e + c": (x + 1.5, MU + 1.5, 1.0),
    "c + e": (1.5 + x, MU + 1.5, 1.0),
    "e - c": (x - 1.5, MU - 1.5, 1.0),
    "c - e": (1.5 - x, 1.5 - MU, -1.0),
    "e / c": (x / 4, MU / 4, 0.25),
    "c * e": (3 * x, 3 * MU, 3.0),
    "-e": (-x, -MU, -1.0),
    "e * e": (x * x, MU**2, 2 * MU),
    "e1 * e2": (x * y, 2 * MU**2, 4 * MU),
    "e ** 3": (x**3, MU**3, 3 * MU**2),
    "exp": (gv.exp(narrow), math.exp(MU), math.exp(MU)),
    "exp, shifted": (gv.exp(narrow, rate=1.0, shift=0.5), math.exp(MU), math.exp(MU)),
    "exp * e": (gv.exp(narrow) * x, math.exp(MU) * MU, math.exp(MU) * (1 + MU)),
    "exp(exp)": (gv.exp(gv.exp(narrow, rate=1.0, shift=MU), rate=2.0, shift=2.0),
                 math.exp(math.exp(MU)), math.exp(math.exp(MU) + MU)),
    "average": (gv.average(x, 10), MU, 1.0),
    "affine of a product": (2.0 - 0.5 * (x * y), 2.0 - MU**2, -2 * MU),
}


@pytest.mark.parametrize("name", list(CASES))
def test_value_and_gradient_are_unbiased(name):
    e, value, grad = CASES[name]
    v, v_se, g, g_se = moments(e)
    assert_close(v, v_se, value)
    assert_close(g, g_se, grad)


def test_products_are_of_independent_estimates_not_of_one():
    v, v_se, _, _ = moments(x * x, seed=1)
    assert abs(v - (MU**2 + 1.0)) > 20 * v_se  # E[X²] would be mu² + 1


def test_exp_is_exp_of_the_mean_not_the_mean_of_exp():
    v, v_se, _, _ = moments(gv.exp(narrow), seed=2)
    assert abs(v - math.exp(MU + 0.125)) > 10 * v_se


def test_average_divides_the_variance():
    _, one, _, _ = moments(x, seed=3)
    _, ten, _, _ = moments(gv.average(x, 10), seed=3)
    assert ten == pytest.approx(one / math.sqrt(10), rel=0.05)


def test_the_algebra_composes_with_estimate_and_fit():
    e = gv.exp(narrow) - 2.0 * x
    assert jnp.shape(e.estimate(jax.random.key(0), MU)) == ()
    result = gv.fit(-(x - 1.0) ** 2, 0.0, optimizer=__import__("optax").adam(0.05),
                    steps=300, key=jax.random.key(0), progress=False)
    assert abs(float(result.params) - 1.0) < 0.2


def test_zero_dimensional_real_arrays_are_constants():
    # a NumPy or JAX 0-d array, float or integer, on the right combines as its number does
    key = jax.random.key(0)
    for c in (np.asarray(2.0), jnp.asarray(2.0), np.asarray(2), jnp.asarray(2, jnp.int32)):
        assert float((x + c).estimate(key, MU)) == pytest.approx(float(x.estimate(key, MU)) + 2.0)
        assert float((x * c).estimate(key, MU)) == pytest.approx(2.0 * float(x.estimate(key, MU)))
    with pytest.raises(TypeError, match="real constants"):
        x + np.asarray([1.0, 2.0])


def test_an_expectation_is_an_object_for_truthiness():
    # `report or objective` chooses between objects; it asks nothing of E[e]
    assert (None or x) is x and bool(x)


@pytest.mark.parametrize("expression, kind, words", [
    (lambda: jnp.exp(x), ValueError, "gv.exp"),
    (lambda: jnp.log(x), ValueError, "no unbiased\nestimator of log|no unbiased estimator of log"),
    (lambda: float(x), TypeError, "no unbiased estimator of log E"),
    (lambda: int(x), TypeError, "nonlinear"),
    (lambda: x < 1.0, TypeError, "nonlinear"),
    (lambda: x * 2.0j, TypeError, "real\nconstants|real constants"),
    (lambda: x + "a", TypeError, "real constants"),
    (lambda: x / y, TypeError, "ratio"),
    (lambda: 1.0 / x, TypeError, "reciprocal"),
    (lambda: x ** 0.5, TypeError, "positive integer power"),
    (lambda: x ** 0, TypeError, "positive integer power"),
    (lambda: 2.0 ** x, TypeError, r"gv.exp\(e \* math.log\(c\)\)"),
    (lambda: gv.exp(1.0), TypeError, "gv.exp takes an Expectation"),
    (lambda: gv.exp(x, rate=0.0), ValueError, "rate"),
    (lambda: gv.average(x, 0), ValueError, "positive int"),
])
def test_nonlinear_uses_are_refused_with_the_fix(expression, kind, words):
    # jnp functions see a ValueError: JAX's jitted functions replace a TypeError
    # raised while reading an argument by their own words
    with pytest.raises(kind, match=words):
        expression()
