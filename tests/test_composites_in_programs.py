"""Every `Expectation`, composite or not, can be called inside an objective program:
the call is one draw of its estimator, independent of every other call, with an
unbiased value and derivative, nested to any depth. Checked by the mean of 2·10⁴
estimates against closed forms and quadrature within 5 standard errors, where the
naive answer (one inner sample pushed through `jnp.exp`) fails."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import gammaln

import genvi as gv

N = 20_000
KEYS = jax.random.split(jax.random.key(0), N)

# -- a Poisson process whose likelihood has an integral in the exponent, averaged over
#    a gamma prior on its rate: E_θ[exp(−∫λ_θ) ∏ λ_θ(tᵢ)] as one program
T = 6.0
EVENTS = jnp.array([0.4, 1.1, 1.5, 2.0, 4.6, 5.2])
C = float(jnp.prod(1 + jnp.sin(EVENTS)))
K = T + 1 - math.cos(T)           # ∫₀ᵀ (1 + sin t) dt


@gv.expectation
def minus_integral(theta):
    u = gv.sample(gv.uniform(0.0, T, grad=gv.REPARAM))
    return -T * theta * (1 + jnp.sin(u))


exp_minus_integral = gv.exp(minus_integral, rate=4.0, shift=-0.8 * T - 4.0)


@gv.expectation
def evidence(a):                  # θ ~ Gamma(a, rate a / 0.8): mean 0.8
    theta = gv.sample(gv.gamma(a, a / 0.8, grad=gv.REPARAM))
    return C * theta ** len(EVENTS) * exp_minus_integral(theta)


@gv.expectation
def naive_evidence(a):            # one inner draw through exp: biased (Jensen)
    theta = gv.sample(gv.gamma(a, a / 0.8, grad=gv.REPARAM))
    return C * theta ** len(EVENTS) * jnp.exp(minus_integral(theta))


def exact_evidence(a: float) -> float:
    b, n = a / 0.8, len(EVENTS)
    return C * math.exp(a * math.log(b) - gammaln(a) + gammaln(a + n) - (a + n) * math.log(b + K))


def estimates(objective, *args):
    v, g = jax.jit(jax.vmap(lambda k: objective.value_and_grad_estimate(k, *args)))(KEYS)
    return np.asarray(v, np.float64), np.asarray(g, np.float64)


def within(samples: np.ndarray, exact: float, se: float = 5.0) -> bool:
    return abs(samples.mean() - exact) <= se * samples.std() / math.sqrt(len(samples))


def test_a_doubly_intractable_likelihood_is_one_program():
    a = 20.0
    v, g = estimates(evidence, a)
    assert within(v, exact_evidence(a))
    fd = (exact_evidence(a + 1e-3) - exact_evidence(a - 1e-3)) / 2e-3
    assert within(g, fd)
    naive, _ = estimates(naive_evidence, a)
    assert not within(naive, exact_evidence(a))    # the one-draw answer is biased


# -- nested: gv.exp(gv.exp(e)) inside a program inside a program -----------------------
@gv.expectation
def noisy(mu):
    return gv.sample(gv.normal(mu, 0.3, grad=gv.REPARAM))


double_exp = gv.exp(gv.exp(noisy, rate=2.0, shift=-1.0), rate=2.0, shift=1.0)


@gv.expectation
def inner_program(theta):
    return double_exp(theta)


@gv.expectation
def outer_program(mu):
    theta = gv.sample(gv.normal(mu, 0.2, grad=gv.REPARAM))
    return inner_program(theta)


def exact_outer(mu: float) -> float:
    nodes, weights = np.polynomial.hermite_e.hermegauss(80)
    return float(np.dot(weights, np.exp(np.exp(mu + 0.2 * nodes))) / math.sqrt(2 * math.pi))


def test_nested_composites_inside_programs_are_unbiased():
    mu = -1.0
    v, g = estimates(outer_program, mu)
    assert within(v, exact_outer(mu))
    fd = (exact_outer(mu + 1e-4) - exact_outer(mu - 1e-4)) / 2e-4
    assert within(g, fd)


# -- each call is its own draw; under vmap each lane is ----------------------------------
one_draw = gv.average(noisy, 1)


@gv.expectation
def two_calls(mu):
    return one_draw(mu) * one_draw(mu)       # independent: E = μ², not μ² + 0.09


@gv.expectation
def lanes(mu):
    draws = jax.vmap(lambda m: one_draw(m))(jnp.full(4, mu))
    return draws[0] * draws[1] + jnp.sum(draws[2:])   # E = μ² + 2μ


def test_calls_are_independent_draws():
    mu = 0.7
    v, g = estimates(two_calls, mu)
    assert within(v, mu ** 2) and within(g, 2 * mu)
    v, g = estimates(lanes, mu)
    assert within(v, mu ** 2 + 2 * mu) and within(g, 2 * mu + 2)


def test_explain_shows_the_nesting():
    explained = outer_program.explain(-1.0)
    # θ's site is the outer program's own; the inner site runs within the nested draw
    assert sorted(" > ".join(s["within"]) for s in explained.sites) == [
        "", "draw of gv.exp(gv.exp(noisy))"]
    assert " top " in str(explained)


def test_a_call_outside_an_objective_is_refused():
    with pytest.raises(TypeError, match="called outside an objective program"):
        double_exp(0.0)
