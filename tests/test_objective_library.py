"""The objective library on a conjugate Gaussian model: values against closed forms,
unbiased gradients, exactness at the posterior, and wake-sleep / forward-KL training
reaching the known optimum.

Model: z ~ N(theta, 1), y ~ N(z, 1). Posterior N((theta + y)/2, 1/2); evidence
N(y; theta, 2); the maximum-likelihood theta is y."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.scipy.stats import norm

import genvi as gv

Y = 0.8
N = 20000
KEYS = jax.random.split(jax.random.key(0), N)


@gv.gen
def model(params, y):
    z = gv.normal(params["theta"], 1.0) @ "z"
    gv.observe(gv.normal(z, 1.0), y)


def make_guide(strategy):
    @gv.gen
    def guide(params, y):
        gv.normal(params["a"] * y + params["b"], jnp.exp(params["log_s"]), grad=strategy) @ "z"
    return guide


reparam_guide, reinforce_guide = make_guide(gv.REPARAM), make_guide(gv.REINFORCE)
LOG_EVIDENCE = float(norm.logpdf(Y, 0.0, math.sqrt(2.0)))
EXACT = {"theta": jnp.array(0.0), "a": jnp.array(0.5), "b": jnp.array(0.0),
         "log_s": jnp.array(0.5 * math.log(0.5))}
ROUGH = {"theta": jnp.array(0.0), "a": jnp.array(0.2), "b": jnp.array(0.3),
         "log_s": jnp.array(0.1)}


def estimates(obj, params, what="grad", keys=KEYS):
    fn = {"grad": obj.grad_estimate, "value": obj.estimate}[what]
    return jax.jit(jax.vmap(lambda k: fn(k, params, Y)))(keys)


def assert_same_mean(a, b):
    a, b = np.asarray(a), np.asarray(b)
    se = np.sqrt(a.var() / a.size + b.var() / b.size)
    assert abs(a.mean() - b.mean()) < 5 * se + 1e-4, (a.mean(), b.mean(), se)


@pytest.mark.parametrize("make", [
    lambda g: gv.iwelbo(model, g, particles=5),
    lambda g: gv.vimco(model, g, particles=5),
    lambda g: gv.dreg(model, g, particles=5),
    lambda g: gv.renyi(model, g, alpha=0.5, particles=5),
])
def test_exact_posterior_gives_log_evidence(make):
    for guide in (reparam_guide, reinforce_guide):
        v = estimates(make(guide), EXACT, "value", KEYS[:200])
        np.testing.assert_allclose(v, LOG_EVIDENCE, atol=1e-5)


def test_dreg_gradient_is_exactly_zero_at_posterior():
    g = estimates(gv.dreg(model, reparam_guide, particles=4), EXACT, keys=KEYS[:200])
    for name in ("a", "b", "log_s"):
        np.testing.assert_allclose(g[name], 0.0, atol=1e-5)


@pytest.mark.parametrize("k", [1, 4])
def test_dreg_and_vimco_unbiased_for_iwelbo_gradient(k):
    reference = estimates(gv.iwelbo(model, reparam_guide, particles=k), ROUGH)
    candidates = [gv.dreg(model, reparam_guide, particles=k)]
    if k > 1:
        candidates.append(gv.vimco(model, reinforce_guide, particles=k))
    for obj in candidates:
        g = estimates(obj, ROUGH)
        for name in ("theta", "a", "b", "log_s"):
            assert_same_mean(g[name], reference[name])


def test_vimco_reduces_variance_over_reinforce():
    plain = estimates(gv.iwelbo(model, reinforce_guide, particles=5), ROUGH)["b"]
    vimco = estimates(gv.vimco(model, reinforce_guide, particles=5), ROUGH)["b"]
    assert np.var(vimco) < 0.5 * np.var(plain)


def test_renyi_interpolates_between_elbo_and_iwelbo():
    key_values = lambda obj: np.mean(estimates(obj, ROUGH, "value"))  # noqa: E731
    elbo = key_values(gv.elbo(model, reparam_guide))
    iw = key_values(gv.iwelbo(model, reparam_guide, particles=5))
    half = key_values(gv.renyi(model, reparam_guide, alpha=0.5, particles=5))
    assert elbo < half < iw < LOG_EVIDENCE
    np.testing.assert_allclose(key_values(gv.renyi(model, reparam_guide, 0.0, 5)), iw, rtol=1e-5)
    np.testing.assert_allclose(key_values(gv.renyi(model, reparam_guide, 1.0, 5)), elbo, atol=0.02)


def test_renyi_gradient_unbiased_against_closed_form_at_k1():
    # At K = 1 the Rényi bound is the ELBO for every alpha.
    ref = estimates(gv.elbo(model, reparam_guide), ROUGH)
    g = estimates(gv.renyi(model, reparam_guide, alpha=0.3, particles=1), ROUGH)
    for name in ("a", "b", "log_s"):
        assert_same_mean(g[name], ref[name])


def train(objective, params, steps=1500, lr=0.02, data=Y):
    opt = optax.adam(optax.cosine_decay_schedule(lr, steps))  # decay: settle, not jitter

    @jax.jit
    def step(carry, key):
        params, state = carry
        grads = objective.grad_estimate(key, params, data)
        updates, state = opt.update(jax.tree_util.tree_map(jnp.negative, grads), state)
        return (optax.apply_updates(params, updates), state), None

    (params, _), _ = jax.lax.scan(step, (params, opt.init(params)),
                                  jax.random.split(jax.random.key(1), steps))
    return params


def test_reweighted_wake_sleep_trains_to_the_optimum():
    rws = gv.wake_model(model, reinforce_guide, 10) + gv.wake_guide(model, reinforce_guide, 10)
    start = {"theta": jnp.array(-1.0), "a": jnp.array(0.0), "b": jnp.array(0.0),
             "log_s": jnp.array(0.0)}
    p = train(rws, start, steps=3000)
    assert abs(float(p["theta"]) - Y) < 0.1           # maximum likelihood
    mean = float(p["a"] * Y + p["b"])
    assert abs(mean - (float(p["theta"]) + Y) / 2) < 0.1
    assert abs(float(jnp.exp(p["log_s"])) - math.sqrt(0.5)) < 0.1


def test_sleep_phase_learns_the_amortized_posterior():
    # Sleep dreams (z, y) from the model (theta = 0) and fits q(z | y) = N(a y + b, s):
    # the optimum is the exact posterior map a = 1/2, b = 0, s = sqrt(1/2).
    start = {"theta": jnp.array(0.0), "a": jnp.array(0.0), "b": jnp.array(0.3),
             "log_s": jnp.array(0.0)}
    p = train(gv.sleep_guide(model, reinforce_guide, particles=16), start, steps=2000, lr=0.03)
    assert abs(float(p["a"]) - 0.5) < 0.05 and abs(float(p["b"])) < 0.05
    assert abs(float(jnp.exp(p["log_s"])) - math.sqrt(0.5)) < 0.05


def test_forward_kl_through_sir_fits_the_posterior():
    start = {"theta": jnp.array(0.0), "a": jnp.array(0.0), "b": jnp.array(0.0),
             "log_s": jnp.array(0.0)}
    p = train(gv.forward_kl_sir(model, reinforce_guide, 20), start, steps=2000)
    assert abs(float(p["a"] * Y + p["b"]) - Y / 2) < 0.1
    assert abs(float(jnp.exp(p["log_s"])) - math.sqrt(0.5)) < 0.15


def test_wake_sleep_with_minibatches():
    # batch_mean of the wake phases = the mean of the per-datapoint objectives
    rws = gv.wake_model(model, reinforce_guide, 5) + gv.wake_guide(model, reinforce_guide, 5)
    ys = jnp.array([0.8, -0.4, 1.5])
    batched = gv.batch_mean(rws, in_axes=(None, 0))
    keys = KEYS[:8000]
    g_batch = jax.jit(jax.vmap(lambda k: batched.grad_estimate(k, ROUGH, ys)))(keys)
    per_point = [jax.jit(jax.vmap(lambda k: rws.grad_estimate(k, ROUGH, y)))(keys) for y in ys]
    for name in ("theta", "b", "log_s"):
        a = np.asarray(g_batch[name])
        b = np.mean([np.asarray(g[name]) for g in per_point], axis=0)
        assert_same_mean(a, b)
