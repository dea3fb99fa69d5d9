"""Trustworthy gradients (issue 14): what a strategy cannot differentiate is refused.

* The smoothness check refuses a REPARAM value reaching a discontinuity (a step
  selecting a value or a branch, floor/round/sign, integer casts, argmax, a while
  predicate, a distribution parameter), naming the site, the primitive and the
  user's line; `gv.assume_continuous` opts out; smooth programs pass and stay
  unbiased (statistical tests, 2·10^4 estimates, 5 standard errors).
* A program with `gv.observe` used as a guide or proposal is refused.
* VIMCO and DReG refuse guide sites with a strategy they are biased for.
* `jax.grad` of `estimate` is the ADEV estimator, not the pathwise derivative.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.stats import norm

import genvi as gv
from programs import model

KEY = jax.random.key(0)
N = 20_000
HERE = __file__.rsplit("/", 1)[-1]


def _refused(objective, *args, site="'x'", prim=""):
    with pytest.raises(gv.DiscontinuityError) as info:
        objective.grad_estimate(KEY, *args)
    msg = str(info.value)
    assert site in msg and prim in msg, msg
    assert HERE in msg, msg                         # the user's source line
    assert "gv.REINFORCE" in msg and "gv.assume_continuous" in msg, msg
    return msg


def _normal_site(mu, grad=gv.REPARAM):
    return gv.sample(gv.normal(mu, 1.0, grad=grad), name="x")


# --------------------------------------------------------------------------- refused uses

def test_step_through_where_is_refused():
    @gv.expectation
    def step(mu):
        return jnp.where(_normal_site(mu) > 0, 1.0, 0.0)
    msg = _refused(step, 0.0, prim="select_n")
    assert "`gt`" in msg


def test_floor_and_sign_and_round_are_refused():
    for f, prim in ((jnp.floor, "floor"), (jnp.sign, "sign"), (jnp.round, "round")):
        @gv.expectation
        def obj(mu, f=f):
            return f(_normal_site(mu))
        _refused(obj, 0.0, prim=prim)


def test_integer_cast_and_bool_to_float_are_refused():
    @gv.expectation
    def to_int(mu):
        return _normal_site(mu).astype(jnp.int32).astype(jnp.float32)
    _refused(to_int, 0.0, prim="convert_element_type")

    @gv.expectation
    def indicator(mu):
        return (_normal_site(mu) > 0.5).astype(jnp.float32)
    _refused(indicator, 0.0, prim="convert_element_type")


def test_argmax_and_argsort_are_refused():
    @gv.expectation
    def amax(mu):
        x = gv.sample(gv.mv_normal_diag(mu * jnp.ones(3), jnp.ones(3), grad=gv.REPARAM), name="x")
        return jnp.asarray(jnp.argmax(x), jnp.float32)
    _refused(amax, 0.0, prim="argmax")

    @gv.expectation
    def asort(mu):
        x = gv.sample(gv.mv_normal_diag(mu * jnp.ones(3), jnp.ones(3), grad=gv.REPARAM), name="x")
        return jnp.sum(jnp.arange(3.0)[jnp.argsort(x)] * x)
    _refused(asort, 0.0, prim="sort")


def test_uniform_reparam_deciding_a_step_is_refused():
    @gv.expectation
    def coin(p):
        u = gv.sample(gv.uniform(0.0, 1.0, grad=gv.REPARAM), name="u")
        return jnp.where(u < p, 1.0, 0.0)
    _refused(coin, 0.3, site="'u'", prim="select_n")


def test_model_cond_on_a_reparam_guide_value_is_refused():
    """The paper's example: the model branches on a value the guide reparameterizes."""
    @gv.gen
    def model(mu):
        x = gv.normal(0.0, 1.0) @ "x"
        jax.lax.cond(x > 0, lambda: gv.normal(1.0, 1.0) @ "y", lambda: gv.normal(-1.0, 1.0) @ "y")

    @gv.gen
    def guide(mu):
        gv.normal(mu, 1.0, grad=gv.REPARAM) @ "x"
        gv.normal(mu, 1.0, grad=gv.REPARAM) @ "y"

    msg = _refused(gv.elbo(model, guide), 0.0, prim="cond")
    assert "model)" in msg and "interpreters.py" not in msg   # the model's line


def test_while_predicate_and_step_as_parameter_are_refused():
    @gv.expectation
    def loop(mu):
        x = _normal_site(mu)
        _, n = jax.lax.while_loop(lambda c: c[0] < 3.0, lambda c: (c[0] + 1.0, c[1] + 1.0), (x, 0.0))
        return n
    _refused(loop, 0.0, prim="while")

    @gv.expectation
    def param(mu):
        x = _normal_site(mu)
        b = gv.sample(gv.flip(jnp.where(x > 0, 0.9, 0.1), grad=gv.ENUM))
        return jnp.where(b, 1.0, 0.0)
    _refused(param, 0.0, prim="select_n")


def test_step_inside_scan_and_vmap_is_refused():
    @gv.expectation
    def scanned(mu):
        x = gv.sample(gv.mv_normal_diag(mu * jnp.ones(4), jnp.ones(4), grad=gv.REPARAM), name="x")
        _, ys = jax.lax.scan(lambda c, xi: (c + xi, jnp.floor(c)), 0.0, x)
        return jnp.sum(ys)
    _refused(scanned, 0.0, prim="floor")

    @gv.gen
    def point(mu):
        return gv.normal(mu, 1.0, grad=gv.REPARAM) @ "x"

    @gv.expectation
    def batched(mu):
        choices, _ = gv.repeat(point, 5).sim(mu)
        return jnp.sum(jnp.where(choices["x"] > 0, 1.0, 0.0))
    _refused(batched, 0.0, prim="select_n")


def test_unnamed_site_is_named_as_such():
    @gv.expectation
    def step(mu):
        return jnp.floor(gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM)))
    _refused(step, 0.0, site="an unnamed gv.sample", prim="floor")


# --------------------------------------------------------------------------- accepted uses

def _grad_stats(objective, *args):
    keys = jax.random.split(jax.random.key(1), N)
    g = jax.jit(jax.vmap(lambda k: objective.grad_estimate(k, *args)))(keys)
    g = np.asarray(g, np.float64)
    return g.mean(), g.std() / math.sqrt(N)


def test_smooth_but_nondifferentiable_uses_pass_and_stay_unbiased():
    """relu, abs, clip, max and logsumexp (whose guards compare the value) are
    continuous: REPARAM is unbiased. d/dμ E[relu(x) + |x| + clip(x, −1, 1)] with
    x ~ N(μ, 1) is Φ(μ) + (2Φ(μ) − 1) + Φ(1 − μ) − Φ(−1 − μ)."""
    @gv.expectation
    def smooth(mu):
        x = _normal_site(mu)
        guards = jnp.where(x == 0, 1.0, x) - x + jnp.where(jnp.isnan(x), 0.0, 0.0)
        return jax.nn.relu(x) + jnp.abs(x) + jnp.clip(x, -1.0, 1.0) + guards

    mu = 0.3
    exact = norm.cdf(mu) + 2 * norm.cdf(mu) - 1 + norm.cdf(1 - mu) - norm.cdf(-1 - mu)
    mean, se = _grad_stats(smooth, mu)
    assert abs(mean - exact) < 5 * se, (mean, exact, se)


def test_assume_continuous_opts_out_and_stays_unbiased():
    """A hand-written relu, `where(x > 0, x, 0)`, is continuous: the user says so."""
    @gv.assume_continuous()
    def my_relu(x):
        return jnp.where(x > 0, x, 0.0)

    @gv.expectation
    def decorated(mu):
        return my_relu(_normal_site(mu))

    @gv.expectation
    def scoped(mu):
        x = _normal_site(mu)
        with gv.assume_continuous():
            y = jnp.where(x > 0, x, 0.0)
        return y

    mu = -0.4
    for obj in (decorated, scoped):
        mean, se = _grad_stats(obj, mu)
        assert abs(mean - norm.cdf(mu)) < 5 * se, (mean, norm.cdf(mu), se)


def test_support_checks_inside_densities_are_not_uses():
    """A uniform model density tests its support on the guide's REPARAM value; the
    ELBO of a uniform guide inside it is unbiased: E_q[log p − log q] with p =
    U(0, 2), q = U(0, b): log(b/2)... d/db = 1/b."""
    @gv.gen
    def model(b):
        gv.uniform(0.0, 2.0) @ "u"

    @gv.gen
    def guide(b):
        gv.uniform(0.0, b, grad=gv.REPARAM) @ "u"

    b = 1.5
    mean, se = _grad_stats(gv.elbo(model, guide), b)
    assert abs(mean - 1 / b) < 5 * se + 1e-4, (mean, 1 / b, se)


def test_reinforce_through_a_step_is_accepted_and_unbiased():
    """The fix the error suggests: REINFORCE at the site. d/dμ P(x > 0) = φ(μ)."""
    @gv.expectation
    def step(mu):
        return jnp.where(_normal_site(mu, grad=gv.REINFORCE) > 0, 1.0, 0.0)

    mean, se = _grad_stats(step, 0.0)
    assert abs(mean - norm.pdf(0.0)) < 5 * se, (mean, norm.pdf(0.0), se)


def test_steps_on_discrete_values_are_fine():
    @gv.expectation
    def e(p):
        b = gv.sample(gv.flip(p, grad=gv.ENUM))
        return jnp.where(b, 1.0, 3.0)
    assert float(e.grad_estimate(KEY, 0.25)) == -2.0


# --------------------------------------------------------------------------- normalization

@gv.gen
def _observing_guide(mu, y):
    z = gv.normal(mu, 1.0, grad=gv.REPARAM) @ "z"
    gv.observe(gv.normal(z, 1.0), y)


@gv.gen
def _guide(mu, y):
    gv.normal(mu, 1.0, grad=gv.REPARAM) @ "z"


def _unnormalized(objective, *args):
    with pytest.raises(gv.UnnormalizedError) as info:
        objective.grad_estimate(KEY, *args)
    msg = str(info.value)
    assert "_observing_guide" in msg and "gv.observe(gv.normal" in msg and "gv.normalize" in msg
    assert HERE in msg, msg


def test_guide_with_observe_is_refused():
    _unnormalized(gv.elbo(model, _observing_guide), 0.0, 1.0)


def test_proposal_with_observe_is_refused():
    @gv.gen
    def posterior(mu, y):
        z = gv.normal(0.0, 1.0, grad=gv.REPARAM) @ "z"
        gv.observe(gv.normal(z, 1.0), y)

    sir = gv.normalize(posterior, gv.importance(_observing_guide, particles=3))
    _unnormalized(gv.elbo(model, sir), 0.0, 1.0)


def test_sleep_phase_guide_with_observe_is_refused():
    _unnormalized(gv.sleep_guide(model, _observing_guide), 0.0, 1.0)


def test_normalize_of_a_model_is_a_valid_guide():
    @gv.gen
    def posterior(mu, y):
        z = gv.normal(mu, 1.0, grad=gv.REPARAM) @ "z"
        gv.observe(gv.normal(z, 1.0), y)
    sir = gv.normalize(posterior, gv.importance(particles=3))
    assert np.isfinite(float(gv.elbo(model, sir).grad_estimate(KEY, 0.0, 1.0)))


# --------------------------------------------------------------------------- prerequisites

def test_vimco_refuses_reparam_guides_and_dreg_refuses_score_guides():
    with pytest.raises(ValueError, match=r"gv.vimco needs grad=gv.REINFORCE.*'z'"):
        gv.vimco(model, _guide, particles=4).grad_estimate(KEY, 0.0, 1.0)

    @gv.gen
    def score_guide(mu, y):
        gv.normal(mu, 1.0, grad=gv.REINFORCE) @ "z"

    with pytest.raises(ValueError, match=r"gv.dreg needs grad=gv.REPARAM.*'z'"):
        gv.dreg(model, score_guide, particles=4).grad_estimate(KEY, 0.0, 1.0)
    baseline = gv.REINFORCE.with_baseline(0.0)

    @gv.gen
    def baseline_guide(mu, y):
        gv.normal(mu, 1.0, grad=baseline) @ "z"

    assert np.isfinite(float(gv.vimco(model, baseline_guide, 4).grad_estimate(KEY, 0.0, 1.0)))
    with pytest.raises(TypeError, match="tractable density"):
        gv.dreg(model, gv.marginal(_guide, keep=["z"]), 2).grad_estimate(KEY, 0.0, 1.0)


# --------------------------------------------------------------------------- jax.grad(estimate)

def test_jax_grad_of_estimate_is_the_adev_estimator():
    """With REINFORCE, the pathwise derivative of the value estimate is 2x (biased:
    the truth for E[x²] is 2μ only by luck of the integrand, so use E[x³] = μ³ + 3μ,
    d/dμ = 3μ² + 3); jax.grad of `estimate` equals `grad_estimate` key by key."""
    @gv.expectation
    def cube(mu):
        return _normal_site(mu, grad=gv.REINFORCE) ** 3

    mu = 0.5
    keys = jax.random.split(jax.random.key(2), N)
    via_grad = jax.jit(jax.vmap(lambda k: jax.grad(cube.estimate, 1)(k, mu)))(keys)
    direct = jax.jit(jax.vmap(lambda k: cube.grad_estimate(k, mu)))(keys)
    np.testing.assert_allclose(via_grad, direct, rtol=1e-5, atol=1e-5)
    g = np.asarray(via_grad, np.float64)
    assert abs(g.mean() - (3 * mu ** 2 + 3)) < 5 * g.std() / math.sqrt(N)
    tangent = jax.jvp(lambda m: cube.estimate(KEY, m), (mu,), (1.0,))[1]
    assert np.isclose(float(tangent), float(cube.grad_estimate(KEY, mu)), rtol=1e-5)


def test_a_jump_that_does_not_move_with_the_parameters_is_fine():
    """x ~ N(0, 1) drawn by REPARAM, free of θ: E[1(x > 0)·θ + 1(x > θ)·0] ...
    d/dθ E[1(x > 0)·θ] = 1/2, and REPARAM is unbiased for it; but 1(x > θ) moves."""
    @gv.expectation
    def fixed_jump(theta):
        x = gv.sample(gv.normal(0.0, 1.0, grad=gv.REPARAM), name="x")
        return jnp.where(x > 0, theta, 0.0)

    mean, se = _grad_stats(fixed_jump, 0.7)
    assert abs(mean - 0.5) < 5 * se, (mean, se)

    @gv.expectation
    def moving_jump(theta):
        x = gv.sample(gv.normal(0.0, 1.0, grad=gv.REPARAM), name="x")
        return jnp.where(x > theta, 1.0, 0.0)
    _refused(moving_jump, 0.7, prim="select_n")


def test_estimate_alone_is_never_refused():
    @gv.expectation
    def step(mu):
        return jnp.where(_normal_site(mu) > 0, 1.0, 0.0)
    keys = jax.random.split(KEY, 4000)
    values = jax.vmap(lambda k: step.estimate(k, 0.0))(keys)
    assert abs(float(values.mean()) - 0.5) < 5 * 0.5 / math.sqrt(4000)
