"""`gv.enumeration()` as one sum-product engine over plates: plates of different sizes
side by side with a shared global site, nested plates with discrete sites at both
levels, a one-lane plate, a site observed in another `gv.vmap` than its own, a
binomial site, a long run of global sites summed by variable elimination, and the
refusal of plates that cross. Every log density against numpy brute force over the
joint values (float64), gradients against float64 central differences."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.special import gammaln, logsumexp
from scipy.stats import norm

import genvi as gv

LOGW = np.log(np.array([0.3, 0.7]))


def lognorm(y, m, s=1.0):
    return norm.logpdf(y, m, s)


# -- two plates of different sizes, a global discrete site shared by both -------------
@gv.gen
def lane_a(mu, g, y):
    a = gv.flip(0.4) @ "a"
    gv.observe(gv.normal(jnp.where(a, mu, -mu) + g, 1.0), y)


@gv.gen
def lane_b(mu, g, y):
    b = gv.categorical(jnp.log(jnp.array([0.2, 0.3, 0.5]))) @ "b"
    gv.observe(gv.normal(mu * b - g, 1.0), y)


@gv.gen
def side_by_side(ya, yb):
    mu = gv.normal(0.0, 2.0) @ "mu"
    g = gv.flip(0.25) @ "g"
    gf = jnp.where(g, 1.0, 0.0)
    gv.vmap(lane_a, in_axes=(None, None, 0))(mu, gf, ya) @ "A"
    gv.vmap(lane_b, in_axes=(None, None, 0))(mu, gf, yb) @ "B"


YA = np.array([0.5, -1.2], np.float32)
YB = np.array([1.5, 0.2, 2.5], np.float32)


def numpy_side_by_side(mu, ya=YA, yb=YB):
    wb = np.log([0.2, 0.3, 0.5])
    total = []
    for g in (0, 1):
        lp = np.log(0.25 if g else 0.75)
        for a in itertools.product((0, 1), repeat=len(ya)):
            for b in itertools.product(range(3), repeat=len(yb)):
                t = lp
                for ai, yi in zip(a, ya):
                    t += np.log(0.4 if ai else 0.6) + lognorm(yi, (mu if ai else -mu) + g)
                for bi, yi in zip(b, yb):
                    t += wb[bi] + lognorm(yi, mu * bi - g)
                total.append(t)
    return lognorm(mu, 0.0, 2.0) + logsumexp(total)


def summed(model, keep):
    return gv.marginal(model, keep=keep, algorithm=gv.enumeration())


def test_plates_of_different_sizes_share_a_global_site():
    m = summed(side_by_side, ["mu"])
    for mu in (0.7, -1.3):
        got = m.log_density(gv.choices({"mu": mu}), jnp.asarray(YA), jnp.asarray(YB))
        assert float(got) == pytest.approx(numpy_side_by_side(mu), abs=1e-4)


def test_the_gradient_through_two_plates_matches_central_differences():
    m = summed(side_by_side, ["mu"])
    g = jax.grad(lambda mu: m.log_density(gv.choices({"mu": mu}), jnp.asarray(YA),
                                          jnp.asarray(YB)))(0.7)
    eps = 1e-5
    fd = (numpy_side_by_side(0.7 + eps) - numpy_side_by_side(0.7 - eps)) / (2 * eps)
    assert float(g) == pytest.approx(fd, abs=2e-3)


# -- nested plates: a group's discrete class, each member's discrete state -------------
TRANS = np.log(np.array([[0.6, 0.3, 0.1], [0.1, 0.3, 0.6]]))


@gv.gen
def member(mu, a, y):
    c = gv.categorical(jnp.asarray(TRANS, jnp.float32)[a]) @ "c"
    gv.observe(gv.normal(mu[c], 1.0), y)


@gv.gen
def group(mu, y):
    a = gv.flip(0.5) @ "a"
    gv.vmap(member, in_axes=(None, None, 0))(mu, a.astype(jnp.int32), y) @ "members"


def nested_of(plate_size=None):
    outer = gv.vmap(group, in_axes=(None, 0)) if plate_size is None else \
        gv.plate(group, size=plate_size, in_axes=(None, 0))

    @gv.gen
    def nested(y):
        mu = gv.normal(jnp.zeros(3), 2.0) @ "mu"
        outer(mu, y) @ "groups"
    return nested


YN = np.random.default_rng(3).normal(size=(2, 3)).astype(np.float32) * 2


def numpy_nested(mu, y=YN, scale=1.0):
    total = 0.0
    for yg in y:                   # groups are independent given mu
        per_a = []
        for a in (0, 1):
            lanes = [logsumexp([TRANS[a, c] + lognorm(yi, mu[c]) for c in range(3)])
                     for yi in yg]
            per_a.append(np.log(0.5) + sum(lanes))
        total += scale * logsumexp(per_a)
    return norm.logpdf(mu, 0.0, 2.0).sum() + total


MU3 = np.array([-1.5, 0.2, 1.8], np.float32)


def test_nested_plates_with_sites_at_both_levels():
    m = summed(nested_of(), ["mu"])
    got = m.log_density(gv.choices({"mu": MU3}), jnp.asarray(YN))
    assert float(got) == pytest.approx(numpy_nested(MU3.astype(np.float64)), abs=1e-4)
    # the brute force over every joint value agrees with the per-group numpy sum
    brute = []
    for a in itertools.product((0, 1), repeat=2):
        for c in itertools.product(range(3), repeat=6):
            c = np.reshape(c, (2, 3))
            brute.append(sum(np.log(0.5) + sum(TRANS[a[g], c[g, j]] + lognorm(YN[g, j],
                                                                             MU3[c[g, j]])
                                               for j in range(3)) for g in range(2)))
    exact = norm.logpdf(MU3, 0.0, 2.0).sum() + logsumexp(brute)
    assert float(got) == pytest.approx(exact, abs=1e-4)


def test_a_subsampled_outer_plate_scales_each_group_marginal():
    m = summed(nested_of(plate_size=10), ["mu"])
    got = m.log_density(gv.choices({"mu": MU3}), jnp.asarray(YN))
    assert float(got) == pytest.approx(numpy_nested(MU3.astype(np.float64), scale=5.0),
                                       abs=1e-3)


def test_the_gradient_through_nested_plates_matches_central_differences():
    m = summed(nested_of(), ["mu"])
    g = jax.grad(lambda mu: m.log_density(gv.choices({"mu": mu}), jnp.asarray(YN)))(
        jnp.asarray(MU3))
    eps = 1e-5
    mu64 = MU3.astype(np.float64)
    fd = [(numpy_nested(mu64 + eps * np.eye(3)[i]) - numpy_nested(mu64 - eps * np.eye(3)[i]))
          / (2 * eps) for i in range(3)]
    assert np.allclose(np.asarray(g), fd, atol=2e-3)


def test_the_plan_names_sites_plates_and_the_largest_intermediate():
    m = summed(nested_of(), ["mu"])
    m.log_density(gv.choices({"mu": MU3}), jnp.asarray(YN))
    (plan,) = m.plans.values()
    text = str(plan)
    assert "sum out 'groups/members/c' per lane of" in text
    assert "sum out 'groups/a' per lane of" in text
    assert text.index("groups/members/c") < text.index("sum out 'groups/a'")
    assert plan.largest == 2 * 3 * 2 * 3


# -- a one-lane plate, a site observed in another vmap, a binomial site ---------------
def test_a_plate_of_one_lane_is_a_plate():
    @gv.gen
    def one(mu, y):
        z = gv.categorical(jnp.log(jnp.array([0.2, 0.8]))) @ "z"
        gv.observe(gv.normal(mu[z], 1.0), y)

    @gv.gen
    def model(y):
        mu = gv.normal(jnp.zeros(2), 1.0) @ "mu"
        gv.vmap(one, in_axes=(None, 0))(mu, y) @ "data"
    mu = np.array([-1.0, 1.0])
    got = summed(model, ["mu"]).log_density(gv.choices({"mu": mu}), jnp.array([0.3]))
    exact = norm.logpdf(mu, 0, 1).sum() + logsumexp(
        [np.log(0.2) + lognorm(0.3, -1.0), np.log(0.8) + lognorm(0.3, 1.0)])
    assert float(got) == pytest.approx(exact, abs=1e-5)


def test_a_site_observed_in_another_vmap_is_in_its_plate():
    @gv.gen
    def prior(i):
        return gv.flip(0.3) @ "z"

    @gv.gen
    def likelihood(mu, z, y):
        gv.observe(gv.normal(jnp.where(z, mu, -mu), 1.0), y)

    @gv.gen
    def model(y):
        mu = gv.normal(0.0, 2.0) @ "mu"
        z = gv.vmap(prior)(jnp.arange(y.shape[0])) @ "prior"
        gv.vmap(likelihood, in_axes=(None, 0, 0))(mu, z, y) @ "lik"
    y = np.array([0.4, -1.1, 2.0], np.float32)
    got = summed(model, ["mu"]).log_density(gv.choices({"mu": 0.9}), jnp.asarray(y))
    exact = lognorm(0.9, 0, 2) + sum(
        logsumexp([np.log(0.3) + lognorm(yi, 0.9), np.log(0.7) + lognorm(yi, -0.9)]) for yi in y)
    assert float(got) == pytest.approx(exact, abs=1e-4)


def test_a_long_run_of_global_sites_is_summed_by_variable_elimination():
    # 24 binary sites, each depending on the one before: 2^24 joint values, summed in
    # pairs (the largest intermediate has 4 entries)
    n = 24

    @gv.gen
    def chain(y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        prev = gv.flip(0.5) @ "x0"
        for i in range(1, n):
            prev = gv.flip(jnp.where(prev, 0.9, 0.2)) @ f"x{i}"
            gv.observe(gv.normal(jnp.where(prev, mu, -mu), 1.0), y[i])
    y = np.random.default_rng(5).normal(size=n).astype(np.float32)
    m = summed(chain, ["mu"])
    got = m.log_density(gv.choices({"mu": 0.6}), jnp.asarray(y))
    trans = np.log(np.array([[0.8, 0.2], [0.1, 0.9]]))
    alpha = np.log([0.5, 0.5])
    for i in range(1, n):
        emit = np.array([lognorm(y[i], -0.6), lognorm(y[i], 0.6)])
        alpha = logsumexp(alpha[:, None] + trans, axis=0) + emit
    assert float(got) == pytest.approx(lognorm(0.6, 0, 1) + logsumexp(alpha), abs=1e-3)
    assert max(m.plans.values(), key=id).largest <= 8


def test_plates_that_cross_are_refused_by_name():
    @gv.gen
    def model(y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        a = gv.flip(jnp.full(2, 0.5)) @ "rows"
        b = gv.flip(jnp.full(3, 0.5)) @ "cols"
        mean = mu * (a[:, None].astype(jnp.float32) + b[None, :].astype(jnp.float32))
        gv.observe(gv.normal(mean, 1.0), y)      # a grid: each cell reads a row and a column
    m = summed(model, ["mu"])
    with pytest.raises(ValueError, match=r"sites of different plates \('(rows|cols)', '(rows|cols)'\)"):
        m.log_density(gv.choices({"mu": 0.5}), jnp.zeros((2, 3)))


def test_a_binomial_site_is_summed_over_0_to_n():
    @gv.gen
    def trial(mu, y):
        k = gv.binomial(4, 0.35) @ "k"
        gv.observe(gv.normal(mu * k, 1.0), y)

    @gv.gen
    def model(y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        gv.vmap(trial, in_axes=(None, 0))(mu, y) @ "data"
    y = np.array([0.5, 2.2, -0.3], np.float32)
    got = summed(model, ["mu"]).log_density(gv.choices({"mu": 0.8}), jnp.asarray(y))
    ks = np.arange(5)
    log_binom = (gammaln(5) - gammaln(ks + 1) - gammaln(5 - ks) + ks * np.log(0.35)
                 + (4 - ks) * np.log(0.65))
    exact = lognorm(0.8, 0, 1) + sum(logsumexp(log_binom + lognorm(yi, 0.8 * ks)) for yi in y)
    assert float(got) == pytest.approx(exact, abs=1e-4)


def test_a_binomial_whose_n_is_traced_is_refused_by_name():
    @gv.gen
    def model(n, y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        k = gv.binomial(n, 0.5) @ "k"
        gv.observe(gv.normal(mu * k, 1.0), y)
    m = summed(model, ["mu"])
    with pytest.raises(ValueError, match=r"site 'k' \(gv.binomial\).*no static finite support"
                                         r".*n is static"):
        m.log_density(gv.choices({"mu": 0.5}), jnp.asarray(3), 1.0)


def test_a_summed_value_that_sets_a_shape_is_refused_by_name():
    @gv.gen
    def model(y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        n = gv.categorical(jnp.zeros(3)) @ "n"
        gv.observe(gv.normal(mu, 1.0), y[: n + 1])
    m = summed(model, ["mu"])
    with pytest.raises(TypeError, match=r"uses the latent 'n' as a Python value: it sets a "
                                        r"shape.*y\[: n \+ 1\]"):
        m.log_density(gv.choices({"mu": 0.5}), jnp.zeros(3))


def test_explain_prints_the_contraction():
    m = summed(nested_of(), ["mu"])

    @gv.gen
    def guide(params, y):
        gv.normal(params["loc"], 0.5, grad=gv.REPARAM) @ "mu"
    report = str(gv.elbo(m, guide).explain({"loc": jnp.zeros(3)}, jnp.asarray(YN)))
    assert "exact sum of marginal(nested, enumeration)'s discrete sites" in report
    assert "sum out 'groups/members/c' per lane of {groups/a:2, groups/members/c[1]:3}" in report
    assert "largest intermediate: 36 entries" in report


def test_a_fit_recovers_the_means_of_a_nested_plate_mixture():
    from genvi_experiments.bench.enumeration.plates import MEANS, data, nested
    y = data(60, 10, seed=1)
    m = summed(nested, ["mu"])
    auto = gv.auto_normal(m)
    params = {"guide": auto.init(jax.random.key(0), {}, y)}
    res = gv.fit(gv.elbo(m, auto), params, y, optimizer=optax.adam(0.05), steps=800,
                 key=jax.random.key(1), progress=False)
    fitted = np.sort(np.asarray(auto.mean(res.params)["mu"]))
    assert np.allclose(fitted, MEANS, atol=0.15), fitted


def test_a_tfp_categorical_declares_its_finite_support():
    from tensorflow_probability.substrates import jax as tfp
    tfp_categorical = gv.from_tfp(tfp.distributions.Categorical)

    @gv.gen
    def point(mu, y):
        z = tfp_categorical(logits=jnp.log(jnp.array([0.2, 0.3, 0.5]))) @ "z"
        gv.observe(gv.normal(mu[z], 1.0), y)

    @gv.gen
    def model(y):
        mu = gv.normal(jnp.zeros(3), 2.0) @ "mu"
        gv.vmap(point, in_axes=(None, 0))(mu, y) @ "data"
    mu = np.array([-1.0, 0.5, 2.0])
    y = np.array([0.1, 1.9, -1.4], np.float32)
    got = summed(model, ["mu"]).log_density(gv.choices({"mu": mu}), jnp.asarray(y))
    exact = norm.logpdf(mu, 0, 2).sum() + sum(
        logsumexp(np.log([0.2, 0.3, 0.5]) + lognorm(yi, mu)) for yi in y)
    assert float(got) == pytest.approx(exact, abs=1e-4)


# -- sums by einsum, and where an einsum would lose digits --------------------------
FAR = np.array([0.0, -100.0])   # the prior's log weights: the second class at e^-100
YFAR = np.array([20.0, 19.5, 0.3], np.float32)


@gv.gen
def far_point(mu, y):
    c = gv.categorical(jnp.asarray(FAR, jnp.float32)) @ "c"
    gv.observe(gv.normal(mu[c], 1.0), y)


@gv.gen
def far_mixture(y):
    mu = gv.normal(jnp.zeros(2), 30.0) @ "mu"
    gv.vmap(far_point, in_axes=(None, 0))(mu, y) @ "points"


def numpy_far(mu):
    prior = norm.logpdf(mu, 0.0, 30.0).sum()
    log_w = FAR - logsumexp(FAR)
    return prior + logsumexp(log_w[:, None] + lognorm(YFAR[None].astype(np.float64),
                                                      mu[:, None]), axis=0).sum()


def test_a_sum_whose_einsum_underflows_is_taken_from_the_join():
    """The first two points lie 20 sd from the likelier class and at the e^-100 one: a
    shifted einsum's product of e^-100 and e^-200 is 0 in float32. Those entries come
    from the logsumexp of the join, and the value and gradient equal numpy's."""
    m = summed(far_mixture, ["mu"])
    mu = np.array([0.0, 20.0], np.float32)

    def log_p(mu):
        return m.log_density(gv.choices({"mu": mu}), jnp.asarray(YFAR))
    value, grad = jax.jit(jax.value_and_grad(log_p))(jnp.asarray(mu))
    want = numpy_far(mu.astype(np.float64))
    eps = 1e-4
    fd = [(numpy_far(mu + eps * e) - numpy_far(mu - eps * e)) / (2 * eps) for e in np.eye(2)]
    assert float(value) == pytest.approx(want, rel=1e-5)
    assert np.allclose(np.asarray(grad), fd, rtol=1e-4, atol=1e-3)
    # particles under vmap take the exact sums together: the same value in each
    values = jax.jit(jax.vmap(log_p))(jnp.stack([jnp.asarray(mu), jnp.asarray([0.5, 1.0])]))
    assert float(values[0]) == pytest.approx(want, rel=1e-5)
    assert float(values[1]) == pytest.approx(numpy_far(np.array([0.5, 1.0])), rel=1e-5)


def test_an_elbo_through_the_einsum_and_its_guard_is_unbiased():
    """The gradient of an ELBO whose model sums a mixture by einsum (both branches of
    the guard are reached: the first with the near point at the likely class, the
    second 20 sd away): its mean over draws equals the derivative of the exact ELBO."""
    m = summed(far_mixture, ["mu"])

    @gv.gen
    def guide(params, y):
        gv.normal(params["loc"], 0.5, grad=gv.REPARAM) @ "mu"
    objective = gv.elbo(m, guide)
    params = {"loc": jnp.asarray([0.5, 19.0])}
    g = jax.jit(jax.vmap(lambda k: objective.grad_estimate(k, params, jnp.asarray(YFAR))))(
        jax.random.split(jax.random.key(0), 2000))["loc"]
    g = np.asarray(g, np.float64)
    x, w = np.polynomial.hermite_e.hermegauss(30)
    w = w / w.sum()

    def exact(loc):  # E_q[log p(y, mu)] + entropy (constant in loc), by quadrature
        grid = np.stack(np.meshgrid(loc[0] + 0.5 * x, loc[1] + 0.5 * x, indexing="ij"), -1)
        vals = np.array([[numpy_far(v) for v in row] for row in grid])
        return float(np.sum(np.outer(w, w) * vals))
    loc = np.array([0.5, 19.0])
    eps = 1e-3
    want = [(exact(loc + eps * e) - exact(loc - eps * e)) / (2 * eps) for e in np.eye(2)]
    se = g.std(0) / np.sqrt(len(g))
    assert np.all(np.abs(g.mean(0) - want) <= 5 * se + 1e-4), (g.mean(0), want, se)
