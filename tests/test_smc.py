"""The SMC objective on a linear-Gaussian state-space model: the particle filter's
evidence estimate is unbiased (Kalman filter gives the exact value) and the
objective's gradient estimator is unbiased; FIVO's is not claimed to be."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.stats import norm

import genvi as gv

A, Q, R = 0.9, 1.0, 0.5   # x_t = A x_{t-1} + N(0, Q); y_t = x_t + N(0, R^2)
YS = jnp.array([0.4, -0.3, 1.1, 0.8, 0.2])
N = 20000


@gv.gen
def step(params, x, y):
    x = gv.normal(params["a"] * x, math.sqrt(Q)) @ "x"
    gv.observe(gv.normal(x, R), y)
    return x


@gv.gen
def proposal(params, x, y):
    gv.normal(params["c"] * x + params["d"] * y, params["s"], grad=gv.REPARAM) @ "x"


def kalman_log_evidence(a, ys):
    m, v, total = 0.0, 0.0, 0.0
    for y in ys:
        m, v = a * m, a * a * v + Q
        s = v + R * R
        total += float(norm.logpdf(y, m, math.sqrt(s)))
        gain = v / s
        m, v = m + gain * (y - m), (1 - gain) * v
    return total


PARAMS = {"a": jnp.array(A), "c": jnp.array(0.5), "d": jnp.array(0.4), "s": jnp.array(0.9)}
KEYS = jax.random.split(jax.random.key(0), N)


def test_evidence_estimate_unbiased_against_kalman():
    obj = gv.smc(step, proposal, init=jnp.array(0.0), particles=6)
    log_z = jax.jit(jax.vmap(lambda k: obj.estimate(k, PARAMS, YS)))(KEYS)
    z = np.exp(np.asarray(log_z, np.float64))
    exact = math.exp(kalman_log_evidence(A, np.asarray(YS)))
    assert abs(z.mean() - exact) < 5 * z.std() / math.sqrt(N), (z.mean(), exact)
    assert np.mean(log_z) < math.log(exact)  # a lower bound on log p(y)


@pytest.mark.parametrize("resample", [gv.REINFORCE, gv.MVD])
def test_smc_gradient_unbiased(resample):
    # With particles=1 there is no resampling choice to differentiate; use 3 and
    # compare with finite differences of a high-precision objective estimate.
    obj = gv.smc(step, proposal, init=jnp.array(0.0), particles=3, resample=resample)
    grads = jax.jit(jax.vmap(lambda k: obj.grad_estimate(k, PARAMS, YS)))(KEYS)
    many = jax.random.split(jax.random.key(7), 400000)

    def value(p):
        return float(jnp.mean(jax.jit(jax.vmap(lambda k: obj.estimate(k, p, YS)))(many)))

    eps = 0.05
    for name in ("a", "d"):
        up = dict(PARAMS, **{name: PARAMS[name] + eps})
        down = dict(PARAMS, **{name: PARAMS[name] - eps})
        # common random numbers make the difference precise; O(eps^2) curvature error
        fd = (value(up) - value(down)) / (2 * eps)
        g = np.asarray(grads[name])
        assert abs(g.mean() - fd) < 5 * g.std() / math.sqrt(N) + 0.02, (name, g.mean(), fd)


def test_fivo_is_named_biased_and_runs():
    obj = gv.fivo(step, proposal, init=jnp.array(0.0), particles=4)
    assert "biased" in obj.name and "BIASED" in gv.fivo.__doc__
    g = obj.grad_estimate(jax.random.key(0), PARAMS, YS)
    assert all(np.isfinite(np.asarray(v)) for v in g.values())
