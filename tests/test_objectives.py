"""ELBO and IWELBO values and gradients against closed forms (SPEC §3).

Conjugate Gaussian model: z ~ N(0, 1), y ~ N(z, 1) observed, so the posterior is
N(y/2, 1/2) and log p(y) = log N(y; 0, 2). With a Gaussian guide N(m, s²):

    ELBO(m, s) = -log 2π - ½(m² + s²) - ½((y - m)² + s²) + ½ log(2πe) + log s
    ∂ELBO/∂m = y - 2m,      ∂ELBO/∂log s = 1 - 2s².

Checked here: with the exact posterior as guide, ELBO and IWELBO estimates equal
log p(y) with zero variance; with another guide the ELBO estimate is unbiased, IWELBO
lies between ELBO and log p(y) and grows with K, and ELBO gradients from REPARAM,
REINFORCE and MVD match the closed form within 5 standard errors (IWELBO gradients
from REINFORCE / MVD agree with REPARAM's); a discrete model (z ~ flip) checks ENUM,
which is exact. Finally, the jaxpr of an IWELBO gradient estimator does not grow with
the particle count (REPARAM, REINFORCE, MVD, ENUM), nor does its compile time much.
"""

import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.special import logsumexp

import genvi as gv

Y = 1.3
LOG_PY = float(-0.5 * math.log(2 * math.pi * 2.0) - Y ** 2 / 4.0)  # log N(y; 0, 2)
EXACT = {"mu": jnp.array(Y / 2), "log_sigma": jnp.array(0.5 * math.log(0.5))}
OTHER = {"mu": jnp.array(0.2), "log_sigma": jnp.array(-0.3)}
N = 20_000


def count_eqns(jaxpr) -> int:
    """Equations in a jaxpr, counted recursively through every sub-jaxpr."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for p in eqn.params.values():
            for q in (p if isinstance(p, (tuple, list)) else (p,)):
                if hasattr(q, "eqns") or hasattr(getattr(q, "jaxpr", None), "eqns"):
                    n += count_eqns(q)
    return n


@gv.gen
def model(params, y):
    z = gv.normal(0.0, 1.0) @ "z"
    gv.observe(gv.normal(z, 1.0), y)


def make_guide(strategy):
    @gv.gen
    def guide(params, y):
        gv.normal(params["mu"], jnp.exp(params["log_sigma"]), grad=strategy) @ "z"
    return guide


GUIDES = {"REPARAM": make_guide(gv.REPARAM), "REINFORCE": make_guide(gv.REINFORCE),
          "MVD": make_guide(gv.MVD)}


def closed_elbo(params, y=Y):
    m, s = float(params["mu"]), math.exp(float(params["log_sigma"]))
    return (-math.log(2 * math.pi) - 0.5 * (m * m + s * s) - 0.5 * ((y - m) ** 2 + s * s)
            + 0.5 * math.log(2 * math.pi * math.e) + math.log(s))


def closed_elbo_grad(params, y=Y):
    m, s = float(params["mu"]), math.exp(float(params["log_sigma"]))
    return {"mu": y - 2 * m, "log_sigma": 1 - 2 * s * s}


def keys(n, seed=0):
    return jax.random.split(jax.random.key(seed), n)


def many(method, n=N, seed=0, *args):
    return jax.jit(jax.vmap(method, in_axes=(0,) + (None,) * len(args)))(keys(n, seed), *args)


def mean_se(x):
    x = np.asarray(x, np.float64)
    return x.mean(), x.std(ddof=1) / math.sqrt(x.size)


# --------------------------------------------------------------------------- exact guide

@pytest.mark.parametrize("name", list(GUIDES))
def test_elbo_at_exact_posterior_is_log_evidence_with_zero_variance(name):
    vals = np.asarray(many(gv.elbo(model, GUIDES[name]).estimate, 100, 0, EXACT, Y), np.float64)
    assert vals.std() < 1e-5
    assert abs(vals.mean() - LOG_PY) < 1e-4


@pytest.mark.parametrize("particles", [1, 5, 64])
def test_iwelbo_at_exact_posterior_is_log_evidence_with_zero_variance(particles):
    obj = gv.iwelbo(model, GUIDES["REPARAM"], particles=particles)
    vals = np.asarray(many(obj.estimate, 100, 1, EXACT, Y), np.float64)
    assert vals.std() < 1e-5
    assert abs(vals.mean() - LOG_PY) < 1e-4


def test_value_and_grad_value_matches_estimate():
    obj = gv.elbo(model, GUIDES["REPARAM"])
    k = jax.random.key(3)
    val, grads = obj.value_and_grad_estimate(k, OTHER, Y)
    assert float(val) == pytest.approx(float(obj.estimate(k, OTHER, Y)), rel=1e-6)
    assert set(grads) == {"mu", "log_sigma"}
    g2 = obj.grad_estimate(k, OTHER, Y)
    for name in grads:
        assert float(grads[name]) == pytest.approx(float(g2[name]), rel=1e-6)


# --------------------------------------------------------------------------- non-optimal guide

def test_elbo_estimate_is_unbiased():
    vals = many(gv.elbo(model, GUIDES["REPARAM"]).estimate, N, 2, OTHER, Y)
    mean, se = mean_se(vals)
    exact = closed_elbo(OTHER)
    assert exact < LOG_PY
    assert abs(mean - exact) < 5 * se, (mean, exact, se)


def test_iwelbo_between_elbo_and_log_evidence_and_increasing_in_k():
    exact_elbo = closed_elbo(OTHER)
    means = {}
    for k in (1, 4, 32):
        vals = many(gv.iwelbo(model, GUIDES["REPARAM"], particles=k).estimate, 5000, 10 + k, OTHER, Y)
        mean, se = mean_se(vals)
        means[k] = (mean, se)
        assert mean < LOG_PY + 5 * se
        if k == 1:
            assert abs(mean - exact_elbo) < 5 * se
        else:
            assert mean - 5 * se > exact_elbo, (k, mean, se, exact_elbo)
    assert means[4][0] + 3 * means[4][1] < means[32][0]
    assert means[1][0] + 3 * means[1][1] < means[4][0]


@pytest.mark.parametrize("name", list(GUIDES))
def test_elbo_gradient_matches_closed_form(name):
    grads = many(gv.elbo(model, GUIDES[name]).grad_estimate, N, 4, OTHER, Y)
    assert set(grads) == {"mu", "log_sigma"}
    exact = closed_elbo_grad(OTHER)
    for p in ("mu", "log_sigma"):
        mean, se = mean_se(grads[p])
        assert abs(mean - exact[p]) < 5 * se, (name, p, mean, exact[p], se)
        assert se < 0.1  # a meaningful test: the estimator is not absurdly noisy


@pytest.mark.parametrize("name", ["REINFORCE", "MVD"])
def test_iwelbo_gradients_agree_across_strategies(name):
    k = 4
    ref = many(gv.iwelbo(model, GUIDES["REPARAM"], particles=k).grad_estimate, N, 5, OTHER, Y)
    got = many(gv.iwelbo(model, GUIDES[name], particles=k).grad_estimate, N, 6, OTHER, Y)
    for p in ("mu", "log_sigma"):
        m1, s1 = mean_se(ref[p])
        m2, s2 = mean_se(got[p])
        assert abs(m1 - m2) < 5 * math.hypot(s1, s2), (name, p, m1, m2, s1, s2)


def test_gradient_ascent_direction_is_towards_posterior():
    # Every objective is maximized: the estimated gradient points to the optimum.
    g = many(gv.elbo(model, GUIDES["REPARAM"]).grad_estimate, 2000, 7, OTHER, Y)
    assert float(jnp.mean(g["mu"])) > 0  # mu = 0.2 < y/2


# --------------------------------------------------------------------------- discrete latent

P_PRIOR = 0.4


@gv.gen
def flip_model(params, y):
    z = gv.flip(P_PRIOR) @ "z"
    gv.observe(gv.normal(jnp.where(z, 1.0, -1.0), 1.0), y)


def make_flip_guide(strategy):
    @gv.gen
    def guide(params, y):
        gv.flip(jax.nn.sigmoid(params["logit"]), grad=strategy) @ "z"
    return guide


FLIP_GUIDES = {"ENUM": make_flip_guide(gv.ENUM), "REINFORCE": make_flip_guide(gv.REINFORCE),
               "MVD": make_flip_guide(gv.MVD)}


def _log_joint(z, y=Y):
    prior = math.log(P_PRIOR if z else 1 - P_PRIOR)
    return prior - 0.5 * math.log(2 * math.pi) - 0.5 * (y - (1.0 if z else -1.0)) ** 2


FLIP_LOG_PY = float(np.logaddexp(_log_joint(True), _log_joint(False)))
FLIP_EXACT_LOGIT = _log_joint(True) - _log_joint(False)


def flip_closed_elbo(logit):
    q = jax.nn.sigmoid(logit)
    return (q * (_log_joint(True) - jnp.log(q))
            + (1 - q) * (_log_joint(False) - jnp.log1p(-q)))


def test_enum_elbo_is_exact():
    obj = gv.elbo(flip_model, FLIP_GUIDES["ENUM"])
    params = {"logit": jnp.array(0.3)}
    vals, grads = many(obj.value_and_grad_estimate, 20, 8, params, Y)
    np.testing.assert_allclose(np.asarray(vals), float(flip_closed_elbo(0.3)), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(grads["logit"]), float(jax.grad(flip_closed_elbo)(0.3)),
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("particles", [1, 8])
def test_flip_iwelbo_at_exact_posterior_is_log_evidence(particles):
    params = {"logit": jnp.array(FLIP_EXACT_LOGIT)}
    obj = gv.iwelbo(flip_model, FLIP_GUIDES["ENUM"], particles=particles)
    vals = np.asarray(many(obj.estimate, 100, 9, params, Y), np.float64)
    assert vals.std() < 1e-5
    assert abs(vals.mean() - FLIP_LOG_PY) < 1e-4


@pytest.mark.parametrize("name", ["REINFORCE", "MVD"])
def test_flip_elbo_gradient_unbiased(name):
    params = {"logit": jnp.array(0.3)}
    grads = many(gv.elbo(flip_model, FLIP_GUIDES[name]).grad_estimate, N, 11, params, Y)
    mean, se = mean_se(grads["logit"])
    exact = float(jax.grad(flip_closed_elbo)(0.3))
    assert abs(mean - exact) < 5 * se, (name, mean, exact, se)


@pytest.mark.parametrize("name", ["REINFORCE", "MVD"])
def test_flip_iwelbo_gradients_agree_with_enum(name):
    params = {"logit": jnp.array(0.3)}
    ref = many(gv.iwelbo(flip_model, FLIP_GUIDES["ENUM"], particles=4).grad_estimate, N, 12, params, Y)
    got = many(gv.iwelbo(flip_model, FLIP_GUIDES[name], particles=4).grad_estimate, N, 13, params, Y)
    m1, s1 = mean_se(ref["logit"])
    m2, s2 = mean_se(got["logit"])
    assert abs(m1 - m2) < 5 * math.hypot(s1, s2), (m1, m2, s1, s2)


def test_iwelbo_matches_hand_written_estimator():
    # IWELBO(K) with REPARAM = logsumexp of K hand-computed log weights - log K (in mean).
    k = 8
    obj = gv.iwelbo(model, GUIDES["REPARAM"], particles=k)
    vals = many(obj.estimate, 5000, 14, OTHER, Y)

    def hand(key):
        m, s = OTHER["mu"], jnp.exp(OTHER["log_sigma"])
        z = m + s * jax.random.normal(key, (k,))
        logp = jax.scipy.stats.norm.logpdf(z) + jax.scipy.stats.norm.logpdf(Y, z, 1.0)
        logq = jax.scipy.stats.norm.logpdf(z, m, s)
        return logsumexp(logp - logq) - math.log(k)

    ref = jax.jit(jax.vmap(hand))(keys(5000, 15))
    m1, s1 = mean_se(vals)
    m2, s2 = mean_se(ref)
    assert abs(m1 - m2) < 5 * math.hypot(s1, s2)


def test_iwelbo_vector_site_with_scalar_scale():
    @gv.gen
    def vmodel(mu, y):
        z = gv.normal(jnp.zeros(3), 1.0) @ "z"
        gv.observe(gv.normal(z, 1.0), y)

    @gv.gen
    def vguide(mu, y):
        gv.normal(mu, 1.0, grad=gv.REPARAM) @ "z"

    g = gv.iwelbo(vmodel, vguide, particles=4).grad_estimate(jax.random.key(0), jnp.zeros(3),
                                                             jnp.ones(3))
    assert g.shape == (3,)


# --------------------------------------------------------------------------- no unrolling

SIZE_CASES = {
    "REPARAM": (model, GUIDES["REPARAM"], OTHER),
    "REINFORCE": (model, GUIDES["REINFORCE"], OTHER),
    "MVD": (model, GUIDES["MVD"], OTHER),
    "ENUM": (flip_model, FLIP_GUIDES["ENUM"], {"logit": jnp.array(0.3)}),
}


@pytest.mark.parametrize("name", list(SIZE_CASES))
def test_iwelbo_gradient_jaxpr_does_not_grow_with_particles(name):
    m, g, params = SIZE_CASES[name]
    key = jax.random.key(0)

    def size(k):
        obj = gv.iwelbo(m, g, particles=k)
        closed = jax.make_jaxpr(lambda p: obj.grad_estimate(key, p, Y))(params)
        return count_eqns(closed), len(str(closed))

    (e2, s2), (e256, s256) = size(2), size(256)
    assert e256 <= 1.5 * e2, (e2, e256)
    assert s256 <= 1.5 * s2, (s2, s256)


@pytest.mark.parametrize("name", list(SIZE_CASES))
def test_iwelbo_gradient_compile_time_does_not_grow_much(name):
    m, g, params = SIZE_CASES[name]
    key = jax.random.key(0)

    def compile_time(k):
        best = float("inf")
        for _ in range(2):
            obj = gv.iwelbo(m, g, particles=k)  # fresh: nothing cached
            fn = jax.jit(lambda p: obj.grad_estimate(key, p, Y))
            t = time.perf_counter()
            fn.lower(params).compile()
            best = min(best, time.perf_counter() - t)
        return best

    t2, t256 = compile_time(2), compile_time(256)
    assert t256 <= 3.0 * t2 + 0.5, (t2, t256)
