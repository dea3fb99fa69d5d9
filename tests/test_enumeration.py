"""`gv.enumeration()`: exact sums of discrete sites in models. Log densities against
numpy (logsumexp for mixtures, the forward algorithm for HMMs) to 1e-4; gradients
against finite differences and, through an objective, 2·10⁴ estimates against
quadrature within 5 standard errors; automatic guides; every refusal by name."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.special import logsumexp
from scipy.stats import norm

import genvi as gv

# -- a mixture: K = 3 components, 2-d points, a global regime flip ---------------------
W = np.array([0.2, 0.5, 0.3])
rng = np.random.default_rng(0)
Y = rng.normal(size=(7, 2)).astype(np.float32) * 2


@gv.gen
def point(mu, shift, y):
    z = gv.categorical(jnp.log(jnp.asarray(W))) @ "z"
    gv.observe(gv.normal(mu[z] + shift, 1.0), y)


def mixture_of(plate_size=None):
    body = gv.vmap(point, in_axes=(None, None, 0)) if plate_size is None else \
        gv.plate(point, size=plate_size, in_axes=(None, None, 0))

    @gv.gen
    def mixture(params, y):
        mu = gv.normal(jnp.zeros((3, 2)), 3.0) @ "mu"
        regime = gv.flip(0.25) @ "regime"
        body(mu, jnp.where(regime, 1.0, 0.0), y) @ "data"
    return mixture


def numpy_mixture(mu, y, scale=1.0):
    per_regime = []
    for regime, p in ((0, 0.75), (1, 0.25)):
        comp = np.stack([np.log(W[k]) + norm.logpdf(y, mu[k] + regime, 1.0).sum(-1)
                         for k in range(3)], 1)          # [N, K]
        per_regime.append(np.log(p) + scale * logsumexp(comp, axis=1).sum())
    return norm.logpdf(mu, 0, 3).sum() + logsumexp(per_regime)


MU = rng.normal(size=(3, 2)).astype(np.float32)


def test_mixture_log_density_is_the_exact_sum():
    m = gv.marginal(mixture_of(), keep=["mu"], algorithm=gv.enumeration())
    got = m.log_density(gv.choices({"mu": MU}), {}, jnp.asarray(Y))
    assert float(got) == pytest.approx(numpy_mixture(MU, Y), abs=1e-4)
    jitted = jax.jit(lambda mu: m.log_density(gv.choices({"mu": mu}), {}, jnp.asarray(Y)))
    assert float(jitted(MU)) == pytest.approx(numpy_mixture(MU, Y), abs=1e-4)


def test_subsampled_plate_scales_each_lane_marginal():
    m = gv.marginal(mixture_of(plate_size=70), keep=["mu"], algorithm=gv.enumeration())
    got = m.log_density(gv.choices({"mu": MU}), {}, jnp.asarray(Y))
    assert float(got) == pytest.approx(numpy_mixture(MU, Y, scale=10.0), abs=1e-3)


def test_gradient_of_the_exact_density_matches_finite_differences():
    m = gv.marginal(mixture_of(), keep=["mu"], algorithm=gv.enumeration())
    g = jax.grad(lambda mu: m.log_density(gv.choices({"mu": mu}), {}, jnp.asarray(Y)))(MU)
    eps = 1e-4
    fd = np.zeros_like(MU, dtype=np.float64)
    for idx in np.ndindex(MU.shape):
        d = np.zeros_like(MU, dtype=np.float64)
        d[idx] = eps
        fd[idx] = (numpy_mixture(MU + d, Y) - numpy_mixture(MU - d, Y)) / (2 * eps)
    assert np.allclose(np.asarray(g), fd, atol=2e-3)


# -- an HMM: 3 states, transitions set by a kept parameter ----------------------------
YS = np.array([0.3, 2.5, 1.9, -1.2, -0.4, 4.1], np.float32)
MEANS = np.array([-1.0, 1.5, 4.0])


def transition(stay):
    off = (1 - stay) / 2
    return off + (stay - off) * np.eye(3)


@gv.gen
def hmm_step(carry, y):
    z_prev, stay = carry
    trans = (1 - stay) / 2 + (stay - (1 - stay) / 2) * jnp.eye(3)
    z = gv.categorical(jnp.log(trans[z_prev])) @ "z"
    gv.observe(gv.normal(jnp.asarray(MEANS)[z], 1.0), y)
    return (z, stay), None


@gv.gen
def hmm(params, ys):
    logit = gv.normal(1.0, 1.0) @ "logit"
    gv.scan(hmm_step)((0, jax.nn.sigmoid(logit)), ys) @ "steps"


def numpy_forward(logit, ys):
    trans = transition(1 / (1 + np.exp(-logit)))
    alpha = np.log(trans[0]) + norm.logpdf(ys[0], MEANS, 1.0)
    for y in ys[1:]:
        alpha = logsumexp(alpha[:, None] + np.log(trans), axis=0) + norm.logpdf(y, MEANS, 1.0)
    return norm.logpdf(logit, 1.0, 1.0) + logsumexp(alpha)


def test_hmm_log_density_is_the_forward_algorithm():
    m = gv.marginal(hmm, keep=["logit"], algorithm=gv.enumeration())
    for logit in (-0.5, 0.7, 2.0):
        got = m.log_density(gv.choices({"logit": logit}), {}, jnp.asarray(YS))
        assert float(got) == pytest.approx(numpy_forward(logit, YS), abs=1e-4)
    g = jax.grad(lambda l: m.log_density(gv.choices({"logit": l}), {}, jnp.asarray(YS)))(0.7)
    fd = (numpy_forward(0.7 + 1e-4, YS) - numpy_forward(0.7 - 1e-4, YS)) / 2e-4
    assert float(g) == pytest.approx(fd, abs=1e-3)


def test_hmm_elbo_gradient_is_unbiased_against_quadrature():
    m = gv.marginal(hmm, keep=["logit"], algorithm=gv.enumeration())

    @gv.gen
    def guide(phi, ys):
        gv.normal(phi, 0.6, grad=gv.REPARAM) @ "logit"
    obj = gv.elbo(m, guide)
    nodes, weights = np.polynomial.hermite_e.hermegauss(60)

    def exact(phi):
        xs = phi + 0.6 * nodes
        vals = [numpy_forward(x, YS) - norm.logpdf(x, phi, 0.6) for x in xs]
        return float(np.dot(weights, vals) / math.sqrt(2 * math.pi))
    n = 20_000
    keys = jax.random.split(jax.random.key(0), n)
    v, g = jax.jit(jax.vmap(lambda k: obj.value_and_grad_estimate(k, 0.3, jnp.asarray(YS))))(keys)
    v, g = np.asarray(v, np.float64), np.asarray(g, np.float64)
    assert abs(v.mean() - exact(0.3)) <= 5 * v.std() / math.sqrt(n) + 1e-4
    fd = (exact(0.3 + 1e-3) - exact(0.3 - 1e-3)) / 2e-3
    assert abs(g.mean() - fd) <= 5 * g.std() / math.sqrt(n) + 1e-3


def test_a_marginal_guide_samples_with_its_exact_density():
    @gv.gen
    def joint(params):
        z = gv.flip(0.3, grad=gv.ENUM) @ "z"
        gv.normal(jnp.where(z, 2.0, -1.0), 1.0, grad=gv.REPARAM) @ "x"
    m = gv.marginal(joint, keep=["x"], algorithm=gv.enumeration())

    @gv.expectation
    def density_gap(params):
        kept, log_q = m.sim(params)
        x = kept["x"]
        exact = jnp.logaddexp(jnp.log(0.3) + jax.scipy.stats.norm.logpdf(x, 2.0, 1.0),
                              jnp.log(0.7) + jax.scipy.stats.norm.logpdf(x, -1.0, 1.0))
        return jnp.abs(log_q - exact)
    gaps = jax.vmap(lambda k: density_gap.estimate(k, {}))(jax.random.split(jax.random.key(0), 64))
    assert float(jnp.max(gaps)) < 1e-5


def test_automatic_guide_sees_the_kept_sites_and_recovers_the_mixture():
    r = np.random.default_rng(1)
    true_mu = np.array([-2.0, 0.5, 3.0])
    z = r.choice(3, size=300, p=[0.3, 0.3, 0.4])
    y = jnp.asarray(true_mu[z] + 0.5 * r.normal(size=300), jnp.float32)

    @gv.gen
    def one(mu, w, y):
        z = gv.categorical(jnp.log(w)) @ "z"
        gv.observe(gv.normal(mu[z], 0.5), y)

    @gv.gen
    def model(params, y):
        w = gv.dirichlet(jnp.ones(3)) @ "w"
        mu = gv.normal(jnp.array([-1.0, 0.0, 1.0]), 3.0) @ "mu"
        gv.vmap(one, in_axes=(None, None, 0))(mu, w, y) @ "data"
    with pytest.raises(ValueError, match="gv.enumeration"):
        gv.auto_normal(model).init(jax.random.key(0), {}, y)   # the discrete site: the fix
    m = gv.marginal(model, keep=["w", "mu"], algorithm=gv.enumeration())
    auto = gv.auto_normal(m)
    params = {"guide": auto.init(jax.random.key(0), {}, y)}
    res = gv.fit(gv.elbo(m, auto), params, y, optimizer=optax.adam(0.05), steps=1500,
                 key=jax.random.key(1), progress=False)
    mean = auto.mean(res.params)
    order = np.argsort(np.asarray(mean["mu"]))    # the components, whatever their labels
    assert np.allclose(np.asarray(mean["mu"])[order], true_mu, atol=0.15)
    assert np.allclose(np.asarray(mean["w"])[order], [0.3, 0.3, 0.4], atol=0.07)


# -- refusals ---------------------------------------------------------------------------
def refused(model, keep, *args, match):
    m = gv.marginal(model, keep=keep, algorithm=gv.enumeration())
    with pytest.raises(ValueError, match=match):
        m.log_density(gv.choices({"mu": 0.5}), *args)


def test_a_site_without_finite_support_is_refused():
    @gv.gen
    def model(y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        n = gv.poisson(3.0) @ "n"
        gv.observe(gv.normal(mu * n, 1.0), y)
    refused(model, ["mu"], 1.0, match=r"'n' \(gv.poisson\).*no finite support")


def test_coupled_lanes_are_refused():
    @gv.gen
    def model(y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        z = gv.flip(jnp.full(4, 0.5)) @ "z"
        gv.observe(gv.normal(mu * jnp.sum(z), 1.0), y)   # every lane through one sum
    refused(model, ["mu"], 1.0, match=r"cannot sum the discrete sites 'z'.*lanes")


def test_a_scan_whose_state_remembers_more_is_refused():
    @gv.gen
    def counting(count, y):
        z = gv.flip(0.5) @ "z"
        count = count + z                       # the count of all earlier values
        gv.observe(gv.normal(count, 1.0), y)
        return count, None

    @gv.gen
    def model(ys):
        gv.normal(0.0, 1.0) @ "mu"
        gv.scan(counting)(0.0, ys) @ "steps"
    refused(model, ["mu"], jnp.zeros(4), match="remembers more than the last steps' discrete values")


def test_scan_results_used_after_the_scan_are_refused():
    @gv.gen
    def step(prev, y):
        z = gv.flip(0.5) @ "z"
        gv.observe(gv.normal(jnp.where(z, 1.0, -1.0), 1.0), y)
        return z, None

    @gv.gen
    def model(ys):
        mu = gv.normal(0.0, 1.0) @ "mu"
        last, _ = gv.scan(step)(False, ys) @ "steps"
        gv.observe(gv.normal(jnp.where(last, mu, -mu), 1.0), 0.0)
    refused(model, ["mu"], jnp.zeros(4), match="used at")


def test_too_many_scalar_sites_and_no_site_and_vectors_are_refused():
    @gv.gen
    def many(y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        total = 0.0
        for i in range(17):
            total = total + (gv.flip(0.5) @ f"b{i}")
        gv.observe(gv.normal(mu + total, 1.0), y)
    refused(many, ["mu"], 1.0, match="131,072 joint values")

    @gv.gen
    def none(y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        gv.observe(gv.normal(mu, 1.0), y)
    refused(none, ["mu"], 1.0, match="no site outside keep")

    @gv.gen
    def counted(y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        a = gv.flip(jnp.full(3, 0.5)) @ "a"
        gv.observe(gv.normal(mu + jnp.sum(a), 1.0), y)   # the count of every lane
    refused(counted, ["mu"], 1.0, match=r"'a'.*lanes are summed at `reduce_sum`")


def test_an_enumerated_model_works_with_every_objective():
    m = gv.marginal(hmm, keep=["logit"], algorithm=gv.enumeration())

    @gv.gen
    def guide(phi, ys):
        gv.normal(phi, 0.6, grad=gv.REPARAM) @ "logit"
    ys = jnp.asarray(YS)
    for obj in (gv.elbo(m, guide), gv.iwelbo(m, guide, particles=4),
                gv.renyi(m, guide, 0.5, 4), gv.dreg(m, guide, 4)):
        value, grad = obj.value_and_grad_estimate(jax.random.key(0), 0.3, ys)
        assert np.isfinite(float(value)) and np.isfinite(float(grad))
