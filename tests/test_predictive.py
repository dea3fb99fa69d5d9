"""gv.predictive and named observations: posterior and prior predictive draws match
the closed forms of a conjugate normal model; draws are stacked under gv.plate and
gv.scan; unnamed observations are not returned and asking for one says how to name
it; a name changes nothing else; guide/model mismatches are errors naming the
address."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv

N, S = 8, 40_000
Y = jnp.asarray(np.random.default_rng(0).normal(0.7, 1.0, N), jnp.float32)
POST_VAR = 1.0 / (1.0 + N)
POST_MEAN = float(jnp.sum(Y)) * POST_VAR


@gv.gen
def model(p, y):
    mu = gv.normal(0.0, 1.0) @ "mu"
    gv.observe(gv.normal(mu, 1.0), y, name="y")


@gv.gen
def guide(p, y):
    gv.normal(p["m"], jnp.exp(p["s"]), grad=gv.REPARAM) @ "mu"


EXACT = {"m": jnp.array(POST_MEAN), "s": jnp.array(0.5 * math.log(POST_VAR))}


def check_moments(x, mean, var, k=5.0):
    x = np.asarray(x, np.float64)
    n = len(x)
    assert abs(x.mean() - mean) < k * math.sqrt(var / n), (x.mean(), mean)
    assert abs(x.var(ddof=1) - var) < k * var * math.sqrt(2 / (n - 1)), (x.var(), var)


def test_posterior_predictive_matches_the_conjugate_closed_form():
    draw = jax.jit(gv.predictive(model, guide, EXACT, num_samples=S))
    out = draw(jax.random.key(0), Y)
    assert out["mu"].shape == (S,) and out["y"].shape == (S, N)
    check_moments(out["mu"], POST_MEAN, POST_VAR)
    check_moments(out["y"][:, 0], POST_MEAN, POST_VAR + 1.0)        # y_new | data
    # the draws of one sample share mu: y_0 - y_1 ~ N(0, 2)
    check_moments(out["y"][:, 0] - out["y"][:, 1], 0.0, 2.0)


def test_prior_predictive_without_a_guide():
    out = gv.predictive(model, None, None, num_samples=S)(jax.random.key(1), jnp.zeros(3))
    check_moments(out["mu"], 0.0, 1.0)
    check_moments(out["y"][:, 2], 0.0, 2.0)


@gv.gen
def point(w, x, y):
    gv.observe(gv.normal(w * x, 0.1), y, name="y")


@gv.gen
def regression(p, x, y):
    w = gv.normal(0.0, 1.0) @ "w"
    gv.plate(point, 1000, in_axes=(None, 0, 0))(w, x, y) @ "data"


@gv.gen
def regression_guide(p, x, y):
    gv.normal(p, 0.01, grad=gv.REPARAM) @ "w"


def test_draws_inside_a_plate_and_a_scan_are_stacked():
    x_new = jnp.linspace(0.0, 1.0, 7)   # new inputs, placeholder observations
    out = gv.predictive(regression, regression_guide, 2.0, num_samples=50)(
        jax.random.key(0), x_new, jnp.zeros(7))
    assert out["w"].shape == (50,) and out["data", "y"].shape == (50, 7)
    np.testing.assert_allclose(jnp.mean(out["data", "y"], 0), 2.0 * x_new, atol=0.1)
    only = gv.predictive(regression, regression_guide, 2.0, 5, sites=["data/y"])(
        jax.random.key(0), x_new, jnp.zeros(7))
    assert only.paths() == [("data", "y")]

    @gv.gen
    def step(z, _):
        z = gv.normal(z, 1.0) @ "z"
        gv.observe(gv.normal(z, 0.5), 0.0, name="x")
        return z, None

    @gv.gen
    def hmm(p):
        gv.scan(step, length=4)(0.0, None) @ "steps"

    out = gv.predictive(hmm, None, None, 6)(jax.random.key(0))
    assert out["steps", "z"].shape == (6, 4) and out["steps", "x"].shape == (6, 4)
    @gv.gen
    def batch(p, z0):   # vmap of scan: (samples, batch, steps), as for choices
        gv.vmap(gv.scan(step, length=4), in_axes=(0, None))(z0, None) @ "b"

    drawn = gv.predictive(batch, None, None, 6)(jax.random.key(0), jnp.zeros(3))
    assert drawn["b", "x"].shape == (6, 3, 4) and drawn["b", "z"].shape == (6, 3, 4)


def test_a_named_observation_may_be_none_for_prediction_only():
    x_new = jnp.linspace(0.0, 1.0, 5)
    out = gv.predictive(regression, regression_guide, 2.0, 50)(jax.random.key(0), x_new, None)
    assert out["data", "y"].shape == (50, 5)
    np.testing.assert_allclose(jnp.mean(out["data", "y"], 0), 2.0 * x_new, atol=0.1)
    with pytest.raises(ValueError, match=r"observation 'data/y' \(gv.normal\).*has no value"):
        regression.simulate(jax.random.key(0), 2.0, x_new, None)
    with pytest.raises(TypeError, match="Only a named observation may be None"):
        gv.gen(lambda: gv.observe(gv.normal(0.0, 1.0), None)).simulate(jax.random.key(0))


def test_observations_broadcast_to_the_observed_shape():
    @gv.gen
    def iid(p, y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        gv.observe(gv.normal(mu, 1.0), y, name="y")   # scalar mu, vector y
    out = gv.predictive(iid, None, None, 4)(jax.random.key(0), jnp.zeros((2, 3)))
    assert out["y"].shape == (4, 2, 3)


def test_unnamed_observations_are_not_returned_and_asking_for_one_says_how():
    @gv.gen
    def unnamed(p, y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        gv.observe(gv.normal(mu, 1.0), y)

    out = gv.predictive(unnamed, guide, EXACT, 10)(jax.random.key(0), Y)
    assert out.paths() == [("mu",)]
    with pytest.raises(KeyError, match=r"no latent site or named observation at 'y'.*"
                                       r"unnamed observations.*test_predictive.py.*name="):
        gv.predictive(unnamed, guide, EXACT, 10, sites=["y"])(jax.random.key(0), Y)


def test_a_name_changes_nothing_else():
    @gv.gen
    def unnamed(p, y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        gv.observe(gv.normal(mu, 1.0), y)

    key = jax.random.key(3)
    a, b = model.simulate(key, None, Y), unnamed.simulate(key, None, Y)
    assert a.choices.paths() == [("mu",)]
    assert float(a.log_density) == float(b.log_density)
    assert float(model.log_density(a.choices, None, Y)) == float(
        unnamed.log_density(a.choices, None, Y))
    e1 = gv.elbo(model, guide).estimate(key, EXACT, Y)
    e2 = gv.elbo(unnamed, guide).estimate(key, EXACT, Y)
    assert float(e1) == float(e2)
    with pytest.raises(TypeError, match="name=\"y\""):
        gv.gen(lambda: gv.observe(gv.normal(0.0, 1.0), 0.0, name=3)).simulate(key)


def test_guide_and_model_mismatches_name_the_address():
    @gv.gen
    def typo(p, y):
        gv.normal(0.0, 1.0) @ "m"

    # 'mu' is drawn from the model (as a site the guide leaves out), and the guide's
    # 'm' is named, with the model's address it may mean
    with pytest.raises(KeyError, match=r"never samples: \['m'\].*'mu'"):
        gv.predictive(model, typo, None, 3)(jax.random.key(0), Y)

    @gv.gen
    def extra(p, y):
        gv.normal(0.0, 1.0) @ "mu"
        gv.normal(0.0, 1.0) @ "aux"

    with pytest.raises(KeyError, match=r"never samples: \['aux'\]"):
        gv.predictive(model, extra, None, 3)(jax.random.key(0), Y)

    @gv.gen
    def clash(p, y):
        mu = gv.normal(0.0, 1.0) @ "mu"
        gv.observe(gv.normal(mu, 1.0), y, name="mu")

    with pytest.raises(ValueError, match="'mu' is used twice"):
        gv.predictive(clash, None, None, 3)(jax.random.key(0), Y)
    with pytest.raises(ValueError, match="num_samples"):
        gv.predictive(model, guide, EXACT, 0)


# --------------------------------------------------------------------------- batch_size

def test_chunked_draws_equal_the_unchunked_ones_for_the_same_key():
    x_new = jnp.linspace(0.0, 1.0, 7)
    full = jax.jit(gv.predictive(regression, regression_guide, 2.0, 103))(
        jax.random.key(4), x_new, None)
    # 103 = 4 * 25 + 3: the last chunk overlaps the one before
    chunked = jax.jit(gv.predictive(regression, regression_guide, 2.0, 103, batch_size=25))(
        jax.random.key(4), x_new, None)
    assert chunked.paths() == full.paths()
    for path in full.paths():
        np.testing.assert_allclose(chunked[path], full[path], rtol=1e-6, atol=1e-6)
    # sample i depends on (key, i) only: fewer samples are a prefix of more
    fewer = gv.predictive(regression, regression_guide, 2.0, 40, batch_size=16)(
        jax.random.key(4), x_new, None)
    np.testing.assert_allclose(fewer["data", "y"], full["data", "y"][:40], rtol=1e-6, atol=1e-6)


def test_chunked_posterior_predictive_matches_the_conjugate_closed_form():
    draw = jax.jit(gv.predictive(model, guide, EXACT, num_samples=S, batch_size=3000))
    out = draw(jax.random.key(5), Y)
    check_moments(out["mu"], POST_MEAN, POST_VAR)
    check_moments(out["y"][:, 0], POST_MEAN, POST_VAR + 1.0)


def _temp_bytes(num_samples, batch_size):
    draw = gv.predictive(regression, regression_guide, 2.0, num_samples, batch_size=batch_size)
    x_new = jnp.linspace(0.0, 1.0, 50)
    compiled = jax.jit(draw).lower(jax.random.key(0), x_new, None).compile()
    analysis = compiled.memory_analysis()
    if analysis is None:
        pytest.skip("this backend reports no memory analysis")
    return analysis.temp_size_in_bytes, analysis.output_size_in_bytes


def test_the_memory_of_chunked_draws_does_not_grow_with_num_samples():
    small, small_out = _temp_bytes(1_000, 100)
    large, large_out = _temp_bytes(16_000, 100)
    assert large_out > 15 * small_out                # the output itself grows, of course
    assert large <= small + 1024, (small, large)     # the rest does not
    unchunked = _temp_bytes(16_000, None)[0]
    assert unchunked > 4 * large, (unchunked, large)  # where all draws are made at once


def test_batch_size_must_be_a_positive_int():
    for bad in (0, -2, 2.5, True, "4"):
        with pytest.raises(ValueError, match="batch_size is a positive int"):
            gv.predictive(model, guide, EXACT, 10, batch_size=bad)
