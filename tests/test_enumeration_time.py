"""The time product of `gv.enumeration`: a chain's steps multiplied one after another
(`time="sequential"`) or by a balanced tree of transition matrices (`time="parallel"`)
give the same value and gradient, on an order-1 and an order-2 chain and on a batch of
padded sequences (the order-2 models of `test_enumeration_chains`), against a float64
numpy forward algorithm; T = 10⁴ steps compile to bounded memory in both."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import norm

import genvi as gv
from test_enumeration_chains import many_chains as chains2, one_chain as chain2

K, SD = 3, 0.7
TRANS = np.array([[0.80, 0.15, 0.05], [0.10, 0.70, 0.20], [0.25, 0.05, 0.70]], np.float32)
MEANS = np.array([-1.5, 0.3, 2.0], np.float32)
TIMES = ("sequential", "parallel")


@gv.gen
def step(carry, y):
    prev, trans, means = carry
    z = gv.categorical(jnp.log(trans[prev])) @ "z"
    gv.observe(gv.normal(means[z], SD), y)
    return (z, trans, means), None


@gv.gen
def hmm(ys):
    means = gv.normal(jnp.zeros(K), 2.0) @ "means"
    gv.scan(step)((0, jnp.asarray(TRANS), means), ys) @ "steps"


def value_and_grad(model, time, means, *args):
    m = gv.marginal(model, keep=["means"], algorithm=gv.enumeration(time=time))
    f = jax.jit(jax.value_and_grad(lambda mu: m.log_density(gv.choices({"means": mu}), *args)))
    return f(jnp.asarray(means)), m


def forward(log_trans, emit):
    """log Σ over paths, float64: log_trans [K^k histories..., K], emit [T, K]; first
    order only (the others are compared between the two forms)."""
    alpha = log_trans[0] + emit[0]
    for t in range(1, len(emit)):
        alpha = logsumexp(alpha[:, None] + log_trans, axis=0) + emit[t]
    return logsumexp(alpha)


def test_an_order_one_chain_gives_one_value_and_gradient_either_way():
    ys = np.random.default_rng(0).normal(size=37).astype(np.float32)   # 36 steps: odd levels
    results = {t: value_and_grad(hmm, t, MEANS, jnp.asarray(ys)) for t in TIMES}
    (seq, _), (par, m) = results["sequential"], results["parallel"]
    assert "parallel in time" in str(*m.plans.values())

    def exact(mu):
        emit = norm.logpdf(ys[:, None].astype(np.float64), mu, SD)
        return norm.logpdf(mu, 0.0, 2.0).sum() + forward(np.log(TRANS.astype(np.float64)), emit)
    assert float(par[0]) == pytest.approx(exact(MEANS.astype(np.float64)), abs=2e-3)
    assert float(par[0]) == pytest.approx(float(seq[0]), abs=1e-3)
    np.testing.assert_allclose(np.asarray(par[1]), np.asarray(seq[1]), rtol=1e-4, atol=1e-4)
    eps = 1e-5
    fd = [(exact(MEANS + eps * np.eye(K)[i]) - exact(MEANS - eps * np.eye(K)[i])) / (2 * eps)
          for i in range(K)]
    np.testing.assert_allclose(np.asarray(par[1]), fd, atol=2e-3)


@pytest.mark.parametrize("batch", [False, True], ids=["one chain", "padded batch"])
def test_an_order_two_chain_gives_one_value_and_gradient_either_way(batch):
    rng = np.random.default_rng(1)
    means = np.array([-1.0, 1.2], np.float32)
    if batch:
        ys = rng.normal(size=(3, 9)).astype(np.float32)
        valid = np.array([[True] * 9, [True] * 4 + [False] * 5, [True] * 8 + [False]])
        model = chains2
    else:
        ys, valid, model = rng.normal(size=11).astype(np.float32), np.ones(11, bool), chain2
    (seq, _), (par, m) = (value_and_grad(model, t, means, jnp.asarray(ys), jnp.asarray(valid))
                          for t in TIMES)
    assert "order 2" in str(*m.plans.values()) and "parallel in time" in str(*m.plans.values())
    assert float(par[0]) == pytest.approx(float(seq[0]), abs=1e-3)
    np.testing.assert_allclose(np.asarray(par[1]), np.asarray(seq[1]), rtol=1e-4, atol=1e-4)


def test_ten_thousand_steps_compile_to_bounded_memory_either_way():
    ys = jnp.asarray(np.random.default_rng(2).normal(size=10_000), jnp.float32)
    values = {}
    for t in TIMES:
        m = gv.marginal(hmm, keep=["means"], algorithm=gv.enumeration(time=t))
        f = jax.jit(jax.value_and_grad(
            lambda mu, ys: m.log_density(gv.choices({"means": mu}), ys)))
        compiled = f.lower(jnp.asarray(MEANS), ys).compile()
        memory = compiled.memory_analysis()
        if memory is not None:   # temporaries: O(T × K³) floats at most, a few MB
            assert memory.temp_size_in_bytes < 64 * 2**20, (t, memory.temp_size_in_bytes)
        values[t] = compiled(jnp.asarray(MEANS), ys)
    assert np.isfinite(float(values["parallel"][0]))
    assert float(values["parallel"][0]) == pytest.approx(float(values["sequential"][0]), rel=1e-5)
    np.testing.assert_allclose(np.asarray(values["parallel"][1]),
                               np.asarray(values["sequential"][1]), rtol=2e-3, atol=2e-2)


def test_a_chain_whose_other_carries_change_is_sequential_and_the_choice_is_checked():
    @gv.gen
    def counting(carry, y):   # a step counter beside the state: the steps differ
        prev, t = carry
        z = gv.flip(jnp.where(prev, 0.9, 0.2)) @ "z"
        gv.observe(gv.normal(jnp.where(z, 1.0, -1.0) + 0.01 * t, 1.0), y)
        return (z, t + 1.0), None

    @gv.gen
    def model(ys):
        gv.normal(0.0, 1.0) @ "means"
        gv.scan(counting)((False, 0.0), ys) @ "steps"
    ys = jnp.asarray([0.5, 1.0, -0.3, 0.2])
    (seq, _), (par, m) = (value_and_grad(model, t, 0.0, ys) for t in TIMES)
    assert "parallel" not in str(*m.plans.values())
    assert float(par[0]) == float(seq[0])
    assert gv.enumeration().parallel(10**6) is (jax.default_backend() != "cpu")
    with pytest.raises(ValueError, match="time='fast' is not one of"):
        gv.enumeration(time="fast")
