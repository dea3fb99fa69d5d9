"""`gv.factor(log_weight)`: a weight on a program's density, treated as an observation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv


@gv.gen
def observed(m, y):
    z = gv.normal(0.0, 1.0) @ "z"
    gv.observe(gv.normal(z, 0.5), y)


@gv.gen
def factored(m, y):
    z = gv.normal(0.0, 1.0) @ "z"
    # the same likelihood written as a factor (without its normalizing constant)
    gv.factor(-0.5 * ((y - z) / 0.5) ** 2)


CONST = -math.log(0.5 * math.sqrt(2 * math.pi))


@gv.gen
def guide(m, y):
    gv.normal(m, 0.8, grad=gv.REPARAM) @ "z"


def test_log_density_adds_the_weight():
    c = gv.choices({"z": 0.3})
    assert np.isclose(float(factored.log_density(c, 0.0, 1.2)) + CONST,
                      float(observed.log_density(c, 0.0, 1.2)), atol=1e-5)
    tr = factored.simulate(jax.random.key(0), 0.0, 1.2)
    z = float(tr.choices["z"])
    expect = -0.5 * z ** 2 - 0.5 * math.log(2 * math.pi) - 0.5 * ((1.2 - z) / 0.5) ** 2
    assert np.isclose(float(tr.log_density), expect, atol=1e-4)


def test_objectives_and_gradients_match_an_observation():
    key = jax.random.key(3)
    for make in (gv.elbo, lambda m, g: gv.iwelbo(m, g, particles=4)):
        a = make(observed, guide)
        b = make(factored, guide)
        assert np.isclose(float(a.estimate(key, 0.2, 1.2)),
                          float(b.estimate(key, 0.2, 1.2)) + CONST, atol=1e-4)
        ga = a.grad_estimate(key, 0.2, 1.2)
        gb = b.grad_estimate(key, 0.2, 1.2)
        for x, y in zip(jax.tree_util.tree_leaves(ga), jax.tree_util.tree_leaves(gb)):
            assert np.allclose(np.asarray(x), np.asarray(y), atol=1e-4)


def test_factor_in_a_subsampled_plate_is_scaled_per_lane():
    @gv.gen
    def point(y):
        gv.factor(-y ** 2)

    @gv.gen
    def model(y):
        gv.plate(point, size=100)(y) @ "data"
    y = jnp.array([1.0, 2.0, 0.5, 0.0])
    assert np.isclose(float(model.log_density(gv.choices({}), y)),
                      -100 / 4 * float(jnp.sum(y ** 2)), rtol=1e-6)


def test_a_guide_with_a_factor_is_refused_by_name():
    @gv.gen
    def weighted(m, y):
        z = gv.normal(m, 1.0, grad=gv.REPARAM) @ "z"
        gv.factor(-z ** 2)
    with pytest.raises(gv.UnnormalizedError, match=r"gv\.factor\(\.\.\.\)"):
        gv.elbo(observed, weighted).estimate(jax.random.key(0), 0.0, 1.0)


def test_bad_weights_are_refused():
    @gv.gen
    def wrong():
        gv.factor(gv.normal(0.0, 1.0))
    with pytest.raises(TypeError, match="gv.observe"):
        wrong.log_density(gv.choices({}))

    @gv.gen
    def nan_weight(w):
        gv.factor(w)
    with gv.validation(True), pytest.raises(gv.InvalidParameters, match="log_weight"):
        nan_weight.log_density(gv.choices({}), jnp.nan)
    with pytest.raises(RuntimeError, match="gv.factor"):
        gv.factor(0.0)   # outside a program
