"""An automatic guide whose parameters come from elsewhere (a checkpoint) needs no data:
`auto.discover(*shapes)` finds the model's sites from the arguments' shapes, and a guide
never initialized discovers them the first time it runs; both give the sites, layout
and draws of `init`. A support that depends on the data's values is refused."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv

X = jnp.linspace(-1.0, 1.0, 8)
Y = 0.7 * X + 0.3


@gv.gen
def regression(params, x, y):
    w = gv.normal(0.0, 1.0) @ "w"
    b = gv.normal(0.0, 1.0) @ "b"
    s = gv.halfnormal(1.0) @ "s"
    gv.observe(gv.normal(w * x + b, s), y, name="y")


def trained():
    auto = gv.auto_low_rank(regression, 2)
    params = {"guide": auto.init(jax.random.key(0), {}, X, Y)}
    fit = gv.fit(gv.elbo(regression, auto), params, X, Y, steps=200,
                 optimizer=optax.adam(0.05), key=jax.random.key(1), progress=False)
    return auto, fit.params


def test_discovering_from_shapes_gives_the_initialized_guide():
    auto, params = trained()
    shapes = (jax.ShapeDtypeStruct(X.shape, X.dtype), jax.ShapeDtypeStruct(Y.shape, Y.dtype))
    fresh = gv.auto_low_rank(regression, 2).discover({}, *shapes)
    assert fresh.layout() == auto.layout()
    for name, value in fresh.median(params).items():
        np.testing.assert_array_equal(value, auto.median(params)[name])
    a = fresh.simulate(jax.random.key(2), params, X, Y).choices
    b = auto.simulate(jax.random.key(2), params, X, Y).choices
    assert jax.tree.all(jax.tree.map(lambda u, v: bool(jnp.array_equal(u, v)), a, b))


def test_a_guide_never_initialized_discovers_its_sites_when_it_runs():
    auto, params = trained()
    fresh = gv.auto_low_rank(regression, 2)
    new_x = jnp.linspace(-2.0, 2.0, 8)
    draws = gv.predictive(regression, fresh, params, num_samples=100)(jax.random.key(3),
                                                                       new_x, None)
    same = gv.predictive(regression, auto, params, num_samples=100)(jax.random.key(3),
                                                                     new_x, None)
    np.testing.assert_array_equal(draws["y"], same["y"])
    assert fresh.layout() == auto.layout()
    estimate = jax.jit(lambda k, p: gv.elbo(regression, gv.auto_low_rank(regression, 2))
                       .estimate(k, p, X, Y))(jax.random.key(4), params)
    assert np.isfinite(estimate)


def test_a_support_that_depends_on_the_data_is_refused():
    @gv.gen
    def bounded(params, y):
        gv.uniform(0.0, jnp.max(y)) @ "u"

    shape = jax.ShapeDtypeStruct((3,), jnp.float32)
    with pytest.raises(ValueError, match="depends on the values"):
        gv.auto_normal(bounded).discover({}, shape)
    assert gv.auto_normal(bounded).discover({}, jnp.array([1.0, 2.0, 3.0])).layout() == {
        "u": (0, 1, ())}


def test_summaries_before_either_call_say_what_to_do():
    with pytest.raises(RuntimeError, match=r"\.discover\(\*args\)"):
        gv.auto_normal(regression).median({"guide": {}})
