"""Markov-local replays (`genvi.replays.markov_scan`): ENUM, MVD and RLOO sites in a scan
replay every step at once, in O(T), where a step's value reaches nearby steps only.
Each case gives the same estimate, for the same key, as one replay per step (the
general path), and the estimates' mean matches the exact gradient on a small chain."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv
from genvi.replays import markov_scan
from genvi.replays.engine import whole_objective_replays
from genvi.core import jaxpr as jx
from genvi_experiments.bench.replays.scan import categorical_hmm, switching_args, switching_chain
from programs import flip_hmm as hmm

T = 6
LOGITS, YS = jnp.linspace(-1.0, 1.0, T), jnp.sin(jnp.arange(T) * 1.0)


def chains(strategy, inner_plate):
    """Several flips per step: HMM chains in a plate (a scan inside `gv.vmap`), or a
    plate inside each step."""

    @gv.gen
    def m_lane(z_prev, y):
        z = gv.flip(jnp.where(z_prev, 0.7, 0.3)) @ "z"
        gv.observe(gv.normal(jnp.where(z, 1.0, -1.0), 1.0), y)
        return z

    @gv.gen
    def g_lane(logit):
        return gv.flip(jax.nn.sigmoid(logit), grad=strategy) @ "z"

    if inner_plate:
        @gv.gen
        def model_step(z_prev, y):
            return gv.vmap(m_lane)(z_prev, y) @ "p", None

        @gv.gen
        def model(ls, ys):
            gv.scan(model_step)(jnp.zeros(ys.shape[1], bool), ys) @ "s"

        @gv.gen
        def guide_step(c, ls):
            gv.vmap(g_lane)(ls) @ "p"
            return c, None

        @gv.gen
        def guide(ls, ys):
            gv.scan(guide_step)(0, ls) @ "s"
        return model, guide

    @gv.gen
    def m_step(z_prev, y):
        return m_lane(z_prev, y) @ "l", None

    @gv.gen
    def g_step(c, logit):
        g_lane(logit) @ "l"
        return c, None

    @gv.gen
    def model_chain(ls, ys):
        gv.scan(m_step)(False, ys) @ "s"

    @gv.gen
    def guide_chain(ls, ys):
        gv.scan(g_step)(0, ls) @ "s"

    @gv.gen
    def model(ls, ys):
        gv.vmap(model_chain)(ls, ys) @ "c"

    @gv.gen
    def guide(ls, ys):
        gv.vmap(guide_chain)(ls, ys) @ "c"
    return model, guide


def reverse_scans(strategy):
    """A hand-written objective: a reverse `lax.scan` holding the site, another reverse
    scan over its values whose carry keeps the previous value and whose outputs are
    used after it."""

    @gv.expectation
    def objective(theta):
        def guide_step(c, logit):
            z = gv.sample(gv.flip(jax.nn.sigmoid(logit + theta), grad=strategy))
            return c + jnp.where(z, 0.3, -0.1), z

        acc, zs = jax.lax.scan(guide_step, 0.0, LOGITS, reverse=True)

        def model_step(c, z):
            prev, total = c
            return (z, total + jnp.where(z == prev, 1.0, -0.5) * theta), jnp.where(z, 1.0, 0.0)

        (last, total), outs = jax.lax.scan(model_step, (False, 0.0), zs, reverse=True)
        return acc + total + jnp.sum(outs * jnp.arange(T)) + jnp.where(last, 2.0, 0.0)
    return objective


def sorted_outputs(strategy):
    """A hand-written objective whose scan outputs, per step, a sort of the step's value
    (an operation without a lane rule: at a step of one lane, that lane's replay)."""

    @gv.expectation
    def objective(theta):
        def step(c, logit):
            z = gv.sample(gv.flip(jax.nn.sigmoid(logit + theta), grad=strategy))
            zf = jnp.where(z, 1.0, -0.5)
            return c, jnp.sort(jnp.stack([zf * theta, 0.2, -zf]))

        _, out = jax.lax.scan(step, 0.0, LOGITS)
        return jnp.sum(out * jnp.array([1.0, 2.0, 3.0])) + jnp.sum(out[1:, 0] * out[:-1, 2])
    return objective


def paired_outputs(strategy, reverse=False):
    """A hand-written objective whose scan outputs, per step, terms of the previous
    step's value and its own: a step's change reaches two outputs."""

    @gv.expectation
    def objective(theta):
        def step(prev, logit):
            z = gv.sample(gv.flip(jax.nn.sigmoid(logit + theta), grad=strategy))
            zf = jnp.where(z, 1.0, -0.5)
            return zf, jnp.stack([zf * prev * theta, jnp.sin(prev + zf)])

        _, out = jax.lax.scan(step, 0.3, LOGITS, reverse=reverse)
        return jnp.sum(out[:, 0]) + jnp.sum(jnp.cos(out[:, 1]) * jnp.arange(T))
    return objective


def exact_paired(theta, reverse=False):
    """`paired_outputs`' expectation, over the 2^T paths of its flips."""
    paths = jnp.array(list(itertools.product([False, True], repeat=T)))
    probs = jax.nn.sigmoid(LOGITS + theta)

    def one(path):
        zf = jnp.where(path, 1.0, -0.5)
        prev = (jnp.concatenate([zf[1:], jnp.array([0.3])]) if reverse
                else jnp.concatenate([jnp.array([0.3]), zf[:-1]]))
        value = jnp.sum(zf * prev * theta) + jnp.sum(jnp.cos(jnp.sin(prev + zf)) * jnp.arange(T))
        return jnp.prod(jnp.where(path, probs, 1 - probs)) * value
    return jnp.sum(jax.vmap(one)(paths))


def lanes_of_a_step_paired(strategy):
    """A vector site in each step whose outputs mix its lanes and read the previous
    step's: each output in every lane's replay."""

    @gv.expectation
    def objective(theta):
        def step(prev, logit):
            z = gv.sample(gv.flip(jax.nn.sigmoid(logit + theta * jnp.arange(3.0)), grad=strategy))
            zf = jnp.where(z, 1.0, -0.5)
            return zf, jnp.sum(zf * prev) + zf * theta

        _, out = jax.lax.scan(step, jnp.full(3, 0.2), LOGITS)
        return jnp.sum(jnp.tanh(out) * jnp.arange(3.0))
    return objective


def lanes_ys(b):
    return (jnp.linspace(-1.0, 1.0, T * b).reshape(T, b), jnp.cos(jnp.arange(T * b)).reshape(T, b))


CASES = {
    "hmm ENUM": (lambda: gv.elbo(*hmm(gv.ENUM)), (LOGITS, YS), 2),
    "hmm MVD": (lambda: gv.elbo(*hmm(gv.MVD)), (LOGITS, YS), 2),
    "hmm RLOO": (lambda: gv.elbo(*hmm(gv.RLOO(3))), (LOGITS, YS), 2),
    "second-order hmm": (lambda: gv.elbo(*hmm(gv.ENUM, order=2)), (LOGITS, YS), 3),
    "3 states ENUM": (lambda: gv.elbo(*categorical_hmm(gv.ENUM, 3)[:2]),
                      (jnp.zeros((T, 3)), YS), 2),
    "3 states MVD": (lambda: gv.elbo(*categorical_hmm(gv.MVD, 3)[:2]),
                     (jnp.zeros((T, 3)), YS), 2),
    "iwelbo": (lambda: gv.iwelbo(*hmm(gv.ENUM), 4), (LOGITS, YS), 2),
    "iwelbo RLOO": (lambda: gv.iwelbo(*hmm(gv.RLOO(3)), 4), (LOGITS, YS), 2),
    "chains in a plate": (lambda: gv.elbo(*chains(gv.MVD, False)),
                          tuple(a.T for a in lanes_ys(3)), 2),
    "a plate in each step": (lambda: gv.elbo(*chains(gv.ENUM, True)), lanes_ys(4), 2),
    "reverse scans": (lambda: reverse_scans(gv.ENUM), (0.3,), 2),
    "outputs without a lane rule": (lambda: sorted_outputs(gv.ENUM), (0.3,), 1),
    "outputs of two steps": (lambda: paired_outputs(gv.ENUM), (0.3,), 2),
    "outputs of two steps, reverse": (lambda: paired_outputs(gv.MVD, True), (0.3,), 2),
    "outputs of two steps, mixing a step's lanes": (lambda: lanes_of_a_step_paired(gv.ENUM),
                                                     (0.3,), 2),
    "switching ENUM": (lambda: gv.elbo(*switching_chain(gv.ENUM)), switching_args(T), 2),
    "switching MVD": (lambda: gv.elbo(*switching_chain(gv.MVD)), switching_args(T), 2),
    "switching RLOO": (lambda: gv.elbo(*switching_chain(gv.RLOO(3))), switching_args(T), 2),
}


@pytest.mark.parametrize("name", list(CASES))
def test_same_estimate_as_a_replay_per_step(name):
    make, args, window = CASES[name]
    key = jax.random.key(7)
    objective = make()
    site = objective.explain(*args, key=key).sites[0]  # the discrete site
    assert "Markov-local" in site["replays"], site["replays"]
    assert f"reaches {window} step" in site["replays"]  # "1 step", "2 steps"
    markov = objective.grad_estimate(key, *args)
    with whole_objective_replays():
        per_step = make().grad_estimate(key, *args)
    for a, b in zip(jax.tree.leaves(markov), jax.tree.leaves(per_step)):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def exact_elbo(logits, ys, transition, means):
    """The ELBO of `categorical_hmm` by enumerating every path of the guide."""
    states = logits.shape[1]
    paths = jnp.array(list(itertools.product(range(states), repeat=logits.shape[0])))
    log_q = jax.nn.log_softmax(logits)

    def one(path):
        prev = jnp.concatenate([jnp.zeros(1, int), path[:-1]])
        log_p = jnp.sum(jax.nn.log_softmax(transition)[prev, path]
                        + jax.scipy.stats.norm.logpdf(ys, means[path], 1.0))
        lq = jnp.sum(log_q[jnp.arange(len(path)), path])
        return jnp.exp(lq) * (log_p - lq)
    return jnp.sum(jax.vmap(one)(paths))


@pytest.mark.parametrize("strategy", [gv.ENUM, gv.MVD, gv.RLOO(2)], ids=repr)
def test_unbiased_against_enumeration_on_a_small_chain(strategy):
    length, n = 4, 20_000
    logits = jnp.array([[0.3, -0.2, 0.1], [0.0, 0.5, -0.4], [-0.3, 0.2, 0.6], [0.1, 0.1, -0.5]])
    ys = jnp.array([-1.2, 0.1, 1.4, 0.9])
    model, guide, transition, means = categorical_hmm(strategy, 3)
    objective = gv.elbo(model, guide)
    assert "Markov-local" in objective.explain(logits, ys).sites[0]["replays"]
    exact = jax.grad(exact_elbo)(logits, ys, transition, means)
    keys = jax.random.split(jax.random.key(11), n)
    grads = jax.jit(jax.vmap(lambda k: objective.grad_estimate(k, logits, ys)))(keys)
    mean, se = jnp.mean(grads, 0), jnp.std(grads, 0) / np.sqrt(n)
    assert grads.shape == (n, length, 3)
    assert np.all(np.abs(mean - exact) < 5 * se + 1e-6), (mean, exact, se)


def exact_switching_elbo(params, ys, regimes=3):
    """The ELBO of `switching_chain` by enumerating the guide's regime paths, each with
    its Gaussian expectations in closed form: w_t ~ N(a_t, 1) in the guide, so
    E log N(w; m, 1) = log N(a; m, 1) − 1/2 and E log N(y; w, s) = log N(y; a, s) − 1/(2s²)."""
    paths = jnp.array(list(itertools.product(range(regimes), repeat=len(ys))))
    log_q = jax.nn.log_softmax(params["logits"])
    means, norm = jnp.linspace(-1.0, 1.0, regimes), jax.scipy.stats.norm.logpdf

    def one(path):
        prev = jnp.concatenate([jnp.zeros(1, int), path[:-1]])
        a = params["mu"][path] + 0.5 * ys
        log_p = jnp.sum(jax.nn.log_softmax(jnp.eye(regimes)[prev])[jnp.arange(len(ys)), path]
                        + norm(a, means[path], 1.0) - 0.5 + norm(ys, a, 0.5) - 2.0)
        log_q_path = jnp.sum(log_q[jnp.arange(len(ys)), path])
        lq = log_q_path + jnp.sum(norm(a, a, 1.0) - 0.5)
        return jnp.exp(log_q_path) * (log_p - lq)
    return jnp.sum(jax.vmap(one)(paths))


@pytest.mark.parametrize("strategy", [gv.ENUM, gv.MVD], ids=repr)
def test_switching_chain_unbiased_against_enumeration(strategy):
    """Markov-local replays through a `switch` holding the guide's continuous state."""
    params, ys = switching_args(3)
    objective = gv.elbo(*switching_chain(strategy))
    replays = objective.explain(params, ys).sites[0]["replays"]
    assert "lane: Markov-local" in replays, replays  # not "... not Markov-local: cond"
    n = 20_000
    value, exact = exact_switching_elbo(params, ys), jax.grad(exact_switching_elbo)(params, ys)
    keys = jax.random.split(jax.random.key(5), n)
    values = jax.jit(jax.vmap(lambda k: objective.estimate(k, params, ys)))(keys)
    assert abs(values.mean() - value) < 5 * values.std() / np.sqrt(n), (values.mean(), value)
    grads = jax.jit(jax.vmap(lambda k: objective.grad_estimate(k, params, ys)))(keys)
    for name in ("logits", "mu"):
        mean, se = grads[name].mean(0), grads[name].std(0) / np.sqrt(n) + 1e-6
        assert np.all(np.abs(mean - exact[name]) < 5 * se), (name, mean, exact[name], se)


@pytest.mark.parametrize("reverse", [False, True])
def test_outputs_of_two_steps_unbiased_against_enumeration(reverse):
    """Outputs that read the previous step's value, held per lane (`Perturbed`). Leaving
    out the outputs a change reaches one step on (round 1) fails it, by 30 standard errors."""
    objective, theta, n = paired_outputs(gv.ENUM, reverse), 1.0, 20_000
    replays = objective.explain(theta).sites[0]["replays"]
    assert "Markov-local" in replays and "reaches 2 steps" in replays, replays
    keys = jax.random.split(jax.random.key(9), n)
    values = jax.jit(jax.vmap(lambda k: objective.estimate(k, theta)))(keys)
    grads = jax.jit(jax.vmap(lambda k: objective.grad_estimate(k, theta)))(keys)
    for got, exact in ((values, exact_paired(theta, reverse)),
                       (grads, jax.grad(exact_paired)(theta, reverse))):
        assert abs(got.mean() - exact) < 5 * got.std() / np.sqrt(n), (got.mean(), exact)


def test_outputs_too_large_to_hold_per_lane_replay_every_step(monkeypatch):
    """Past `MAX_OUTPUT_ELEMENTS`, an output read at later steps sends each step to a
    whole replay of its own, which explain names, with the same estimate."""
    monkeypatch.setattr(markov_scan, "MAX_OUTPUT_ELEMENTS", 2 * T * T - 1)
    key, objective = jax.random.key(4), paired_outputs(gv.ENUM)
    replays = objective.explain(0.3, key=key).sites[0]["replays"]
    assert "not Markov-local: a scan output that depends on an earlier step's value" in replays
    with whole_objective_replays():
        per_step = paired_outputs(gv.ENUM).grad_estimate(key, 0.3)
    np.testing.assert_allclose(objective.grad_estimate(key, 0.3), per_step, rtol=1e-6)


def test_a_carry_that_keeps_the_change_replays_every_step():
    """An autoregressive guide redraws every later step in a replay (same key, other
    parameters): the change never leaves the carry, so each step is replayed whole."""
    key = jax.random.key(3)
    objective = gv.elbo(*hmm(gv.ENUM, guide_carries_z=True))
    (site,) = objective.explain(LOGITS, YS, key=key).sites
    assert site["replays"].startswith("1 × 1 lane: whole-objective replays, after the scan")
    assert "not Markov-local" in site["replays"] and site["runs"] == T
    with whole_objective_replays():
        per_step = gv.elbo(*hmm(gv.ENUM, guide_carries_z=True)).grad_estimate(key, LOGITS, YS)
    np.testing.assert_allclose(objective.grad_estimate(key, LOGITS, YS), per_step,
                               rtol=1e-6)


def test_runs_count_one_evaluation_per_alternative():
    for length in (20, 80):
        z = jnp.zeros(length)
        (site,) = gv.elbo(*hmm(gv.ENUM)).explain(z, z).sites
        assert site["runs"] == 1 and f"1 × {length} steps × 1 lane" in site["replays"]


def test_accumulators_are_found_in_the_body():
    def body(c, x):
        total, prev, count = c
        term = jnp.where(x == prev, 1.0, 0.0)
        return (total + term, x, count - 1), prev + total * 0  # `total` used twice

    closed = jax.make_jaxpr(lambda: jax.lax.scan(body, (0.0, 0.0, 5), jnp.ones(3)))()
    (scan_eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"]
    assert jx.ScanEqn.of(scan_eqn).accumulators() == frozenset({2})

    def body2(c, x):
        total, prev = c
        return (total - jnp.where(x == prev, 1.0, 0.0), x), None

    closed = jax.make_jaxpr(lambda: jax.lax.scan(body2, (0.0, 0.0), jnp.ones(3)))()
    (scan_eqn,) = [e for e in closed.jaxpr.eqns if e.primitive.name == "scan"]
    assert jx.ScanEqn.of(scan_eqn).accumulators() == frozenset({0})
    assert jx.ScanEqn.of(scan_eqn).accumulators(subtract=False) == frozenset()
