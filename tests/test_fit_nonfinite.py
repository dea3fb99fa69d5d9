"""gv.fit and non-finite steps: by default it stops at the first one, naming the step
and the gradient leaves, with the parameters from before it; `skip_nonfinite=True`
counts skipped steps and warns past `skip_warn_fraction`; common mistakes (a program
instead of an objective, integer parameters, a list as data) get clear errors."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv
from programs import guide, model

MEAN_ELBO = gv.batch_mean(gv.elbo(model, guide), in_axes=(None, 0))
ADAM = optax.adam(0.05)
START = {"m": 0.0, "s": 0.0}


def fit_mean(data, **kw):
    kw.setdefault("steps", 40)
    kw.setdefault("chunk_size", 2)   # one capacity: one compile shared by these tests
    return gv.fit(MEAN_ELBO, START, data, optimizer=ADAM, key=jax.random.key(0),
                  batch_size=2, progress=False, **kw)


def test_nan_in_data_stops_at_its_step_with_the_parameters_from_before():
    data = jnp.arange(8.0).at[2].set(jnp.nan)
    with pytest.raises(gv.NonFiniteError) as info:
        fit_mean(data)
    e = info.value
    assert isinstance(e, FloatingPointError)
    assert 0 < e.step < 4                       # the first epoch's batch holding data[2]
    assert f"step {e.step}" in str(e) and "gv.validation()" in str(e)
    assert "skip_nonfinite=True" in str(e) and "data argument 0 has 1 non-finite" in str(e)
    assert np.isnan(e.value) and sorted(e.leaves) == ["['m']", "['s']"]
    history = e.result.history
    assert history["objective"].shape == (e.step,) and np.all(np.isfinite(history["objective"]))
    assert history["num_skipped"] == 0
    # exactly the parameters of a run that stops before the bad step
    before = fit_mean(data, steps=e.step)
    for name in ("m", "s"):
        got = np.asarray(e.result.params[name])
        assert np.isfinite(got) and got == np.asarray(before.params[name]) != START[name]


def test_clean_data_runs_through_with_nothing_skipped():
    res = fit_mean(jnp.arange(8.0))
    assert res.history["num_skipped"] == 0 and not res.history["skipped"].any()
    assert np.isfinite(float(res.params["m"]))


@gv.expectation
def shrinking(p):
    # the kernel is pushed below 0, where k log k (and its gradient) is NaN
    x = gv.sample(gv.normal(p["loc"], 1.0, grad=gv.REPARAM))
    k = p["net"]["kernel"]
    penalty = 3.0 * jnp.sum(k) - 0.01 * jnp.sum(k * jnp.log(k))
    return -(x - 1.0) ** 2 - p["net"]["bias"] ** 2 - penalty


def test_nonfinite_gradient_names_the_leaf():
    params = {"loc": 0.0, "net": {"kernel": jnp.ones(3), "bias": 0.5}}
    with pytest.raises(gv.NonFiniteError) as info:
        gv.fit(shrinking, params, optimizer=optax.adam(0.1), steps=100, key=jax.random.key(1),
               chunk_size=4, progress=False)
    e = info.value
    assert e.step > 4 and e.leaves == ["['net']['kernel']"]
    assert "['net']['kernel']" in str(e) and "['loc']" not in str(e)
    # the parameters the failing step was evaluated at: finite, the kernel just below 0
    kept = e.result.params
    assert np.all(np.isfinite(np.asarray(kept["net"]["kernel"]))) and np.isfinite(kept["loc"])
    assert np.all(np.asarray(kept["net"]["kernel"]) < 0)
    assert np.all(np.isfinite(e.result.history["objective"]))


@gv.expectation
def mostly_nan(p):
    # NaN whenever x < 1.28: about 90% of the steps
    x = gv.sample(gv.normal(p["m"], 1.0, grad=gv.REPARAM))
    return jnp.log(x - 1.28)


def fit_mostly_nan(skip_nonfinite=True):
    return gv.fit(mostly_nan, {"m": 0.0}, optimizer=ADAM, steps=200, key=jax.random.key(2),
                  skip_nonfinite=skip_nonfinite, progress=False)


def test_skip_nonfinite_counts_and_warns():
    with pytest.warns(gv.NonFiniteWarning, match=r"skipped \d+ of 200 steps \(\d+\.\d%") as rec:
        res = fit_mostly_nan()
    assert "gv.validation()" in str(rec[0].message)
    n = res.history["num_skipped"]
    assert isinstance(n, int) and n == res.history["skipped"].sum() > 150
    assert np.isfinite(float(res.params["m"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error", gv.NonFiniteWarning)
        skip = gv.SkipNonfinite(warn_fraction=0.95)
        assert fit_mostly_nan(skip_nonfinite=skip).history["num_skipped"] == n
        fit_mostly_nan(skip_nonfinite=gv.SkipNonfinite(warn_fraction=None))
    with pytest.raises(gv.NonFiniteError, match="step 0"):
        gv.fit(mostly_nan, {"m": 0.0}, optimizer=ADAM, steps=200, key=jax.random.key(2),
               progress=False)


def test_a_program_is_not_an_objective():
    with pytest.raises(TypeError, match=r"gv\.elbo\(model, guide\).*program 'model', which is "
                                        "a program, not an objective"):
        gv.fit(model, START, 1.0, optimizer=ADAM, steps=10, key=jax.random.key(0))
    with pytest.raises(TypeError, match=r"gv\.Expectation.*got <function"):
        gv.fit(lambda p: p, START, optimizer=ADAM, steps=10, key=jax.random.key(0))
    with pytest.raises(TypeError, match="gv.Evaluation's objective.*program 'guide'"):
        gv.Evaluation(guide, jnp.zeros(4), every=10)


def test_integer_parameters_name_the_leaf():
    with pytest.raises(TypeError, match=r"\['m'\] \(int32\).*0\.0 instead of 0"):
        gv.fit(MEAN_ELBO, {"m": 0, "s": 0.0}, jnp.zeros(4), optimizer=ADAM, steps=10,
               key=jax.random.key(0))
    with pytest.raises(TypeError, match=r"\['flag'\] \(bool\)"):
        gv.fit(MEAN_ELBO, {"m": 0.0, "s": 0.0, "flag": True}, jnp.zeros(4), optimizer=ADAM,
               steps=10, key=jax.random.key(0))
    with pytest.raises(TypeError, match=r"args\[0\]\['m'\] \(int32\)"):
        MEAN_ELBO.value_and_grad_estimate(jax.random.key(0), {"m": 0, "s": 0.0}, jnp.zeros(4))


def test_a_list_of_numbers_is_data_like_an_array():
    values = [0.5, 1.0, 1.5, 2.0]
    as_list, as_array = fit_mean(values, steps=10), fit_mean(jnp.asarray(values), steps=10)
    for name in ("m", "s"):
        assert np.asarray(as_list.params[name]) == np.asarray(as_array.params[name])
    with pytest.raises(TypeError, match="data argument 0 is a Python list"):
        fit_mean([[1.0, 2.0], [3.0]])


@pytest.mark.parametrize("size", [10, 70_000])
def test_the_finiteness_check_is_exact(size):
    from genvi.training.step import finite as _finite
    check = jax.jit(_finite)
    big = jnp.full(size, 3e38)          # finite entries whose sum would overflow
    assert check(jnp.float32(1.0), {"a": big, "b": jnp.ones(3)})
    for bad in (jnp.nan, jnp.inf, -jnp.inf):
        assert not check(jnp.float32(1.0), {"a": big.at[size // 2].set(bad), "b": jnp.ones(3)})
        assert not check(jnp.float32(bad), {"a": big, "b": jnp.ones(3)})


@gv.expectation
def cusp(p):
    # sqrt(|w|) at w = 0: the value is finite, the gradient 0/0
    x = gv.sample(gv.normal(p["b"], 1.0, grad=gv.REPARAM))
    return -x ** 2 + jnp.sum(jnp.sqrt(jnp.abs(p["w"][:1])))


def test_finite_value_with_a_nan_gradient_in_a_large_leaf():
    with pytest.raises(gv.NonFiniteError, match=r"step 0 .*non-finite gradient at \['w'\]\.") as e:
        gv.fit(cusp, {"b": 0.0, "w": jnp.zeros(70_000)}, optimizer=ADAM, steps=5,
               key=jax.random.key(3), progress=False)
    assert np.isfinite(e.value.value) and f"estimate {e.value.value:.6g} and" in str(e.value)


def test_grad_estimate_of_a_nan_objective_is_nan_not_finite():
    # a negative scale: the value is NaN while the pathwise gradient alone is finite;
    # grad_estimate, which returns no value, must not hide the NaN
    @gv.gen
    def negative_scale(p, y):
        gv.normal(p["m"], -1.0, grad=gv.REPARAM) @ "z"

    objective = gv.elbo(model, negative_scale)
    value, _ = objective.value_and_grad_estimate(jax.random.key(0), {"m": 0.0}, 1.0)
    grad = objective.grad_estimate(jax.random.key(0), {"m": 0.0}, 1.0)
    assert np.isnan(float(value)) and np.isnan(float(grad["m"]))
    # a finite objective keeps its gradient
    assert np.isfinite(float(gv.elbo(model, guide).grad_estimate(jax.random.key(0), START, 1.0)["m"]))
