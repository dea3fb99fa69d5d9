"""Numerically tuned log densities equal their textbook forms, with derivatives."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv


@pytest.mark.parametrize("x", [0.0, 1.0])
def test_bernoulli_log_density_value_and_derivatives_match_softplus_form(x):
    logits = jnp.linspace(-80.0, 80.0, 1601)
    ref = lambda l: x * l - jax.nn.softplus(l)  # noqa: E731
    new = lambda l: gv.Bernoulli().lane_log_prob(x, l)  # noqa: E731
    for order in range(3):
        np.testing.assert_allclose(np.asarray(jax.vmap(new)(logits)), np.asarray(jax.vmap(ref)(logits)),
                                   atol=1e-6)
        ref, new = jax.grad(ref), jax.grad(new)
    # at l = 0 the derivative is x − 1/2, not a one-sided value
    assert float(jax.grad(lambda l: gv.Bernoulli().lane_log_prob(x, l))(0.0)) == pytest.approx(x - 0.5)


def test_bernoulli_log_density_derivative_in_the_value():
    g = jax.grad(lambda v: gv.Bernoulli().lane_log_prob(v, 1.7))(0.3)
    assert float(g) == pytest.approx(1.7)
