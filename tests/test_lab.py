"""`gv.compare_estimators`: its numbers are the direct ones, its bias flag fires for a
biased estimator and only for it, and it writes a table and a figure."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv

P = 0.3
F1, F0 = 0.64, 0.04          # f(b) = (b - 0.2)²: f(1), f(0)
EXACT = F1 - F0              # d/dp E f(b), b ~ flip(p)
SAMPLES = 4000


def f(b):
    return (b - 0.2) ** 2


def make(strategy):
    @gv.expectation
    def e(p):
        return f(jnp.where(gv.sample(gv.flip(p, grad=strategy)), 1.0, 0.0))
    return e


@gv.expectation
def relaxed(p):
    """A biased surrogate: the flip replaced by its concrete relaxation (temperature
    0.5), reparameterized."""
    u = gv.sample(gv.uniform(0.0, 1.0, grad=gv.REPARAM))
    logit = jnp.log(p) - jnp.log1p(-p) + jnp.log(u) - jnp.log1p(-u)
    return f(jax.nn.sigmoid(logit / 0.5))


@pytest.fixture(scope="module")
def labs():
    objectives = {"REINFORCE": make(gv.REINFORCE), "MVD": make(gv.MVD),
                  "ENUM": make(gv.ENUM), "relaxed": relaxed}
    key = jax.random.key(0)
    exact = gv.compare_estimators(objectives, key, P, samples=SAMPLES, rounds=2, exact=EXACT,
                                  batch=1000)
    others = gv.compare_estimators(objectives, key, P, samples=SAMPLES, rounds=2, batch=1000)
    return exact, others


def test_numbers_are_the_direct_computation(labs):
    lab, _ = labs
    keys = jax.random.split(jax.random.key(0), SAMPLES)
    direct = np.asarray(jax.jit(jax.vmap(lambda k: make(gv.REINFORCE).grad_estimate(k, P)))(keys),
                        np.float64)
    assert lab.mean["REINFORCE"]["p"] == pytest.approx(direct.mean(), rel=1e-5, abs=1e-6)
    assert lab.variance["REINFORCE"]["p"] == pytest.approx(direct.var(ddof=1), rel=1e-4)
    assert lab.stderr["REINFORCE"]["p"] == pytest.approx(direct.std(ddof=1) / math.sqrt(SAMPLES),
                                                          rel=1e-4)
    # ... and the variance is REINFORCE's exact one: f(1)/p w.p. p, −f(0)/(1−p) otherwise
    values, probs = np.array([F1 / P, -F0 / (1 - P)]), np.array([P, 1 - P])
    var = probs @ (values - EXACT) ** 2
    m4 = probs @ (values - EXACT) ** 4
    assert abs(lab.variance["REINFORCE"]["p"] - var) < 5 * math.sqrt((m4 - var ** 2) / SAMPLES)
    # MVD and ENUM are exact for a single flip: variance 0, mean f(1) − f(0)
    for name in ("MVD", "ENUM"):
        assert lab.variance[name]["p"] == pytest.approx(0.0, abs=1e-10)
        assert lab.mean[name]["p"] == pytest.approx(EXACT, rel=1e-6)
    assert set(lab.seconds) == {"REINFORCE", "MVD", "ENUM", "relaxed"}
    assert all(0 < s < 1 for s in lab.seconds.values())
    w = lab.work_variance["REINFORCE"]["p"]
    assert w == pytest.approx(lab.variance["REINFORCE"]["p"] * lab.seconds["REINFORCE"])


def test_bias_flag_fires_only_for_the_biased_estimator(labs):
    for lab in labs:
        assert lab.flagged == [("relaxed", "p")], lab.table()
        assert lab.max_z["relaxed"]["p"] > 10
    assert labs[0].against == "exact" and labs[1].against == "others"


def test_table_and_figure(labs, tmp_path):
    lab = labs[0]
    text = lab.table()
    assert str(lab) == text
    assert text.count("\n| p |") == 4 and "**biased**" in text and "exact gradient" in text
    path = lab.plot(str(tmp_path / "lab.png"))
    assert (tmp_path / "lab.png").stat().st_size > 1000 and path.endswith("lab.png")


def test_make_choices_pytree_leaves_and_errors(tmp_path):
    def make_cat(strategy):
        @gv.expectation
        def e(params, w):
            k = gv.sample(gv.categorical(params["logits"], grad=strategy))
            return w[k] ** 2
        return e

    params, w = {"logits": jnp.array([0.1, -0.3, 0.5])}, jnp.array([1.0, -2.0, 3.0])
    probs = jax.nn.softmax(params["logits"])
    exact = {"logits": probs * (w ** 2 - probs @ w ** 2)}
    lab = gv.compare_estimators({"REINFORCE": gv.REINFORCE, "ENUM": gv.ENUM}, jax.random.key(1),
                                params, w, make=make_cat, samples=500, rounds=2, exact=exact,
                                figure=str(tmp_path / "cat.png"))
    assert lab.leaves == ("logits",) and lab.mean["ENUM"]["logits"].shape == (3,)
    assert lab.flagged == [] and (tmp_path / "cat.png").exists()
    with pytest.raises(ValueError, match="no gradient leaf starts with"):
        gv.compare_estimators({"E": make_cat(gv.ENUM)}, jax.random.key(1), params, w,
                              leaves=["nope"])
    with pytest.raises(TypeError, match="not a gv.Expectation"):
        gv.compare_estimators({"E": gv.ENUM}, jax.random.key(1), params, w)


def test_random_walk_exact_derivative_matches_enumeration():
    """The benchmark's exact reference (dynamic programming) against all 2⁸ paths."""
    import itertools

    from genvi_experiments.bench.frontier.lab import walk_exact

    def brute(theta, n=8):
        total = 0.0
        for ups in itertools.product([0, 1], repeat=n):
            x, prob = 0, 1.0
            for u in ups:
                q = math.exp(-x / theta)
                prob *= q if u else 1 - q
                x += 1 if u else -1
            total += prob * x * x
        return total

    value, derivative = walk_exact(3.0, 8)
    assert value == pytest.approx(brute(3.0), rel=1e-12)
    h = 1e-5
    assert derivative == pytest.approx((brute(3.0 + h) - brute(3.0 - h)) / (2 * h), rel=1e-6)
