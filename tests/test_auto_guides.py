"""Automatic guides (gv.auto_normal / auto_mvn / auto_low_rank / auto_delta /
auto_flow) and constrained parameters.

* The coin model (Beta(10, 10) prior, 6 heads and 4 tails; posterior Beta(16, 14)):
  every auto guide fitted with gv.fit + gv.elbo has posterior mean 16/30 within 0.01,
  except auto_delta, whose point is the MAP 15/28 (the mode of the posterior density
  in the constrained space: a point mass has log density 0, so its ELBO is
  log p(z*, x), with no Jacobian).
* A conjugate Gaussian model with two correlated sites: auto_mvn recovers the exact
  posterior mean and covariance (the chain rule across sites).
* The guide's log density at constrained values is the analytic transformed density
  (gamma, beta, dirichlet, uniform sites; normal, mvn and flow families), and samples
  lie inside the supports.
* Discrete sites are refused with a message naming the address, the distribution and
  the fix; `inline` combines an auto guide with a hand-written discrete site.
* Summaries; constrained parameters train under gv.fit.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.scipy.stats import multivariate_normal

import genvi as gv
from tests.estimates import estimates, within

HEADS = jnp.array([True] * 6 + [False] * 4)


@gv.gen
def coin(params, y):
    p = gv.beta(10.0, 10.0) @ "p"
    gv.observe(gv.flip(jnp.broadcast_to(p, y.shape)), y)


def fit(auto, model, data, steps=1500, lr=0.05, seed=0, particles=8):
    """Fit with gv.fit on the mean of `particles` independent ELBO estimates (the same
    data in every lane of a gv.batch_mean: the same objective, less gradient noise)."""
    params = {"guide": auto.init(jax.random.key(seed), {}, data)}
    opt = optax.adam(optax.cosine_decay_schedule(lr, steps, alpha=0.01))
    objective = gv.batch_mean(gv.elbo(model, auto), in_axes=(None, 0))
    lanes = jnp.broadcast_to(data, (particles,) + data.shape)
    result = gv.fit(objective, params, lanes, optimizer=opt, steps=steps,
                    key=jax.random.key(seed + 1), progress=False)
    return result.params


COIN_GUIDES = {
    "auto_normal": lambda m: gv.auto_normal(m),
    "auto_mvn": lambda m: gv.auto_mvn(m),
    "auto_low_rank": lambda m: gv.auto_low_rank(m, rank=1),
    "auto_flow": lambda m: gv.auto_flow(m, hidden=(8,)),
    "auto_flow, 3 layers": lambda m: gv.auto_flow(m, hidden=(8,), num_layers=3),
}


@pytest.mark.parametrize("name", sorted(COIN_GUIDES))
def test_coin_posterior_mean(name):
    auto = COIN_GUIDES[name](coin)
    params = fit(auto, coin, HEADS)
    mean = float(auto.mean(params, num_samples=40_000)["p"])
    print(f"\n{name}: posterior mean {mean:.4f} (exact {16 / 30:.4f})")
    assert abs(mean - 16 / 30) < 0.01, (name, mean)
    draws = auto.sample(jax.random.key(3), params, 5000)["p"]
    assert draws.shape == (5000,) and bool(jnp.all((draws > 0) & (draws < 1)))
    assert abs(float(jnp.std(draws)) - math.sqrt(16 * 14 / (30**2 * 31))) < 0.01


def test_coin_auto_delta_is_the_map():
    auto = gv.auto_delta(coin)
    params = fit(auto, coin, HEADS, steps=600)
    point = float(auto.median(params)["p"])
    print(f"\nauto_delta: point {point:.4f} (MAP {15 / 28:.4f})")
    assert abs(point - 15 / 28) < 0.01, point          # the MAP, not the mean 16/30
    assert float(auto.mean(params, num_samples=10)["p"]) == pytest.approx(point)
    q = auto.quantiles(params, [0.1, 0.9])["p"]
    np.testing.assert_allclose(q, [point, point])
    # its ELBO is exactly the log joint at the point (log q = 0)
    value = gv.elbo(coin, auto).estimate(jax.random.key(0), params, HEADS)
    log_joint = coin.log_density(gv.choices({"p": point}), params, HEADS)
    assert float(value) == pytest.approx(float(log_joint), abs=1e-4)


# -- conjugate Gaussian model with two correlated sites --------------------------------

Y_OBS = jnp.array([1.5, -0.5])
A = np.array([[1.0, 1.0], [1.0, 0.0]])
NOISE = np.array([0.5, 1.0])


@gv.gen
def linear(params, y):
    a = gv.normal(0.0, 1.0) @ "a"
    b = gv.normal(0.0, 1.0) @ "b"
    gv.observe(gv.normal(a + b, NOISE[0]), y[0])
    gv.observe(gv.normal(a, NOISE[1]), y[1])


def exact_linear_posterior():
    prec = np.eye(2) + A.T @ np.diag(NOISE**-2) @ A
    cov = np.linalg.inv(prec)
    return cov @ A.T @ np.diag(NOISE**-2) @ np.asarray(Y_OBS), cov


def test_auto_mvn_recovers_conjugate_posterior():
    auto = gv.auto_mvn(linear)
    params = fit(auto, linear, Y_OBS, steps=1500)
    mean, cov = exact_linear_posterior()
    loc, chol = auto.loc_scale_tril(params["guide"])
    np.testing.assert_allclose(loc, mean, atol=0.03)
    np.testing.assert_allclose(chol @ chol.T, cov, atol=0.03)
    assert cov[0, 1] < -0.1                        # the correlation is really there
    med = auto.median(params)
    np.testing.assert_allclose([med["a"], med["b"]], mean, atol=0.03)


# -- supports: samples inside, exact transformed densities -----------------------------

@gv.gen
def constrained(params):
    gv.normal(0.0, 1.0) @ "x"
    gv.gamma(2.0, 1.0) @ "g"
    gv.beta(2.0, 3.0) @ "b"
    gv.dirichlet(jnp.ones(3)) @ "d"
    gv.uniform(1.0, 3.0) @ "u"


def log_abs_det(f, z):
    return jnp.linalg.slogdet(jax.jacfwd(f)(z))[1]


def analytic_transformed(z, log_q_z):
    """log q of the constrained values: the base density at the unconstrained vector
    z = (x, log g, logit b, d (2 numbers), logit((u − 1) / 2)) minus log |J|."""
    x, lg, lb, d, lu = z[0], z[1], z[2], z[3:5], z[5]
    log_j = lg                                                     # exp
    log_j += jax.nn.log_sigmoid(lb) + jax.nn.log_sigmoid(-lb)      # sigmoid
    simplex = gv.Constrained(d, "simplex").bijector
    log_j += log_abs_det(lambda v: simplex.forward(v)[:2], d)      # first K-1 coords
    log_j += math.log(2.0) + jax.nn.log_sigmoid(lu) + jax.nn.log_sigmoid(-lu)
    values = {"x": x, "g": jnp.exp(lg), "b": jax.nn.sigmoid(lb), "d": simplex.forward(d),
              "u": 1.0 + 2.0 * jax.nn.sigmoid(lu)}
    return values, log_q_z - log_j


@pytest.mark.parametrize("family", ["auto_normal", "auto_mvn", "auto_low_rank"])
def test_transformed_density_is_exact(family):
    make = {"auto_normal": gv.auto_normal, "auto_mvn": gv.auto_mvn,
            "auto_low_rank": lambda m: gv.auto_low_rank(m, 2)}[family]
    auto = make(constrained)
    params = {"guide": auto.init(jax.random.key(0), {})}
    # perturb every leaf so that the check is not at a special point
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree_util.tree_unflatten(
        tree, [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    if family == "auto_mvn":   # a well-conditioned factor with cross-site terms
        tril = jnp.tril(jax.random.normal(jax.random.key(3), (6, 6)), -1)
        params["guide"]["scale_tril"] = gv.lower_cholesky(0.7 * jnp.eye(6) + 0.2 * tril)
    z = jax.random.normal(jax.random.key(2), (6,))

    @jax.jit
    def check(params):
        loc, chol = auto.loc_scale_tril(params["guide"])
        values, expected = analytic_transformed(
            z, multivariate_normal.logpdf(z, loc, chol @ chol.T))
        return auto.log_density(gv.choices(values), params), expected
    got, expected = check(params)
    assert float(got) == pytest.approx(float(expected), abs=2e-3)
    draws = auto.sample(jax.random.key(4), params, 2000)
    assert bool(jnp.all(draws["g"] > 0))
    assert bool(jnp.all((draws["b"] > 0) & (draws["b"] < 1)))
    assert bool(jnp.all((draws["u"] > 1) & (draws["u"] < 3)))
    assert bool(jnp.all(draws["d"] > 0))
    np.testing.assert_allclose(draws["d"].sum(-1), 1.0, atol=1e-5)
    # the guide's own log density of its draws is finite; simulate agrees with log_density
    tr = jax.jit(auto.simulate)(jax.random.key(5), params)
    assert float(tr.log_density) == pytest.approx(
        float(jax.jit(auto.log_density)(tr.choices, params)), abs=1e-4)


def test_flow_density_is_exact():
    """auto_flow's per-site conditionals multiply to the IAF density:
    log N(ε) − log |det ∂z/∂ε| at z = IAF(ε), mapped through the supports."""
    auto = gv.auto_flow(constrained, hidden=(8,))
    params = {"guide": auto.init(jax.random.key(0), {})}
    leaves, tree = jax.tree_util.tree_flatten(params)
    keys = jax.random.split(jax.random.key(1), len(leaves))
    params = jax.tree_util.tree_unflatten(
        tree, [x + 0.3 * jax.random.normal(k, x.shape) for x, k in zip(leaves, keys)])
    net, variables = auto._made(), params["guide"]["made"]

    def iaf(eps):
        mu, s = net.apply(variables, eps)
        return mu + jax.nn.softplus(s) * eps

    @jax.jit
    def check(params, eps):
        z = iaf(eps)
        log_q_z = jnp.sum(jax.scipy.stats.norm.logpdf(eps)) - log_abs_det(iaf, eps)
        values, expected = analytic_transformed(z, log_q_z)
        return auto.log_density(gv.choices(values), params), expected
    got, expected = check(params, jax.random.normal(jax.random.key(2), (6,)))
    assert float(got) == pytest.approx(float(expected), abs=2e-3)
    tr = jax.jit(auto.simulate)(jax.random.key(5), params)
    assert float(tr.log_density) == pytest.approx(
        float(jax.jit(auto.log_density)(tr.choices, params)), abs=1e-3)


def test_elbo_gradients_flow_through_constrained_sites():
    auto = gv.auto_normal(constrained)
    params = {"guide": auto.init(jax.random.key(0), {})}
    grads = gv.elbo(constrained, auto).grad_estimate(jax.random.key(1), params)
    flat = jax.tree_util.tree_leaves(grads)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in flat)
    assert any(float(jnp.abs(g).sum()) > 0 for g in flat)


# -- discrete sites, combination, misuse ------------------------------------------------

@gv.gen
def mixture(params, y):
    mu = gv.normal(0.0, 3.0) @ "mu"
    c = gv.flip(0.5) @ "c"
    gv.observe(gv.normal(jnp.where(c, mu, -mu), 1.0), y)


def test_discrete_site_is_refused_with_the_fix():
    with pytest.raises(ValueError) as err:
        gv.auto_normal(mixture).init(jax.random.key(0), {}, 1.0)
    msg = str(err.value)
    assert "'c'" in msg and "gv.flip" in msg and "exclude=['c']" in msg
    assert "inline" in msg and "grad=gv.ENUM" in msg


def test_inline_combines_with_a_hand_written_discrete_site():
    auto = gv.auto_normal(mixture, exclude=["c"])
    params = {"guide": auto.init(jax.random.key(0), {}, 1.0), "logit": jnp.array(0.0)}

    @gv.gen
    def guide(params, y):
        auto.inline(params, y)
        gv.flip(jax.nn.sigmoid(params["logit"]), grad=gv.ENUM) @ "c"

    result = gv.fit(gv.elbo(mixture, guide), params, 2.0, optimizer=optax.adam(0.05),
                    steps=300, key=jax.random.key(1), progress=False)
    assert abs(float(auto.median(result.params)["mu"])) > 1.0     # |mu| moves towards 2
    assert sorted(guide.simulate(jax.random.key(2), result.params, 2.0).choices.flat()) == [
        ("c",), ("mu",)]


def test_misuse_messages():
    auto = gv.auto_normal(coin)
    with pytest.raises(RuntimeError, match=r"call \.init\(key, \*args\)"):
        auto.simulate(jax.random.key(0), {"guide": {}}, HEADS)
    params = auto.init(jax.random.key(0), {}, HEADS)
    with pytest.raises(TypeError, match="'guide' entry"):
        auto.simulate(jax.random.key(0), params, HEADS)
    with pytest.raises(KeyError, match="names no site"):
        gv.auto_normal(coin, exclude=["q"]).init(jax.random.key(0), {}, HEADS)


# -- summaries ---------------------------------------------------------------------------

@gv.gen
def rate_model(params, y):
    r = gv.gamma(3.0, 2.0) @ "r"
    gv.observe(gv.poisson(jnp.broadcast_to(r, y.shape)), y)


def test_summaries_match_samples():
    auto = gv.auto_normal(rate_model)
    y = jnp.array([1, 2, 0, 3])
    params = {"guide": {"loc": {"r": jnp.array(0.2)}, "scale": {"r": gv.positive(0.4)}}}
    auto.init(jax.random.key(0), {}, y)                       # discovers the sites
    med = float(auto.median(params)["r"])
    assert med == pytest.approx(math.exp(0.2), rel=1e-5)      # lognormal median
    q = auto.quantiles(params, [0.1, 0.5, 0.9])["r"]
    np.testing.assert_allclose(q, np.exp(0.2 + 0.4 * np.array([-1.2815516, 0.0, 1.2815516])),
                               rtol=1e-4)
    draws = auto.sample(jax.random.key(1), params, 20_000)["r"]
    np.testing.assert_allclose(np.quantile(draws, [0.1, 0.5, 0.9]), q, rtol=0.03)
    assert float(auto.mean(params)["r"]) == pytest.approx(math.exp(0.2 + 0.08), rel=0.02)


# -- constrained parameters -------------------------------------------------------------

def test_constrained_parameters_roundtrip():
    assert float(gv.constrain(gv.positive(2.5))) == pytest.approx(2.5)
    assert float(gv.constrain(gv.unit_interval(0.2))) == pytest.approx(0.2)
    assert float(gv.constrain(gv.interval(-1.0, -2.0, 4.0))) == pytest.approx(-1.0, abs=1e-6)
    np.testing.assert_allclose(gv.constrain(gv.simplex(jnp.array([0.1, 0.2, 0.7]))),
                               [0.1, 0.2, 0.7], rtol=1e-5)
    chol = jnp.array([[1.0, 0.0], [0.5, 2.0]])
    np.testing.assert_allclose(gv.constrain(gv.lower_cholesky(chol)), chol, rtol=1e-5)
    tree = {"a": gv.positive(jnp.ones(3)), "b": 1.0}
    leaves = jax.tree_util.tree_leaves(tree)                 # what optax sees
    np.testing.assert_allclose(leaves[0], np.zeros(3))
    assert gv.constrain(tree)["b"] == 1.0
    with pytest.raises(ValueError, match="inside the domain"):
        gv.positive(0.0)


def test_constrained_parameters_train_under_fit():
    @gv.gen
    def model(params, y):
        z = gv.normal(0.0, 1.0) @ "z"
        gv.observe(gv.normal(z, 1.0), y)

    @gv.gen
    def guide(params, y):
        p = gv.constrain(params)
        gv.normal(p["m"], p["s"], grad=gv.REPARAM) @ "z"

    params = {"m": 0.0, "s": gv.positive(2.0)}
    opt = optax.adam(optax.cosine_decay_schedule(0.05, 1000, alpha=0.01))
    objective = gv.batch_mean(gv.elbo(model, guide), in_axes=(None, 0))  # 16 particles
    result = gv.fit(objective, params, jnp.ones(16), optimizer=opt, steps=1000,
                    key=jax.random.key(0), progress=False)
    assert isinstance(result.params["s"], gv.Constrained)
    fitted = gv.constrain(result.params)                     # posterior N(0.5, 1/2)
    assert float(fitted["m"]) == pytest.approx(0.5, abs=0.05)
    assert float(fitted["s"]) == pytest.approx(math.sqrt(0.5), abs=0.05)


@pytest.mark.parametrize("make", [gv.auto_mvn, lambda m: gv.auto_flow(m, hidden=(4,))])
def test_joint_guides_under_particles(make):
    """Under gv.iwelbo's particle vmap, the later sites' conditionals are batched."""
    auto = make(linear)
    params = {"guide": auto.init(jax.random.key(0), {}, Y_OBS)}
    value, grads = gv.iwelbo(linear, auto, particles=4).value_and_grad_estimate(
        jax.random.key(1), params, Y_OBS)
    assert bool(jnp.isfinite(value))
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))


def test_global_latent_under_a_subsampled_plate():
    """auto_normal trains a global latent of a gv.plate model under minibatches (the
    exact posterior of mu: N(Σy / (N + 0.01), 1 / (N + 0.01))); a local latent inside
    the subsampled plate is refused, naming it and the fix."""
    n = 100
    y = 1.0 + jax.random.normal(jax.random.key(0), (n,))

    @gv.gen
    def point(mu, yi):
        gv.observe(gv.normal(mu, 1.0), yi)

    @gv.gen
    def model(params, ys):
        mu = gv.normal(0.0, 10.0) @ "mu"
        gv.plate(point, n, in_axes=(None, 0))(mu, ys) @ "data"

    auto = gv.auto_normal(model)
    params = {"guide": auto.init(jax.random.key(1), {}, y[:10])}
    opt = optax.adam(optax.cosine_decay_schedule(0.05, 1500, alpha=0.01))
    result = gv.fit(gv.elbo(model, auto), params, y, optimizer=opt, steps=1500,
                    batch_size=10, key=jax.random.key(2), progress=False)
    loc, sd = auto.marginals(result.params)
    assert float(loc[0]) == pytest.approx(float(y.sum() / (n + 0.01)), abs=0.03)
    assert float(sd[0]) == pytest.approx(1 / math.sqrt(n + 0.01), abs=0.03)

    @gv.gen
    def local(mu, yi):
        z = gv.normal(mu, 1.0) @ "z"
        gv.observe(gv.normal(z, 1.0), yi)

    @gv.gen
    def model2(params, ys):
        mu = gv.normal(0.0, 10.0) @ "mu"
        gv.plate(local, n, in_axes=(None, 0))(mu, ys) @ "data"

    with pytest.raises(ValueError, match=r"'data/z' \(gv.normal\) is a local latent.*"
                                         r"exclude=\['data/z'\]"):
        gv.auto_normal(model2).init(jax.random.key(0), {}, y[:10])


def _expected_log_q(ldj, loc, scale):
    """E[log q] over a mean-field normal guide in the unconstrained space, and its
    derivative in `loc`, in float64: −Σ log(s √(2πe)) − E[log |det ∂y/∂u|], the
    expectation by Gauss–Hermite quadrature on a product grid, the derivative by
    central differences."""
    x, w = np.polynomial.hermite_e.hermegauss(40)
    w = w / w.sum()
    loc, scale = np.asarray(loc, np.float64), np.asarray(scale, np.float64)

    def value(m):
        grid = np.stack(np.meshgrid(*[m_i + s_i * x for m_i, s_i in zip(m, scale)],
                                    indexing="ij"), -1)
        weight = np.prod(np.stack(np.meshgrid(*[w] * len(m), indexing="ij"), -1), -1)
        return -np.sum(np.log(scale * math.sqrt(2 * math.pi * math.e))) - np.sum(weight * ldj(grid))
    eps = 1e-5
    grad = [(value(loc + eps * e) - value(loc - eps * e)) / (2 * eps) for e in np.eye(len(loc))]
    return value(loc), np.array(grad)


def _scores_its_draws_exactly(auto, name, loc, scale, ldj):
    """Whether 4,000 estimates of E_q[log q] from `auto`'s own draws, and of its
    derivative in the loc of site `name`, are within 5 standard errors of the
    quadrature (`_expected_log_q`)."""
    @gv.expectation
    def log_q(params):
        return auto.sim(params)[1]
    params = {"guide": {"loc": {name: jnp.asarray(loc, jnp.float32)},
                        "scale": {name: gv.positive(jnp.asarray(scale, jnp.float32))}}}
    v, g = estimates(log_q, params, n=4000)
    g = g["guide"]["loc"][name].reshape(len(v), -1)
    want, want_grad = _expected_log_q(ldj, np.atleast_1d(loc), np.atleast_1d(scale))
    return (within(v.mean(), v.std() / math.sqrt(len(v)), want)
            and within(g.mean(0), g.std(0) / math.sqrt(len(g)), want_grad))


def test_a_guide_scores_its_own_draw_where_the_constrained_value_rounds():
    """A beta site drawn at u ≈ 18: σ(18) is 1 in float32, so inverting the value gives
    u ≈ 16.6, and a density taken there is 90 nats off with a wrong gradient. The guide
    scores its draw at the draw: E[log q] and its derivative in loc match quadrature."""
    @gv.gen
    def model(params):
        gv.beta(2.0, 2.0) @ "p"
    auto = gv.auto_normal(model)
    auto.init(jax.random.key(0), {})

    def ldj(u):  # log σ'(u)
        return -np.logaddexp(0, -u[..., 0]) - np.logaddexp(0, u[..., 0])
    assert _scores_its_draws_exactly(auto, "p", 18.0, 0.1, ldj)


def test_a_guide_over_numpyros_stick_breaking_scores_its_own_draw():
    """The draw that made `gv.fit` stop on NumPyro's HMM example: a Dirichlet site at
    u = (2, 15.7), where NumPyro's stick-breaking inverse of the value returns a second
    coordinate near 85 (it subtracts a cumulative sum from 1). Scored at the draw,
    E[log q] and its gradient match quadrature of NumPyro's log-Jacobian in float64."""
    numpyro = pytest.importorskip("numpyro")
    nd = pytest.importorskip("numpyro.distributions")

    def model():
        numpyro.sample("p", nd.Dirichlet(jnp.ones(3)))
    auto = gv.auto_normal(gv.from_numpyro(model))
    auto.init(jax.random.key(0), {})

    def ldj(u):  # stick-breaking with offsets log(K − 1 − i): Σ log z_i + (K − 1 − i) log(1 − z_i)
        x = u - np.log([2.0, 1.0])
        return np.sum(-np.logaddexp(0, -x) - np.array([2.0, 1.0]) * np.logaddexp(0, x), -1)
    assert _scores_its_draws_exactly(auto, "p", [2.0, 15.7], [0.05, 0.05], ldj)
