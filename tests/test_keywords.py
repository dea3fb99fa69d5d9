"""Data by keyword, as NumPyro takes it (`svi.run(key, n, X=X, Y=Y)`): a program's
`init`, `simulate`, `log_density`, an objective's estimates, `gv.fit` and
`gv.predictive` take keyword arguments, and give what the same arguments by position
give; a keyword left out takes the function's default (`Y=None`)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv
from genvi.core.program_mistakes import StaticUseError

numpyro = pytest.importorskip("numpyro")
nd = pytest.importorskip("numpyro.distributions")

X = jax.random.normal(jax.random.key(1), (20, 3))
Y = X @ jnp.array([1.0, -1.0, 0.5]) + 0.3 * jax.random.normal(jax.random.key(2), (20,))


def regression(X, Y=None):
    w = numpyro.sample("w", nd.Normal(jnp.zeros(3), 1.0).to_event(1))
    s = numpyro.sample("s", nd.HalfNormal(1.0))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("Y", nd.Normal(X @ w, s), obs=Y)


def programs():
    from numpyro.infer import autoguide

    guide = autoguide.AutoNormal(regression)
    return gv.from_numpyro(regression), gv.from_numpyro(guide, strategies=gv.REPARAM)


def test_a_numpyro_program_takes_its_data_by_keyword():
    model, guide = programs()
    params = guide.init(jax.random.key(0), X=X, Y=Y)
    assert sorted(params) == sorted(guide.init(jax.random.key(0), X, Y))
    trace = model.simulate(jax.random.key(3), {}, X=X)   # Y left out: its default, None
    assert sorted(trace.choices.flat()) == [("Y",), ("s",), ("w",)]
    assert float(model.log_density(trace.choices, {}, X=X)) == float(
        model.log_density(trace.choices, {}, X, None))
    elbo = gv.elbo(model, guide)
    key = jax.random.key(4)
    assert float(elbo.estimate(key, params, X=X, Y=Y)) == float(elbo.estimate(key, params, X, Y))
    by_name, by_place = (elbo.grad_estimate(key, params, X=X, Y=Y),
                         elbo.grad_estimate(key, params, X, Y))
    for a, b in zip(jax.tree_util.tree_leaves(by_name), jax.tree_util.tree_leaves(by_place)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_fit_and_predictive_take_data_by_keyword():
    model, guide = programs()
    params = guide.init(jax.random.key(0), X, Y)
    run = dict(optimizer=optax.adam(0.02), steps=50, key=jax.random.key(1), progress=False)
    by_name = gv.fit(gv.elbo(model, guide), params, X=X, Y=Y, **run)
    by_place = gv.fit(gv.elbo(model, guide), params, X, Y, **run)
    np.testing.assert_array_equal(by_name.history["objective"], by_place.history["objective"])
    batched = gv.fit(gv.elbo(model, guide), params, X=X, Y=Y, batch_size=5, **run)
    assert np.all(np.isfinite(batched.history["objective"]))
    draws = gv.predictive(model, guide, by_name.params, 7)(jax.random.key(2), X=X[:4])
    assert draws["Y"].shape == (7, 4)


def test_gen_programs_and_objectives_take_keywords_too():
    @gv.gen
    def model(params, y, scale=1.0):
        z = gv.normal(0.0, scale) @ "z"
        gv.observe(gv.normal(z, 1.0), y)

    @gv.gen
    def guide(params, y, scale=1.0):
        gv.normal(params, 1.0, grad=gv.REPARAM) @ "z"

    @gv.expectation
    def shifted(m, shift=0.0):
        return gv.sample(gv.normal(m + shift, 1.0, grad=gv.REPARAM)) ** 2

    key = jax.random.key(0)
    choices = gv.choices({"z": 0.3})
    assert float(model.log_density(choices, 0.0, y=1.0, scale=2.0)) == float(
        model.log_density(choices, 0.0, 1.0, 2.0))
    elbo = gv.elbo(model, guide)
    assert float(elbo.grad_estimate(key, 0.5, y=1.0)) == float(elbo.grad_estimate(key, 0.5, 1.0))
    assert float(shifted.grad_estimate(key, 0.5, shift=1.0)) == float(
        shifted.grad_estimate(key, 0.5, 1.0))


def bnn(X, Y=None, D_H=4):
    """NumPyro's bnn.py in small: the hidden width D_H, a Python int, sets shapes."""
    w1 = numpyro.sample("w1", nd.Normal(jnp.zeros((X.shape[1], D_H)), 1.0).to_event(2))
    w2 = numpyro.sample("w2", nd.Normal(jnp.zeros(D_H), 1.0).to_event(1))
    with numpyro.plate("n", X.shape[0]):
        numpyro.sample("Y", nd.Normal(jnp.tanh(X @ w1) @ w2, 0.5), obs=Y)


def test_a_python_int_argument_is_a_constant_a_program_may_use_as_a_shape():
    """As NumPyro's svi.run makes it: a width passed as data sets shapes, by position or
    by keyword, in init, estimates, gv.fit and gv.predictive; a new value traces anew."""
    from numpyro.infer import autoguide

    model = gv.from_numpyro(bnn)
    guide = gv.from_numpyro(autoguide.AutoNormal(bnn), strategies=gv.REPARAM)
    params = guide.init(jax.random.key(0), X, Y, 5)
    assert params["w1_auto_loc"].shape == (3, 5)
    elbo = gv.elbo(model, guide)
    assert np.isfinite(float(elbo.estimate(jax.random.key(1), params, X, Y, 5)))
    assert float(elbo.estimate(jax.random.key(1), params, X, Y, D_H=5)) == float(
        elbo.estimate(jax.random.key(1), params, X, Y, 5))
    fit = gv.fit(elbo, params, X, Y, D_H=5, optimizer=optax.adam(0.01), steps=30,
                 key=jax.random.key(2), progress=False)
    assert np.all(np.isfinite(fit.history["objective"]))
    draws = gv.predictive(model, guide, fit.params, 3)(jax.random.key(3), X[:2], None, 5)
    assert draws["w1"].shape == (3, 3, 5) and draws["Y"].shape == (3, 2)

    @gv.gen
    def sized(params, n):
        return gv.normal(jnp.zeros(n), 1.0) @ "z"

    assert sized.simulate(jax.random.key(0), None, 2).choices["z"].shape == (2,)
    assert sized.simulate(jax.random.key(0), None, 3).choices["z"].shape == (3,)


def test_a_python_int_to_differentiate_is_still_refused_by_name():
    @gv.expectation
    def e(m):
        return gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM))

    with pytest.raises(TypeError, match=r"args\[0\].*0\.0 instead of 0"):
        e.grad_estimate(jax.random.key(0), 0)


def test_an_array_argument_used_as_a_python_value_is_named_with_the_fix():
    """annotation.py's `int(np.max(positions))`, and a width passed as an array: the
    message names the argument and says to pass the number as a Python int."""
    def annotation(positions, annotations):
        num_annotators = int(np.max(positions)) + 1
        beta = numpyro.sample("beta", nd.Beta(jnp.ones(num_annotators), 1.0).to_event(1))
        numpyro.sample("y", nd.Bernoulli(beta[positions]), obs=annotations)

    positions, annotations = np.array([0, 1, 2, 1]), np.array([1, 0, 1, 1])
    with pytest.raises(StaticUseError, match=r"argument 'positions'.*int\(np\.max"):
        gv.from_numpyro(annotation).simulate(jax.random.key(0), {}, positions, annotations)

    @gv.gen
    def sized(params, n):
        return gv.normal(jnp.zeros(n), 1.0) @ "z"

    with pytest.raises(StaticUseError, match=r"argument 'n'.*Python int"):
        sized.simulate(jax.random.key(0), None, jnp.array(3))
