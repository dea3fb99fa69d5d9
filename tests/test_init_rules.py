"""Where automatic guides start (`genvi.guides.init_rules`): at given values, uniform
in the unconstrained space, at a prior draw, or at the prior median (the default,
unchanged); the flat layout of the joint families; refusals that name the site."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv


@gv.gen
def model(params):
    gv.normal(jnp.zeros(2), 1.0) @ "a"
    gv.dirichlet(jnp.ones(3)) @ "w"
    gv.gamma(2.0, 1.0) @ "rate"


VALUES = {"a": jnp.array([0.5, -1.5]), "w": jnp.array([0.2, 0.3, 0.5]), "rate": 4.0}


def test_a_point_guide_starts_at_given_values():
    auto = gv.auto_delta(model, init=gv.init_to_value(VALUES))
    median = auto.median({"guide": auto.init(jax.random.key(0), {})})
    for name, value in VALUES.items():
        np.testing.assert_allclose(np.asarray(median[name]), np.asarray(value), rtol=1e-5)


@pytest.mark.parametrize("family", ["auto_normal", "auto_mvn", "auto_low_rank", "auto_flow"])
def test_every_family_starts_at_the_same_location(family):
    point = gv.auto_delta(model, init=gv.init_to_value(VALUES))
    start = point.init(jax.random.key(0), {})["value"]
    extra = {"rank": 2} if family == "auto_low_rank" else {"hidden": (4,)} \
        if family == "auto_flow" else {}
    auto = getattr(gv, family)(model, init=gv.init_to_value(VALUES), **extra)
    params = auto.init(jax.random.key(0), {})
    for name, (lo, hi, shape) in auto.layout().items():
        if family == "auto_normal":
            loc = params["loc"][name]
        elif family == "auto_flow":  # the output layer's bias holds the location
            loc = params["made"]["params"]["bias_out"][lo:hi]
        else:
            loc = params["loc"][lo:hi]
        np.testing.assert_allclose(np.ravel(loc), np.ravel(start[name]), rtol=1e-5, atol=1e-6)


def test_given_values_for_some_sites_leave_the_others_to_the_fallback():
    base = gv.auto_normal(model).init(jax.random.key(0), {})
    part = gv.auto_normal(model, init=gv.init_to_value({"rate": 4.0})).init(jax.random.key(0), {})
    np.testing.assert_allclose(np.asarray(part["loc"]["a"]), np.asarray(base["loc"]["a"]))
    assert not np.allclose(np.asarray(part["loc"]["rate"]), np.asarray(base["loc"]["rate"]))


def test_the_default_is_uniform_within_radius_2_as_in_numpyro():
    default = gv.auto_normal(model).init(jax.random.key(3), {})
    uniform = gv.auto_normal(model, init=gv.init_to_uniform()).init(jax.random.key(3), {})
    for name in VALUES:
        np.testing.assert_array_equal(np.asarray(default["loc"][name]),
                                      np.asarray(uniform["loc"][name]))


def test_uniform_starts_lie_in_the_radius_and_follow_the_key():
    auto = gv.auto_normal(model, init=gv.init_to_uniform(radius=0.5))
    one, two = auto.init(jax.random.key(0), {}), auto.init(jax.random.key(1), {})
    again = auto.init(jax.random.key(0), {})
    locs = np.concatenate([np.ravel(v) for v in one["loc"].values()])
    assert np.all(np.abs(locs) < 0.5) and locs.std() > 0.05
    assert not np.allclose(np.asarray(one["loc"]["a"]), np.asarray(two["loc"]["a"]))
    np.testing.assert_array_equal(np.asarray(one["loc"]["a"]), np.asarray(again["loc"]["a"]))
    with pytest.raises(ValueError, match="radius must be positive"):
        gv.init_to_uniform(radius=0.0)


def test_a_sample_start_is_one_prior_draw_in_the_support():
    starts = [gv.auto_delta(model, init=gv.init_to_sample()) for _ in range(2)]
    draws = []
    for k, auto in enumerate(starts):
        params = {"guide": auto.init(jax.random.key(k), {})}
        m = auto.median(params)
        assert float(m["rate"]) > 0 and abs(float(jnp.sum(m["w"])) - 1.0) < 1e-5
        draws.append(float(m["rate"]))
    assert draws[0] != draws[1]


def test_the_layout_places_each_site_in_the_flat_location():
    auto = gv.auto_mvn(model, init=gv.init_to_value(VALUES))
    params = auto.init(jax.random.key(0), {})
    layout = auto.layout()
    assert list(layout) == ["a", "w", "rate"]
    assert layout["a"] == (0, 2, (2,)) and layout["w"] == (2, 4, (2,)) \
        and layout["rate"] == (4, 5, ())
    start, stop, _ = layout["a"]
    np.testing.assert_allclose(np.asarray(params["loc"][start:stop]), np.asarray(VALUES["a"]))
    start, stop, _ = layout["rate"]
    np.testing.assert_allclose(np.exp(np.asarray(params["loc"][start:stop])), 4.0, rtol=1e-5)


def test_bad_starting_values_are_refused_by_name():
    with pytest.raises(ValueError, match=r"\['b'\].*not latent sites"):
        gv.auto_normal(model, init=gv.init_to_value({"b": 1.0})).init(jax.random.key(0), {})
    with pytest.raises(ValueError, match="'a'.*shape"):
        gv.auto_normal(model, init=gv.init_to_value({"a": jnp.zeros(3)})).init(
            jax.random.key(0), {})
    with pytest.raises(ValueError, match="'rate'.*gamma.*outside its support"):
        gv.auto_normal(model, init=gv.init_to_value({"rate": -1.0})).init(jax.random.key(0), {})
