"""The mistakes of a new user's first hour get clear words that name the fix:

* a distribution call without `@ "addr"` in a program (or never drawn in an objective)
  is an error naming the distribution, the line and `@ "name"`, never a silent drop;
  every legitimate use of a distribution call stays silent;
* a plain function (no `@gv.gen`) passed as a model, guide or program is a TypeError
  naming the argument and `@gv.gen`, at every entry point;
* a Python `if` on a latent is an error naming the latent, the line and the fixes,
  chained from JAX's TracerBoolConversionError;
* `grad=` on a model site that an objective only scores warns, naming the site and
  the strategy; a model the objective samples, or a guide only scored, does not.
"""

import warnings

import jax
import jax.numpy as jnp
import optax
import pytest

import genvi as gv
from genvi.core.program_mistakes import TracedConditionError, UnusedStrategyWarning
from programs import model

KEY = jax.random.key(0)


@gv.gen
def guide(p, y):
    gv.normal(p, 1.0, grad=gv.REPARAM) @ "z"


# --------------------------------------------------------------------------- unaddressed samples

@gv.gen
def forgot_address(y):
    z = gv.normal(0.0, 1.0) @ "z"
    gv.normal(z, 1.0)                                     # no @ "x": would be dropped
    gv.observe(gv.normal(z, 1.0), y)


def test_a_sample_without_an_address_is_an_error_naming_the_distribution_and_the_fix():
    with pytest.raises(TypeError) as err:
        forgot_address.simulate(KEY, 0.0)
    text = str(err.value)
    assert "forgot_address" in text and "gv.normal(...)" in text
    assert '@ "name"' in text and "silently dropped" in text
    assert "test_first_hour.py" in text and "gv.normal(z, 1.0)" in text   # the line itself
    with pytest.raises(TypeError, match="never sampled"):           # also when scoring it
        forgot_address.log_density(gv.choices({"z": 0.0}), 0.0)


@gv.gen
def inner(mu):
    gv.bernoulli(logits=jnp.zeros(2))                            # in a sub-program
    return gv.normal(mu, 1.0) @ "x"


@gv.gen
def outer():
    return inner(0.0) @ "sub"


@gv.gen
def in_vmap(mus):
    return gv.vmap(gv.gen(lambda m: (gv.flip(0.5), gv.normal(m, 1.0) @ "x")[1]))(mus) @ "v"


@gv.gen
def in_scan():
    def step(c, _):
        gv.poisson(2.0)
        return gv.normal(c, 1.0) @ "x", None
    return gv.scan(gv.gen(step), length=3)(0.0) @ "s"


@gv.gen
def in_cond(i):
    def branch(m):
        gv.gamma(2.0, 1.0)
        return gv.normal(m, 1.0) @ "x"
    return jax.lax.cond(i > 0, branch, branch, 0.0)


@pytest.mark.parametrize("program, args, dist", [
    (outer, (), "gv.bernoulli"), (in_vmap, (jnp.zeros(3),), "gv.flip"),
    (in_scan, (), "gv.poisson"), (in_cond, (1,), "gv.gamma")])
def test_unaddressed_samples_are_found_in_sub_programs_combinators_and_branches(program, args, dist):
    with pytest.raises(TypeError, match=f"{dist}\\(\\.\\.\\.\\).*@ \"name\""):
        program.simulate(KEY, *args)


def test_an_objective_that_makes_a_distribution_call_and_never_draws_it_says_gv_sample():
    @gv.expectation
    def objective(mu):
        gv.normal(mu, 1.0, grad=gv.REPARAM)
        return mu ** 2
    with pytest.raises(TypeError, match=r"objective 'objective'.*gv\.sample\(gv\.normal"):
        objective.estimate(KEY, 1.0)


def sample_it(call, name):
    return call @ name


@gv.gen
def every_legitimate_use(p, y):
    d = gv.normal(0.0, 1.0)
    z = d @ "z"                                           # sampled later, by name
    w = sample_it(gv.normal(z, 1.0), "w")                 # passed to a helper that samples it
    gv.observe(gv.normal(w, 1.0), y)                      # observed
    gv.factor(gv.normal(0.0, 2.0).log_prob(z))            # read for its density
    gv.observe(gv.normal(z, 1.0), None, name="y_new")     # a named observation, drawn later
    per_point = gv.gen(lambda m: gv.normal(m, 1.0) @ "u")
    return gv.plate(per_point, size=4)(jnp.zeros(2)) @ "data"


def test_every_legitimate_use_of_a_distribution_call_is_silent():
    draws = gv.predictive(every_legitimate_use, None, None, 5)(KEY, 1.0)
    assert draws["y_new"].shape == (5,) and draws["data", "u"].shape == (5, 2)

    @gv.expectation
    def objective(mu):
        x = gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
        return x ** 2
    assert jnp.isfinite(objective.grad_estimate(KEY, 1.0))
    sir = gv.normalize(model, gv.importance(guide, particles=3))
    gv.elbo(model, sir).estimate(KEY, 0.0, 1.0)
    gv.elbo(model, gv.marginal(guide, keep=["z"])).estimate(KEY, 0.0, 1.0)


# --------------------------------------------------------------------------- plain functions

def plain_model(p, y):
    z = gv.normal(0.0, 1.0) @ "z"
    gv.observe(gv.normal(z, 1.0), y)


def plain_guide(p, y):
    gv.normal(p, 1.0, grad=gv.REPARAM) @ "z"


@pytest.mark.parametrize("build, arg", [
    (lambda: gv.elbo(plain_model, guide), "model"),
    (lambda: gv.elbo(model, plain_guide), "guide"),
    (lambda: gv.iwelbo(plain_model, guide, particles=3), "model"),
    (lambda: gv.renyi(model, plain_guide, alpha=0.5, particles=3), "guide"),
    (lambda: gv.vimco(plain_model, guide, particles=3), "model"),
    (lambda: gv.dreg(model, plain_guide, particles=3), "guide"),
    (lambda: gv.wake_model(plain_model, guide, particles=3), "model"),
    (lambda: gv.wake_guide(model, plain_guide, particles=3), "guide"),
    (lambda: gv.sleep_guide(plain_model, guide), "model"),
    (lambda: gv.forward_kl_sir(model, plain_guide, particles=3), "guide"),
    (lambda: gv.smc(plain_model, guide, init=0.0, particles=3), "model_step"),
    (lambda: gv.predictive(plain_model, guide, 0.0, 10), "model"),
    (lambda: gv.predictive(model, plain_guide, 0.0, 10), "guide"),
    (lambda: gv.auto_normal(plain_model), "model"),
    (lambda: gv.auto_delta(plain_model), "model"),
    (lambda: gv.vmap(plain_guide), "program"),
    (lambda: gv.repeat(plain_guide, 3), "program"),
    (lambda: gv.scan(plain_guide), "program"),
    (lambda: gv.marginal(plain_guide, keep=["z"]), "program"),
    (lambda: gv.normalize(plain_model), "program"),
    (lambda: gv.importance(plain_guide, particles=2), "proposal"),
])
def test_a_plain_function_as_a_program_names_the_argument_and_gv_gen(build, arg):
    with pytest.raises(TypeError) as err:
        build()
    text = str(err.value)
    assert f"the {arg}" in text and "plain Python function" in text
    assert "@gv.gen" in text and "def plain_" in text


def test_a_program_call_or_an_objective_in_place_of_a_program_says_what_to_pass():
    with pytest.raises(TypeError, match=r"program call model\(\.\.\.\); pass the program itself"):
        gv.elbo(model(0.0, 1.0), guide)
    with pytest.raises(TypeError, match="the objective 'elbo', not a program"):
        gv.elbo(gv.elbo(model, guide), guide)


def test_fit_of_a_plain_function_says_which_decorator():
    with pytest.raises(TypeError, match=r"@gv\.expectation.*@gv\.gen.*gv\.elbo\(model, guide\)"):
        gv.fit(plain_model, 0.0, 1.0, optimizer=optax.adam(0.1), steps=2, key=KEY,
               progress=False)


# --------------------------------------------------------------------------- Python control flow

@gv.gen
def branches_in_python(p, y):
    z = gv.normal(0.0, 1.0) @ "z"
    if z > 0:                                             # traced: no concrete value
        gv.observe(gv.normal(z, 1.0), y)


def test_a_python_if_on_a_latent_names_the_latent_the_line_and_the_fixes():
    with pytest.raises(TracedConditionError) as err:
        gv.elbo(branches_in_python, guide).estimate(KEY, 0.0, 1.0)
    text = str(err.value)
    assert "'branches_in_python'" in text and "the latent 'z'" in text
    assert "test_first_hour.py" in text and "`if z > 0:`" in text
    assert "jnp.where" in text and "jax.lax.cond" in text and "gv.ENUM" in text
    assert isinstance(err.value, TypeError)
    assert isinstance(err.value.__cause__, jax.errors.TracerBoolConversionError)


def test_a_python_while_on_an_argument_under_vmap_and_in_an_objective():
    @gv.gen
    def loops(y):
        x = gv.normal(0.0, 1.0) @ "x"
        while y > x:
            y = y - 1.0
    with pytest.raises(TracedConditionError, match=r"the latent 'x'.*while y > x"):
        gv.vmap(loops).simulate(KEY, jnp.ones(3))

    @gv.expectation
    def objective(mu):
        x = gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
        return x if 2 * x > mu else -x
    with pytest.raises(TracedConditionError, match=r"objective 'objective' uses a traced value"):
        objective.estimate(KEY, 0.0)


# --------------------------------------------------------------------------- grad= on model sites

@gv.gen
def model_with_grad(p, y):
    z = gv.normal(0.0, 1.0, grad=gv.MVD) @ "z"
    b = gv.flip(0.5, grad=gv.ENUM) @ "b"
    gv.observe(gv.normal(z + b, 1.0), y)


@gv.gen
def guide_zb(p, y):
    gv.normal(p, 1.0, grad=gv.REPARAM) @ "z"
    gv.flip(0.3, grad=gv.REINFORCE) @ "b"


def unused_strategy_warnings(objective, *args):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        objective.grad_estimate(KEY, *args)
    return [str(w.message) for w in caught if issubclass(w.category, UnusedStrategyWarning)]


def test_grad_on_a_model_site_that_the_objective_only_scores_warns():
    found = unused_strategy_warnings(gv.elbo(model_with_grad, guide_zb), 0.0, 1.0)
    assert len(found) == 1
    text = found[0]
    assert "'elbo'" in text and "'model_with_grad'" in text
    assert "'b' (grad=gv.ENUM)" in text and "'z' (grad=gv.MVD)" in text
    assert "put grad= there" in text
    assert issubclass(UnusedStrategyWarning, UserWarning) and gv.UnusedStrategyWarning is UnusedStrategyWarning


def test_a_model_site_with_the_guide_sites_strategy_does_not_warn():
    # a sub-program shared by model and guide carries the same grad= in both: nothing
    # misleads; only the site whose strategy differs from the guide's is named
    @gv.gen
    def guide_same_b(p, y):
        gv.normal(p, 1.0, grad=gv.REPARAM) @ "z"
        gv.flip(0.3, grad=gv.ENUM) @ "b"

    found = unused_strategy_warnings(gv.elbo(model_with_grad, guide_same_b), 0.0, 1.0)
    assert len(found) == 1
    assert "'z' (grad=gv.MVD)" in found[0] and "'b'" not in found[0]


def test_no_warning_where_the_model_is_sampled_or_has_no_grad_or_a_guide_is_only_scored():
    assert unused_strategy_warnings(gv.elbo(model, guide), 0.0, 1.0) == []
    # gv.importance(proposal=None) samples the model with its own strategies
    sir = gv.normalize(model_with_grad, gv.importance(particles=2, resample=gv.REINFORCE))
    assert unused_strategy_warnings(gv.elbo(model_with_grad, sir), 0.0, 1.0) == []
    # the sleep phase scores the guide only: a guide's grad= is for its own sim
    assert unused_strategy_warnings(gv.sleep_guide(model, guide), 0.0, 1.0) == []


@gv.gen
def indexed_by_a_flip(p, y):
    b = gv.flip(0.3) @ "b"
    means = jnp.array([-1.0, 1.0])
    gv.observe(gv.normal(means[b], 1.0), y)                # a bool index: a mask


def test_a_flip_used_as_an_index_names_the_latent_and_the_fix():
    from genvi.core.program_mistakes import BooleanIndexError
    with pytest.raises(BooleanIndexError) as err:
        indexed_by_a_flip.simulate(KEY, 0.0, 1.0)
    text = str(err.value)
    assert "'indexed_by_a_flip'" in text and "the latent 'b'" in text
    assert "`gv.observe(gv.normal(means[b], 1.0), y)" in text
    assert "b.astype(jnp.int32)" in text and "jnp.where" in text
    assert isinstance(err.value.__cause__, jax.errors.NonConcreteBooleanIndexError)
