"""A learned surrogate's or baseline's operands must read parameters of their own
(`genvi.adev.variance_training`): `gv.RELAX`'s phi and a learned
`gv.REINFORCE.with_baseline` put the estimator's variance gradient on what they read,
so a parameter the objective also reads would be trained on the sum. Each refused case
is first shown biased: its gradient estimate, averaged, misses the exact gradient."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv


def linear(phi, z):
    return jnp.sum(phi["w"] * z) + phi["b"]


def f_of(x):
    return jnp.where(x, 1.0, 3.0)


def exact_grad(theta):  # d/dθ E f(x), x ~ Bernoulli(σ(θ)): (1 − 3) σ'(θ)
    s = jax.nn.sigmoid(theta)
    return -2.0 * s * (1 - s)


def shared_logit_objective(stop):
    @gv.expectation
    def e(params):
        logit = jax.lax.stop_gradient(params["theta"]) if stop else params["theta"]
        phi = {"w": params["w"] * logit, "b": 0.0}
        x = gv.sample(gv.bernoulli(logits=params["theta"], grad=gv.RELAX(linear, phi)), name="x")
        return f_of(x)
    return e


PARAMS = {"theta": jnp.float32(0.4), "w": jnp.float32(1.5)}


def test_the_refused_case_is_biased_and_stop_gradient_is_not():
    # the same estimator with the check out of the way (the parameter read twice under
    # two names, which genvi cannot tell from two parameters): its mean gradient in θ
    # misses the exact one; with stop_gradient it is unbiased
    @gv.expectation
    def twice(params):
        phi = {"w": params["w"] * params["theta_too"], "b": 0.0}
        x = gv.sample(gv.bernoulli(logits=params["theta"], grad=gv.RELAX(linear, phi)), name="x")
        return f_of(x)
    keys = jax.random.split(jax.random.key(0), 20_000)
    both = {**PARAMS, "theta_too": PARAMS["theta"]}
    g = jax.jit(jax.vmap(lambda k: twice.grad_estimate(k, both)))(keys)
    summed = np.asarray(g["theta"]) + np.asarray(g["theta_too"])  # the gradient in θ
    se = summed.std() / np.sqrt(summed.size)
    assert abs(summed.mean() - exact_grad(0.4)) > 5 * se
    g = jax.jit(jax.vmap(lambda k: shared_logit_objective(True).grad_estimate(k, PARAMS)))(keys)
    est = np.asarray(g["theta"])
    assert abs(est.mean() - exact_grad(0.4)) < 5 * est.std() / np.sqrt(est.size)


def test_relax_reading_the_sites_own_parameter_is_refused():
    with pytest.raises(gv.VarianceTrainingError) as err:
        shared_logit_objective(False).grad_estimate(jax.random.key(0), PARAMS)
    text = str(err.value)
    assert "gv.RELAX(linear, phi) at 'x' (gv.bernoulli)" in text
    assert "params['theta']" in text and "params['w']" not in text.splitlines()[0]
    assert "jax.lax.stop_gradient" in text
    shared_logit_objective(True).grad_estimate(jax.random.key(0), PARAMS)  # no error


def test_a_parameter_reaching_the_objectives_value_is_refused():
    @gv.expectation
    def e(params):
        phi = {"w": params["scale"], "b": 0.0}
        x = gv.sample(gv.bernoulli(logits=params["theta"], grad=gv.RELAX(linear, phi)), name="x")
        return params["scale"] * f_of(x)
    with pytest.raises(gv.VarianceTrainingError, match=r"params\['scale'\]"):
        e.grad_estimate(jax.random.key(0), {"theta": 0.4, "scale": 2.0})


def test_a_parameter_reaching_the_objective_through_a_zero_derivative_is_not():
    # round, floor, ceil and sign have derivative zero: the objective's gradient gets
    # nothing in `scale` from them, so training it for the variance biases nothing
    for step in (jnp.round, jnp.floor, jnp.ceil, jnp.sign):
        @gv.expectation
        def e(params, step=step):
            phi = {"w": params["scale"], "b": 0.0}
            x = gv.sample(gv.bernoulli(logits=params["theta"], grad=gv.RELAX(linear, phi)), name="x")
            return step(params["scale"]) * f_of(x)
        g = e.grad_estimate(jax.random.key(0), {"theta": 0.4, "scale": 2.0})
        assert np.isfinite(g["scale"])


def test_only_differentiated_inputs_count():
    @gv.expectation
    def e(theta, phi):
        x = gv.sample(gv.bernoulli(logits=theta, grad=gv.RELAX(linear, phi)), name="x")
        return f_of(x) * phi["w"]
    phi = {"w": jnp.float32(1.0), "b": jnp.float32(0.0)}
    e.grad_estimate(jax.random.key(0), 0.4, phi)  # phi not differentiated: nothing to train
    e.estimate(jax.random.key(0), 0.4, phi)
    with pytest.raises(gv.VarianceTrainingError, match=r"phi\['w'\]"):
        e.grad_estimate(jax.random.key(0), 0.4, phi, argnums=(0, 1))


def test_a_learned_baseline_sharing_a_parameter_is_refused():
    @gv.expectation
    def e(params):
        baseline = params["b"] * 2.0
        x = gv.sample(gv.normal(params["mu"] + params["b"], 1.0,
                                grad=gv.REINFORCE.with_baseline(baseline)), name="x")
        return x ** 2
    with pytest.raises(gv.VarianceTrainingError) as err:
        e.grad_estimate(jax.random.key(0), {"mu": 0.5, "b": 0.1})
    assert "gv.REINFORCE.with_baseline(baseline) at 'x' (gv.normal)" in str(err.value)

    @gv.expectation
    def own(params):
        x = gv.sample(gv.normal(params["mu"], 1.0,
                                grad=gv.REINFORCE.with_baseline(params["b"])), name="x")
        return x ** 2
    own.grad_estimate(jax.random.key(0), {"mu": 0.5, "b": 0.1})  # its own: no error

    # AIR's baseline: its network's value times the previous presence, a discrete value
    # whose law reads the guide's parameters but whose tangent is none: no error
    @gv.expectation
    def after_a_flip(params):
        first = gv.sample(gv.flip(jax.nn.sigmoid(params["theta"]), grad=gv.ENUM), name="first")
        b = params["b"] * first.astype(jnp.float32)
        x = gv.sample(gv.normal(params["theta"], 1.0, grad=gv.REINFORCE.with_baseline(b)),
                      name="x")
        return x ** 2 + first
    after_a_flip.grad_estimate(jax.random.key(0), {"theta": 0.5, "b": 0.1})


def test_found_through_scans_conds_and_calls():
    @gv.gen
    def chain(params):
        @gv.gen
        def step(carry, _):
            phi = {"w": carry, "b": 0.0}
            x = gv.flip(jax.nn.sigmoid(params["theta"]), grad=gv.RELAX(linear, phi)) @ "x"
            return carry * 0.5, x
        gv.scan(step)(params["w"], jnp.arange(3)) @ "steps"

    @gv.expectation
    def through_the_carry(params):
        choices, _ = chain.sim(params)
        xs = choices["steps", "x"]
        return jnp.sum(f_of(xs)) + jax.jit(lambda w: jax.lax.cond(w > 0, jnp.sin, jnp.cos, w))(
            params["w"])
    with pytest.raises(gv.VarianceTrainingError, match=r"params\['w'\]"):
        through_the_carry.grad_estimate(jax.random.key(0), {"theta": 0.4, "w": 1.0})

    @gv.expectation
    def carry_only(params):
        choices, _ = chain.sim(params)
        return jnp.sum(f_of(choices["steps", "x"]))
    carry_only.grad_estimate(jax.random.key(0), {"theta": 0.4, "w": 1.0})  # w: phi's alone


def test_found_in_a_switch_among_strategies():
    @gv.expectation
    def e(params, which):
        phi = {"w": params["theta"], "b": 0.0}
        grad = gv.switch(which, [gv.ENUM, gv.RELAX(linear, phi)])
        return f_of(gv.sample(gv.bernoulli(logits=params["theta"], grad=grad), name="x"))
    with pytest.raises(gv.VarianceTrainingError, match=r"params\['theta'\]"):
        e.grad_estimate(jax.random.key(0), {"theta": 0.4}, jnp.int32(1))


@jax.custom_vjp
def product(x, y):
    return x * y


product.defvjp(lambda x, y: (x * y, (x, y)), lambda r, g: (g * r[1], g * r[0]))


@jax.custom_jvp
def sine(x):
    return jnp.sin(x)


sine.defjvp(lambda p, t: (jnp.sin(p[0]), jnp.cos(p[0]) * t[0]))


@pytest.mark.parametrize("use,refused", [("custom_vjp", True), ("custom_jvp", True),
                                         ("neither", False)])
def test_found_through_functions_with_their_own_derivative(use, refused):
    @gv.expectation
    def e(params):
        phi = {"w": params["w"], "b": 0.0}
        x = gv.sample(gv.bernoulli(logits=params["theta"], grad=gv.RELAX(linear, phi)), name="x")
        extra = {"custom_vjp": product(params["c"], params["w"]), "custom_jvp": sine(params["w"]),
                 "neither": product(params["c"], 2.0) + sine(params["c"])}[use]
        return f_of(x) + extra
    params = {"theta": 0.3, "w": 1.0, "c": 0.5}
    if refused:
        with pytest.raises(gv.VarianceTrainingError, match=r"params\['w'\]"):
            e.grad_estimate(jax.random.key(0), params)
    else:
        e.grad_estimate(jax.random.key(0), params)


def test_checked_in_the_built_in_objectives():
    @gv.gen
    def model(params, y):
        z = gv.flip(0.5) @ "z"
        gv.observe(gv.normal(jnp.where(z, 1.0, -1.0), 1.0), y)

    @gv.gen
    def guide(params, y):
        phi = {"w": params["theta"], "b": 0.0}
        gv.bernoulli(logits=params["theta"], grad=gv.RELAX(linear, phi)) @ "z"
    for objective, y in ((gv.elbo(model, guide), 0.5),
                         (gv.batch_mean(gv.elbo(model, guide)), jnp.ones(4))):
        with pytest.raises(gv.VarianceTrainingError, match=r"argument 0\['theta'\]"):
            objective.grad_estimate(jax.random.key(0), {"theta": 0.3}, y)
