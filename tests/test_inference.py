"""gv.marginal and gv.normalize: density estimates unbiased in density space, exact
with the exact conditional as proposal, and unbiased gradients through them."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.stats import norm

import genvi as gv

N = 20000


def _within(samples, exact, floor=1e-6):
    samples = np.asarray(samples)
    se = samples.std() / np.sqrt(samples.size)
    assert abs(samples.mean() - exact) < 5 * se + floor, (samples.mean(), exact, se)


@gv.gen
def joint(p):
    u = gv.normal(p, 1.0, grad=gv.REPARAM) @ "u"
    gv.normal(u, 1.0, grad=gv.REPARAM) @ "x"


@gv.gen
def exact_reverse(kept, p):
    gv.normal((kept["x"] + p) / 2, jnp.sqrt(0.5), grad=gv.REPARAM) @ "u"


@gv.gen
def rough_reverse(kept, p):
    gv.normal(kept["x"], 1.0, grad=gv.REPARAM) @ "u"


ALGORITHMS = {"prior": gv.importance(particles=3),
              "proposal": gv.importance(rough_reverse, particles=4),
              "exact": gv.importance(exact_reverse, particles=3)}
KEYS = jax.random.split(jax.random.key(0), N)


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_marginal_density_unbiased_in_density_space(name):
    m = gv.marginal(joint, keep=["x"], algorithm=ALGORITHMS[name])
    est = jax.jit(jax.vmap(lambda k: m.estimate_log_density(k, gv.choices({"x": 0.7}), 0.2)))(KEYS)
    exact = float(norm.pdf(0.7, 0.2, np.sqrt(2.0)))
    _within(np.exp(est), exact)
    if name == "exact":
        assert np.std(np.exp(est)) < 1e-6


@pytest.mark.parametrize("name", list(ALGORITHMS))
def test_marginal_sim_reciprocal_unbiased(name):
    # E[1/ŵ | x] = 1/p(x), so E[p(x)/ŵ] = 1 under x ~ the marginal.
    m = gv.marginal(joint, keep=["x"], algorithm=ALGORITHMS[name])
    tr = jax.jit(jax.vmap(lambda k: m.simulate(k, 0.2)))(KEYS)
    ratio = np.exp(norm.logpdf(np.asarray(tr.choices["x"]), 0.2, np.sqrt(2.0)) - tr.log_density)
    _within(ratio, 1.0)
    assert set(tr.choices.paths()) == {("x",)}


def test_nested_marginal_as_proposal():
    # RAVI: the proposal for "u" is itself a marginal over an auxiliary "v".
    @gv.gen
    def reverse_joint(kept, p):
        v = gv.normal(kept["x"], 1.0, grad=gv.REPARAM) @ "v"
        gv.normal((v + p) / 2, 0.9, grad=gv.REPARAM) @ "u"

    inner = gv.marginal(reverse_joint, keep=["u"], algorithm=gv.importance(particles=2))
    m = gv.marginal(joint, keep=["x"], algorithm=gv.importance(inner, particles=3))
    est = jax.jit(jax.vmap(lambda k: m.estimate_log_density(k, gv.choices({"x": 0.7}), 0.2)))(KEYS)
    # log_density uses only fresh proposals: an unbiased estimate of p(x) needs an
    # unbiased estimate of 1/q, which the inner marginal's sim provides.
    _within(np.exp(est), float(norm.pdf(0.7, 0.2, np.sqrt(2.0))))


LOGITS = jnp.log(jnp.array([0.2, 0.5, 0.3]))


@gv.gen
def categorical_posterior(y):
    z = gv.categorical(LOGITS, grad=gv.ENUM) @ "z"
    gv.observe(gv.normal(z.astype(jnp.float32), 1.0), y)


def _sir_marginal(y, k):
    """The exact output distribution of SIR with k prior particles, by enumeration."""
    lik = np.exp(norm.logpdf(y, np.arange(3.0), 1.0))
    prior = np.array([0.2, 0.5, 0.3])
    q = np.zeros(3)
    for zs in itertools.product(range(3), repeat=k):
        w = lik[list(zs)]
        for j in range(k):
            q[zs[j]] += np.prod(prior[list(zs)]) * w[j] / w.sum()
    return q


@pytest.mark.parametrize("value", [0, 1, 2])
def test_normalize_density_unbiased_in_density_space(value):
    sir = gv.normalize(categorical_posterior, gv.importance(particles=3))
    est = jax.jit(jax.vmap(lambda k: sir.estimate_log_density(
        k, gv.choices({"z": jnp.int32(value)}), 1.7)))(KEYS)
    _within(np.exp(est), _sir_marginal(1.7, 3)[value])


def test_normalize_sim_reciprocal_unbiased():
    sir = gv.normalize(categorical_posterior, gv.importance(particles=3))
    tr = jax.jit(jax.vmap(lambda k: sir.simulate(k, 1.7)))(KEYS)
    z, inverse = np.asarray(tr.choices["z"]), np.exp(-np.asarray(tr.log_density))
    q = _sir_marginal(1.7, 3)
    for value in range(3):  # E[(1/ŵ) 1{z = a}] = q(a) · (1/q(a)) = 1
        _within(inverse * (z == value), 1.0)
    assert np.all(np.isin(z, [0, 1, 2])) and q.sum() == pytest.approx(1.0)


def test_normalize_exact_with_posterior_proposal():
    @gv.gen
    def gaussian_posterior(y):
        z = gv.normal(0.0, 1.0, grad=gv.REPARAM) @ "z"
        gv.observe(gv.normal(z, 1.0), y)

    @gv.gen
    def exact(y):
        gv.normal(y / 2, jnp.sqrt(0.5), grad=gv.REPARAM) @ "z"

    sir = gv.normalize(gaussian_posterior, gv.importance(exact, particles=4))
    keys = KEYS[:200]
    est = jax.vmap(lambda k: sir.estimate_log_density(k, gv.choices({"z": 0.3}), 1.0))(keys)
    np.testing.assert_allclose(est, norm.logpdf(0.3, 0.5, np.sqrt(0.5)), atol=1e-5)
    tr = jax.vmap(lambda k: sir.simulate(k, 1.0))(keys)
    np.testing.assert_allclose(tr.log_density, norm.logpdf(tr.choices["z"], 0.5, np.sqrt(0.5)),
                               atol=1e-4)


def test_marginal_outside_objective_is_a_clear_error():
    m = gv.marginal(joint, keep=["x"])
    with pytest.raises(RuntimeError, match="estimate_log_density"):
        m.log_density(gv.choices({"x": 0.1}), 0.0)
    with pytest.raises(TypeError, match="sub-program"):
        gv.gen(lambda: m(0.0) @ "m").simulate(jax.random.key(0))


def test_hvi_gradient_unbiased():
    # Model x ~ N(0, 1), y ~ N(x, 1); hierarchical guide u ~ N(p, 1), x ~ N(u, 1) with
    # the exact reverse conditional for u: HVI equals the ELBO of the marginal guide
    # N(p, 2), whose gradient is closed-form.
    @gv.gen
    def model(p, y):
        x = gv.normal(0.0, 1.0) @ "x"
        gv.observe(gv.normal(x, 1.0), y)

    @gv.gen
    def guide_joint(p, y):
        return joint.body(p)

    @gv.gen
    def reverse(kept, p, y):
        return exact_reverse.body(kept, p)

    guide = gv.marginal(guide_joint, keep=["x"], algorithm=gv.importance(reverse, particles=1))
    hvi = gv.elbo(model, guide)
    y, p = 0.8, 0.3
    # ELBO(p) = -(p² + 2)/2 - ((y - p)² + 2)/2 + terms without p
    exact = jax.grad(lambda p: -(p ** 2 + 2) / 2 - ((y - p) ** 2 + 2) / 2)(p)
    g = jax.jit(jax.vmap(lambda k: hvi.grad_estimate(k, p, y)))(KEYS)
    _within(g, float(exact), floor=1e-4)
