"""A model written without `params` (`def model(y)`): objectives, gv.fit, gv.predictive
and gv.diagnose call every program as (params, *data), and such a model is called with
the data alone; an automatic guide of it takes its own parameters directly, with no
{"guide": ...} entry. The fits equal those of the same model written with params."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv

Y = jnp.array([0.5, 1.0, 1.5, 0.2])


@gv.gen
def bare(y):
    z = gv.normal(0.0, 1.0) @ "z"
    gv.observe(gv.normal(z, 1.0), y, name="y")


@gv.gen
def with_params(params, y):
    z = gv.normal(0.0, 1.0) @ "z"
    gv.observe(gv.normal(z, 1.0), y, name="y")


@gv.gen
def guide(params, y):
    gv.normal(params["m"], jnp.exp(params["s"]), grad=gv.REPARAM) @ "z"


def fit(model, q, params):
    return gv.fit(gv.elbo(model, q), params, Y, steps=1000,
                  optimizer=optax.adam(optax.cosine_decay_schedule(0.05, 1000)),
                  key=jax.random.key(1), progress=False)


def test_the_same_fit_bit_for_bit():
    start = {"m": 0.0, "s": 0.0}
    a, b = fit(bare, guide, start), fit(with_params, guide, start)
    assert jax.tree.all(jax.tree.map(lambda u, v: bool(jnp.array_equal(u, v)), a.params, b.params))
    # exact posterior N(sum y / (n + 1), 1 / (n + 1))
    assert float(a.params["m"]) == pytest.approx(float(Y.sum()) / 5, abs=0.03)


def test_called_with_or_without_params():
    one = bare.simulate(jax.random.key(0), Y).choices["z"]
    two = bare.simulate(jax.random.key(0), {}, Y).choices["z"]
    assert float(one) == float(two)
    draws = gv.predictive(bare, guide, {"m": 0.6, "s": -0.8}, num_samples=50)(jax.random.key(2), Y)
    assert draws["y"].shape == (50, 4)


def test_an_automatic_guide_takes_its_parameters_directly():
    auto = gv.auto_normal(bare)
    result = fit(bare, auto, auto.init(jax.random.key(0), Y))
    assert float(auto.median(result.params)["z"]) == pytest.approx(float(Y.sum()) / 5, abs=0.03)
    report = gv.diagnose(bare, auto, result.params, Y, key=jax.random.key(3), num_samples=2000)
    assert report.verdict == "good"
    wrapped = gv.auto_normal(with_params)
    params = {"guide": wrapped.init(jax.random.key(0), {}, Y)}
    np.testing.assert_array_equal(
        gv.elbo(with_params, wrapped).estimate(jax.random.key(4), params, Y),
        gv.elbo(bare, auto).estimate(jax.random.key(4), params["guide"], Y))


def test_a_model_that_reads_params_still_needs_the_guide_entry():
    auto = gv.auto_normal(with_params)
    own = auto.init(jax.random.key(0), {}, Y)
    with pytest.raises(TypeError, match="'guide' entry"):
        gv.elbo(with_params, auto).estimate(jax.random.key(0), own, Y)


def test_a_wrong_number_of_arguments_is_still_an_error():
    with pytest.raises(TypeError, match="argument"):
        bare.simulate(jax.random.key(0), {}, Y, Y)
