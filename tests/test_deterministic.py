"""gv.deterministic: a value computed from the choices, recorded by simulate and
gv.predictive (so gv.to_arviz's posterior) at its address, stacked by plates and scans;
it changes no density and no gradient (bit for bit), a guide may hold one, and
log_density accepts the choices simulate returns."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv

X = jnp.arange(5.0)
Y = jnp.array([0.1, 0.4, 1.1, 1.4, 2.2])


@gv.gen
def point(mu, x, y):
    gv.deterministic("mean", mu * x)
    gv.observe(gv.normal(mu * x, 1.0), y, name="y")


@gv.gen
def model(params, x, y):
    log_s = gv.normal(0.0, 1.0) @ "log_s"
    s = gv.deterministic("s", jnp.exp(log_s))
    mu = gv.normal(0.0, s) @ "mu"
    gv.deterministic("positive", mu > 0)          # a bool of a REPARAM value: no gradient
    gv.plate(point, 5, in_axes=(None, 0, 0))(mu, x, y) @ "data"


@gv.gen
def plain_point(mu, x, y):
    gv.observe(gv.normal(mu * x, 1.0), y, name="y")


@gv.gen
def plain_model(params, x, y):
    s = jnp.exp(gv.normal(0.0, 1.0) @ "log_s")
    mu = gv.normal(0.0, s) @ "mu"
    gv.plate(plain_point, 5, in_axes=(None, 0, 0))(mu, x, y) @ "data"


@gv.gen
def guide(params, x, y):
    log_s = gv.normal(params["a"], 0.5, grad=gv.REPARAM) @ "log_s"
    gv.deterministic("guide_s", jnp.exp(log_s))
    gv.normal(params["m"], 0.3, grad=gv.REPARAM) @ "mu"


PARAMS = {"a": 0.2, "m": 0.4}


def test_simulate_records_values_stacked_by_the_plate():
    tr = model.simulate(jax.random.key(0), {}, X, Y)
    c = tr.choices
    assert sorted(c.flat()) == [("data", "mean"), ("log_s",), ("mu",), ("positive",), ("s",)]
    np.testing.assert_allclose(c["s"], jnp.exp(c["log_s"]), rtol=1e-6)
    np.testing.assert_allclose(c["data", "mean"], c["mu"] * X, rtol=1e-6)
    assert c["positive"].dtype == jnp.bool_
    # the choices simulate returns are accepted back; the derived values are not read
    assert float(model.log_density(c, {}, X, Y)) == pytest.approx(float(tr.log_density))
    wrong = gv.choices({**{"/".join(a): v for a, v in c.flat().items()}, "s": 123.0})
    assert float(model.log_density(wrong, {}, X, Y)) == float(model.log_density(c, {}, X, Y))


def test_density_and_gradient_are_unchanged_bit_for_bit():
    choices = gv.choices({"log_s": 0.3, "mu": 0.5})
    assert (float(model.log_density(choices, {}, X, Y))
            == float(plain_model.log_density(choices, {}, X, Y)))
    with_values = gv.elbo(model, guide)
    without = gv.elbo(plain_model, guide)
    for seed in range(3):
        a = with_values.value_and_grad_estimate(jax.random.key(seed), PARAMS, X, Y)
        b = without.value_and_grad_estimate(jax.random.key(seed), PARAMS, X, Y)
        assert jax.tree.all(jax.tree.map(lambda u, v: bool(jnp.array_equal(u, v)), a, b))


def test_predictive_and_arviz_put_derived_values_in_the_posterior():
    draws = gv.predictive(model, guide, PARAMS, num_samples=200)(jax.random.key(1), X, Y)
    assert sorted(draws.flat()) == [("data", "mean"), ("data", "y"), ("log_s",), ("mu",),
                                    ("positive",), ("s",)]         # the guide's own: not
    np.testing.assert_allclose(draws["s"], jnp.exp(draws["log_s"]), rtol=1e-6)
    np.testing.assert_allclose(draws["data", "mean"], draws["mu"][:, None] * X, rtol=1e-6)
    prior = gv.predictive(model, None, {}, num_samples=50)(jax.random.key(2), X, Y)
    np.testing.assert_allclose(prior["s"], jnp.exp(prior["log_s"]), rtol=1e-6)
    idata = gv.to_arviz(draws, model=model, args=(PARAMS, X, Y))
    assert {"s", "positive", "data.mean"} <= set(idata.posterior.data_vars)
    assert idata.posterior["data.mean"].dims == ("chain", "draw", "data")
    assert list(idata.posterior_predictive.data_vars) == ["data.y"]


def test_a_guide_may_hold_one():
    result = gv.fit(gv.elbo(model, guide), PARAMS, X, Y, steps=50, key=jax.random.key(3),
                    optimizer=optax.adam(0.05), progress=False)
    assert np.isfinite(result.history["objective"][-1])
    report = gv.diagnose(model, guide, PARAMS, X, Y, key=jax.random.key(4), num_samples=300)
    np.testing.assert_allclose(report.draws["guide_s"], jnp.exp(report.draws["log_s"]),
                               rtol=1e-6)
    assert np.isfinite(report.log_evidence)


def test_automatic_guides_skip_derived_values():
    auto = gv.auto_normal(model)
    params = {"guide": auto.init(jax.random.key(0), {}, X, Y)}
    assert sorted(auto.layout()) == ["log_s", "mu"]
    draws = gv.predictive(model, auto, params, num_samples=20)(jax.random.key(5), X, Y)
    np.testing.assert_allclose(draws["s"], jnp.exp(draws["log_s"]), rtol=1e-6)


def test_inside_a_scan_values_stack_by_step():
    @gv.gen
    def step(x, _):
        x = gv.normal(0.9 * x, 1.0) @ "x"
        gv.deterministic("square", x ** 2)
        return x, None

    @gv.gen
    def chain(params):
        gv.scan(step, length=7)(0.0, None) @ "steps"

    c = jax.jit(lambda k: chain.simulate(k, {}).choices)(jax.random.key(6))
    np.testing.assert_allclose(c["steps", "square"], c["steps", "x"] ** 2, rtol=1e-6)
    assert c["steps", "square"].shape == (7,)
    assert float(chain.log_density(c, {})) == float(chain.log_density(
        gv.choices({"steps": {"x": c["steps", "x"]}}), {}))


def test_misuse_is_a_clear_error():
    @gv.gen
    def swapped():
        z = gv.normal(0.0, 1.0) @ "z"
        gv.deterministic(z, "z")

    with pytest.raises(TypeError, match="the name comes first"):
        swapped.simulate(jax.random.key(0))

    @gv.gen
    def a_draw():
        gv.deterministic("z", gv.normal(0.0, 1.0))

    with pytest.raises(TypeError, match="not a distribution call"):
        a_draw.simulate(jax.random.key(0))


def test_a_value_of_a_summed_site_changes_no_enumerated_gradient():
    def mixture(record: bool):
        @gv.gen
        def one(mu, y):
            z = gv.flip(0.3) @ "z"
            m = jnp.where(z, mu, -mu)
            if record:
                gv.deterministic("m", m)
            gv.observe(gv.normal(m, 1.0), y)

        @gv.gen
        def mixed(params, y):
            mu = gv.normal(0.0, 3.0) @ "mu"
            gv.plate(one, 4, in_axes=(None, 0))(mu, y) @ "data"
        return gv.marginal(mixed, keep=["mu"], algorithm=gv.enumeration())

    @gv.gen
    def q(params, y):
        gv.normal(params["m"], 0.5, grad=gv.REPARAM) @ "mu"

    y = jnp.array([1.0, -2.0, 0.5, 3.0])
    a, b = (gv.elbo(mixture(r), q).value_and_grad_estimate(jax.random.key(0), {"m": 1.0}, y)
            for r in (True, False))
    assert jax.tree.all(jax.tree.map(lambda u, v: bool(jnp.array_equal(u, v)), a, b))
