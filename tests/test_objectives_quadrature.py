"""Exact gradients of multi-particle objectives with a continuous guide, by
Gauss–Hermite quadrature over the K = 2 particles, against genvi's estimators; and a
hierarchical guide whose reverse proposal learns with the objective.

Model: z ~ N(theta, 1), y ~ N(z, 1); guide N(a y + b, exp(log_s))."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.scipy.special import logsumexp
from jax.scipy.stats import norm

import genvi as gv

Y, K, N = 0.8, 2, 20000
PARAMS = {"theta": jnp.array(0.3), "a": jnp.array(0.2), "b": jnp.array(0.3),
          "log_s": jnp.array(0.1)}
NODES, WEIGHTS = np.polynomial.hermite.hermgauss(40)


@gv.gen
def model(params, y):
    z = gv.normal(params["theta"], 1.0) @ "z"
    gv.observe(gv.normal(z, 1.0), y)


def guide_with(strategy):
    @gv.gen
    def guide(params, y):
        gv.normal(params["a"] * y + params["b"], jnp.exp(params["log_s"]), grad=strategy) @ "z"
    return guide


def quadrature(reduce):
    """E_{z1, z2 ~ q}[reduce(log w1, log w2)] on a 40×40 Gauss–Hermite grid."""
    def value(params):
        m, s = params["a"] * Y + params["b"], jnp.exp(params["log_s"])
        z = m + s * math.sqrt(2.0) * jnp.asarray(NODES)
        log_w = (norm.logpdf(z, params["theta"], 1.0) + norm.logpdf(Y, z, 1.0)
                 - norm.logpdf(z, m, s))
        w = jnp.asarray(WEIGHTS) / math.sqrt(math.pi)
        grid = jax.vmap(lambda l1: jax.vmap(lambda l2: reduce(jnp.stack([l1, l2])))(log_w))(log_w)
        return jnp.sum(w[:, None] * w[None, :] * grid)
    return value


IWELBO = lambda lw: logsumexp(lw) - math.log(K)  # noqa: E731
CASES = {
    "iwelbo": (lambda g: gv.iwelbo(model, g, K), IWELBO, gv.REPARAM),
    "iwelbo-reinforce": (lambda g: gv.iwelbo(model, g, K), IWELBO, gv.REINFORCE),
    "iwelbo-mvd": (lambda g: gv.iwelbo(model, g, K), IWELBO, gv.MVD),
    "vimco": (lambda g: gv.vimco(model, g, K), IWELBO, gv.REINFORCE),
    "renyi": (lambda g: gv.renyi(model, g, 0.5, K),
              lambda lw: 2 * (logsumexp(0.5 * lw) - math.log(K)), gv.REPARAM),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gradient_matches_quadrature(name):
    make, reduce, strategy = CASES[name]
    obj = make(guide_with(strategy))
    keys = jax.random.split(jax.random.key(0), N)
    values, grads = jax.jit(jax.vmap(lambda k: obj.value_and_grad_estimate(k, PARAMS, Y)))(keys)
    exact_value = float(quadrature(reduce)(PARAMS))
    exact_grad = jax.grad(quadrature(reduce))(PARAMS)
    v = np.asarray(values)
    assert abs(v.mean() - exact_value) < 5 * v.std() / math.sqrt(N) + 1e-4
    for p in PARAMS:
        g = np.asarray(grads[p])
        assert abs(g.mean() - float(exact_grad[p])) < 5 * g.std() / math.sqrt(N) + 1e-4, (
            p, g.mean(), float(exact_grad[p]))


def test_dreg_guide_gradient_matches_quadrature():
    # DReG is unbiased for the IWELBO gradient of the guide and of the model.
    obj = gv.dreg(model, guide_with(gv.REPARAM), K)
    keys = jax.random.split(jax.random.key(1), N)
    grads = jax.jit(jax.vmap(lambda k: obj.grad_estimate(k, PARAMS, Y)))(keys)
    exact = jax.grad(quadrature(IWELBO))(PARAMS)
    for p in PARAMS:
        g = np.asarray(grads[p])
        assert abs(g.mean() - float(exact[p])) < 5 * g.std() / math.sqrt(N) + 1e-4


def test_wake_model_gradient_matches_quadrature():
    # With guide samples held fixed, the model gradient equals IWELBO's model gradient.
    obj = gv.wake_model(model, guide_with(gv.REINFORCE), K)
    keys = jax.random.split(jax.random.key(2), N)
    g = np.asarray(jax.jit(jax.vmap(lambda k: obj.grad_estimate(k, PARAMS, Y)))(keys)["theta"])
    exact = float(jax.grad(quadrature(IWELBO))(PARAMS)["theta"])
    assert abs(g.mean() - exact) < 5 * g.std() / math.sqrt(N) + 1e-4


def test_learnable_reverse_proposal_trains_with_the_objective():
    # Hierarchical guide u ~ N(m, 1), z ~ N(u, 1), marginalized over u with a learned
    # reverse model r(u | z) = N(c z + e, exp(log_r)). The exact reverse conditional is
    # N((z + m)/2, 1/2): maximizing IWHVI drives r towards it.
    @gv.gen
    def joint(params, y):
        u = gv.normal(params["m"], 1.0, grad=gv.REPARAM) @ "u"
        gv.normal(u, 1.0, grad=gv.REPARAM) @ "z"

    @gv.gen
    def reverse(kept, params, y):
        gv.normal(params["c"] * kept["z"] + params["e"], jnp.exp(params["log_r"]),
                  grad=gv.REPARAM) @ "u"

    guide = gv.marginal(joint, keep=["z"], algorithm=gv.importance(reverse, particles=2))
    obj = gv.elbo(model, guide)
    params = {"theta": jnp.array(0.0), "m": jnp.array(0.4), "c": jnp.array(0.0),
              "e": jnp.array(0.0), "log_r": jnp.array(0.0)}
    opt = optax.adam(optax.cosine_decay_schedule(0.03, 3000))
    fixed = ("theta", "m")

    def step(carry, key):
        p, s = carry
        g = obj.grad_estimate(key, p, Y)
        g = {k: (jnp.zeros_like(v) if k in fixed else -v) for k, v in g.items()}
        u, s = opt.update(g, s)
        return (optax.apply_updates(p, u), s), None

    (params, _), _ = jax.jit(lambda p: jax.lax.scan(step, (p, opt.init(p)),
                                                     jax.random.split(jax.random.key(3), 3000)))(params)
    assert abs(float(params["c"]) - 0.5) < 0.1
    assert abs(float(params["e"]) - 0.2) < 0.1
    assert abs(float(jnp.exp(params["log_r"])) - math.sqrt(0.5)) < 0.1
