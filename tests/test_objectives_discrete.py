"""Gradient unbiasedness of the objective library with a *discrete* guide.

Model: z ~ flip(0.4), y ~ N(±1, 1) observed; guide: z ~ flip(sigmoid(logit)). With K
particles the exact objective is a finite sum over the 2^K particle configurations,
so its exact gradient comes from `jax.grad` of that sum."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.special import logsumexp
from jax.scipy.stats import norm

import genvi as gv

Y, K, N = 0.3, 3, 20000


@gv.gen
def model(params, y):
    z = gv.flip(0.4) @ "z"
    gv.observe(gv.normal(jnp.where(z, 1.0, -1.0), 1.0), y)


def guide_with(strategy):
    @gv.gen
    def guide(params, y):
        gv.flip(jax.nn.sigmoid(params["logit"]), grad=strategy) @ "z"
    return guide


def log_weight(z, logit):
    p = jax.nn.sigmoid(logit)
    log_p = jnp.where(z, jnp.log(0.4), jnp.log(0.6)) + norm.logpdf(Y, jnp.where(z, 1.0, -1.0), 1.0)
    log_q = jnp.where(z, jnp.log(p), jnp.log1p(-p))
    return log_p - log_q, log_q


def exact(reduce, k):
    """E over k guide particles of reduce(log w), by enumeration."""
    def value(logit):
        total = 0.0
        for zs in itertools.product([False, True], repeat=k):
            zs = jnp.array(zs)
            log_w, log_q = log_weight(zs, logit)
            total = total + jnp.exp(jnp.sum(log_q)) * reduce(log_w)
        return total
    return value


REDUCTIONS = {
    "elbo": (lambda g: gv.elbo(model, g), lambda lw: lw[0], 1),
    "iwelbo": (lambda g: gv.iwelbo(model, g, particles=K), lambda lw: logsumexp(lw) - math.log(K), K),
    "vimco": (lambda g: gv.vimco(model, g, particles=K), lambda lw: logsumexp(lw) - math.log(K), K),
    "renyi": (lambda g: gv.renyi(model, g, alpha=0.5, particles=K),
              lambda lw: 2 * (logsumexp(0.5 * lw) - math.log(K)), K),
}


@pytest.mark.parametrize("name", list(REDUCTIONS))
@pytest.mark.parametrize("strategy", [gv.ENUM, gv.REINFORCE, gv.MVD])
def test_discrete_guide_gradient_unbiased(name, strategy):
    if name == "vimco" and strategy is not gv.REINFORCE:
        pytest.skip("VIMCO's control variate is for score-function (REINFORCE) guides")
    make, reduce, k = REDUCTIONS[name]
    obj = make(guide_with(strategy))
    params = {"logit": jnp.array(0.2)}
    keys = jax.random.split(jax.random.key(0), N)
    values, grads = jax.jit(jax.vmap(lambda key: obj.value_and_grad_estimate(key, params, Y)))(keys)
    exact_value = float(exact(reduce, k)(0.2))
    exact_grad = float(jax.grad(exact(reduce, k))(0.2))
    g, v = np.asarray(grads["logit"]), np.asarray(values)
    assert abs(v.mean() - exact_value) < 5 * v.std() / math.sqrt(N) + 1e-5
    assert abs(g.mean() - exact_grad) < 5 * g.std() / math.sqrt(N) + 1e-5, (g.mean(), exact_grad)


def test_wake_guide_gradient_matches_enumeration():
    # Σ_k w̃_k ∂log q(z_k) with z_k ~ q held fixed: E over particles by enumeration.
    obj = gv.wake_guide(model, guide_with(gv.REINFORCE), particles=K)

    def expected_grad(logit):
        total = 0.0
        for zs in itertools.product([False, True], repeat=K):
            zs = jnp.array(zs)
            log_w, log_q = log_weight(zs, logit)
            w = jax.nn.softmax(log_w)
            dlogq = jax.grad(lambda l: jnp.sum(w * log_weight(zs, l)[1]))(logit)
            total = total + jnp.exp(jnp.sum(log_q)) * dlogq
        return total

    keys = jax.random.split(jax.random.key(1), N)
    g = np.asarray(jax.jit(jax.vmap(lambda key: obj.grad_estimate(key, {"logit": jnp.array(0.2)}, Y)))(keys)["logit"])
    assert abs(g.mean() - float(expected_grad(0.2))) < 5 * g.std() / math.sqrt(N) + 1e-5
