"""Lane-local replays (genvi.replays.lanes): ENUM and MVD at a batched site evaluate every
lane's alternatives in one lane-tracked evaluation of the rest of the objective.

* On the same key they give the same estimate as whole-objective replays, for flip,
  bernoulli, categorical (through a one-hot matrix product) and the count
  distributions, under gv.vmap and gv.repeat.
* Their mean matches the exact gradient (enumeration over every joint value of a
  small plate) within 5 standard errors.
* A continuation that couples the lanes (a max, a logsumexp across the plate) takes
  the general path where they couple and stays unbiased.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv
from estimates import moments, within
from genvi.replays.engine import whole_objective_replays

KEY = jax.random.key(0)
B = 5
YS = jnp.linspace(-2.0, 2.0, B)


def plate_elbo(strategy, site="flip", plate="vmap"):
    """An ELBO over a plate: z_i from the site's distribution, y_i ~ normal(g(z_i), 1)."""
    def draw(theta, grad):
        if site == "flip":
            return gv.flip(jax.nn.sigmoid(theta), grad=grad)
        if site == "bernoulli":
            return gv.bernoulli(logits=theta, grad=grad)
        if site == "flip_structured":
            return gv.flip(jax.nn.sigmoid(theta), grad=grad)
        if site in ("categorical", "categorical_index"):
            return gv.categorical(jnp.stack([theta, -theta, 0.5 * theta]), grad=grad)
        if site == "poisson":
            return gv.poisson(jnp.exp(theta), grad=grad)
        if site == "binomial":
            return gv.binomial(4, jax.nn.sigmoid(theta), grad=grad)
        return gv.geometric(jax.nn.sigmoid(theta), grad=grad)

    def mean_of(z):
        if site == "categorical":  # a one-hot row times a table: a matrix product
            return jax.nn.one_hot(z, 3) @ jnp.array([-1.0, 0.5, 2.0])
        if site == "flip_structured":  # pad, reverse and split along a non-lane axis
            v = jnp.pad(jnp.array([1.0, -2.0, 0.5, 1.5]) * (z + 0.5), (1, 2), constant_values=0.3)
            first, second = jnp.split(v[::-1], [3])
            return jnp.sum(first) - 0.5 * jnp.sum(second)
        if site == "categorical_index":  # a row of a table, rows[z] (as a mixture's
            # means[z]): JAX builds the index vectors with a concatenate, then gathers
            return jnp.sum(jnp.array([[-1.0, 0.2], [0.5, 0.0], [2.0, -0.3]])[z])
        return jnp.where(z > 0, 1.0, -1.0) * (1.0 + 0.1 * z)

    @gv.gen
    def model_i(theta, y):
        z = draw(jnp.zeros_like(theta), None) @ "z"
        gv.observe(gv.normal(mean_of(z), 1.0), y)

    @gv.gen
    def guide_i(theta, y):
        draw(theta, strategy) @ "z"

    if plate == "vmap":
        mapped = gv.vmap
    else:  # gv.repeat over one shared parameter and one datum
        def mapped(g):
            return lambda theta, y: gv.repeat(g, B)(theta, y)

    @gv.gen
    def model(theta, ys):
        mapped(model_i)(theta, ys) @ "p"

    @gv.gen
    def guide(theta, ys):
        mapped(guide_i)(theta, ys) @ "p"

    return gv.elbo(model, guide)


def _args(plate):
    return (jnp.linspace(-1.0, 1.0, B), YS) if plate == "vmap" else (jnp.float32(0.3), 0.5)


SAME_KEY = [("flip", gv.ENUM, "vmap"), ("flip", gv.MVD, "vmap"), ("bernoulli", gv.ENUM, "vmap"),
            ("categorical", gv.ENUM, "vmap"), ("categorical", gv.MVD, "vmap"),
            ("categorical_index", gv.ENUM, "vmap"), ("categorical_index", gv.MVD, "vmap"),
            ("flip_structured", gv.ENUM, "vmap"), ("flip_structured", gv.MVD, "vmap"),
            ("poisson", gv.MVD, "vmap"), ("binomial", gv.MVD, "vmap"),
            ("geometric", gv.MVD, "vmap"), ("flip", gv.ENUM, "repeat")]


@pytest.mark.parametrize("site,strategy,plate", SAME_KEY)
def test_lane_local_equals_whole_objective_replays_on_the_same_key(site, strategy, plate):
    args = _args(plate)
    keys = jax.random.split(KEY, 4)
    objective = plate_elbo(strategy, site, plate)
    fast = jax.jit(jax.vmap(lambda k: objective.grad_estimate(k, *args)))(keys)
    with whole_objective_replays():
        general = plate_elbo(strategy, site, plate)
        slow = jax.jit(jax.vmap(lambda k: general.grad_estimate(k, *args)))(keys)
    (entry,) = objective.explain(*args).sites
    assert entry["replays"].endswith(f"× {B} lanes: lane-local"), entry
    np.testing.assert_allclose(fast, slow, rtol=2e-5, atol=2e-5)


def _over_flips(theta, f):
    """E f(z) for z ~ flip(sigmoid(θ)) lane by lane, by enumerating all 2^B joint values
    (`f(z)` takes z as floats)."""
    total = 0.0
    for z in itertools.product([0, 1], repeat=B):
        z = jnp.array(z, jnp.float32)
        q = jnp.prod(jnp.where(z > 0, jax.nn.sigmoid(theta), 1 - jax.nn.sigmoid(theta)))
        total = total + q * f(z)
    return total


def _exact_plate_gradient(theta):
    """d/dθ of the flip-plate ELBO by enumerating all 2^B joint values."""
    def elbo(theta):
        def log_p_minus_log_q(z):
            q_lane = jnp.where(z > 0, jax.nn.sigmoid(theta), 1 - jax.nn.sigmoid(theta))
            mean = jnp.where(z > 0, 1.0, -1.0) * (1.0 + 0.1 * z)
            log_p = jnp.sum(jnp.log(0.5) + jax.scipy.stats.norm.logpdf(YS, mean, 1.0))
            return log_p - jnp.sum(jnp.log(q_lane))
        return _over_flips(theta, log_p_minus_log_q)
    return jax.grad(elbo)(theta)


@pytest.mark.parametrize("strategy", [gv.ENUM, gv.MVD])
def test_lane_local_mean_matches_enumeration(strategy):
    theta = jnp.linspace(-1.0, 1.0, B)
    n = 20_000
    obj = plate_elbo(strategy)
    grads = jax.jit(jax.vmap(lambda k: obj.grad_estimate(k, theta, YS)))(jax.random.split(KEY, n))
    exact = _exact_plate_gradient(theta)
    se = grads.std(0) / np.sqrt(n) + 1e-6
    assert np.all(np.abs(grads.mean(0) - exact) < 5 * se), (grads.mean(0), exact, se)


COUPLINGS = {
    "max": lambda v: jnp.max(v),
    "logsumexp": lambda v: jax.nn.logsumexp(v),
    "product of sums": lambda v: jnp.sum(v[:2]) * jnp.sum(v),
}


@pytest.mark.parametrize("name", list(COUPLINGS))
def test_coupled_continuations_take_the_general_path_and_stay_unbiased(name):
    couple = COUPLINGS[name]
    c = jnp.array([0.5, -1.0, 2.0, 1.5, -0.3])

    @gv.expectation
    def objective(theta):
        z = gv.sample(gv.flip(jax.nn.sigmoid(theta), grad=gv.ENUM), name="z")
        return couple(jnp.sin(c * z + theta))

    def exact(theta):
        return _over_flips(theta, lambda z: couple(jnp.sin(c * z + theta)))

    theta = jnp.linspace(-1.0, 1.0, B)
    n = 20_000
    grads = jax.jit(jax.vmap(lambda k: objective.grad_estimate(k, theta)))(jax.random.split(KEY, n))
    (entry,) = objective.explain(theta).sites
    assert "lanes coupled at" in entry["replays"], entry
    truth = jax.grad(exact)(theta)
    se = grads.std(0) / np.sqrt(n) + 1e-6
    assert np.all(np.abs(grads.mean(0) - truth) < 5 * se), (grads.mean(0), truth, se)


def test_a_cond_holding_sites_is_replayed_lane_by_lane_and_stays_unbiased():
    """A `cond` on the lanes holding a sampling site: each lane's replay takes the branch
    its value chooses and draws there with the run's key, as a whole replay does."""
    c = jnp.array([0.5, -1.0, 2.0, 1.5, -0.3])

    def make():
        @gv.expectation
        def objective(theta):
            z = gv.sample(gv.flip(jax.nn.sigmoid(theta), grad=gv.ENUM), name="z")
            w = jax.lax.cond(jnp.sum(z) > 2,
                             lambda: gv.sample(gv.normal(theta[0], 1.0, grad=gv.REPARAM)),
                             lambda: gv.sample(gv.normal(-1.0, 2.0, grad=gv.REPARAM)))
            return jnp.sin(w + jnp.sum(c * z))
        return objective

    def exact(theta):  # E sin(w + a) = sin(m + a) exp(-s²/2) for w ~ N(m, s)
        def given(z):
            a = jnp.sum(c * z)
            return jnp.where(jnp.sum(z) > 2, jnp.sin(theta[0] + a) * jnp.exp(-0.5),
                             jnp.sin(-1.0 + a) * jnp.exp(-2.0))
        return _over_flips(theta, given)

    theta, objective = jnp.linspace(-1.0, 1.0, B), make()
    entry = objective.explain(theta).sites[0]
    assert entry["replays"] == f"1 × {B} lanes: lane-local", entry  # not whole replays
    keys = jax.random.split(KEY, 20_000)
    grads = jax.jit(jax.vmap(lambda k: objective.grad_estimate(k, theta)))(keys)
    with whole_objective_replays():
        whole = make()
        slow = jax.jit(jax.vmap(lambda k: whole.grad_estimate(k, theta)))(keys[:8])
    np.testing.assert_allclose(grads[:8], slow, rtol=1e-5, atol=1e-5)
    truth = jax.grad(exact)(theta)
    se = grads.std(0) / np.sqrt(len(keys)) + 1e-6
    assert np.all(np.abs(grads.mean(0) - truth) < 5 * se), (grads.mean(0), truth, se)


@pytest.mark.parametrize("site", ["flip", "categorical_index"])
def test_estimator_size_does_not_grow_quadratically_with_lanes(site):
    """FLOPs of the compiled ENUM gradient step grow linearly in the plate size."""
    def flops(b):
        theta, ys = jnp.zeros(b), jnp.linspace(-2.0, 2.0, b)
        return plate_elbo(gv.ENUM, site).explain(theta, ys).flops_gradient
    small, large = flops(500), flops(2000)
    assert large / small < 4.5, (small, large)   # linear: 4; the general path: 16


def test_explain_names_each_site_its_strategy_and_its_replays():
    @gv.gen
    def step(c, _):
        b = gv.flip(jax.nn.sigmoid(c), grad=gv.MVD) @ "b"   # depends on θ via the carry
        return c + b, b

    @gv.gen
    def guide(theta):
        gv.normal(theta, 1.0, grad=gv.REPARAM) @ "z"
        gv.flip(jax.nn.sigmoid(theta), grad=gv.ENUM) @ "k"
        gv.scan(step, length=4)(theta, None) @ "s"

    @gv.gen
    def model(theta):
        z = gv.normal(0.0, 1.0) @ "z"
        k = gv.flip(0.5) @ "k"
        total, _ = gv.scan(step, length=4)(theta, None) @ "s"
        gv.observe(gv.normal(z * k + total, 1.0), 1.0)

    objective = gv.elbo(model, guide)
    text = str(objective.explain(0.5))
    assert "z  " in text and "gv.REPARAM" in text and "none" in text
    assert "exact enumeration" in text                      # the top-level ENUM flip
    assert "scan(4)" in text and "after the scan" in text   # MVD inside the scan
    assert "FLOPs" in text


def scan_plate_elbo(strategy):
    """A plate inside each step of a gv.scan, its lanes carried to the next step."""
    @gv.gen
    def point_guide(logit, y):
        return gv.flip(jax.nn.sigmoid(logit), grad=strategy) @ "z"

    @gv.gen
    def point_model(logit, y):
        z = gv.flip(0.5) @ "z"
        gv.observe(gv.normal(jnp.where(z, 1.0, -1.0), 1.0), y)
        return z

    def stepper(point):
        @gv.gen
        def step(logits, ys):
            zs = gv.vmap(point)(logits, ys) @ "p"
            return logits + 0.5 * zs, zs
        return step

    @gv.gen
    def guide(logits, ys):
        gv.scan(stepper(point_guide))(logits, ys) @ "s"

    @gv.gen
    def model(logits, ys):
        gv.scan(stepper(point_model))(logits, ys) @ "s"

    return gv.elbo(model, guide)


@pytest.mark.parametrize("strategy", [gv.ENUM, gv.MVD])
def test_plates_inside_scan_are_lane_local_and_equal_whole_replays(strategy):
    logits, ys = jnp.linspace(-1.0, 1.0, B), jnp.linspace(-2.0, 2.0, 3 * B).reshape(3, B)
    keys = jax.random.split(KEY, 4)
    objective = scan_plate_elbo(strategy)
    fast = jax.jit(jax.vmap(lambda k: objective.grad_estimate(k, logits, ys)))(keys)
    with whole_objective_replays():
        general = scan_plate_elbo(strategy)
        slow = jax.jit(jax.vmap(lambda k: general.grad_estimate(k, logits, ys)))(keys)
    (entry,) = objective.explain(logits, ys).sites
    # the guide's carry keeps each step's change (it feeds the next step's logits), so
    # each step is replayed, lane-locally
    assert "lane-local, after the scan; not Markov-local" in entry["replays"], entry
    np.testing.assert_allclose(fast, slow, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("grad", [gv.ENUM, gv.MVD])
def test_a_call_holding_sites_after_a_scan_draws_as_the_run_drew(grad):
    """A `jax.jit` holding a site, after a scan whose sites are replayed: the replays
    draw the call's site as the run drew it (it used to reach XLA unevaluated)."""
    @gv.expectation
    def e(p):
        def step(total, _):
            b = gv.sample(gv.flip(p, grad=grad), name="b")
            return total + jnp.where(b, 1.0, 0.0), None

        total, _ = jax.lax.scan(step, 0.0, None, length=3)
        c = jax.jit(lambda q: gv.sample(gv.flip(q, grad=grad), name="c"))(p)
        return total * jnp.where(c, 1.0, 0.0)   # E = 3 p², d/dp = 6 p

    p = 0.3
    v, v_se, g, g_se, _ = moments(e, p)
    assert within(v, v_se, 3 * p * p) and within(g, g_se, 6 * p), (v, v_se, g, g_se)
