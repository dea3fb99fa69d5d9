"""A new distribution and a new strategy, each one small class (docs/extending.md)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv


class Exponential(gv.Distribution):
    name = "exponential"
    reparameterized = True

    def sample(self, key, rate):
        return jax.random.exponential(key, jnp.shape(rate)) / rate

    def lane_log_prob(self, x, rate):
        return jnp.log(rate) - rate * x


class ScoreOnly(gv.Strategy):
    """REINFORCE written from scratch as a user would."""

    kind = "REINFORCE"
    needs = ("sample", "lane_log_prob", "scorable")

    def jvp(self, dist, key, primals, tangents, k):
        x = dist.sample(key, *primals)
        _, score = gv.dual.jvp(lambda *p: dist.log_prob(x, *p), primals, tangents)
        return k.dual(x).plus(score=score)


exponential = Exponential()
N = 20000


def _grads(obj, arg, n=N, seed=0):
    keys = jax.random.split(jax.random.key(seed), n)
    return np.asarray(jax.jit(jax.vmap(lambda k: obj.grad_estimate(k, arg)))(keys))


@pytest.mark.parametrize("strategy", [gv.REPARAM, gv.REINFORCE, ScoreOnly()])
def test_custom_distribution_and_strategy_unbiased(strategy):
    # E[exp(-X)] for X ~ Exp(rate) is rate / (rate + 1); derivative 1 / (rate + 1)^2.
    @gv.expectation
    def e(rate):
        x = gv.sample(exponential(rate, grad=strategy))
        return jnp.exp(-x)

    rate = 1.5
    g = _grads(e, rate)
    exact = 1.0 / (rate + 1.0) ** 2
    assert abs(g.mean() - exact) < 5 * g.std() / np.sqrt(N) + 1e-4


def test_custom_distribution_in_programs():
    @gv.gen
    def model(rate):
        x = exponential(rate) @ "x"
        gv.observe(gv.normal(x, 1.0), 0.3)
        return x

    tr = model.simulate(jax.random.key(0), 2.0)
    x = tr.choices["x"]
    expected = (jnp.log(2.0) - 2.0 * x) + jax.scipy.stats.norm.logpdf(0.3, x, 1.0)
    np.testing.assert_allclose(tr.log_density, expected, rtol=1e-5)
    np.testing.assert_allclose(model.log_density(tr.choices, 2.0), expected, rtol=1e-5)


def test_custom_distribution_rejects_unlisted_strategy():
    program = gv.gen(lambda: exponential(1.0, grad=gv.MVD) @ "x")
    with pytest.raises(ValueError, match="exponential does not support the MVD.*'x'"):
        program.simulate(jax.random.key(0))
