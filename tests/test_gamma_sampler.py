"""The fast Gamma sampler behind gv.gamma / gv.beta / gv.dirichlet: right
distribution (Kolmogorov–Smirnov), right implicit gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats as st

import genvi as gv
from genvi.distributions.gamma_sampler import gamma


@pytest.mark.parametrize("alpha", [0.2, 0.9, 1.0, 3.0, 40.0])
def test_gamma_distribution(alpha):
    x = np.asarray(gamma(jax.random.key(3), jnp.full((100000,), alpha)), np.float64)
    assert st.kstest(x, st.gamma(alpha).cdf).pvalue > 1e-3
    assert np.all(x > 0)


@pytest.mark.parametrize("a, b", [(0.5, 0.5), (2.0, 5.0), (15.0, 15.0)])
def test_beta_distribution(a, b):
    x = jax.vmap(lambda k: gv.beta.sample(k, a, b))(jax.random.split(jax.random.key(4), 50000))
    assert st.kstest(np.asarray(x, np.float64), st.beta(a, b).cdf).pvalue > 1e-3


def test_dirichlet_moments():
    alpha = jnp.array([0.5, 2.0, 4.0])
    x = jax.vmap(lambda k: gv.dirichlet.sample(k, alpha))(jax.random.split(jax.random.key(5), 50000))
    np.testing.assert_allclose(np.mean(x, 0), alpha / alpha.sum(), atol=5e-3)
    np.testing.assert_allclose(np.sum(x, 1), 1.0, atol=1e-5)


def test_implicit_gradient_is_unbiased():
    # d/dalpha E[x] = 1 for x ~ Gamma(alpha)
    keys = jax.random.split(jax.random.key(6), 40000)
    g = np.asarray(jax.vmap(lambda k: jax.grad(lambda a: gamma(k, a))(2.5))(keys))
    assert abs(g.mean() - 1.0) < 5 * g.std() / np.sqrt(g.size)
