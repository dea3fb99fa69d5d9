"""AIR's pattern in miniature, checked against exact enumeration: presence variables
in a `gv.scan` whose probability is forced to 0 once an object is absent (so ENUM /
MVD meet alternatives of probability 0), continuous sites masked inside a `cond` on
presence, in model and guide, for every z_pres strategy, alone and in a batch.

Model: pres_t ~ flip(0.6 · pres_{t−1}); if pres_t: z_t ~ N(0, 1); y ~ N(Σ pres_t z_t, σ).
Guide: pres_t ~ flip(sigmoid(logit_t) · pres_{t−1}); if pres_t: z_t ~ N(mu, 1) (REPARAM).
Per presence path with n objects, E_q[log p − log q] is in closed form."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv

T, SIGMA, Y, N = 2, 0.7, 1.3, 20000
PARAMS = {"logits": jnp.array([0.3, -0.2]), "mu": jnp.array(0.4)}


@gv.gen
def model(params, y):
    @gv.gen
    def step(carry, _):
        total, prev = carry
        pres = gv.flip(0.6 * prev) @ "pres"
        total = jax.lax.cond(pres, lambda s: s + (gv.normal(0.0, 1.0) @ "z"), lambda s: s, total)
        return (total, pres.astype(jnp.float32)), None

    (total, _), _ = gv.scan(step, length=T)((jnp.zeros(()), jnp.ones(())), None) @ "steps"
    gv.observe(gv.normal(total, SIGMA), y)


def guide_with(pres_grad):
    @gv.gen
    def guide(params, y):
        @gv.gen
        def step(prev, t):
            p = jax.nn.sigmoid(params["logits"][t]) * prev
            pres = gv.flip(p, grad=pres_grad(t)) @ "pres"
            jax.lax.cond(pres, lambda: gv.normal(params["mu"], 1.0, grad=gv.REPARAM) @ "z",
                         lambda: jnp.zeros(()))
            return pres.astype(jnp.float32), None

        gv.scan(step)(jnp.ones(()), jnp.arange(T)) @ "steps"
    return guide


def exact_elbo(params):
    """Σ over presence paths (0,0), (1,0), (1,1) of q(path) · E[log p − log q | path]."""
    total = 0.0
    for n in range(T + 1):
        q_path, p_path, q_live, p_live = 1.0, 1.0, 1.0, 1.0
        for t in range(T):
            q1, p1 = jax.nn.sigmoid(params["logits"][t]) * q_live, 0.6 * p_live
            on = t < n
            q_path *= q1 if on else 1 - q1
            p_path *= p1 if on else 1 - p1
            q_live, p_live = (q_live, p_live) if on else (0.0, 0.0)
        mu = params["mu"]
        lik = -0.5 * math.log(2 * math.pi * SIGMA ** 2) - ((Y - n * mu) ** 2 + n) / (2 * SIGMA ** 2)
        total = total + q_path * (jnp.log(p_path) - jnp.log(q_path) + lik - n * mu ** 2 / 2)
    return total


STRATEGIES = {
    "REINFORCE": lambda t: gv.REINFORCE,
    "ENUM": lambda t: gv.ENUM,
    "MVD": lambda t: gv.MVD,
    "switch(MVD, ENUM)": lambda t: gv.switch(t, [gv.MVD, gv.ENUM]),
}


def _check(values, grads, exact_value, exact_grads):
    v = np.asarray(values)
    assert abs(v.mean() - exact_value) < 5 * v.std() / math.sqrt(len(v)) + 1e-5
    for name in exact_grads:
        g = np.asarray(grads[name]).reshape(len(v), -1)
        e = np.asarray(exact_grads[name]).reshape(-1)
        se = g.std(0) / math.sqrt(len(v))
        assert np.all(np.abs(g.mean(0) - e) < 5 * se + 1e-5), (name, g.mean(0), e)


@pytest.mark.parametrize("name", list(STRATEGIES))
def test_masked_presence_elbo_gradient_matches_enumeration(name):
    obj = gv.elbo(model, guide_with(STRATEGIES[name]))
    keys = jax.random.split(jax.random.key(0), N)
    values, grads = jax.jit(jax.vmap(lambda k: obj.value_and_grad_estimate(k, PARAMS, Y)))(keys)
    assert all(bool(jnp.all(jnp.isfinite(g))) for g in jax.tree_util.tree_leaves(grads))
    _check(values, grads, float(exact_elbo(PARAMS)), jax.grad(exact_elbo)(PARAMS))


@pytest.mark.parametrize("name", ["ENUM", "MVD"])
def test_masked_presence_batch_mean_matches_enumeration(name):
    # the same datapoint twice: the batch mean has the single-datapoint expectation
    obj = gv.batch_mean(gv.elbo(model, guide_with(STRATEGIES[name])))
    ys = jnp.full((2,), Y)
    keys = jax.random.split(jax.random.key(1), N // 2)
    values, grads = jax.jit(jax.vmap(lambda k: obj.value_and_grad_estimate(k, PARAMS, ys)))(keys)
    _check(values, grads, float(exact_elbo(PARAMS)), jax.grad(exact_elbo)(PARAMS))


def test_flip_log_density_has_finite_gradient_at_zero_probability():
    g = jax.grad(lambda p: gv.flip.log_prob(jnp.array(False), p))(0.0)
    assert float(g) == -1.0
    assert float(gv.flip.log_prob(jnp.array(True), 0.0)) == -np.inf


def test_switch_rejects_non_strategies_and_unsupported_kinds():
    with pytest.raises(TypeError, match="gradient strategies"):
        gv.switch(0, [gv.MVD, "ENUM"])

    @gv.gen
    def bad(params):
        gv.normal(params, 1.0, grad=gv.switch(0, [gv.REPARAM, gv.ENUM])) @ "x"

    @gv.expectation
    def obj(params):
        _, log_q = bad.sim(params)
        return log_q

    with pytest.raises(ValueError, match="does not support the ENUM"):
        obj.grad_estimate(jax.random.key(0), 0.0)


# Sites with several lanes inside a longer scan: their replays are deferred to after the
# scan and evaluated a few steps at a time (all steps at once, in groups, one by one).
def _lanes_objective(dist, grad):
    @gv.gen
    def chain(theta):
        @gv.gen
        def step(prev, theta_t):
            strategy = grad(theta_t) if callable(grad) else grad
            x = dist(theta_t + 0.5 * prev, strategy) @ "x"
            return x.astype(jnp.float32), None

        gv.scan(step)(jnp.zeros(theta.shape[1]), theta) @ "steps"

    @gv.expectation
    def objective(theta):
        choices, _ = chain.sim(theta)
        xs = choices["steps", "x"].astype(jnp.float32)
        weights = jnp.arange(1.0, xs.size + 1).reshape(xs.shape) / xs.size
        s = jnp.sum(weights * xs)
        return jnp.sin(2.0 * s) + s * s
    return chain, objective


def _flip(logits, grad):
    return gv.flip(jax.nn.sigmoid(logits), grad=grad)


def _categorical(logits, grad):  # three values per lane; logits shifted per value
    return gv.categorical(logits[:, None] * jnp.array([0.0, 1.0, -0.5]), grad=grad)


def _exact_lanes(theta, support):
    steps, lanes = theta.shape
    grids = np.array(np.meshgrid(*[support] * (steps * lanes), indexing="ij"))
    configs = jnp.asarray(grids.reshape(steps * lanes, -1).T.reshape(-1, steps, lanes))

    def one(xs):
        prev, logq = jnp.zeros(lanes), 0.0
        for t in range(steps):
            logits = theta[t] + 0.5 * prev
            if len(support) == 2:
                logq += jnp.sum(gv.flip.log_prob(xs[t].astype(bool), jax.nn.sigmoid(logits)))
            else:
                lp = jax.nn.log_softmax(logits[:, None] * jnp.array([0.0, 1.0, -0.5]), -1)
                logq += jnp.sum(jnp.take_along_axis(lp, xs[t][:, None].astype(jnp.int32), 1))
            prev = xs[t].astype(jnp.float32)
        weights = jnp.arange(1.0, xs.size + 1).reshape(xs.shape) / xs.size
        s = jnp.sum(weights * xs)
        return jnp.exp(logq) * (jnp.sin(2.0 * s) + s * s)

    return jnp.sum(jax.vmap(one)(configs))


@pytest.mark.parametrize("dist, shape, support, grad", [
    (_flip, (3, 1), (0, 1), gv.MVD),          # 3 replays: one group
    (_flip, (4, 2), (0, 1), gv.MVD),          # 2 per step: groups of 2 steps
    (_flip, (4, 2), (0, 1), gv.ENUM),
    (_categorical, (3, 2), (0, 1, 2), gv.ENUM),  # 4 per step: one step at a time
    # gv.switch by step: REINFORCE's branch pads MVD's replays with dead terms ...
    (_flip, (4, 2), (0, 1), lambda th: gv.switch(th[0] > 0, [gv.REINFORCE, gv.MVD])),
    # ... while ENUM (2 values) and MVD (3) differ, so each branch replays in place
    (_categorical, (3, 2), (0, 1, 2), lambda th: gv.switch(th[0] > 0, [gv.ENUM, gv.MVD])),
], ids=["flip-1-lane-MVD", "flip-2-lanes-MVD", "flip-2-lanes-ENUM", "categorical-2-lanes-ENUM",
        "flip-switch-REINFORCE-MVD", "categorical-switch-ENUM-MVD"])
def test_deferred_replays_of_many_lane_sites_in_scan_match_enumeration(dist, shape, support, grad):
    theta = jnp.linspace(-0.8, 0.9, shape[0] * shape[1]).reshape(shape)
    _, objective = _lanes_objective(dist, grad)
    keys = jax.random.split(jax.random.key(2), N)
    values, grads = jax.jit(jax.vmap(lambda k: objective.value_and_grad_estimate(k, theta)))(keys)
    exact = _exact_lanes(theta, support)
    _check(values, {"theta": grads}, float(exact), {"theta": jax.grad(_exact_lanes)(theta, support)})
