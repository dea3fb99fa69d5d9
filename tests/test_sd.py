"""`gv.SD`: stochastic derivatives with pruning are unbiased (against exact sums:
enumeration or series), transpose exactly (reverse mode = forward mode on the same
key), and compose with scan, vmap, cond and the other strategies."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy import stats

import genvi as gv
from programs import flip_chain_expectation

N = 40000
KEYS = jax.random.split(jax.random.key(0), N)
F32 = jnp.float32


def grads_of(obj, *args):
    """N independent gradient estimates (and values) in one compiled function."""
    values, grads = jax.jit(jax.vmap(lambda k: obj.value_and_grad_estimate(k, *args)))(KEYS)
    return np.asarray(values), jax.tree.map(np.asarray, grads)


def assert_unbiased(samples, exact, what="", rel=0.0):
    """Within 5 standard errors; `rel`, a relative floor for estimates whose spread is
    below float32's resolution of the value."""
    samples, exact = np.asarray(samples), np.asarray(exact, np.float64)
    mean = samples.mean(0)
    se = samples.std(0) / math.sqrt(samples.shape[0])
    z = np.abs(mean - exact) / (se + 1e-7 + rel * np.abs(exact))
    assert np.all(z < 5), f"{what}: mean {mean}, exact {exact}, z {z}"


def f_of(x):
    """A downstream function that is not linear in the value."""
    return jnp.sin(1.7 * jnp.asarray(x, F32) + 0.3)


# distribution, parameters, (support, log pmf) for the exact expectation
SUPPORT = jnp.arange(120, dtype=F32)
CASES = {
    "flip": (lambda q: gv.flip(q[0], grad=gv.SD), [0.3],
             lambda q: (jnp.array([0.0, 1.0]), jnp.log(jnp.array([1 - q[0], q[0]])))),
    "bernoulli": (lambda q: gv.bernoulli(logits=q[0], grad=gv.SD), [0.4],
                  lambda q: (jnp.array([0.0, 1.0]),
                             jnp.array([jax.nn.log_sigmoid(-q[0]), jax.nn.log_sigmoid(q[0])]))),
    "categorical": (lambda q: gv.categorical(q, grad=gv.SD), [0.2, -0.5, 1.0, 0.3],
                    lambda q: (jnp.arange(4.0), jax.nn.log_softmax(q))),
    "poisson": (lambda q: gv.poisson(q[0], grad=gv.SD), [2.5],
                lambda q: (SUPPORT, stats.poisson.logpmf(SUPPORT, q[0]))),
    "geometric": (lambda q: gv.geometric(q[0], grad=gv.SD), [0.35],
                  lambda q: (SUPPORT, stats.geom.logpmf(SUPPORT + 1, q[0]))),
    "binomial": (lambda q: gv.binomial(6, q[0], grad=gv.SD), [0.4],
                 lambda q: (jnp.arange(7.0), stats.binom.logpmf(jnp.arange(7.0), 6, q[0]))),
}


def site_and_exact(make, law, scale):
    """E[f(x) · scale(q)] at one site `make(q)`: the objective and its exact sum over
    `law(q)` (support, log pmf)."""
    @gv.expectation
    def obj(q):
        return f_of(gv.sample(make(q))) * scale(q)

    def exact(q):
        xs, logp = law(q)
        return jnp.sum(jnp.exp(logp) * f_of(xs)) * scale(q)
    return obj, exact


@pytest.mark.parametrize("name", list(CASES))
def test_single_site_unbiased(name):
    make, q, law = CASES[name]
    q = jnp.asarray(q, F32)
    obj, exact = site_and_exact(make, law, lambda q: 1.0 + 0.1 * q[0])  # ∂f too
    values, g = grads_of(obj, q)
    assert_unbiased(values, exact(q), f"{name} value")
    assert_unbiased(g, jax.grad(exact)(q), f"{name} gradient")


# a value almost never drawn next to likely ones: a rule that put its boundary's term
# on the rare draw (weight ~1 / p) would be unbiased, yet the mean of N estimates would
# miss it (drawn about 0.04 times in N); SD carries it on the likely draws instead
RARE = {
    "flip near 1": (lambda q: gv.flip(q[0], grad=gv.SD), [1.0 - 1e-6],
                    lambda q: (jnp.array([0.0, 1.0]), jnp.log(jnp.array([1 - q[0], q[0]])))),
    "categorical, a rare class between likely ones": (
        lambda q: gv.categorical(q, grad=gv.SD), [0.0, math.log(2e-6), 0.3],
        lambda q: (jnp.arange(3.0), jax.nn.log_softmax(q))),
}


@pytest.mark.parametrize("name", list(RARE))
def test_a_rare_value_carries_no_large_weight(name):
    make, q, law = RARE[name]
    q = jnp.asarray(q, F32)
    obj, exact = site_and_exact(make, law, lambda q: 1.0)
    _, g = grads_of(obj, q)
    # nearly every estimate of the flip is the same number (the likely draw's term,
    # Δf / p): float32 resolves it to ~1e-6 of its size
    assert_unbiased(g, jax.grad(exact)(q), f"{name} gradient", rel=1e-5)
    # every weight bounded: no estimate is far beyond the derivative's own scale
    assert np.max(np.abs(g)) < 10 * (np.max(np.abs(jax.grad(exact)(q))) + 1.0)


def test_coupled_chain_unbiased():
    """Three flips sharing θ, each probability depending on the earlier values."""
    def probs(t, b1, b2):
        return (jax.nn.sigmoid(t), jax.nn.sigmoid(t + 0.8 * b1 - 0.3),
                jax.nn.sigmoid(0.5 * t - 0.6 * b2 + 0.5 * b1))

    def f(t, b1, b2, b3):
        return jnp.sin(b1 + 2 * b2 - 1.5 * b3 + t)

    @gv.expectation
    def obj(t):
        b1 = gv.sample(gv.flip(probs(t, 0, 0)[0], grad=gv.SD)).astype(F32)
        b2 = gv.sample(gv.flip(probs(t, b1, 0)[1], grad=gv.SD)).astype(F32)
        b3 = gv.sample(gv.flip(probs(t, b1, b2)[2], grad=gv.SD)).astype(F32)
        return f(t, b1, b2, b3)

    def exact(t):
        total = 0.0
        for b1, b2, b3 in itertools.product([0.0, 1.0], repeat=3):
            p1, p2, p3 = probs(t, b1, b2)
            w = (p1 if b1 else 1 - p1) * (p2 if b2 else 1 - p2) * (p3 if b3 else 1 - p3)
            total = total + w * f(t, b1, b2, b3)
        return total

    _, g = grads_of(obj, F32(0.2))
    assert_unbiased(g, jax.grad(exact)(F32(0.2)), "chain")


C30 = jnp.linspace(-1.0, 1.5, 30)
P30 = jnp.linspace(0.05, 0.95, 30)


@gv.expectation
def plate30(p):
    b = gv.sample(gv.flip(p, grad=gv.SD)).astype(F32)
    return jnp.sin(jnp.sum(b * C30))


def plate30_exact(p):
    """E sin(Σ c_i b_i) = Im Π (1 − p_i + p_i e^{i c_i})."""
    return jnp.imag(jnp.prod(1 - p + p * jnp.exp(1j * C30)))


def test_nonseparable_plate_unbiased():
    _, g = grads_of(plate30, P30)
    assert_unbiased(g, jax.grad(plate30_exact)(P30), "30-lane plate")


@gv.expectation
def mixed_lanes(q):
    """SD sites: a plate, a categorical and a scan in one program."""
    b = gv.sample(gv.flip(jax.nn.sigmoid(q[:5]), grad=gv.SD)).astype(F32)
    c = gv.sample(gv.categorical(q[5:9], grad=gv.SD)).astype(F32)

    def step(carry, _):
        k = gv.sample(gv.geometric(jax.nn.sigmoid(q[9] + 0.1 * carry), grad=gv.SD)).astype(F32)
        return carry + k, k

    total, ks = jax.lax.scan(step, F32(0.0), None, length=3)
    return jnp.sin(jnp.sum(b * q[:5]) + c + 0.2 * total) + jnp.cos(ks[0])


def test_reverse_mode_equals_forward_mode():
    q = jnp.linspace(-0.6, 0.7, 10)
    keys = jax.random.split(jax.random.key(3), 4)
    directions = jax.random.normal(jax.random.key(4), (4, 10))
    grad, fwd = jax.jit(lambda keys, dirs: (
        jax.vmap(lambda k: mixed_lanes.grad_estimate(k, q))(keys),
        jax.vmap(lambda k, v: mixed_lanes.jvp_estimate(k, (q,), (v,))[1])(keys, dirs)))(keys, directions)
    np.testing.assert_allclose(np.sum(np.asarray(grad) * np.asarray(directions), -1),
                               np.asarray(fwd), rtol=1e-4, atol=1e-5)
    assert np.any(np.abs(np.asarray(grad)) > 0)


def test_scan_unbiased():
    """jax.lax.scan of 3 steps; each flip's probability depends on the carry."""
    w = jnp.array([1.0, -0.5, 2.0])

    @gv.expectation
    def obj(t):
        def step(c, wi):
            b = gv.sample(gv.flip(jax.nn.sigmoid(t + 0.7 * c - 0.5), grad=gv.SD)).astype(F32)
            return c + b, b * wi
        c, ys = jax.lax.scan(step, F32(0.0), w)
        return c ** 2 + jnp.sin(jnp.sum(ys)) + t * c

    def exact(t):
        total = 0.0
        for path in itertools.product([0.0, 1.0], repeat=3):
            c, prob = 0.0, 1.0
            for b in path:
                q = jax.nn.sigmoid(t + 0.7 * c - 0.5)
                prob = prob * (q if b else 1 - q)
                c += b
            total = total + prob * (c ** 2 + jnp.sin(jnp.dot(jnp.array(path), w)) + t * c)
        return total

    _, g = grads_of(obj, F32(0.2))
    assert_unbiased(g, jax.grad(exact)(F32(0.2)), "scan")


@gv.gen
def chain_step(t, _):
    b = gv.flip(jax.nn.sigmoid(t), grad=gv.SD) @ "b"
    return t + jnp.where(b, 0.5, -0.5), b


@gv.gen
def lane(p):
    return gv.flip(p, grad=gv.SD) @ "b"


def test_gen_combinators_unbiased():
    """gv.vmap (a plate) and gv.scan guides, sampled with `sim` inside the objective."""
    @gv.expectation
    def obj(p, t):
        cm, _ = gv.vmap(lane).sim(p)
        b = cm["b"].astype(F32)
        cs, _ = gv.scan(chain_step, length=3).sim(t, None)
        s = cs["b"].astype(F32)
        return jnp.sin(jnp.sum(b * C30[:4])) * jnp.cos(jnp.sum(s * jnp.array([1.0, 0.5, -0.7])))

    def exact(p, t):
        plate = jnp.imag(jnp.prod(1 - p + p * jnp.exp(1j * C30[:4])))
        return plate * flip_chain_expectation(
            t, lambda path: jnp.cos(jnp.dot(path, jnp.array([1.0, 0.5, -0.7]))))

    p, t = P30[:4], F32(0.3)
    _, (gp, gt) = jax.jit(jax.vmap(lambda k: obj.value_and_grad_estimate(k, p, t, argnums=(0, 1))))(KEYS)
    exact_p, exact_t = jax.grad(exact, (0, 1))(p, t)
    assert_unbiased(gp, exact_p, "gv.vmap")
    assert_unbiased(gt, exact_t, "gv.scan")


def test_cond_and_batched_cond_unbiased():
    """SD sites in both branches of a lax.cond chosen by an SD flip, and a cond
    under jax.vmap (its sites become masked lanes)."""
    @gv.expectation
    def obj(t):
        b = gv.sample(gv.flip(jax.nn.sigmoid(t), grad=gv.SD))
        y = jax.lax.cond(
            b,
            lambda: jnp.sin(2.0 * gv.sample(gv.flip(jax.nn.sigmoid(t + 0.5), grad=gv.SD)) + 0.3),
            lambda: jnp.cos(gv.sample(gv.categorical(t * jnp.array([1.0, -1.0, 0.5]), grad=gv.SD))
                            .astype(F32)))

        def one(u):
            c = gv.sample(gv.flip(jax.nn.sigmoid(u), grad=gv.SD))
            return jax.lax.cond(c, lambda: 1.0 + gv.sample(gv.flip(jax.nn.sigmoid(-u), grad=gv.SD)),
                                lambda: jnp.float32(-0.5))
        z = jax.vmap(one)(jnp.array([t, 0.5 * t]))
        return y + jnp.sin(jnp.sum(z * jnp.array([1.0, 0.7])))

    def exact(t):
        p, q = jax.nn.sigmoid(t), jax.nn.sigmoid(t + 0.5)
        pc = jax.nn.softmax(t * jnp.array([1.0, -1.0, 0.5]))
        first = p * (q * jnp.sin(2.3) + (1 - q) * jnp.sin(0.3)) + (1 - p) * jnp.sum(pc * jnp.cos(jnp.arange(3.0)))
        lanes = []
        for u in (t, 0.5 * t):
            pu, qu = jax.nn.sigmoid(u), jax.nn.sigmoid(-u)
            lanes.append((jnp.array([-0.5, 1.0, 2.0]), jnp.array([1 - pu, pu * (1 - qu), pu * qu])))
        second = 0.0
        for (v1, w1), (v2, w2) in itertools.product(zip(*lanes[0]), zip(*lanes[1])):
            second = second + w1 * w2 * jnp.sin(v1 + 0.7 * v2)
        return first + second

    _, g = grads_of(obj, F32(0.2))
    assert_unbiased(g, jax.grad(exact)(F32(0.2)), "cond")


def test_beside_other_strategies_unbiased():
    """REPARAM, REINFORCE, MVD and ENUM sites beside SD sites; an SD site after a
    top-level ENUM site (inside its enumerated branches)."""
    nodes, weights = np.polynomial.hermite_e.hermegauss(40)
    nodes, weights = jnp.asarray(nodes, F32), jnp.asarray(weights / weights.sum(), F32)

    def parts(t, z, b1, b2, r):
        return (jax.nn.sigmoid(t), jax.nn.sigmoid(t + 0.5 * b1), jax.nn.sigmoid(0.3 * t + 0.4 * b2),
                jax.nn.sigmoid(0.5 * z - t + 0.3 * b2), 0.4 + 0.2 * jnp.tanh(t))

    def f(t, z, b1, b2, k, b3, r):
        return jnp.sin(z + b1 + 2 * b2 - b3 + 0.3 * k + 0.5 * r)

    @gv.expectation
    def obj(t, mu):
        z = gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
        b1 = gv.sample(gv.flip(parts(t, z, 0, 0, 0)[0], grad=gv.SD)).astype(F32)
        r = gv.sample(gv.flip(parts(t, z, b1, 0, 0)[4], grad=gv.REINFORCE)).astype(F32)
        b2 = gv.sample(gv.flip(parts(t, z, b1, 0, r)[1], grad=gv.ENUM)).astype(F32)
        k = gv.sample(gv.geometric(parts(t, z, b1, b2, r)[2], grad=gv.MVD)).astype(F32)
        b3 = gv.sample(gv.flip(parts(t, z, b1, b2, r)[3], grad=gv.SD)).astype(F32)
        return f(t, z, b1, b2, k, b3, r)

    ks = jnp.arange(80.0)

    def exact(t, mu):
        z = mu + nodes
        total = 0.0
        for b1, r, b2, b3 in itertools.product([0.0, 1.0], repeat=4):
            p1, p2, pg, p3, pr = parts(t, z, b1, b2, r)
            w = ((p1 if b1 else 1 - p1) * (pr if r else 1 - pr) * (p2 if b2 else 1 - p2)
                 * (p3 if b3 else 1 - p3))
            pk = jnp.exp(stats.geom.logpmf(ks + 1, pg))
            inner = jnp.sum(pk[:, None] * f(t, z[None], b1, b2, ks[:, None], b3, r), 0)
            total = total + jnp.sum(weights * w * inner)
        return total

    args = (F32(0.2), F32(0.3))
    _, (gt, gm) = jax.jit(jax.vmap(lambda k: obj.value_and_grad_estimate(k, *args, argnums=(0, 1))))(KEYS)
    et, em = jax.grad(exact, (0, 1))(*args)
    assert_unbiased(gt, et, "mixed θ")
    assert_unbiased(gm, em, "mixed μ")


def test_zero_mass_gives_no_nan():
    """p = 0: the alternative has probability 0 and its continuation is −inf; no
    SD site has mass, so no replay contributes and nothing is NaN."""
    @gv.expectation
    def obj(p):
        b = gv.sample(gv.flip(p, grad=gv.SD))
        return jnp.where(b, -jnp.inf, 1.0) + p

    g = jax.jit(jax.vmap(lambda k: obj.grad_estimate(k, 0.0)))(KEYS[:8])
    np.testing.assert_array_equal(np.asarray(g), 1.0)


def test_sd_refused_in_switch():
    with pytest.raises(TypeError, match="gv.switch cannot hold gv.SD"):
        gv.switch(jnp.int32(0), [gv.SD, gv.MVD])


def test_class_ranks_count_or_sort_alike():
    # SD's categorical order: counted for few classes, sorted for many; ties by index
    from genvi.distributions.discrete import _ranks
    p = jax.random.dirichlet(jax.random.key(2), jnp.ones(12), (5,))
    p = p.at[:, 3].set(p[:, 7])   # ties
    sorted_ranks = jnp.argsort(jnp.argsort(-p, axis=-1, stable=True), axis=-1, stable=True)
    np.testing.assert_array_equal(_ranks(p), sorted_ranks)
    wide = jnp.tile(p, (1, 4))     # 48 classes: the sorting path
    np.testing.assert_array_equal(
        _ranks(wide), jnp.argsort(jnp.argsort(-wide, axis=-1, stable=True), axis=-1, stable=True))
