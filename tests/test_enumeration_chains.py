"""`gv.enumeration()` on chains of order k: a `gv.scan` whose carry holds the last k
discrete values (Pyro's `markov(history=k)`). Log densities against numpy brute force
over every path and a numpy forward algorithm on pair states (float64); a batch of
padded sequences; a third-order chain; gradients against float64 central
differences; a fit that recovers a second-order transition table."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.special import logsumexp
from scipy.stats import norm

import genvi as gv

K, SD = 2, 0.6
# p(z_t | z_{t-1}, z_{t-2}): a chain that alternates where the last two agree
TRANS2 = np.array([[[0.3, 0.7], [0.8, 0.2]],
                   [[0.6, 0.4], [0.1, 0.9]]], np.float32)      # [z_{t-2}, z_{t-1}, z_t]
MEANS = np.array([-1.0, 1.2], np.float32)
YS = np.random.default_rng(2).normal(size=(3, 7)).astype(np.float32)


@gv.gen
def step2(carry, inputs):
    prev, prev2, trans, means = carry
    y, valid = inputs
    z = gv.categorical(jnp.log(trans[prev2, prev])) @ "z"
    gv.factor(jnp.where(valid, gv.normal.log_prob(y, means[z], SD), 0.0))
    return (z, prev, trans, means), None


@gv.gen
def sequence2(trans, means, ys, valid):
    gv.scan(step2)((0, 0, trans, means), (ys, valid)) @ "steps"


@gv.gen
def one_chain(ys, valid):
    means = gv.normal(jnp.zeros(K), 2.0) @ "means"
    sequence2(jnp.asarray(TRANS2), means, ys, valid) @ "chain"


@gv.gen
def many_chains(ys, valid):
    means = gv.normal(jnp.zeros(K), 2.0) @ "means"
    gv.vmap(sequence2, in_axes=(None, None, 0, 0))(jnp.asarray(TRANS2), means, ys,
                                                    valid) @ "seqs"


def brute_force(trans, means, y, valid):
    """log Σ over every path of the chain (z_{-1} = z_{-2} = 0)."""
    total = []
    for path in itertools.product(range(K), repeat=len(y)):
        prev, prev2, lp = 0, 0, 0.0
        for z, yt, ok in zip(path, y, valid):
            lp += np.log(trans[prev2, prev, z]) + (norm.logpdf(yt, means[z], SD) if ok else 0.0)
            prev, prev2 = z, prev
        total.append(lp)
    return logsumexp(total)


def pair_forward(trans, means, y, valid):
    """The forward algorithm on pair states (z_{t-1}, z_t), float64."""
    emit = lambda t: norm.logpdf(y[t], means, SD) if valid[t] else np.zeros(K)  # noqa: E731
    alpha = np.full((K, K), -np.inf)
    alpha[0] = np.log(trans[0, 0]) + emit(0)            # (z_{-1} = 0, z_0)
    for t in range(1, len(y)):
        new = np.full((K, K), -np.inf)
        for a, b, c in itertools.product(range(K), repeat=3):
            new[b, c] = np.logaddexp(new[b, c], alpha[a, b] + np.log(trans[a, b, c]) + emit(t)[c])
        alpha = new
    return logsumexp(alpha)


def log_density(model, means, ys, valid):
    m = gv.marginal(model, keep=["means"], algorithm=gv.enumeration())
    return m.log_density(gv.choices({"means": means}), jnp.asarray(ys), jnp.asarray(valid))


def test_a_second_order_chain_is_summed_exactly():
    valid = np.ones(7, bool)
    got = log_density(one_chain, MEANS, YS[0], valid)
    prior = norm.logpdf(MEANS, 0.0, 2.0).sum()
    truth = brute_force(TRANS2, MEANS, YS[0], valid)
    assert pair_forward(TRANS2, MEANS, YS[0], valid) == pytest.approx(truth, abs=1e-9)
    assert float(got) == pytest.approx(prior + truth, abs=1e-4)


def test_a_batch_of_padded_second_order_sequences():
    valid = np.array([[True] * 7, [True] * 4 + [False] * 3, [True] * 6 + [False]])
    got = log_density(many_chains, MEANS, YS, valid)
    want = norm.logpdf(MEANS, 0.0, 2.0).sum() + sum(
        pair_forward(TRANS2, MEANS, y, v) for y, v in zip(YS, valid))
    assert float(got) == pytest.approx(want, abs=1e-4)


def test_the_gradient_of_a_second_order_chain_matches_central_differences():
    valid = np.array([[True] * 7, [True] * 4 + [False] * 3, [True] * 6 + [False]])
    g = jax.grad(lambda m: log_density(many_chains, m, YS, valid))(jnp.asarray(MEANS))

    def exact(m):
        return norm.logpdf(m, 0.0, 2.0).sum() + sum(
            pair_forward(TRANS2, m, y, v) for y, v in zip(YS, valid))
    eps, m64 = 1e-5, MEANS.astype(np.float64)
    fd = [(exact(m64 + eps * np.eye(K)[i]) - exact(m64 - eps * np.eye(K)[i])) / (2 * eps)
          for i in range(K)]
    np.testing.assert_allclose(np.asarray(g), fd, atol=2e-3)


def test_a_third_order_chain_is_summed_exactly():
    trans3 = np.random.default_rng(4).dirichlet(np.ones(K), size=(K, K, K)).astype(np.float32)

    @gv.gen
    def step3(carry, y):
        p1, p2, p3 = carry
        z = gv.categorical(jnp.log(jnp.asarray(trans3))[p3, p2, p1]) @ "z"
        gv.observe(gv.normal(jnp.asarray(MEANS)[z], SD), y)
        return (z, p1, p2), None

    @gv.gen
    def model(ys):
        gv.normal(0.0, 1.0) @ "mu"
        gv.scan(step3)((0, 0, 0), ys) @ "steps"
    y = YS[1, :6]
    m = gv.marginal(model, keep=["mu"], algorithm=gv.enumeration())
    got = m.log_density(gv.choices({"mu": 0.0}), jnp.asarray(y))
    paths = []
    for path in itertools.product(range(K), repeat=len(y)):
        hist, lp = [0, 0, 0], 0.0
        for z, yt in zip(path, y):
            lp += np.log(trans3[hist[2], hist[1], hist[0], z]) + norm.logpdf(yt, MEANS[z], SD)
            hist = [z] + hist[:2]
        paths.append(lp)
    assert float(got) == pytest.approx(norm.logpdf(0.0, 0, 1) + logsumexp(paths), abs=1e-4)


def test_a_fit_recovers_a_second_order_transition_table():
    rng = np.random.default_rng(7)
    true = np.array([[[0.1, 0.9], [0.9, 0.1]], [[0.5, 0.5], [0.2, 0.8]]])
    ys = np.zeros((40, 30), np.float32)
    for s in range(40):
        prev, prev2 = 0, 0
        for t in range(30):
            z = rng.choice(K, p=true[prev2, prev])
            ys[s, t] = MEANS[z] + SD * rng.normal()
            prev, prev2 = z, prev

    @gv.gen
    def model(ys, valid):
        trans = gv.dirichlet(jnp.ones((K, K, K))) @ "trans"
        gv.vmap(sequence2, in_axes=(None, None, 0, 0))(trans, jnp.asarray(MEANS), ys,
                                                        valid) @ "seqs"
    m = gv.marginal(model, keep=["trans"], algorithm=gv.enumeration())
    auto = gv.auto_normal(m)
    valid = jnp.ones(ys.shape, bool)
    params = {"guide": auto.init(jax.random.key(0), jnp.asarray(ys), valid)}
    res = gv.fit(gv.elbo(m, auto), params, jnp.asarray(ys), valid, optimizer=optax.adam(0.05),
                 steps=600, key=jax.random.key(1), progress=False)
    fitted = np.asarray(auto.mean(res.params)["trans"])
    assert np.allclose(fitted, true, atol=0.12), fitted


def test_the_plan_names_the_chain_and_its_order():
    m = gv.marginal(many_chains, keep=["means"], algorithm=gv.enumeration())
    m.log_density(gv.choices({"means": MEANS}), jnp.asarray(YS), jnp.ones(YS.shape, bool))
    (plan,) = m.plans.values()
    assert "forward algorithm over 'seqs/steps/z'" in str(plan)
    assert "order 2, 4 histories × 2 values per step, 7 steps, 3 sequences at once" in str(plan)


@gv.gen
def cell(z, y):          # a plate inside each step: one discrete site per cell
    x = gv.flip(jnp.where(z, 0.8, 0.3)) @ "x"
    gv.observe(gv.normal(jnp.where(x, 1.0, -1.0), 0.7), y)


@gv.gen
def step_with_cells(prev, ys):
    z = gv.flip(jnp.where(prev, 0.9, 0.2)) @ "z"
    gv.vmap(cell, in_axes=(None, 0))(z, ys) @ "cells"
    return z, None


@gv.gen
def chain_of_plates(grid):
    gv.normal(0.0, 1.0) @ "mu"
    gv.scan(step_with_cells)(False, grid) @ "steps"


def test_a_plate_inside_a_scan_step_is_summed_within_each_step():
    grid = np.random.default_rng(8).normal(size=(3, 2)).astype(np.float32)
    m = gv.marginal(chain_of_plates, keep=["mu"], algorithm=gv.enumeration())
    got = m.log_density(gv.choices({"mu": 0.0}), jnp.asarray(grid))
    p_z = lambda prev, z: (0.9 if prev else 0.2) if z else (0.1 if prev else 0.8)  # noqa: E731
    p_x = lambda z, x: (0.8 if z else 0.3) if x else (0.2 if z else 0.7)  # noqa: E731
    paths = []
    for zs in itertools.product((0, 1), repeat=3):
        for xs in itertools.product((0, 1), repeat=6):
            lp, prev = 0.0, 0
            for t, z in enumerate(zs):
                lp += np.log(p_z(prev, z))
                for j in range(2):
                    x = xs[2 * t + j]
                    lp += np.log(p_x(z, x)) + norm.logpdf(grid[t, j], 1.0 if x else -1.0, 0.7)
                prev = z
            paths.append(lp)
    assert float(got) == pytest.approx(norm.logpdf(0.0, 0, 1) + logsumexp(paths), abs=1e-4)
    (plan,) = m.plans.values()
    assert "sum out 'steps/cells/x' within each step" in str(plan)


@gv.gen
def sequences_of_plates(grids):
    gv.normal(0.0, 1.0) @ "mu"
    gv.vmap(gv.scan(step_with_cells), in_axes=(None, 0))(False, grids) @ "seqs"


def numpy_chain_of_plates(grid):
    p_z = lambda prev, z: (0.9 if prev else 0.2) if z else (0.1 if prev else 0.8)  # noqa: E731
    p_x = lambda z, x: (0.8 if z else 0.3) if x else (0.2 if z else 0.7)  # noqa: E731
    steps, cells = grid.shape
    paths = []
    for zs in itertools.product((0, 1), repeat=steps):
        for xs in itertools.product((0, 1), repeat=steps * cells):
            lp, prev = 0.0, 0
            for t, z in enumerate(zs):
                lp += np.log(p_z(prev, z))
                for j in range(cells):
                    x = xs[cells * t + j]
                    lp += np.log(p_x(z, x)) + norm.logpdf(grid[t, j], 1.0 if x else -1.0, 0.7)
                prev = z
            paths.append(lp)
    return logsumexp(paths)


def test_a_plate_inside_the_steps_of_a_batch_of_sequences_is_summed_per_sequence():
    grids = np.random.default_rng(9).normal(size=(4, 3, 2)).astype(np.float32)  # 4 sequences
    m = gv.marginal(sequences_of_plates, keep=["mu"], algorithm=gv.enumeration())
    got = m.log_density(gv.choices({"mu": 0.0}), jnp.asarray(grids))
    want = norm.logpdf(0.0, 0, 1) + sum(numpy_chain_of_plates(g) for g in grids)
    assert float(got) == pytest.approx(want, abs=1e-4)
    (plan,) = m.plans.values()
    assert "sum out 'seqs/cells/x' within each step" in str(plan)
    assert "4 sequences at once" in str(plan)


# -- a plate's sites and a chain's sites in one model, summed apart --------------------
ROWS = np.log(np.array([[0.8, 0.2], [0.3, 0.7]], np.float32))
YP = np.array([1.4, -0.8, 0.3], np.float32)     # the plate's points
YC = np.array([0.2, 1.5, 1.1, -0.4], np.float32)  # the chain's observations


@gv.gen
def mix_point(mu, shift, y):
    z = gv.flip(0.35) @ "z"
    gv.observe(gv.normal(jnp.where(z, mu, -mu) + shift, 1.0), y)
    return z


@gv.gen
def chain_step(carry, y):
    s, shift = carry
    s = gv.categorical(jnp.asarray(ROWS)[s]) @ "s"
    gv.observe(gv.normal(1.2 * s - shift, SD), y)
    return (s, shift), s


def plate_and_chain(couple: bool = False):
    @gv.gen
    def model(yp, yc):
        mu = gv.normal(0.0, 2.0) @ "mu"
        g = gv.flip(0.4) @ "g"          # a global site read by both
        shift = jnp.where(g, 0.5, -0.5)
        z = gv.vmap(mix_point, in_axes=(None, None, 0))(mu, shift, yp) @ "points"
        _, states = gv.scan(chain_step)((0, shift), yc) @ "chain"
        if couple:   # a term that reads a point's class and the chain's states together
            gv.factor(jnp.sum(states) * 0.1 * jnp.sum(z))
        return z
    return model


def numpy_plate_and_chain(mu):
    total = []
    for g in (0, 1):
        shift = 0.5 if g else -0.5
        lp_g = np.log(0.4 if g else 0.6)
        plate = sum(logsumexp([np.log(0.35) + norm.logpdf(y, mu + shift, 1.0),
                               np.log(0.65) + norm.logpdf(y, -mu + shift, 1.0)]) for y in YP)
        paths = []
        for path in itertools.product(range(2), repeat=len(YC)):
            lp, prev = 0.0, 0
            for s, y in zip(path, YC):
                lp += ROWS[prev, s] + norm.logpdf(y, 1.2 * s - shift, SD)
                prev = s
            paths.append(lp)
        total.append(lp_g + plate + logsumexp(paths))
    return norm.logpdf(mu, 0.0, 2.0) + logsumexp(total)


def test_a_plate_and_a_chain_in_one_model_are_summed_apart():
    m = gv.marginal(plate_and_chain(), keep=["mu"], algorithm=gv.enumeration())

    def log_p(mu):
        return m.log_density(gv.choices({"mu": mu}), jnp.asarray(YP), jnp.asarray(YC))
    for mu in (0.7, -1.6):
        assert float(log_p(mu)) == pytest.approx(numpy_plate_and_chain(mu), abs=1e-4)
    eps = 1e-5
    fd = (numpy_plate_and_chain(0.7 + eps) - numpy_plate_and_chain(0.7 - eps)) / (2 * eps)
    assert float(jax.grad(log_p)(0.7)) == pytest.approx(fd, abs=2e-3)
    (plan,) = m.plans.values()
    text = str(plan)
    assert "'points/z'" in text and "'chain/s'" in text


def test_a_term_that_couples_a_plate_and_a_chain_is_refused_by_name():
    m = gv.marginal(plate_and_chain(couple=True), keep=["mu"], algorithm=gv.enumeration())
    with pytest.raises(ValueError, match=r"'chain/s'.*'points/z'|'points/z'.*'chain/s'"):
        m.log_density(gv.choices({"mu": 0.7}), jnp.asarray(YP), jnp.asarray(YC))
