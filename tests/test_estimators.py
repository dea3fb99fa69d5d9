"""Statistical tests of genvi's gradient estimators (ADEV).

Every estimator genvi derives must be *unbiased*. For each program below we draw
`N` independent estimates (one `jax.random.split` key each, vectorized with
`jax.vmap` under one `jax.jit`) of the value and of the gradient, and require, for
every component, that

    |mean - exact| <= 5 standard errors + 1e-3 |exact| + 1e-5.

The exact values come from references that share no code with genvi: float64
NumPy/SciPy enumeration over finite (or truncated) supports, and fixed Gaussian
quadrature rules for continuous distributions (Gauss-Hermite for normals,
Gauss-Jacobi for beta/Dirichlet, generalized Gauss-Laguerre for gamma/Laplace,
Gauss-Legendre for uniform). The rules are smooth functions of the parameters, so
exact gradients are central finite differences of the float64 reference
(error ~1e-9). `test_reference_*` pins the references against closed forms.

Each test function is written once and used twice: with `jnp` inside the genvi
objective and with `np` inside the reference (`f(x, params, xp)`), and depends on
the parameters both through the sampled value and directly (pathwise term).

Sections:
1. every distribution x gradient strategy pair (incl. TFP-wrapped, baselines);
2. ENUM on a single-lane site is exact (zero variance);
3. composite programs: discrete then continuous sites and the reverse, sites
   under `jax.vmap`, `jax.lax.scan`, `jax.lax.cond`/`switch`, sums and scalings
   of expectations, `gv.batch_mean`;
4. reverse mode (`grad_estimate`) agrees with forward mode (`jvp_estimate`) on the
   same key;
plus the strategies a distribution must refuse.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree
from scipy import integrate, special, stats

import genvi as gv

pytestmark = pytest.mark.filterwarnings(  # TFP's JAX substrate asks for float64 internally
    "ignore:Explicitly requested dtype float64:UserWarning")

N = 20_000          # independent estimates per unbiasedness check
Z_SE = 5.0          # allowed deviation, in standard errors of the mean
REL_FLOOR = 1e-3    # plus this fraction of |exact|
ABS_FLOOR = 1e-5    # plus this (float32 accumulation)
F32 = jnp.float32


# ---------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------
def as_params(d: dict) -> dict:
    """A parameter dict of float32 JAX arrays."""
    return {k: jnp.asarray(v, F32) for k, v in d.items()}


def as_numpy(params: dict) -> dict:
    """The same parameters in float64 NumPy (exactly the float32 values used)."""
    return {k: np.asarray(v, np.float64) for k, v in params.items()}


def reference(F: Callable[[dict], float], params: dict, h: float = 1e-5) -> tuple:
    """`(F(params), dF/dparams)` of a float64 reference expected value `F`
    (a function of a dict of NumPy arrays), by central finite differences."""
    p0 = as_numpy(params)
    grad = {}
    for name, v in p0.items():
        g = np.zeros_like(v)
        for idx in np.ndindex(v.shape):
            up = {k: x.copy() for k, x in p0.items()}
            dn = {k: x.copy() for k, x in p0.items()}
            up[name][idx] += h
            dn[name][idx] -= h
            g[idx] = (F(up) - F(dn)) / (2 * h)
        grad[name] = g
    return float(F(p0)), grad


def _compare(what: str, samples: Any, exact: Any, failures: list) -> None:
    s = np.asarray(samples, np.float64)
    exact = np.asarray(exact, np.float64)
    assert s.shape[1:] == exact.shape, f"{what}: shape {s.shape[1:]} != {exact.shape}"
    n = s.shape[0]
    mean, se = s.mean(0), s.std(0, ddof=1) / math.sqrt(n)
    tol = Z_SE * se + REL_FLOOR * np.abs(exact) + ABS_FLOOR
    bad = ~(np.abs(mean - exact) <= tol)  # also catches NaN
    for i in np.flatnonzero(bad):
        idx = tuple(int(j) for j in np.unravel_index(i, exact.shape))
        failures.append(f"{what}{list(idx) if idx else ''}: mean {mean[idx]:.6g} vs exact "
                        f"{exact[idx]:.6g} (diff {mean[idx] - exact[idx]:.3g}, "
                        f"se {se[idx]:.3g}, tol {tol[idx]:.3g})")


def estimates(obj: gv.Expectation, args: tuple, n: int = N, seed: int = 0,
              argnums: Any = 0) -> tuple:
    """`n` independent `(value, gradient)` estimates, vectorized over keys."""
    keys = jax.random.split(jax.random.key(seed), n)
    fn = jax.jit(jax.vmap(lambda k: obj.value_and_grad_estimate(k, *args, argnums=argnums)))
    return fn(keys)


def check_unbiased(obj: gv.Expectation, args: tuple, exact_value: Any, exact_grad: Any, *,
                   n: int = N, seed: int = 0, argnums: Any = 0) -> tuple:
    """Assert the value and every gradient component are unbiased; returns the
    estimates `(values [n], grads pytree of [n, ...])`."""
    values, grads = estimates(obj, args, n, seed, argnums)
    failures: list = []
    if exact_value is not None:
        _compare("value", values, exact_value, failures)
    leaves, treedef = jax.tree_util.tree_flatten_with_path(grads)
    for (path, est), ex in zip(leaves, treedef.flatten_up_to(exact_grad)):
        _compare("grad" + jax.tree_util.keystr(path), est, ex, failures)
    assert not failures, "biased estimator:\n  " + "\n  ".join(failures)
    return values, grads


def strategy(name: str, baseline: Any = 1.0) -> gv.Strategy:
    if name == "REINFORCE+baseline":
        return gv.REINFORCE.with_baseline(jnp.asarray(baseline, F32))
    return getattr(gv, name)


def sel(b: Any, a: float, c: float) -> jax.Array:
    """float32 `a if b else c`."""
    return jnp.where(b, F32(a), F32(c))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


# ---------------------------------------------------------------------------------
# Float64 reference expectations (no genvi code)
# ---------------------------------------------------------------------------------
_HZ, _HW = np.polynomial.hermite_e.hermegauss(80)
_HW = _HW / _HW.sum()


def gaussian_expect(g: Callable, mean: Any, chol: Any, n: int = 30) -> float:
    """E g(X), X = mean + chol @ Z, Z ~ N(0, I) (tensor Gauss-Hermite grid).
    `g` maps [M, d] to [M]."""
    mean = np.atleast_1d(mean)
    d = mean.shape[0]
    z1, w1 = np.polynomial.hermite_e.hermegauss(n)
    w1 = w1 / w1.sum()
    z = np.stack(np.meshgrid(*[z1] * d, indexing="ij"), -1).reshape(-1, d)
    w = np.prod(np.stack(np.meshgrid(*[w1] * d, indexing="ij"), -1).reshape(-1, d), -1)
    return float(np.sum(w * g(mean + z @ np.asarray(chol).T)))


def normal_expect(g: Callable, loc: float, scale: float) -> float:
    return float(np.sum(_HW * g(loc + scale * _HZ)))


def _beta_rule(a: float, b: float, n: int = 60) -> tuple:
    t, w = special.roots_jacobi(n, b - 1.0, a - 1.0)  # weight (1-t)^(b-1) (1+t)^(a-1)
    return (1.0 + t) / 2.0, w / w.sum()


def beta_expect(g: Callable, a: float, b: float) -> float:
    x, w = _beta_rule(a, b)
    return float(np.sum(w * g(x)))


def gamma_expect(g: Callable, shape: float, rate: float, n: int = 120) -> float:
    y, w = special.roots_genlaguerre(n, shape - 1.0)
    return float(np.sum(w / w.sum() * g(y / rate)))


def laplace_expect(g: Callable, loc: float, scale: float, n: int = 120) -> float:
    y, w = special.roots_laguerre(n)
    return float(0.5 * np.sum(w * (g(loc + scale * y) + g(loc - scale * y))))


def uniform_expect(g: Callable, low: float, high: float, n: int = 64) -> float:
    t, w = np.polynomial.legendre.leggauss(n)
    return float(np.sum(w / 2.0 * g(low + (high - low) * (t + 1.0) / 2.0)))


def dirichlet3_expect(g: Callable, alpha: Any) -> float:
    """Stick breaking: x0 ~ Beta(a0, a1 + a2), v ~ Beta(a1, a2), x = (x0, (1-x0) v, (1-x0)(1-v))."""
    a0, a1, a2 = alpha
    x0, w0 = _beta_rule(a0, a1 + a2)
    v, wv = _beta_rule(a1, a2)
    x0, v = x0[:, None], v[None, :]
    x = np.stack(np.broadcast_arrays(x0, (1 - x0) * v, (1 - x0) * (1 - v)), -1)
    return float(np.sum(w0[:, None] * wv[None, :] * g(x)))


def discrete_expect(g: Callable, support: Any, probs: Any) -> float:
    return float(np.sum(np.asarray(probs) * g(np.asarray(support, np.float64))))


def flips_expect(g: Callable, ps: Any) -> float:
    """E g(B) for independent flips B_i ~ Bernoulli(ps_i) of any shape (enumeration)."""
    ps = np.asarray(ps, np.float64)
    configs = np.array(list(itertools.product([0.0, 1.0], repeat=ps.size))).reshape((-1,) + ps.shape)
    probs = np.prod(np.where(configs == 1.0, ps, 1.0 - ps).reshape(len(configs), -1), -1)
    return discrete_expect(g, configs, probs)


def softmax(logits: Any) -> np.ndarray:
    e = np.exp(logits - np.max(logits))
    return e / e.sum()


def mvn_cov(p: dict, xp: Any) -> Any:
    s = xp.exp(p["log_s"])
    c = p["rho"] * s[0] * s[1]
    return xp.stack([xp.stack([s[0] ** 2, c]), xp.stack([c, s[1] ** 2])])


# ---------------------------------------------------------------------------------
# 1. Every distribution x strategy pair
# ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """A distribution with parameters, a test function `f(x, params, xp)`, the
    reference `expect(g, numpy params) = E g(X)`, and the strategies to test."""

    draw: Callable          # (params, strategy) -> float32 value inside an objective
    f: Callable             # (x, params, xp) -> scalar
    expect: Callable        # (g, params) -> float
    params: dict
    strategies: tuple
    baseline: Any = 1.0     # constant baseline for "REINFORCE+baseline"


def _tfp():
    from tensorflow_probability.substrates import jax as tfp
    return tfp


W22 = np.array([[1.0, -0.5], [2.0, 0.7]])

CASES = {
    "normal": Case(
        draw=lambda p, s: gv.sample(gv.normal(p["loc"], p["scale"], grad=s)),
        f=lambda x, p, xp: xp.sin(2 * x) + 0.3 * x ** 2 + p["loc"] * xp.cos(x),
        expect=lambda g, p: normal_expect(g, p["loc"], p["scale"]),
        params={"loc": 0.4, "scale": 1.2},
        strategies=("REPARAM", "REINFORCE", "MVD", "REINFORCE+baseline")),
    "mv_normal_diag": Case(
        draw=lambda p, s: gv.sample(gv.mv_normal_diag(p["loc"], p["scale"], grad=s)),
        f=lambda x, p, xp: (xp.sin(x[..., 0]) * xp.cos(x[..., 1]) + 0.3 * (x[..., 0] - x[..., 2]) ** 2
                            + p["loc"][2] * xp.sin(x[..., 2])),
        expect=lambda g, p: gaussian_expect(g, p["loc"], np.diag(p["scale"])),
        params={"loc": [0.3, -0.5, 1.0], "scale": [0.8, 1.1, 0.6]},
        strategies=("REPARAM", "REINFORCE", "MVD")),
    "mv_normal": Case(
        draw=lambda p, s: gv.sample(gv.mv_normal(p["loc"], mvn_cov(p, jnp), grad=s)),
        f=lambda x, p, xp: (xp.sin(x[..., 0] + 0.5 * x[..., 1]) + 0.2 * x[..., 0] * x[..., 1]
                            + p["rho"] * xp.cos(x[..., 1])),
        expect=lambda g, p: gaussian_expect(g, p["loc"], np.linalg.cholesky(mvn_cov(p, np)), n=40),
        params={"loc": [0.2, -0.4], "log_s": [0.1, -0.2], "rho": 0.5},
        strategies=("REPARAM", "REINFORCE")),
    "normal_broadcast": Case(  # three lanes: a vector loc with one scalar scale
        draw=lambda p, s: gv.sample(gv.normal(p["loc"], p["scale"], grad=s)),
        f=lambda x, p, xp: xp.sin(x[..., 0] - x[..., 2]) + 0.2 * (x ** 2).sum(-1) * xp.cos(x[..., 1]),
        expect=lambda g, p: gaussian_expect(g, p["loc"], p["scale"] * np.eye(3), n=24),
        params={"loc": [0.1, -0.6, 0.9], "scale": 0.7},
        strategies=("REPARAM", "REINFORCE", "MVD")),
    "uniform": Case(
        draw=lambda p, s: gv.sample(gv.uniform(p["low"], p["high"], grad=s)),
        f=lambda x, p, xp: xp.sin(3 * x) + x ** 2 + p["high"] * xp.cos(x),
        expect=lambda g, p: uniform_expect(g, p["low"], p["high"]),
        params={"low": -0.3, "high": 1.4},
        strategies=("REPARAM",)),
    "beta": Case(
        draw=lambda p, s: gv.sample(gv.beta(p["a"], p["b"], grad=s)),
        f=lambda x, p, xp: xp.sin(4 * x) + x ** 2 + p["a"] * x,
        expect=lambda g, p: beta_expect(g, p["a"], p["b"]),
        params={"a": 2.0, "b": 3.0},
        strategies=("REPARAM", "REINFORCE")),
    "gamma": Case(
        draw=lambda p, s: gv.sample(gv.gamma(p["shape"], p["rate"], grad=s)),
        f=lambda x, p, xp: xp.sin(2 * x) + 0.2 * x ** 2 + p["rate"] * xp.cos(x),
        expect=lambda g, p: gamma_expect(g, p["shape"], p["rate"]),
        params={"shape": 2.5, "rate": 1.5},
        strategies=("REPARAM", "REINFORCE")),
    "dirichlet": Case(
        draw=lambda p, s: gv.sample(gv.dirichlet(p["alpha"], grad=s)),
        f=lambda x, p, xp: xp.sin(3 * x[..., 0]) + x[..., 1] ** 2 + 2 * x[..., 0] * x[..., 2],
        expect=lambda g, p: dirichlet3_expect(g, p["alpha"]),
        params={"alpha": [1.5, 2.0, 3.0]},
        strategies=("REPARAM", "REINFORCE")),
    "tfp_laplace": Case(
        draw=lambda p, s: gv.sample(gv.from_tfp(_tfp().distributions.Laplace)(
            loc=p["loc"], scale=p["scale"], grad=s)),
        f=lambda x, p, xp: xp.sin(2 * x) + 0.2 * x ** 2 + p["loc"] * xp.cos(x),
        expect=lambda g, p: laplace_expect(g, p["loc"], p["scale"]),
        params={"loc": 0.3, "scale": 0.9},
        strategies=("REPARAM", "REINFORCE")),
    "tfp_poisson": Case(
        draw=lambda p, s: gv.sample(gv.from_tfp(_tfp().distributions.Poisson)(
            rate=p["rate"], grad=s)).astype(F32),
        f=lambda x, p, xp: xp.sin(x) + 0.1 * x ** 2 + p["rate"] * xp.cos(x),
        expect=lambda g, p: discrete_expect(g, np.arange(120), stats.poisson.pmf(np.arange(120), p["rate"])),
        params={"rate": 2.5},
        strategies=("REINFORCE",)),
    "flip": Case(
        draw=lambda p, s: gv.sample(gv.flip(p["p"], grad=s)).astype(F32),
        f=lambda x, p, xp: xp.sin(3 * x + p["p"]) + 2 * x * p["p"],
        expect=lambda g, p: flips_expect(g, p["p"]),
        params={"p": 0.35},
        strategies=("ENUM", "REINFORCE", "MVD")),
    "bernoulli_scalar": Case(
        draw=lambda p, s: gv.sample(gv.bernoulli(logits=p["logits"], grad=s)).astype(F32),
        f=lambda x, p, xp: xp.cos(2 * x - p["logits"]) + x * p["logits"] ** 2,
        expect=lambda g, p: flips_expect(g, sigmoid(p["logits"])),
        params={"logits": 0.4},
        strategies=("ENUM", "REINFORCE", "MVD")),
    "bernoulli": Case(  # a 2x2 array of independent lanes
        draw=lambda p, s: gv.sample(gv.bernoulli(logits=p["logits"], grad=s)).astype(F32),
        f=lambda x, p, xp: ((x * W22).sum(axis=(-2, -1)) ** 2 + xp.sin(x[..., 0, 0] + 2 * x[..., 1, 1])
                            + p["logits"][0, 1] * x[..., 0, 1]),
        expect=lambda g, p: flips_expect(g, sigmoid(p["logits"])),
        params={"logits": [[0.3, -1.0], [0.8, 0.1]]},
        strategies=("ENUM", "REINFORCE", "MVD", "REINFORCE+baseline"),
        baseline=[[2.0, 1.0], [3.0, 2.5]]),  # one baseline per lane
    "categorical": Case(
        draw=lambda p, s: gv.sample(gv.categorical(p["logits"], grad=s)).astype(F32),
        f=lambda x, p, xp: xp.sin(2 * x) + 0.3 * x ** 2 + p["logits"][1] * xp.cos(x),
        expect=lambda g, p: discrete_expect(g, np.arange(4), softmax(p["logits"])),
        params={"logits": [0.2, -0.5, 1.0, 0.0]},
        strategies=("ENUM", "REINFORCE", "MVD", "REINFORCE+baseline")),
    "categorical_batch": Case(  # two independent categorical lanes (logits [2, 3])
        draw=lambda p, s: gv.sample(gv.categorical(p["logits"], grad=s)).astype(F32),
        f=lambda x, p, xp: xp.sin(x[..., 0] + 2 * x[..., 1]) + (x[..., 0] - x[..., 1]) ** 2
        + p["logits"][1, 2] * x[..., 1],
        expect=lambda g, p: discrete_expect(
            g, list(itertools.product(range(3), repeat=2)),
            [softmax(p["logits"][0])[i] * softmax(p["logits"][1])[j]
             for i, j in itertools.product(range(3), repeat=2)]),
        params={"logits": [[0.2, -0.5, 1.0], [0.0, 0.7, -0.3]]},
        strategies=("ENUM", "REINFORCE", "MVD")),
    "geometric": Case(
        draw=lambda p, s: gv.sample(gv.geometric(p["p"], grad=s)).astype(F32),
        f=lambda x, p, xp: xp.sin(x) + 0.05 * x ** 2 + p["p"] * xp.cos(x),
        expect=lambda g, p: discrete_expect(g, np.arange(800), (1 - p["p"]) ** np.arange(800) * p["p"]),
        params={"p": 0.4},
        strategies=("REINFORCE", "MVD")),
    "poisson": Case(
        draw=lambda p, s: gv.sample(gv.poisson(p["rate"], grad=s)).astype(F32),
        f=lambda x, p, xp: xp.sin(x) + 0.1 * x ** 2 + p["rate"] * xp.cos(x),
        expect=lambda g, p: discrete_expect(g, np.arange(120), stats.poisson.pmf(np.arange(120), p["rate"])),
        params={"rate": 2.5},
        strategies=("REINFORCE", "MVD", "REINFORCE+baseline"),
        baseline=2.0),
    "binomial": Case(  # n = 6 trials (a constant); differentiate in p
        draw=lambda p, s: gv.sample(gv.binomial(6, p["p"], grad=s)).astype(F32),
        f=lambda x, p, xp: xp.sin(x) + 0.2 * x ** 2 + p["p"] * x,
        expect=lambda g, p: discrete_expect(g, np.arange(7), stats.binom.pmf(np.arange(7), 6, p["p"])),
        params={"p": 0.3},
        strategies=("ENUM", "REINFORCE", "MVD")),
}


def case_objective(case: Case, strat: gv.Strategy) -> gv.Expectation:
    @gv.expectation
    def objective(params):
        return case.f(case.draw(params, strat), params, jnp)
    return objective


def case_reference(case: Case) -> Callable[[dict], float]:
    return lambda p: case.expect(lambda x: case.f(x, p, np), p)


DIST_STRATEGY = [pytest.param(name, s, id=f"{name}-{s}")
                 for name, case in CASES.items() for s in case.strategies]


@pytest.mark.parametrize("name, strat", DIST_STRATEGY)
def test_distribution_strategy_unbiased(name, strat):
    case = CASES[name]
    params = as_params(case.params)
    obj = case_objective(case, strategy(strat, case.baseline))
    check_unbiased(obj, (params,), *reference(case_reference(case), params))


@pytest.mark.parametrize("name", ["normal", "categorical", "bernoulli"])
def test_reinforce_learned_baseline(name):
    """A baseline computed from parameters `w` (one per lane for the 2x2 bernoulli):
    the objective's parameters get unbiased gradients; `w` gets the documented
    training signal, the gradient of -1/2 (f - b)^2, whose mean is (E f - b) db/dw."""
    case = CASES[name]
    shape = np.shape(case.baseline) if name == "bernoulli" else ()
    params = as_params({**case.params, "w": np.full(shape, 0.3)})

    @gv.expectation
    def objective(p):
        b = 2.0 * p["w"] + 0.5
        return case.f(case.draw(p, gv.REINFORCE.with_baseline(b)), p, jnp)

    value, grad = reference(case_reference(case), params)
    b = 2.0 * as_numpy(params)["w"] + 0.5
    grad["w"] = 2.0 * (value - b)
    check_unbiased(objective, (params,), value, grad)


def test_reinforce_baseline_reduces_variance():
    """Sanity check that a baseline near E f actually acts as a control variate."""
    params = {"loc": F32(0.4), "scale": F32(1.2)}

    def make(s):
        @gv.expectation
        def objective(p):
            x = gv.sample(gv.normal(p["loc"], p["scale"], grad=s))
            return 10.0 + jnp.sin(2 * x)
        return objective

    _, plain = estimates(make(gv.REINFORCE), (params,), n=4000)
    _, based = estimates(make(gv.REINFORCE.with_baseline(10.0)), (params,), n=4000)
    assert float(jnp.std(based["loc"])) < 0.2 * float(jnp.std(plain["loc"]))


# ---------------------------------------------------------------------------------
# 2. ENUM on a single-lane site: exact, zero variance
# ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["flip", "bernoulli_scalar", "categorical"])
def test_enum_single_site_is_exact(name):
    case = CASES[name]
    params = as_params(case.params)
    exact_value, exact_grad = reference(case_reference(case), params)
    values, grads = estimates(case_objective(case, gv.ENUM), (params,), n=256)
    for what, est, ex in [("value", values, exact_value)] + [
            (f"grad[{k}]", grads[k], exact_grad[k]) for k in exact_grad]:
        est = np.asarray(est, np.float64)
        assert est.std(0).max() < 1e-5, f"{what}: ENUM estimate is not deterministic"
        np.testing.assert_allclose(est.mean(0), ex, rtol=1e-5, atol=1e-5, err_msg=what)


# ---------------------------------------------------------------------------------
# 3. Composite programs. Builders return (objective, params, reference F).
# ---------------------------------------------------------------------------------
DISCRETE = ["ENUM", "MVD", "REINFORCE"]
CONTINUOUS = ["REPARAM", "REINFORCE", "MVD"]


def build_discrete_then_normal(s: str):
    """A flip, then a REPARAM normal whose mean depends on it."""
    S = getattr(gv, s)

    @gv.expectation
    def objective(p):
        b = gv.sample(gv.flip(p["p"], grad=S)).astype(F32)
        x = gv.sample(gv.normal(p["mu"] + 1.5 * b, 0.8, grad=gv.REPARAM))
        return jnp.sin(2 * x) + b * x ** 2 + p["p"] * x

    def F(p):
        def branch(b):
            return normal_expect(lambda x: np.sin(2 * x) + b * x ** 2 + p["p"] * x, p["mu"] + 1.5 * b, 0.8)
        return p["p"] * branch(1.0) + (1 - p["p"]) * branch(0.0)

    return objective, as_params({"p": 0.3, "mu": 0.2}), F


def build_normal_then_flip(s: str):
    """A REPARAM normal, then a flip with probability sigmoid(x)."""
    S = getattr(gv, s)

    @gv.expectation
    def objective(p):
        x = gv.sample(gv.normal(p["mu"], jnp.exp(p["log_s"]), grad=gv.REPARAM))
        b = gv.sample(gv.flip(jax.nn.sigmoid(x), grad=S))
        return jnp.where(b, jnp.sin(2 * x), x ** 2 - 1.0)

    def F(p):
        g = lambda x: sigmoid(x) * np.sin(2 * x) + (1 - sigmoid(x)) * (x ** 2 - 1.0)
        return normal_expect(g, p["mu"], np.exp(p["log_s"]))

    return objective, as_params({"mu": 0.3, "log_s": -0.2}), F


def build_discrete_then_discrete(s1: str, s2: str):
    """A flip, then a categorical whose logits depend on it (an ENUM site followed by
    MVD/REINFORCE sites exercises replays of the continuation inside enumeration)."""
    S1, S2 = getattr(gv, s1), getattr(gv, s2)
    shift = jnp.array([1.0, -1.0, 0.5], F32)

    @gv.expectation
    def objective(p):
        b = gv.sample(gv.flip(p["p"], grad=S1)).astype(F32)
        k = gv.sample(gv.categorical(p["logits"] + b * shift, grad=S2)).astype(F32)
        return jnp.sin(2 * k + b) + (k - b) ** 2 + p["p"] * k

    def F(p):
        total = 0.0
        for b in (0.0, 1.0):
            probs = softmax(p["logits"] + b * np.array([1.0, -1.0, 0.5]))
            k = np.arange(3.0)
            total += (p["p"] if b else 1 - p["p"]) * np.dot(
                probs, np.sin(2 * k + b) + (k - b) ** 2 + p["p"] * k)
        return total

    return objective, as_params({"p": 0.4, "logits": [0.3, -0.2, 0.6]}), F


def build_vmap_flips(s: str, shared: bool):
    """Three flips under jax.vmap, f = (sum)^2 + ...: iid (one unmapped p) or one p per lane."""
    S = getattr(gv, s)
    w = jnp.array([1.0, 2.0, 3.0], F32)

    @gv.expectation
    def objective(p):
        if shared:
            bs = jax.vmap(lambda _: gv.sample(gv.flip(p["p"], grad=S)))(jnp.arange(3))
        else:
            bs = jax.vmap(lambda q: gv.sample(gv.flip(q, grad=S)))(p["p"])
        bs = bs.astype(F32)
        return jnp.sum(bs) ** 2 + 0.5 * jnp.sin(jnp.dot(bs, w))

    def F(p):
        ps = np.broadcast_to(p["p"], (3,))
        return flips_expect(lambda b: b.sum(-1) ** 2 + 0.5 * np.sin(b @ np.array([1.0, 2.0, 3.0])), ps)

    return objective, as_params({"p": 0.4 if shared else [0.3, 0.6, 0.8]}), F


def build_vmap_normals(s: str):
    """Three independent normals under jax.vmap, f = (sum sin x)^2 + ..."""
    S = getattr(gv, s)

    @gv.expectation
    def objective(p):
        xs = jax.vmap(lambda m: gv.sample(gv.normal(m, jnp.exp(p["log_s"]), grad=S)))(p["mu"])
        return jnp.sum(jnp.sin(xs)) ** 2 + 0.1 * jnp.sum(xs ** 2)

    def F(p):
        g = lambda x: np.sin(x).sum(-1) ** 2 + 0.1 * (x ** 2).sum(-1)
        return gaussian_expect(g, p["mu"], np.exp(p["log_s"]) * np.eye(3), n=24)

    return objective, as_params({"mu": [0.5, -0.3, 1.0], "log_s": -0.1}), F


SCAN_W = np.array([1.0, -0.5, 2.0])


def build_scan_flips(s: str):
    """jax.lax.scan of length 3; each step's flip probability depends on the carry."""
    S = getattr(gv, s)

    @gv.expectation
    def objective(p):
        def step(c, w):
            b = gv.sample(gv.flip(jax.nn.sigmoid(p["theta"] + 0.7 * c - 0.5), grad=S)).astype(F32)
            return c + b, b * w
        c, ys = jax.lax.scan(step, F32(0.0), jnp.asarray(SCAN_W, F32))
        return c ** 2 + jnp.sin(jnp.sum(ys)) + p["theta"] * c

    def F(p):
        total = 0.0
        for path in itertools.product([0.0, 1.0], repeat=3):
            c, prob = 0.0, 1.0
            for b in path:
                q = sigmoid(p["theta"] + 0.7 * c - 0.5)
                prob *= q if b else 1 - q
                c += b
            total += prob * (c ** 2 + np.sin(np.dot(path, SCAN_W)) + p["theta"] * c)
        return total

    return objective, as_params({"theta": 0.2}), F


def build_scan_normals(s: str):
    """An AR(1) chain of 3 normals in jax.lax.scan."""
    S = getattr(gv, s)

    @gv.expectation
    def objective(p):
        def step(c, _):
            x = gv.sample(gv.normal(0.5 * c + p["mu"], jnp.exp(p["log_s"]), grad=S))
            return x, jnp.sin(x)
        c, ys = jax.lax.scan(step, F32(0.0), None, length=3)
        return 0.2 * c ** 2 + jnp.sum(ys)

    def F(p):
        sd = np.exp(p["log_s"])
        mean = p["mu"] * np.array([1.0, 1.5, 1.75])
        A = sd * np.array([[1.0, 0, 0], [0.5, 1.0, 0], [0.25, 0.5, 1.0]])
        return gaussian_expect(lambda x: 0.2 * x[:, 2] ** 2 + np.sin(x).sum(-1), mean, A, n=24)

    return objective, as_params({"mu": 0.3, "log_s": -0.3}), F


def build_cond_flips(s: str):
    """Flips nested in jax.lax.cond branches, with a cond inside a cond."""
    S = getattr(gv, s)

    @gv.expectation
    def objective(p):
        q = p["q"]

        def flip(i):
            return gv.sample(gv.flip(q[i], grad=S))

        def yes(_):
            return jax.lax.cond(flip(1), lambda _: sel(flip(2), 3.0, 1.0), lambda _: F32(-0.5), None)

        def no(_):
            return sel(flip(3), -1.0, 0.5)

        v = jax.lax.cond(flip(0), yes, no, None)
        return v ** 2 + jnp.sin(v) + q[0] * v

    def F(p):
        q = p["q"]
        h = lambda v: v ** 2 + np.sin(v) + q[0] * v
        yes = q[1] * (q[2] * h(3.0) + (1 - q[2]) * h(1.0)) + (1 - q[1]) * h(-0.5)
        no = q[3] * h(-1.0) + (1 - q[3]) * h(0.5)
        return q[0] * yes + (1 - q[0]) * no

    return objective, as_params({"q": [0.3, 0.6, 0.75, 0.45]}), F


def build_cond_continuous(s_flip: str, s_normal: str):
    """A flip choosing between two branches that each sample a normal."""
    S1, S2 = getattr(gv, s_flip), getattr(gv, s_normal)

    @gv.expectation
    def objective(p):
        b = gv.sample(gv.flip(p["p"], grad=S1))
        v = jax.lax.cond(
            b,
            lambda p: jnp.sin(2 * gv.sample(gv.normal(p["mu"], 1.0, grad=S2))),
            lambda p: 0.5 * gv.sample(gv.normal(2 * p["mu"], 0.5, grad=S2)) ** 2,
            p)
        return v + p["mu"] * v

    def F(p):
        yes = normal_expect(lambda x: np.sin(2 * x), p["mu"], 1.0)
        no = normal_expect(lambda x: 0.5 * x ** 2, 2 * p["mu"], 0.5)
        return (1 + p["mu"]) * (p["p"] * yes + (1 - p["p"]) * no)

    return objective, as_params({"p": 0.35, "mu": 0.4}), F


def build_switch(s: str):
    """A categorical choosing a jax.lax.switch branch; branches sample a REPARAM
    normal, a flip, or nothing."""
    S = getattr(gv, s)

    @gv.expectation
    def objective(p):
        k = gv.sample(gv.categorical(p["logits"], grad=S))
        branches = [
            lambda p: jnp.sin(3 * gv.sample(gv.normal(p["mu"], 0.5, grad=gv.REPARAM))),
            lambda p: sel(gv.sample(gv.flip(p["q"], grad=S)), 2.0, -1.0),
            lambda p: p["mu"] ** 2,
        ]
        v = jax.lax.switch(k, branches, p)
        return v ** 2 + v

    def F(p):
        h = lambda v: v ** 2 + v
        e0 = normal_expect(lambda x: h(np.sin(3 * x)), p["mu"], 0.5)
        e1 = p["q"] * h(2.0) + (1 - p["q"]) * h(-1.0)
        e2 = h(p["mu"] ** 2)
        return float(np.dot(softmax(p["logits"]), [e0, e1, e2]))

    return objective, as_params({"logits": [0.1, 0.5, -0.3], "mu": 0.4, "q": 0.7}), F


def build_batch_mean(s: str):
    """gv.batch_mean of a per-datapoint objective over 4 datapoints."""
    S = getattr(gv, s)
    xs = jnp.array([-1.0, 0.5, 2.0, 0.3], F32)

    @gv.expectation
    def per_point(p, x):
        z = gv.sample(gv.normal(p["mu"], jnp.exp(p["log_s"]), grad=gv.REPARAM))
        b = gv.sample(gv.flip(jax.nn.sigmoid(p["w"] * x), grad=S)).astype(F32)
        return -((z - x) ** 2) + b * jnp.sin(z + x) + p["w"] * x

    def F(p):
        def one(x):
            q = sigmoid(p["w"] * x)
            return normal_expect(lambda z: -((z - x) ** 2) + q * np.sin(z + x) + p["w"] * x,
                                 p["mu"], np.exp(p["log_s"]))
        return float(np.mean([one(x) for x in np.asarray(xs, np.float64)]))

    return gv.batch_mean(per_point, in_axes=(None, 0)), as_params({"mu": 0.2, "log_s": -0.1, "w": 0.8}), F, xs


def _check_built(built, **kw):
    objective, params, F = built[:3]
    extra = tuple(built[3:])
    check_unbiased(objective, (params,) + extra, *reference(F, params), **kw)


@pytest.mark.parametrize("s", DISCRETE)
def test_discrete_site_then_reparam_normal(s):
    _check_built(build_discrete_then_normal(s))


@pytest.mark.parametrize("s", DISCRETE)
def test_reparam_normal_then_dependent_flip(s):
    _check_built(build_normal_then_flip(s))


@pytest.mark.parametrize("s1, s2", [("ENUM", "ENUM"), ("ENUM", "MVD"), ("ENUM", "REINFORCE"),
                                    ("MVD", "ENUM"), ("REINFORCE", "ENUM"), ("MVD", "REINFORCE")])
def test_discrete_site_then_discrete_site(s1, s2):
    _check_built(build_discrete_then_discrete(s1, s2))


@pytest.mark.parametrize("shared", [True, False], ids=["iid", "per_lane_p"])
@pytest.mark.parametrize("s", DISCRETE)
def test_vmap_flips(s, shared):
    _check_built(build_vmap_flips(s, shared))


@pytest.mark.parametrize("learned", [False, True], ids=["constant", "learned"])
def test_vmap_flips_reinforce_baseline(learned):
    """REINFORCE with a baseline on a site under jax.vmap (one baseline per lane)."""
    @gv.expectation
    def objective(p):
        b = 2.0 * p["w"] + 0.5 if learned else F32(3.0)
        bs = jax.vmap(lambda q: gv.sample(gv.flip(q, grad=gv.REINFORCE.with_baseline(b))))(p["p"])
        return jnp.sum(bs.astype(F32)) ** 2 + p["p"][0]

    params = as_params({"p": [0.3, 0.6, 0.8], "w": 0.3})
    F = lambda p: flips_expect(lambda b: b.sum(-1) ** 2, p["p"]) + p["p"][0]
    value, grad = reference(F, params)
    if learned:  # the gradient of -1/2 sum_lanes (f - b)^2, b = 2w + 0.5 in each lane
        grad["w"] = 3 * 2.0 * (value - (2.0 * 0.3 + 0.5))
    check_unbiased(objective, (params,), value, grad)


@pytest.mark.parametrize("s", CONTINUOUS)
def test_vmap_normals(s):
    _check_built(build_vmap_normals(s))


@pytest.mark.parametrize("s", DISCRETE)
def test_scan_flips(s):
    _check_built(build_scan_flips(s))


@pytest.mark.parametrize("s", CONTINUOUS)
def test_scan_normals(s):
    _check_built(build_scan_normals(s))


@pytest.mark.parametrize("s", DISCRETE)
def test_cond_nested_flips(s):
    _check_built(build_cond_flips(s))


@pytest.mark.parametrize("s_flip, s_normal", [("ENUM", "REPARAM"), ("MVD", "MVD"),
                                              ("REINFORCE", "REINFORCE"), ("MVD", "REPARAM")])
def test_cond_branches_with_normals(s_flip, s_normal):
    _check_built(build_cond_continuous(s_flip, s_normal))


@pytest.mark.parametrize("s", DISCRETE)
def test_switch_on_categorical(s):
    _check_built(build_switch(s))


@pytest.mark.parametrize("s", DISCRETE)
def test_batch_mean(s):
    _check_built(build_batch_mean(s))


def build_reused_subprogram(where: str, s: str):
    """One sub-program (a scan step, a cond branch, a jitted function) sampling a
    flip, used twice: the two uses are two independent sites."""
    S = getattr(gv, s)

    def draw(q):
        return gv.sample(gv.flip(q, grad=S)).astype(F32)

    def step(c, q):
        return c + draw(q), None

    jitted = jax.jit(draw)

    def twice(q):
        if where == "scan":
            return [jax.lax.scan(step, F32(0.0), q[i:i + 1])[0] for i in range(2)]
        if where == "cond":
            return [jax.lax.cond(q[0] > -1.0, draw, lambda _: F32(0.0), q[i]) for i in range(2)]
        return [jitted(q[i]) for i in range(2)]

    @gv.expectation
    def objective(p):
        b1, b2 = twice(p["q"])
        return (b1 + 2 * b2) ** 2 + jnp.sin(b1)

    def F(p):
        return flips_expect(lambda b: (b[..., 0] + 2 * b[..., 1]) ** 2 + np.sin(b[..., 0]), p["q"])

    return objective, as_params({"q": [0.3, 0.6]}), F


@pytest.mark.parametrize("where, s", [
    pytest.param(w, s, id=f"{w}-{s}") for w in ("scan", "cond", "jit") for s in DISCRETE])
def test_reused_subprogram_sites_are_independent(where, s):
    """JAX shares the jaxpr of a function traced twice: a replay must override only
    the use it was asked for (sites are located by their enclosing equations)."""
    _check_built(build_reused_subprogram(where, s))


COMBINATIONS = {
    "2*e1-e2": lambda a, b: 2.0 * a - b,
    "e1+e2": lambda a, b: a + b,
    "-e1": lambda a, b: -a,
    "e2*0.5-(-e1)": lambda a, b: b * 0.5 - (-a),
}


@pytest.mark.parametrize("combo", list(COMBINATIONS))
def test_expectation_algebra(combo):
    """Sums, differences and scalings of expectations (e1: normal REPARAM,
    e2: categorical MVD then a flip ENUM) are estimated without bias."""
    c1, c2 = CASES["normal"], CASES["categorical"]
    e1 = case_objective(c1, gv.REPARAM)

    @gv.expectation
    def e2(p):
        k = c2.draw(p, gv.MVD)
        b = gv.sample(gv.flip(jax.nn.sigmoid(p["loc"]), grad=gv.ENUM)).astype(F32)
        return c2.f(k, p, jnp) * (1.0 + b)

    params = as_params({**c1.params, **c2.params})
    F1 = case_reference(c1)
    F2 = lambda p: (1 + sigmoid(p["loc"])) * case_reference(c2)(p)
    fn = COMBINATIONS[combo]
    check_unbiased(fn(e1, e2), (params,), *reference(lambda p: fn(F1(p), F2(p)), params))


def test_several_arguments_argnums():
    """Gradients with respect to two positional arguments (argnums=(0, 1)) and
    with respect to the second only."""
    @gv.expectation
    def objective(mu, q):
        x = gv.sample(gv.normal(mu, 0.9, grad=gv.MVD))
        b = gv.sample(gv.flip(q, grad=gv.ENUM)).astype(F32)
        return jnp.sin(x + b) + mu * q

    mu, q = F32(0.3), F32(0.6)

    def F(p):
        return (p["q"] * normal_expect(lambda x: np.sin(x + 1), p["mu"], 0.9)
                + (1 - p["q"]) * normal_expect(np.sin, p["mu"], 0.9) + p["mu"] * p["q"])

    value, grad = reference(F, {"mu": mu, "q": q})
    check_unbiased(objective, (mu, q), value, (grad["mu"], grad["q"]), argnums=(0, 1))
    check_unbiased(objective, (mu, q), value, grad["q"], argnums=1)


# ---------------------------------------------------------------------------------
# 4. Reverse mode equals forward mode on the same key
# ---------------------------------------------------------------------------------
REV_FWD_PROGRAMS = {
    "mv_normal_diag-REPARAM": lambda: (case_objective(CASES["mv_normal_diag"], gv.REPARAM),
                                       as_params(CASES["mv_normal_diag"].params)),
    "normal-REINFORCE": lambda: (case_objective(CASES["normal"], gv.REINFORCE),
                                 as_params(CASES["normal"].params)),
    "bernoulli-REINFORCE+baseline": lambda: (
        case_objective(CASES["bernoulli"], strategy("REINFORCE+baseline", CASES["bernoulli"].baseline)),
        as_params(CASES["bernoulli"].params)),
    "mv_normal_diag-MVD": lambda: (case_objective(CASES["mv_normal_diag"], gv.MVD),
                                   as_params(CASES["mv_normal_diag"].params)),
    "bernoulli-MVD": lambda: (case_objective(CASES["bernoulli"], gv.MVD),
                              as_params(CASES["bernoulli"].params)),
    "categorical-ENUM": lambda: (case_objective(CASES["categorical"], gv.ENUM),
                                 as_params(CASES["categorical"].params)),
    "bernoulli-ENUM": lambda: (case_objective(CASES["bernoulli"], gv.ENUM),
                               as_params(CASES["bernoulli"].params)),
    "discrete_then_normal-ENUM": lambda: build_discrete_then_normal("ENUM")[:2],
    "scan_flips-MVD": lambda: build_scan_flips("MVD")[:2],
    "scan_normals-REPARAM": lambda: build_scan_normals("REPARAM")[:2],
    "scan_flips-ENUM": lambda: build_scan_flips("ENUM")[:2],
    "cond-REINFORCE": lambda: build_cond_flips("REINFORCE")[:2],
    "switch-MVD": lambda: build_switch("MVD")[:2],
    "batch_mean-ENUM": lambda: (lambda b: (b[0], b[1], b[3]))(build_batch_mean("ENUM")),
}


@pytest.mark.parametrize("program", list(REV_FWD_PROGRAMS))
def test_reverse_mode_matches_forward_mode(program):
    objective, params, *data = REV_FWD_PROGRAMS[program]()  # data: no tangent (None)
    flat, unravel = ravel_pytree(params)

    def both(key, vkey):
        v = unravel(jax.random.normal(vkey, flat.shape, flat.dtype))
        value, g = objective.value_and_grad_estimate(key, params, *data)
        fvalue, tangent = objective.jvp_estimate(key, (params, *data), (v, *[None] * len(data)))
        return value, fvalue, jnp.vdot(ravel_pytree(g)[0], ravel_pytree(v)[0]), tangent

    keys = jax.random.split(jax.random.key(7), 8)
    vkeys = jax.random.split(jax.random.key(8), 8)
    value, fvalue, rev, fwd = map(np.asarray, jax.jit(jax.vmap(both))(keys, vkeys))
    plain = np.asarray(jax.jit(jax.vmap(lambda k: objective.estimate(k, params, *data)))(keys))
    assert np.all(np.isfinite(rev)) and np.all(np.isfinite(fwd))
    np.testing.assert_allclose(fvalue, value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(plain, value, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rev, fwd, rtol=1e-4, atol=1e-5 * max(1.0, np.abs(fwd).max()))


# ---------------------------------------------------------------------------------
# Strategies a distribution must refuse
# ---------------------------------------------------------------------------------
UNSUPPORTED = {
    # The uniform's support moves with its parameters: score-function gradients
    # would be biased, so REINFORCE must be refused.
    "uniform-REINFORCE": lambda p: gv.uniform(p - 1.0, p + 1.0, grad=gv.REINFORCE),
    "uniform-MVD": lambda p: gv.uniform(p - 1.0, p + 1.0, grad=gv.MVD),
    "normal-ENUM": lambda p: gv.normal(p, 1.0, grad=gv.ENUM),
    "mv_normal-MVD": lambda p: gv.mv_normal(jnp.full(2, p), jnp.eye(2), grad=gv.MVD),
    "poisson-REPARAM": lambda p: gv.poisson(jnp.exp(p), grad=gv.REPARAM),
    "geometric-ENUM": lambda p: gv.geometric(jax.nn.sigmoid(p), grad=gv.ENUM),
    "tfp_poisson-REPARAM": lambda p: gv.from_tfp(_tfp().distributions.Poisson)(
        rate=jnp.exp(p), grad=gv.REPARAM),
}


@pytest.mark.parametrize("name", list(UNSUPPORTED))
def test_unsupported_strategy_raises(name):
    @gv.expectation
    def objective(p):
        return jnp.sum(gv.sample(UNSUPPORTED[name](p))).astype(F32)

    with pytest.raises(ValueError, match=f"does not support the {name.split('-')[1]} gradient"):
        objective.grad_estimate(jax.random.key(0), F32(0.5))


# ---------------------------------------------------------------------------------
# The references themselves
# ---------------------------------------------------------------------------------
def test_reference_quadrature_matches_closed_forms():
    m, s = 0.4, 1.2
    assert abs(normal_expect(np.sin, m, s) - np.sin(m) * np.exp(-s * s / 2)) < 1e-12
    _, g = reference(lambda p: normal_expect(np.sin, p["m"], p["s"]), {"m": m, "s": s})
    assert abs(g["m"] - np.cos(m) * np.exp(-s * s / 2)) < 1e-8
    assert abs(g["s"] + s * np.sin(m) * np.exp(-s * s / 2)) < 1e-8
    chol = np.linalg.cholesky(np.array([[1.2, 0.4], [0.4, 0.8]]))
    a = np.array([1.0, 0.5])
    closed = np.sin(a @ [0.2, -0.4]) * np.exp(-a @ chol @ chol.T @ a / 2)
    assert abs(gaussian_expect(lambda x: np.sin(x @ a), [0.2, -0.4], chol, n=40) - closed) < 1e-12
    assert abs(uniform_expect(np.sin, -0.3, 1.4) - (np.cos(-0.3) - np.cos(1.4)) / 1.7) < 1e-12
    for g in (lambda x: np.sin(4 * x), lambda x: x ** 2):
        assert abs(beta_expect(g, 2.0, 3.0) - integrate.quad(
            lambda x: g(x) * stats.beta.pdf(x, 2.0, 3.0), 0, 1, epsabs=1e-13)[0]) < 1e-10
        assert abs(gamma_expect(g, 2.5, 1.5) - integrate.quad(
            lambda x: g(x) * stats.gamma.pdf(x, 2.5, scale=1 / 1.5), 0, np.inf, epsabs=1e-13)[0]) < 1e-9
    assert abs(laplace_expect(np.cos, 0.3, 0.9) - np.cos(0.3) / (1 + 0.81)) < 1e-10
    alpha = np.array([1.5, 2.0, 3.0])
    A = alpha.sum()
    second_moment = alpha[1] * (alpha[1] + 1) / (A * (A + 1))
    assert abs(dirichlet3_expect(lambda x: x[..., 1] ** 2, alpha) - second_moment) < 1e-12
    cross_moment = alpha[0] * alpha[2] / (A * (A + 1))
    assert abs(dirichlet3_expect(lambda x: x[..., 0] * x[..., 2], alpha) - cross_moment) < 1e-12
    assert abs(flips_expect(lambda b: b.sum(-1) ** 2, np.full(3, 0.4)) - (3 * 0.4 * 0.6 + 9 * 0.16)) < 1e-12
    k = np.arange(800)
    assert abs(discrete_expect(lambda x: x, k, 0.6 ** k * 0.4) - 0.6 / 0.4) < 1e-12
