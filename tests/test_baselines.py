"""REINFORCE baselines: constant, decaying average and learned — unbiased, less
variance, and a learned baseline trains by regression onto the objective."""

import jax
import jax.numpy as jnp
import numpy as np

import genvi as gv

N = 20000


def _objective(baseline_fn):
    @gv.expectation
    def e(params):
        b = baseline_fn(params)
        strategy = gv.REINFORCE if b is None else gv.REINFORCE.with_baseline(b)
        x = gv.sample(gv.normal(params["mu"], 1.0, grad=strategy))
        return 10.0 + jnp.sin(x)   # large offset: a baseline near 10 removes most variance
    return e


def _grads(e, params, seed=0):
    keys = jax.random.split(jax.random.key(seed), N)
    return jax.jit(jax.vmap(lambda k: e.grad_estimate(k, params)))(keys)


def test_baselines_unbiased_and_reduce_variance():
    params = {"mu": jnp.array(0.4), "b": jnp.array(10.0)}
    exact = np.cos(0.4) * np.exp(-0.5)   # d/dmu E sin(x), x ~ N(mu, 1)
    plain = _grads(_objective(lambda p: None), params)["mu"]
    const = _grads(_objective(lambda p: 10.0), params)["mu"]
    learned = _grads(_objective(lambda p: p["b"]), params)["mu"]
    for g in (plain, const, learned):
        assert abs(g.mean() - exact) < 5 * g.std() / np.sqrt(N) + 1e-3
    assert const.std() < 0.2 * plain.std()
    np.testing.assert_allclose(const, learned, rtol=1e-5, atol=1e-6)


def test_learned_baseline_gets_regression_gradient():
    # The baseline parameter gets E[f - b] (ascent on -1/2 (f - b)^2): positive when
    # b is below the objective's mean, negative above it.
    e = _objective(lambda p: p["b"])
    mean_f = 10.0 + np.sin(0.4) * np.exp(-0.5)
    for b in (8.0, 12.0):
        g = _grads(e, {"mu": jnp.array(0.4), "b": jnp.array(b)})["b"]
        assert abs(g.mean() - (mean_f - b)) < 5 * g.std() / np.sqrt(N) + 1e-3


def test_decaying_average_baseline_loop():
    e = _objective(lambda p: p["avg"])
    params = {"mu": jnp.array(0.4), "avg": jnp.array(0.0)}
    avg = jnp.array(0.0)
    for i in range(200):
        value, _ = e.value_and_grad_estimate(jax.random.key(i), {**params, "avg": avg})
        avg = gv.decaying_average(avg, value, decay=0.95)
    assert abs(float(avg) - (10.0 + np.sin(0.4) * np.exp(-0.5))) < 0.3
