"""gv.auto_low_rank in Woodbury form: the guide's log density is the dense
multivariate normal's (covariance W Wᵀ + diag(d²)) at D = 30, rank 3, split over
several sites, and its jaxpr holds no D × D (or any larger than r × r) Cholesky or
triangular solve; draws have the right covariance."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.scipy.stats import multivariate_normal

import genvi as gv
from genvi.core import jaxpr as jx

D, R = 30, 3


@gv.gen
def model(params):     # real sites of 10, 1, 4 and 15 coordinates: D = 30
    gv.normal(jnp.zeros(10), 1.0) @ "a"
    gv.normal(0.0, 1.0) @ "b"
    gv.normal(jnp.zeros((2, 2)), 1.0) @ "c"
    gv.normal(jnp.zeros(15), 1.0) @ "e"


def random_params(auto):
    params = {"guide": auto.init(jax.random.key(0), {})}
    k1, k2, k3 = jax.random.split(jax.random.key(1), 3)
    params["guide"]["loc"] = jax.random.normal(k1, (D,))
    params["guide"]["cov_factor"] = jax.random.normal(k2, (D, R))
    params["guide"]["scale"] = gv.positive(jnp.exp(0.5 * jax.random.normal(k3, (D,))))
    return params


def as_choices(z):
    return gv.choices({"a": z[:10], "b": z[10], "c": z[11:15].reshape(2, 2), "e": z[15:]})


def dense(params):
    p = gv.constrain(params["guide"])
    d = p["scale"]
    w = d[:, None] * p["cov_factor"]         # the factor is relative to the scale
    return p["loc"], w @ w.T + jnp.diag(d * d)


def test_log_density_matches_the_dense_mvn():
    auto = gv.auto_low_rank(model, R)
    params = random_params(auto)
    loc, cov = dense(params)
    score = jax.jit(lambda z: auto.log_density(as_choices(z), params))
    for seed in range(3):
        z = loc + 1.5 * jax.random.normal(jax.random.key(10 + seed), (D,))
        want = multivariate_normal.logpdf(z, loc, cov)
        assert float(score(z)) == pytest.approx(float(want), rel=1e-5, abs=1e-4)
    tr = jax.jit(auto.simulate)(jax.random.key(5), params)
    assert float(tr.log_density) == pytest.approx(float(score(jnp.concatenate(
        [jnp.ravel(tr.choices[k]) for k in ("a", "b", "c", "e")]))), rel=1e-5, abs=1e-4)


def linalg_shapes(jaxpr):
    """(primitive, shape of its matrix operand) of every cholesky / triangular_solve,
    sub-jaxprs (jit, loops) included."""
    found = []
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        if eqn.primitive.name in ("cholesky", "triangular_solve"):
            found.append((eqn.primitive.name, eqn.invars[0].aval.shape[-2:]))
        for sub in jx.sub_jaxprs(eqn):
            found += linalg_shapes(sub)
    return found


def test_no_dense_factorization_in_the_density():
    auto = gv.auto_low_rank(model, R)
    params = random_params(auto)
    z = jnp.zeros(D)
    score = jax.make_jaxpr(lambda p: auto.log_density(as_choices(z), p))(params).jaxpr
    sim = jax.make_jaxpr(lambda k, p: auto.simulate(k, p).log_density)(
        jax.random.key(0), params).jaxpr
    for jaxpr in (score, sim):
        shapes = linalg_shapes(jaxpr)
        assert ("cholesky", (R, R)) in shapes                 # the r × r capacitance
        assert all(shape == (R, R) for _, shape in shapes), shapes


def test_draws_have_the_low_rank_covariance():
    auto = gv.auto_low_rank(model, R)
    params = random_params(auto)
    loc, cov = dense(params)
    draws = auto.sample(jax.random.key(2), params, 20000)
    z = jnp.concatenate([draws["a"], draws["b"][:, None], draws["c"].reshape(-1, 4),
                         draws["e"]], -1)
    np.testing.assert_allclose(z.mean(0), loc, atol=0.1)
    np.testing.assert_allclose(jnp.cov(z.T), cov, atol=0.25 + 0.05 * float(jnp.max(cov)))
    m, sd = auto.marginals(params)
    np.testing.assert_allclose(sd, jnp.sqrt(jnp.diag(cov)), rtol=1e-5)
