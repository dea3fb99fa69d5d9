"""Common mistakes get clear words (issue 14, item 8): each error names the program,
address or key involved and says how to fix it.

Covers: a forgotten PRNG key (simulate, estimate, grad_estimate, estimated
programs); a misspelt address ("did you mean"); shape mismatches at a site, an
observation and an unnamed gv.sample; a Python list or a scalar mapped by
gv.batch_mean; a distribution or program call used as a value (returned, in
arithmetic, passed to jnp; a method called on a program call); a key missing from
a params dict; a non-string address.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv

KEY = jax.random.key(0)


@gv.gen
def model(y):
    z = gv.normal(0.0, 1.0) @ "z"
    gv.observe(gv.normal(z, 1.0), y)
    return z


@gv.expectation
def objective(m):
    return gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM)) ** 2


def q(s):
    return re.escape(s)


# --------------------------------------------------------------------------- forgotten key

def test_simulate_without_key_names_the_program_and_the_fix():
    with pytest.raises(TypeError, match=q("model.simulate(key, *args)") + ".*" + q("jax.random.key(0)")):
        model.simulate(1.0)
    with pytest.raises(TypeError, match="got a batch of keys.*jax.vmap"):
        model.simulate(jax.random.split(KEY, 3), 1.0)
    # every form of a key is accepted: new-style, legacy uint32[2], traced under jit / vmap
    model.simulate(jax.random.PRNGKey(0), 1.0)
    jax.jit(lambda k: model.simulate(k, 1.0))(KEY)
    jax.vmap(lambda k: model.simulate(k, 1.0))(jax.random.split(KEY, 2))


@pytest.mark.parametrize("method", ["estimate", "grad_estimate", "value_and_grad_estimate"])
def test_objective_without_key(method):
    with pytest.raises(TypeError, match=q(f"objective.{method}(key, *args)") + ".*jax.random.key"):
        getattr(objective, method)(0.5)


def test_estimated_program_without_key():
    sir = gv.normalize(model, gv.importance(particles=2))
    with pytest.raises(TypeError, match=q("normalize(model).simulate(key") + ".*jax.random.key"):
        sir.simulate(1.0)
    with pytest.raises(TypeError, match=q("estimate_log_density(key") + ".*jax.random.key"):
        sir.estimate_log_density(gv.choices({"z": 0.0}), 1.0)


# --------------------------------------------------------------------------- misspelt addresses

def test_misspelt_guide_address_suggests_the_unvisited_one():
    @gv.gen
    def guide(m, y):
        gv.normal(m, 1.0, grad=gv.REPARAM) @ "Z"

    @gv.gen
    def model2(m, y):
        return model(y) @ "z"

    elbo = gv.elbo(gv.gen(lambda m, y: model.body(y)), guide)
    with pytest.raises(KeyError, match="'z'.*Did you mean 'Z'"):
        elbo.grad_estimate(KEY, 0.0, 1.0)
    # nested addresses are shown as 'a/b'
    with pytest.raises(KeyError, match=q("'z/z'") + ".*" + q("Did you mean 'Z/z'")):
        model2.log_density(gv.choices({"Z": {"z": 0.0}}), 0.0, 1.0)


def test_misspelt_address_inside_scan():
    @gv.gen
    def step(c, _):
        return c, gv.normal(c, 1.0) @ "x"

    with pytest.raises(KeyError, match="'x'.*Did you mean 'X'"):
        gv.scan(step, length=4).log_density(gv.choices({"X": jnp.zeros(4)}), 0.0)


def test_never_visited_address_suggests_the_site():
    with pytest.raises(KeyError, match="never visits.*'zz'.*Did you mean 'z'"):
        model.log_density(gv.choices({"z": 0.0, "zz": 1.0}), 1.0)


# --------------------------------------------------------------------------- shapes at sites

def test_shape_mismatch_at_a_site_names_the_address():
    @gv.gen
    def bad():
        return gv.normal(jnp.zeros(3), jnp.ones(4)) @ "x"

    with pytest.raises(ValueError, match=r"gv\.normal at address 'x'.*loc \(3,\).*scale \(4,\).*broadcast") as info:
        bad.simulate(KEY)
    assert info.value.__cause__ is not None  # JAX's own error stays chained


def test_shape_mismatch_at_an_observation():
    @gv.gen
    def bad():
        gv.observe(gv.normal(jnp.zeros(3), 1.0), jnp.zeros(4))

    with pytest.raises(ValueError, match=r"observation of gv\.normal.*\(4,\).*loc \(3,\)"):
        bad.simulate(KEY)
    with pytest.raises(ValueError, match=r"observation of gv\.normal"):
        bad.log_density(gv.choices({}))


def test_shape_mismatch_in_an_unnamed_sample():
    @gv.expectation
    def bad(m):
        return jnp.sum(gv.sample(gv.normal(m + jnp.zeros(3), jnp.ones(4), grad=gv.REPARAM)))

    with pytest.raises(ValueError, match=r"unnamed gv\.sample of gv\.normal.*\(3,\).*\(4,\)"):
        bad.estimate(KEY, 0.5)


# --------------------------------------------------------------------------- gv.batch_mean data

@gv.expectation
def per_point(m, x):
    return gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM)) * x


def test_batch_mean_of_a_python_list():
    with pytest.raises(ValueError, match=r"argument 1 \(x\).*axis 0.*Python list.*jnp\.asarray"):
        gv.batch_mean(per_point).grad_estimate(KEY, 0.5, [1.0, 2.0])


def test_batch_mean_of_a_scalar():
    with pytest.raises(ValueError, match=r"argument 1 \(x\).*axis 0.*shape \(\).*leading"):
        gv.batch_mean(per_point).grad_estimate(KEY, 0.5, 2.0)


def test_batch_mean_maps_part_of_an_argument_like_vmap():
    # in_axes may be a pytree prefix of an argument, as in jax.vmap: a shared mean and
    # one offset per datapoint
    @gv.expectation
    def sq(p, x):
        return (p["shared"] + p["local"] - x) ** 2

    p = {"shared": jnp.array(0.5), "local": jnp.array([0.0, 1.0, -1.0])}
    x = jnp.array([1.0, 2.0, 3.0])
    obj = gv.batch_mean(sq, in_axes=({"shared": None, "local": 0}, 0))
    value, g = obj.value_and_grad_estimate(KEY, p, x)
    r = p["shared"] + p["local"] - x
    np.testing.assert_allclose(value, jnp.mean(r ** 2), rtol=1e-6)
    np.testing.assert_allclose(g["shared"], jnp.mean(2 * r), rtol=1e-6)
    np.testing.assert_allclose(g["local"], 2 * r / 3, rtol=1e-6)
    with pytest.raises(ValueError, match=r"in_axes for argument 0 \(p\).*not a prefix"):
        gv.batch_mean(sq, in_axes=({"other": 0}, 0)).estimate(KEY, p, x)


# --------------------------------------------------------------------------- a distribution as a value

def test_returned_distribution_without_address():
    @gv.gen
    def forgot():
        return gv.normal(0.0, 1.0)

    with pytest.raises(TypeError, match=r"'forgot' returns gv\.normal.*@ \"address\""):
        forgot.simulate(KEY)


def test_distribution_in_arithmetic_or_jnp():
    @gv.gen
    def arith():
        return gv.normal(0.0, 1.0) * 2.0

    @gv.gen
    def through_jnp():
        return jnp.exp(gv.normal(0.0, 1.0))

    with pytest.raises(TypeError, match=r"gv\.normal.*not a value.*@ \"address\".*gv\.sample"):
        arith.simulate(KEY)
    # jnp functions catch TypeErrors from their arguments, so this one is a ValueError
    with pytest.raises(ValueError, match=r"gv\.normal.*not a value.*@ \"address\""):
        through_jnp.simulate(KEY)


def test_program_call_used_as_a_value():
    @gv.gen
    def outer():
        return model(1.0) + 1.0

    with pytest.raises(TypeError, match=r"model\(\.\.\.\) is not a value.*@ \"address\".*model\.sim"):
        outer.simulate(KEY)


def test_method_of_a_program_call():
    with pytest.raises(AttributeError, match=r"model\(\.\.\.\) makes a program call.*model\.simulate\(key"):
        model(1.0).simulate(KEY)


def test_non_string_address():
    @gv.gen
    def numbered():
        return gv.normal(0.0, 1.0) @ 3

    with pytest.raises(TypeError, match=r"addresses are strings.*got 3 \(int\).*gv\.vmap"):
        numbered.simulate(KEY)


# --------------------------------------------------------------------------- missing params keys

def test_missing_params_key_in_a_program():
    @gv.gen
    def prior(params):
        return gv.normal(params["mu"], 1.0) @ "x"

    with pytest.raises(KeyError, match=r"program 'prior'.*'mu'.*argument 0.*\['mus'\].*Did you mean 'mus'"):
        prior.simulate(KEY, {"mus": 1.0})


def test_missing_nested_params_key_in_an_objective():
    @gv.expectation
    def loss(params, x):
        return gv.sample(gv.normal(params["enc"]["w"], 1.0, grad=gv.REPARAM)) * x

    with pytest.raises(KeyError, match=r"objective 'loss'.*'w'.*" + q("params['enc']") + r".*\['W'\]"):
        loss.grad_estimate(KEY, {"enc": {"W": 0.0}}, 1.0)


def test_other_key_errors_are_untouched():
    @gv.gen
    def local():
        table = {"a": 1.0}
        return gv.normal(table["b"], 1.0) @ "x"

    with pytest.raises(KeyError) as info:
        local.simulate(KEY)
    assert type(info.value) is KeyError and info.value.args == ("b",)
