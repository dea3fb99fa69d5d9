"""Constrained parameters and summaries (issue 26, item 6):

* a constructor refuses a value outside its domain (simplex not summing to 1,
  Cholesky factor with an entry above the diagonal, nonpositive scale, value outside
  an interval), naming the constraint, the offending value and the fix; eager
  `gv.constrain`, `jit` and an optax step all read the same parameter (TFP's bijector
  cache once made the eager read return the input); a traced invalid value is NaN;
* the Gaussian guides' quantiles of a `gv.from_tfp` site are exact (the transformed
  normal quantile), independent of the key and equal to `median` at 0.5; where they
  stay Monte Carlo (a simplex site) `median` is still their 0.5 quantile;
* choice maps read and build nested addresses in the "data/obs" form that summaries
  and error messages print;
* `gv.auto_low_rank` refuses a rank that is not a positive int, and its discrete-site
  fix includes the rank.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.scipy.special import ndtri
from tensorflow_probability.substrates import jax as tfp

import genvi as gv
from genvi.guides.gaussian import monotone_quantiles

tfd, tfb = tfp.distributions, tfp.bijectors


# -- (a) constructors -----------------------------------------------------------------
@pytest.mark.parametrize("make, words", [
    (lambda: gv.simplex([0.1, 0.6, 0.5]),
     ["gv.simplex([0.1, 0.6, 0.5])", "sum to 1", "1.2", "p / p.sum(-1, keepdims=True)"]),
    (lambda: gv.simplex([0.5, 0.5, 0.0]), ["> 0", "[(2,)]", "renormalize"]),
    (lambda: gv.lower_cholesky(jnp.array([[1.0, 0.5], [0.0, 2.0]])),
     ["gv.lower_cholesky", "zero above the diagonal", "[(0, 1)]: [0.5]", "jnp.tril(L)"]),
    (lambda: gv.lower_cholesky(jnp.array([[-1.0, 0.0], [0.3, 2.0]])),
     ["positive on the diagonal", "[(0, 0)]: [-1.0]", "jnp.linalg.cholesky(S)"]),
    (lambda: gv.positive(-1.0), ["gv.positive(-1.0)", "positive (> 0", "got -1.0", "Fix:"]),
    (lambda: gv.positive(jnp.array([1.0, 0.0])), ["[(1,)]: [0.0]", "Fix:"]),
    (lambda: gv.unit_interval(1.2), ["gv.unit_interval(1.2)", "(0, 1)", "got 1.2", "Fix:"]),
    (lambda: gv.interval(3.0, 1.0, 3.0), ["gv.interval(3.0, 1.0, 3.0)", "(1, 3)", "widen"]),
    (lambda: gv.interval(1.0, 2.0, 1.0), ["low < high"]),
    (lambda: gv.lower_cholesky(jnp.ones(3)), ["square"]),
])
def test_constructor_refuses_a_value_outside_its_domain(make, words):
    with pytest.raises(ValueError) as err:
        make()
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def _valid_params():
    return {"w": gv.simplex([0.2, 0.3, 0.5]),
            "tril": gv.lower_cholesky(jnp.array([[1.0, 0.0], [0.5, 2.0]])),
            "s": gv.positive(jnp.array([0.5, 2.0])),
            "frac": gv.unit_interval(0.3), "x": gv.interval(1.5, 1.0, 3.0)}


def test_eager_jit_and_an_optax_step_read_the_same_parameters():
    params = _valid_params()
    eager = gv.constrain(params)
    jitted = jax.jit(gv.constrain)(params)
    # the stored array is not one TFP cached: a copy of it reads bit for bit the same
    # (the cached read gave the input back, 0.2 where the bijector computes 0.19999999)
    fresh = gv.constrain(jax.tree_util.tree_map(lambda x: jnp.array(x, copy=True), params))
    for name in params:
        np.testing.assert_array_equal(fresh[name], eager[name])
    opt = optax.adam(0.1)

    @jax.jit
    def step(grads, p):
        updates, _ = opt.update(grads, opt.init(p), p)
        return optax.apply_updates(p, updates)
    # a zero gradient moves nothing: the stepped parameters must read as before
    stepped = step(jax.tree_util.tree_map(jnp.zeros_like, params), params)
    for name in params:
        np.testing.assert_allclose(jitted[name], eager[name], rtol=1e-6, atol=1e-7)
        np.testing.assert_allclose(gv.constrain(stepped)[name], eager[name],
                                   rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(eager["w"], [0.2, 0.3, 0.5], rtol=1e-6)
    np.testing.assert_allclose(eager["tril"], [[1.0, 0.0], [0.5, 2.0]], rtol=1e-6)

    # one real step (a gradient of the constrained values): eager and jit still agree
    def loss(p):
        c = gv.constrain(p)
        return sum(jnp.sum(jnp.sin(3.0 * v)) for v in jax.tree_util.tree_leaves(c))
    moved = step(jax.jit(jax.grad(loss))(params), params)
    eager, jitted = gv.constrain(moved), jax.jit(gv.constrain)(moved)
    for name in params:
        np.testing.assert_allclose(jitted[name], eager[name], rtol=1e-6, atol=1e-7)
        assert not np.allclose(eager[name], gv.constrain(params)[name])   # it moved
    np.testing.assert_allclose(jnp.sum(eager["w"]), 1.0, rtol=1e-6)
    assert float(eager["tril"][0, 1]) == 0.0


def test_a_traced_value_outside_the_domain_is_nan_not_projected():
    def raw(v):
        return gv.simplex(v).raw
    bad = jax.jit(raw)(jnp.array([0.1, 0.6, 0.5]))
    good = jax.jit(raw)(jnp.array([0.2, 0.3, 0.5]))
    assert bool(jnp.all(jnp.isnan(bad)))
    np.testing.assert_allclose(good, gv.simplex([0.2, 0.3, 0.5]).raw, rtol=1e-6)
    assert bool(jnp.isnan(jax.jit(lambda v: gv.positive(v).raw)(0.0)))


# -- (b) quantiles of TFP sites ---------------------------------------------------------
lognormal = gv.from_tfp(tfd.LogNormal)


@gv.gen
def tfp_model(params):
    lognormal(loc=0.3, scale=0.5) @ "s"
    gv.normal(0.0, 1.0) @ "x"


@pytest.mark.parametrize("make", [gv.auto_normal, gv.auto_mvn,
                                  lambda m: gv.auto_low_rank(m, rank=1)])
def test_quantiles_of_a_from_tfp_site_are_exact_and_agree_with_the_median(make):
    auto = make(tfp_model)
    params = {"guide": auto.init(jax.random.key(0), {})}
    qs = jnp.array([0.05, 0.25, 0.5, 0.9])
    q = auto.quantiles(params, qs)["s"]
    loc, sd = auto.marginals(params)          # site "s" is coordinate 0
    exact = tfd.LogNormal(loc[0], sd[0]).quantile(qs)
    np.testing.assert_allclose(q, exact, rtol=1e-5)
    again = auto.quantiles(params, qs, key=jax.random.key(7))["s"]
    np.testing.assert_array_equal(q, again)  # exact: no key enters
    assert float(auto.median(params)["s"]) == pytest.approx(float(q[2]), rel=1e-6)


def test_monotone_quantiles_mirror_the_level_where_the_bijector_decreases():
    site = types.SimpleNamespace(bijector=lambda: tfb.Scale(-2.0), ushape=())
    qs = jnp.array([0.1, 0.5, 0.8])
    got = monotone_quantiles(site, jnp.array([1.0]), jnp.array([0.5]), qs)
    exact = -2.0 * (1.0 + 0.5 * ndtri(1.0 - qs))   # the q-quantile of −2 Z, Z ~ N(1, 0.5²)
    np.testing.assert_allclose(got, exact, rtol=1e-6)


@gv.gen
def simplex_model(params):
    gv.dirichlet(jnp.array([2.0, 3.0, 4.0])) @ "d"


def test_monte_carlo_quantiles_of_a_simplex_site_match_the_median():
    auto = gv.auto_normal(simplex_model)
    params = {"guide": auto.init(jax.random.key(0), {})}
    median = auto.median(params)["d"]
    np.testing.assert_array_equal(median, auto.quantiles(params, [0.25, 0.5])["d"][1])
    assert "Monte Carlo" in type(auto).quantiles.__doc__


# -- (c) nested addresses ---------------------------------------------------------------
@gv.gen
def data(mu):
    gv.normal(mu, 1.0) @ "obs"


@gv.gen
def nested_model(params):
    mu = gv.normal(0.0, 1.0) @ "mu"
    data(mu) @ "data"


def test_choice_maps_take_the_nested_address_form_summaries_print():
    cm = nested_model.simulate(jax.random.key(0), {}).choices
    assert "data/obs" in cm and "data/nope" not in cm
    assert float(cm["data/obs"]) == float(cm["data", "obs"]) == float(cm["data"]["obs"])
    assert gv.choices({"data/obs": 1.0}).paths() == [("data", "obs")]
    lp_nested = nested_model.log_density({"mu": 0.2, "data": {"obs": 0.5}}, {})
    lp_string = nested_model.log_density({"mu": 0.2, "data/obs": 0.5}, {})
    assert float(lp_nested) == float(lp_string)
    with pytest.raises(KeyError) as err:
        cm["data/ob"]
    message = err.value.args[0]
    assert "'data/obs'" in message and '"outer/inner"' in message


def test_an_address_with_a_slash_is_refused_since_slash_nests():
    @gv.gen
    def model():
        gv.normal(0.0, 1.0) @ "data/obs"

    with pytest.raises(ValueError, match=r"contains '/'.*'data_obs'.*sub-program at 'data'"):
        model.simulate(jax.random.key(0))

    @gv.gen
    def named(y):
        gv.observe(gv.normal(0.0, 1.0), y, name="data/y")

    with pytest.raises(ValueError, match=r"contains '/'.*'data_y'"):
        named.simulate(jax.random.key(0), 1.0)


def test_an_auto_guide_summary_of_a_nested_site_is_a_valid_choice_map():
    auto = gv.auto_normal(nested_model)
    params = {"guide": auto.init(jax.random.key(0), {})}
    median = auto.median(params)
    assert set(median) == {"mu", "data/obs"}
    cm = gv.choices(median)
    assert float(cm["data", "obs"]) == float(median["data/obs"])
    assert bool(jnp.isfinite(nested_model.log_density(cm, {})))


# -- (d) auto_low_rank's rank -----------------------------------------------------------
@pytest.mark.parametrize("rank, error", [(0, ValueError), (-2, ValueError),
                                         (1.5, TypeError), ("2", TypeError),
                                         (True, TypeError)])
def test_auto_low_rank_refuses_a_rank_that_is_not_a_positive_int(rank, error):
    with pytest.raises(error, match="positive int.*rank=2"):
        gv.auto_low_rank(tfp_model, rank)


@gv.gen
def mixed_model(params):
    gv.normal(0.0, 1.0) @ "x"
    gv.flip(0.3) @ "k"


def test_auto_low_rank_discrete_fix_keeps_the_rank():
    with pytest.raises(ValueError, match=r"gv\.auto_low_rank\(model, rank=3, exclude=\['k'\]\)"):
        gv.auto_low_rank(mixed_model, 3).init(jax.random.key(0), {})
