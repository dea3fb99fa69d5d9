"""Numerics at the edges (issue 14, item 6).

* An alternative of probability 0 (a flip whose probability is forced to 0 by an
  earlier choice, or saturated to exactly 0 or 1 in float32) contributes exactly 0 to
  the ENUM / MVD / REINFORCE estimators, never NaN: in forward mode (`jvp_estimate`)
  and in reverse mode (`grad_estimate`, JAX's transpose, where a masked term's zero
  cotangent meets its derivative d log q = dq / q = ∞), at top level and inside
  `gv.vmap`, `gv.repeat`, `gv.scan` and `lax.cond`.
* Beta, gamma and Dirichlet draws stay inside the open support in float32.
* Every built-in distribution at extreme valid parameters: finite samples, log
  densities and gradient estimates for each strategy it supports.

Exact values come from enumeration in the test itself; statistical checks take 10^4
estimates and allow 5 standard errors.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv

N = 10_000
LOG_HALF = math.log(0.5)
PARAMS = {"lb": jnp.array(0.3), "lc": jnp.array(-0.2)}
DIRECTION = {"lb": jnp.array(0.7), "lc": jnp.array(1.3)}  # forward-mode tangent


def _close(estimates, exact, what=""):
    """All finite, and the mean within 5 standard errors (+ float32 round-off)."""
    e = np.asarray(estimates, np.float64).reshape(len(estimates), -1)
    exact = np.asarray(exact, np.float64).reshape(-1)
    assert np.all(np.isfinite(e)), f"{what}: {np.sum(~np.isfinite(e))} non-finite estimates"
    se = e.std(0) / math.sqrt(len(e))
    tol = 5 * se + 1e-5 * (1 + np.abs(exact))
    assert np.all(np.abs(e.mean(0) - exact) <= tol), (what, e.mean(0), exact, se)


# ------------------------------------------------------------------ b ~ flip, c ~ flip(q·b)
# Model b ~ flip(.5), c ~ flip(σ(lm)·b), n ~ geometric(1 − .5·b); guide b ~ flip(σ(lb)),
# c ~ flip(σ(lc)·b), n ~ geometric(1 − σ(lc)·b). When b = False, c = True has
# probability 0 under both (log p − log q is −inf + inf there), and n's success
# probability is 1 (xlog1py's derivative is 0/0 at the only value n = 0).

PARAMS = {"lb": jnp.array(0.3), "lc": jnp.array(-0.2), "lm": jnp.array(0.4)}
DIRECTION = {"lb": jnp.array(0.7), "lc": jnp.array(1.3), "lm": jnp.array(-0.6)}


def pair_elbo(params, count=True):
    """The exact ELBO of one (b, c, n) triple: b = False forces c = n = 0 in both."""
    qb, qc, pm = (jax.nn.sigmoid(params[k]) for k in ("lb", "lc", "lm"))
    c = qc * (jnp.log(pm) - jnp.log(qc)) + (1 - qc) * (jnp.log1p(-pm) - jnp.log1p(-qc))
    # n ~ geometric(1 − qc): E n = qc / (1 − qc); log-densities n log(1 − p) + log p
    n = qc / (1 - qc) * (LOG_HALF - jnp.log(qc)) + LOG_HALF - jnp.log1p(-qc)
    on = LOG_HALF - jnp.log(qb) + c + (n if count else 0.0)
    return (1 - qb) * (LOG_HALF - jnp.log1p(-qb)) + qb * on


def pair_model(count=True):
    @gv.gen
    def model(params, i):
        b = gv.flip(0.5) @ "b"
        gv.flip(jax.nn.sigmoid(params["lm"]) * b) @ "c"
        if count:
            gv.geometric(1 - 0.5 * b) @ "n"
    return model


def pair_guide(grad, count=True):
    count_grad = gv.MVD if grad is gv.ENUM else grad   # geometric has no ENUM

    @gv.gen
    def guide(params, i):
        b = gv.flip(jax.nn.sigmoid(params["lb"]), grad=grad) @ "b"
        q = jax.nn.sigmoid(params["lc"]) * b
        gv.flip(q, grad=grad) @ "c"
        if count:
            gv.geometric(1 - q, grad=count_grad) @ "n"
    return guide


@gv.gen
def cond_model(params, i):
    b = gv.flip(0.5) @ "b"
    pm = jax.nn.sigmoid(params["lm"])

    def on():
        gv.flip(pm) @ "c"
        gv.geometric(0.5) @ "n"

    def off():   # the untaken branch is evaluated too (a select), at the guide's values
        gv.flip(0.0 * pm) @ "c"
        gv.geometric(1.0) @ "n"
    jax.lax.cond(b, on, off)


def cond_guide(grad):
    count_grad = gv.MVD if grad is gv.ENUM else grad

    @gv.gen
    def guide(params, i):
        b = gv.flip(jax.nn.sigmoid(params["lb"]), grad=grad) @ "b"
        q = jax.nn.sigmoid(params["lc"])

        def branch(q):
            def run():
                gv.flip(q, grad=grad) @ "c"
                gv.geometric(1 - q, grad=count_grad) @ "n"
            return run
        jax.lax.cond(b, branch(q), branch(0.0 * q))
    return guide


L = 3  # lanes of gv.vmap / gv.repeat, steps of gv.scan


def _scan(g):
    """`g` in each of L steps of a gv.scan."""
    @gv.gen
    def step(params, _):
        g(params, 0.0) @ "pair"
        return params, None

    @gv.gen
    def program(params, i):
        gv.scan(step, length=L)(params) @ "steps"
    return program


COMBINATORS = {  # name: (wrap a program, its argument i, how many copies of the triple)
    "top": (lambda g: g, 0.0, 1),
    "cond": (None, 0.0, 1),
    "vmap": (lambda g: gv.vmap(g, in_axes=(None, 0)), jnp.arange(L, dtype=jnp.float32), L),
    "repeat": (lambda g: gv.repeat(g, L), 0.0, L),
    "scan": (_scan, 0.0, L),
}


def _elbo(where, grad):
    wrap, _, _ = COMBINATORS[where]
    if where == "cond":
        return gv.elbo(cond_model, cond_guide(grad))
    return gv.elbo(wrap(pair_model()), wrap(pair_guide(grad)))


def test_enum_probability_zero_alternative_is_exact():
    # The case (no n): d/dlc was NaN against the exact 0.028437 in reverse mode.
    params = {**PARAMS, "lm": jnp.array(0.0)}
    obj = gv.elbo(pair_model(count=False), pair_guide(gv.ENUM, count=False))
    grads = obj.grad_estimate(jax.random.key(0), params, 0.0)
    exact = jax.grad(lambda p: pair_elbo(p, count=False))(params)
    assert float(exact["lc"]) == pytest.approx(0.028437, abs=1e-6)
    for name in params:
        assert float(grads[name]) == pytest.approx(float(exact[name]), rel=1e-5, abs=1e-7)


# Replays (lane-by-lane ENUM, MVD) in each combinator; REINFORCE at top level (it replays
# nothing). Each case is one jit of 10^4 forward and reverse estimates, 3–6 s of
# compilation: the suite runs one case per combinator, `-m slow` the others.
SLOW = pytest.mark.slow
CASES = [("top", "ENUM"), ("top", "MVD"), ("top", "REINFORCE"), ("cond", "ENUM"),
         ("vmap", "ENUM"), ("scan", "MVD"),
         pytest.param("cond", "MVD", marks=SLOW), pytest.param("vmap", "MVD", marks=SLOW),
         pytest.param("repeat", "ENUM", marks=SLOW), pytest.param("scan", "ENUM", marks=SLOW)]


@pytest.mark.parametrize("where, grad", CASES)
def test_probability_zero_alternative_forward_and_reverse(where, grad):
    _, i, copies = COMBINATORS[where]
    obj = _elbo(where, getattr(gv, grad))

    def one(key):
        value, grads = obj.value_and_grad_estimate(key, PARAMS, i)
        _, tangent = obj.jvp_estimate(key, (PARAMS, i), (DIRECTION, None))
        return value, grads, tangent

    value, grads, tangent = jax.jit(jax.vmap(one))(jax.random.split(jax.random.key(1), N))
    exact = jax.grad(pair_elbo)(PARAMS)
    directional = sum(float(exact[k]) * float(DIRECTION[k]) for k in exact)
    _close(value, copies * float(pair_elbo(PARAMS)), f"{where} {grad} value")
    _close(np.stack([grads[k] for k in PARAMS], 1), [copies * float(exact[k]) for k in PARAMS],
           f"{where} {grad} reverse")
    _close(tangent, copies * directional, f"{where} {grad} forward")


# ------------------------------------------------------------------ Pyro's test_avoid_nan
# Port of pyro tests/infer/test_enum.py::test_avoid_nan: model and guide flips with
# probabilities 0, 0.5, 1, the guide's as parameters, enumerated. Exact values: the
# derivative of the enumerated ELBO over the values of positive probability (the others
# contribute 0): d/dq (1 − q)(0 − log(1 − q)) = 1 at q = 0, 0 at q = p = .5, and
# d/dq q (0 − log q) = −1 at q = 1.
AVOID_NAN_Q = jnp.array([0.0, 0.5, 1.0])


def _avoid_nan_exact():
    def elbo(q):
        total = 0.0
        for i, q0 in enumerate(np.asarray(AVOID_NAN_Q)):   # static: the live values at q0
            p = float(AVOID_NAN_Q[i])
            if q0 > 0:
                total += q[i] * (math.log(p) - jnp.log(q[i]))
            if q0 < 1:
                total += (1 - q[i]) * (math.log1p(-p) - jnp.log1p(-q[i]))
        return total
    return jax.grad(elbo)(AVOID_NAN_Q)


@gv.gen
def avoid_nan_model(q):
    for i in range(3):
        gv.flip(AVOID_NAN_Q[i]) @ f"z{i}"


@gv.gen
def avoid_nan_guide(q):
    for i in range(3):
        gv.flip(q[i], grad=gv.ENUM) @ f"z{i}"


@gv.gen
def avoid_nan_plate_model(q):
    gv.flip(AVOID_NAN_Q) @ "z"


@gv.gen
def avoid_nan_plate_guide(q):
    gv.flip(q, grad=gv.ENUM) @ "z"


def _value_grad_tangent(obj, direction):
    def one(key, q):
        value, grad = obj.value_and_grad_estimate(key, q)
        return value, grad, obj.jvp_estimate(key, (q,), (direction,))[1]
    return one


def test_pyro_avoid_nan():
    exact = np.asarray(_avoid_nan_exact())
    np.testing.assert_allclose(exact, [1.0, 0.0, -1.0], atol=1e-6)
    direction = jnp.array([1.0, 2.0, 3.0])
    # Three sites, enumerated exactly (was NaN in all three entries): deterministic.
    sites = _value_grad_tangent(gv.elbo(avoid_nan_model, avoid_nan_guide), direction)
    value, grad, tangent = jax.jit(sites)(jax.random.key(2), AVOID_NAN_Q)
    assert float(value) == pytest.approx(0.0, abs=1e-6)
    np.testing.assert_allclose(np.asarray(grad), exact, atol=1e-6)
    assert float(tangent) == pytest.approx(float(exact @ direction), abs=1e-5)
    # One plated site (Pyro's form), enumerated lane by lane: unbiased.
    plate = _value_grad_tangent(gv.elbo(avoid_nan_plate_model, avoid_nan_plate_guide), direction)
    keys = jax.random.split(jax.random.key(2), N)
    value, grad, tangent = jax.jit(jax.vmap(plate, (0, None)))(keys, AVOID_NAN_Q)
    _close(value, 0.0, "plate value")
    _close(grad, exact, "plate reverse")
    _close(tangent, exact @ direction, "plate forward")


# ------------------------------------------------------------------ saturated probabilities
SATURATED = jnp.array([17.0, -17.0, 40.0, -40.0])  # σ(17) and σ(40) are exactly 1 in float32


@gv.gen
def coin_model(a):
    gv.flip(0.5) @ "z"


@gv.gen
def flip_guide(a):
    gv.flip(jax.nn.sigmoid(a), grad=gv.ENUM) @ "z"


@gv.gen
def bernoulli_guide(a):
    gv.bernoulli(logits=a, grad=gv.ENUM) @ "z"


def test_enum_at_saturated_probability():
    # d/da ELBO = d/da [−KL(flip(σ(a)) ‖ flip(.5))] = −a σ(a) σ(−a). Where σ(a) rounds to
    # 1 the alternative of probability 0 contributes 0, and float32 resolves
    # d log σ(a) = σ(−a) only to about 6e-8 (bernoulli's too): the answer is then within
    # 1e-6 of the exact one (|a| × 6e-8), and finite.
    key = jax.random.key(3)
    a = np.asarray(SATURATED, np.float64)
    exact = -a / (1 + np.exp(a)) / (1 + np.exp(-a))
    for guide in (flip_guide, bernoulli_guide):
        obj = gv.elbo(coin_model, guide)
        grads, forward = jax.jit(jax.vmap(lambda a: (obj.grad_estimate(key, a),
                                                     obj.jvp_estimate(key, (a,), (1.0,))[1])))(SATURATED)
        assert np.all(np.isfinite(grads)) and np.all(np.isfinite(forward)), (guide, grads, forward)
        np.testing.assert_allclose(np.asarray(grads), np.asarray(forward), rtol=1e-5, atol=1e-12)
        np.testing.assert_allclose(np.asarray(grads, np.float64), exact, rtol=1e-4, atol=1e-6)
        assert float(grads[1]) == pytest.approx(exact[1], rel=1e-4)   # σ(−17) itself is exact


# ------------------------------------------------------------------ open supports in float32
BOUNDARY = {  # name: (distribution, parameters): draws that used to round to 0 or 1
    "beta(0.1, 0.1)": (gv.beta, (0.1, 0.1)),
    "beta(0.01, 1)": (gv.beta, (0.01, 1.0)),
    "gamma(0.01, 1)": (gv.gamma, (0.01, 1.0)),
    "dirichlet(0.01 × 3)": (gv.dirichlet, (jnp.full(3, 0.01),)),
}


def test_draws_stay_inside_the_open_support():
    # 10^5 independent draws as one draw of 10^5 lanes (compiles once, unbatched).
    def check(dist, params):
        params = tuple(jnp.broadcast_to(jnp.asarray(p, jnp.float32), (100_000,) + jnp.shape(p))
                       for p in params)

        def draw(key):
            x = dist.sample(key, *params)
            score = jax.grad(lambda p: jnp.sum(dist.lane_log_prob(x, *p)))(params)  # per lane
            return x, dist.lane_log_prob(x, *params), score
        return draw

    draws = {name: check(*case) for name, case in BOUNDARY.items()}
    out = jax.jit(lambda key: {n: f(key) for n, f in draws.items()})(jax.random.key(4))
    for name, (x, logp, score) in out.items():
        x = np.asarray(x)
        upper = np.inf if name.startswith("gamma") else 1.0
        assert np.all((x > 0) & (x < upper)), (name, np.sum(x <= 0), np.sum(x >= upper))
        assert np.all(np.isfinite(np.asarray(logp))), name
        assert all(np.all(np.isfinite(np.asarray(s))) for s in score), name


def test_reparam_gradients_at_small_concentrations_unbiased():
    # d/dθ E[x], x drawn with REPARAM at concentrations whose draws hit the float32
    # boundary: the clipped draws keep the implicit gradient of the unclipped ones.
    @gv.expectation
    def mean_draws(p):
        x = gv.sample(gv.beta(p["a"], p["b"], grad=gv.REPARAM))
        d = gv.sample(gv.dirichlet(p["alpha"], grad=gv.REPARAM))
        return x + d[0]

    p = {"a": jnp.array(0.1), "b": jnp.array(0.1), "alpha": jnp.full(3, 0.05)}
    grads = jax.jit(jax.vmap(lambda k: mean_draws.grad_estimate(k, p)))(
        jax.random.split(jax.random.key(5), N))
    a, b, al = 0.1, 0.1, 0.05   # E x = a/(a+b), E d_0 = alpha_0/Σ alpha
    exact = {"a": b / (a + b) ** 2, "b": -a / (a + b) ** 2,
             "alpha": [2 * al / (3 * al) ** 2, -al / (3 * al) ** 2, -al / (3 * al) ** 2]}
    for k, v in exact.items():
        _close(grads[k], v, f"REPARAM d/d{k}")


# ------------------------------------------------------------------ every distribution
# Extreme valid parameters, stacked (one jit per distribution, mapped over the sets
# and over keys): samples, their log densities and every supported strategy's estimate
# of ∇ E[Σ tanh(x / scale) − log p(x)] (a bounded function plus the entropy, the two
# kinds of term of an ELBO) must be finite.
E6, T6, O6 = 1e6, 1e-6, 1 - 1e-6
EXTREMES = {  # name: (distribution, parameter sets as arrays with a leading set axis, scale)
    "normal": (gv.normal, ([0.0, E6, 0.0, -E6], [T6, T6, E6, E6]), 1.0),
    "mv_normal_diag": (gv.mv_normal_diag, (np.outer([0.0, E6, -E6], np.ones(3)),
                                           np.outer([T6, T6, E6], np.ones(3))), 1.0),
    "mv_normal": (gv.mv_normal, (np.outer([0.0, E6, -E6], np.ones(2)),
                                 np.stack([T6 * np.eye(2), E6 * np.eye(2),
                                           [[1.0, 0.999], [0.999, 1.0]]])), 1.0),
    "uniform": (gv.uniform, ([0.0, -E6, E6], [T6, E6, E6 + 1.0]), 1.0),
    "beta": (gv.beta, ([T6, T6, E6, E6], [T6, E6, T6, E6]), 1.0),
    "gamma": (gv.gamma, ([T6, T6, E6, E6], [T6, E6, T6, E6]), 1.0),
    "dirichlet": (gv.dirichlet, (np.array([[T6] * 3, [E6] * 3, [T6, 1.0, E6]]),), 1.0),
    "flip": (gv.flip, ([0.0, T6, O6, 1.0],), 1.0),
    "bernoulli": (gv.bernoulli, ([-40.0, 40.0, 0.0],), 1.0),
    "categorical": (gv.categorical, (np.array([[40.0, -40.0, 0.0], [-40.0, -40.0, 40.0]]),), 1.0),
    "geometric": (gv.geometric, ([T6, O6, 1.0],), 10.0),
    "poisson": (gv.poisson, ([T6, E6],), 10.0),
    "binomial": (gv.binomial, ([1.0, 1.0, 1e6, 10.0], [0.0, T6, T6, 1.0]), 10.0),
}
PROPERTY_KEYS = 128


@pytest.mark.parametrize("name", list(EXTREMES))
def test_every_distribution_finite_at_extreme_parameters(name):
    dist, sets, scale = EXTREMES[name]
    sets = tuple(jnp.asarray(p, jnp.float32) for p in sets)
    # binomial's n is a count (not differentiated): passed as a second argument
    counts, sets = ((sets[0].astype(jnp.int32),), sets[1:]) if name == "binomial" else ((), sets)

    def objective(strategy):
        @gv.expectation
        def e(params, counts):
            x = gv.sample(dist(*counts, *params, grad=strategy))
            f = jnp.sum(jnp.tanh(jnp.asarray(x, jnp.float32) / scale))
            return f - dist.log_prob(x, *counts, *params)
        return e

    # ENUM sums a binomial's support 0..n where n is static; here n is an argument (up
    # to 10⁶ trials), so the other strategies are the ones to check
    objectives = {s: objective(getattr(gv, s)) for s in dist.strategies
                  if not (name == "binomial" and s == "ENUM")}

    def one(key, params, counts):
        x = dist.sample(key, *counts, *params)
        grads = {s: e.grad_estimate(key, params, counts) for s, e in objectives.items()}
        return x, dist.log_prob(x, *counts, *params), grads

    # lax.map, not vmap: these programs compile faster unbatched, and run in no time
    run = jax.jit(lambda keys, sets, counts: jax.lax.map(
        lambda a: jax.lax.map(lambda k: one(k, *a), keys), (sets, counts)))
    x, logp, grads = run(jax.random.split(jax.random.key(6), PROPERTY_KEYS), sets, counts)
    for i in range(len(sets[0])):
        where = f"{name} at {[np.asarray(p[i]).tolist() for p in counts + sets]}"
        assert np.all(np.isfinite(np.asarray(x[i], np.float64))), f"{where}: samples"
        assert np.all(np.isfinite(np.asarray(logp[i]))), f"{where}: log densities"
        for s, g in grads.items():
            leaves = jax.tree_util.tree_leaves(g)
            assert all(np.all(np.isfinite(np.asarray(leaf[i]))) for leaf in leaves), f"{where}: {s}"
