"""`gv.validation()` you can rely on (issue 14, items 4 and 5).

* A failed check raises `gv.InvalidParameters` itself, not JAX's wrapped
  `JaxRuntimeError`, under genvi's entry points (`simulate`, `log_density`,
  `estimate`, `grad_estimate`, `gv.fit`), under the user's `jax.jit` / `jax.vmap` /
  `jax.lax.scan` run inside the block, and under `gv.scan`; with one traceback (no
  chained JAX error, no second traceback logged by JAX).
* The validation state is part of every compile cache: an objective compiled before
  the block is checked inside it, and one compiled inside is not checked after it.
* Observed values are checked (NaN, outside the support), and so are values scored by
  `log_density`; the error names the distribution, the observation's source line and
  the program.
"""

import logging
import traceback

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv
from programs import model

KEY = jax.random.key(0)


@gv.gen
def scaled(s):
    return gv.normal(0.0, s) @ "x"


@gv.gen
def guide(p, y):
    gv.normal(p["m"], p["s"], grad=gv.REPARAM) @ "z"   # the scale as given: may be < 0


ELBO = gv.elbo(model, guide)
GOOD = {"m": 0.5, "s": 0.8}
BAD = {"m": 0.5, "s": -0.8}
Z_SCALE = r"(?s)gv\.normal at address 'z'.*scale must be > 0"


def clean(e: BaseException) -> None:
    """The error is genvi's own, with no JAX error chained to it."""
    assert type(e) is gv.InvalidParameters
    assert e.__cause__ is None
    assert e.__suppress_context__ or e.__context__ is None
    assert not isinstance(e.__context__, jax.errors.JaxRuntimeError) or e.__suppress_context__


def entry_clean(e: BaseException) -> None:
    """Raised by a genvi entry point: no context at all, and a traceback through
    the user's and genvi's code only."""
    clean(e)
    assert e.__context__ is None
    assert not getattr(e, "__notes__", None)   # JAX's note about filtered frames
    files = {f.filename for f in traceback.extract_tb(e.__traceback__)}
    assert not any("/jax/" in f or "/jaxlib/" in f for f in files), files


# --------------------------------------------------------------------------- entry points

def test_negative_scale_is_nan_without_validation_and_an_error_with_it():
    value, grads = ELBO.value_and_grad_estimate(KEY, BAD, 1.0)
    assert np.isnan(float(value))          # the silent case the issue measured
    with gv.validation():
        for run in (ELBO.estimate, ELBO.grad_estimate, ELBO.value_and_grad_estimate):
            with pytest.raises(gv.InvalidParameters, match=Z_SCALE) as info:
                run(KEY, BAD, 1.0)
            entry_clean(info.value)
        assert "objective 'elbo'" in str(info.value)
        checked = ELBO.value_and_grad_estimate(KEY, GOOD, 1.0)   # valid: the same numbers
    plain = ELBO.value_and_grad_estimate(KEY, GOOD, 1.0)
    for a, b in zip(jax.tree_util.tree_leaves(plain), jax.tree_util.tree_leaves(checked)):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_objective_compiled_outside_is_checked_inside_and_not_after():
    objective = gv.elbo(model, guide)
    assert np.isnan(float(objective.estimate(KEY, BAD, 1.0)))   # compiled, unchecked
    with gv.validation():
        with pytest.raises(gv.InvalidParameters, match=Z_SCALE):
            objective.estimate(KEY, BAD, 1.0)
        with pytest.raises(gv.InvalidParameters, match=Z_SCALE):
            objective.grad_estimate(KEY, BAD, 1.0)
    assert np.isnan(float(objective.estimate(KEY, BAD, 1.0)))   # compiled inside: not after
    objective.grad_estimate(KEY, BAD, 1.0)


def test_simulate_log_density_and_gv_scan():
    @gv.gen
    def step(c, s):
        return c, gv.normal(c, s) @ "x"

    with gv.validation():
        with pytest.raises(gv.InvalidParameters, match=r"(?s)gv\.normal at address 'x'") as info:
            scaled.simulate(KEY, -1.0)
        entry_clean(info.value)
        with pytest.raises(gv.InvalidParameters, match=r"gv\.normal at address 'x'"):
            gv.scan(step).simulate(KEY, 0.0, jnp.array([1.0, -1.0, 1.0]))
        gv.scan(step).simulate(KEY, 0.0, jnp.array([1.0, 2.0, 1.0]))
        with pytest.raises(gv.InvalidParameters, match=r"(?s)gv\.normal at address 'x'") as info:
            scaled.log_density(gv.choices({"x": 0.0}), -1.0)
        entry_clean(info.value)


def test_gv_fit_raises_invalid_parameters_also_with_a_chunk_compiled_before():
    optimizer = optax.sgd(0.01)
    fit = lambda p: gv.fit(ELBO, p, 1.0, optimizer=optimizer, steps=3, key=KEY,  # noqa: E731
                           progress=False)
    fit(GOOD)   # compiles gv.fit's chunk for this objective and optimizer, unchecked
    with gv.validation():
        with pytest.raises(gv.InvalidParameters, match=Z_SCALE) as info:
            fit(BAD)
    entry_clean(info.value)


# --------------------------------------------------------------------------- user transformations

def test_user_jit_vmap_and_lax_scan_inside_the_block():
    bad = jnp.array([1.0, -1.0])
    cases = {
        "jit": lambda: jax.jit(scaled.simulate)(KEY, -1.0),
        "vmap": lambda: jax.vmap(scaled.simulate, (None, 0))(KEY, bad),
        "jit of vmap": lambda: jax.jit(jax.vmap(scaled.simulate, (None, 0)))(KEY, bad),
        "lax.scan": lambda: jax.lax.scan(
            lambda c, s: (c, scaled.simulate(KEY, s).retval), 0.0, bad),
        "jit of grad_estimate": lambda: jax.jit(ELBO.grad_estimate)(KEY, BAD, 1.0),
    }
    for name, run in cases.items():
        with pytest.raises(gv.InvalidParameters, match=r"gv\.normal at address") as info:
            with gv.validation():
                jax.block_until_ready(run())
        clean(info.value)


def test_user_jit_under_global_validation_names_the_site_in_jax_error():
    # The user's jit compiled before validation was on is recompiled with the checks.
    # No block to leave: JAX's runtime error is what it raises; the message holds genvi's.
    simulate = jax.jit(scaled.simulate)
    assert np.isnan(float(simulate(KEY, -1.0).log_density))
    gv.set_validation(True)
    try:
        with pytest.raises(jax.errors.JaxRuntimeError, match=r"gv\.normal at address 'x'"):
            jax.block_until_ready(simulate(KEY, -1.0))
        with pytest.raises(gv.InvalidParameters):
            scaled.simulate(KEY, -1.0)
        with gv.validation(False):
            scaled.simulate(KEY, -1.0)
    finally:
        gv.set_validation(False)
    scaled.simulate(KEY, -1.0)


def test_jax_logs_no_second_traceback(caplog):
    with caplog.at_level(logging.DEBUG):
        with pytest.raises(gv.InvalidParameters):
            with gv.validation():
                jax.jit(scaled.simulate)(KEY, -1.0)
        with gv.validation():
            with pytest.raises(gv.InvalidParameters):
                scaled.simulate(KEY, -1.0)
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


# --------------------------------------------------------------------------- observations

def _observer(make):
    @gv.gen
    def observer(y):
        gv.observe(make(), y)   # the line the error names
    return observer


OBS_LINE = _observer.__code__.co_firstlineno + 3
CASES = [  # (distribution, invalid observation, valid observation)
    ("normal", lambda: gv.normal(0.0, 1.0), jnp.nan, 0.3),
    ("gamma", lambda: gv.gamma(2.0, 1.0), -1.0, 0.5),
    ("beta", lambda: gv.beta(2.0, 2.0), 1.5, 0.25),
    ("uniform", lambda: gv.uniform(0.0, 1.0), 2.0, 1.0),
    ("dirichlet", lambda: gv.dirichlet(jnp.ones(2)), jnp.array([0.5, 0.6]), jnp.array([0.4, 0.6])),
    ("mv_normal", lambda: gv.mv_normal(jnp.zeros(2), jnp.eye(2)), jnp.array([0.0, jnp.inf]),
     jnp.zeros(2)),
    ("flip", lambda: gv.flip(0.3), 0.5, True),
    ("bernoulli", lambda: gv.bernoulli(logits=jnp.zeros(2)), jnp.array([1.0, 2.0]), jnp.array([1.0, 0.0])),
    ("categorical", lambda: gv.categorical(jnp.zeros(3)), 3, 2),
    ("poisson", lambda: gv.poisson(2.0), 1.5, 0),
    ("geometric", lambda: gv.geometric(0.5), -1, 4),
    ("binomial", lambda: gv.binomial(5, 0.5), 6, 5),
]


@pytest.mark.parametrize("name,make,bad,good", CASES, ids=[c[0] for c in CASES])
def test_observed_values_are_checked(name, make, bad, good):
    observer = _observer(make)
    with gv.validation():
        with pytest.raises(gv.InvalidParameters) as info:
            observer.log_density(gv.choices({}), bad)
        assert np.isfinite(float(observer.log_density(gv.choices({}), good)))
    message = str(info.value)
    assert message.startswith(f"invalid observation for gv.{name} at ")
    assert f"test_validation.py:{OBS_LINE} (_observer.<locals>.observer)" in message
    assert "in program 'observer'" in message
    entry_clean(info.value)


def test_observation_inside_an_objective_and_under_jit():
    @gv.gen
    def rates(p, y):
        r = gv.gamma(2.0, 1.0) @ "r"
        gv.observe(gv.poisson(r), y)

    @gv.gen
    def q(p, y):
        gv.gamma(jnp.exp(p), 1.0, grad=gv.REPARAM) @ "r"   # REPARAM values checked: no alarm

    counts = jnp.array([1.0, 2.5, 0.0])
    objective = gv.elbo(rates, q)
    with gv.validation():
        objective.grad_estimate(KEY, 0.0, jnp.array([1.0, 2.0, 0.0]))
        with pytest.raises(gv.InvalidParameters,
                           match=r"invalid observation for gv\.poisson .* in program 'rates'.*"
                                 r"whole number >= 0 \(got 2\.5\)") as info:
            objective.grad_estimate(KEY, 0.0, counts)
        entry_clean(info.value)
    with pytest.raises(gv.InvalidParameters, match=r"gv\.poisson"):
        with gv.validation():
            jax.jit(rates.log_density)(gv.choices({"r": 1.0}), 0.0, counts)


def test_scored_values_are_checked_by_address():
    with gv.validation():
        with pytest.raises(gv.InvalidParameters,
                           match=r"invalid value for gv\.normal at address 'x'.*\(got nan\)"):
            scaled.log_density(gv.choices({"x": jnp.nan}), 1.0)
        with pytest.raises(gv.InvalidParameters,
                           match=r"invalid value for gv\.gamma at address 'r'.*>= 0"):
            gv.gen(lambda: gv.gamma(2.0, 1.0) @ "r").log_density(gv.choices({"r": -1.0}))


def test_vmapped_observations_report_the_count_and_a_failing_value():
    observer = _observer(lambda: gv.gamma(2.0, 1.0))
    data = jnp.array([[1.0, -2.0], [-3.0, 1.0], [1.0, 1.0]])
    with gv.validation():
        with pytest.raises(gv.InvalidParameters, match=r"2 entries fail, e\.g\. -2\b"):
            jax.vmap(observer.log_density, (None, 0))(gv.choices({}), data)
        with pytest.raises(gv.InvalidParameters, match=r"2 entries fail, e\.g\. -2\b"):
            observer.log_density(gv.choices({}), data)


def test_untaken_cond_branches_are_not_checked_under_vmap():
    # jax.vmap of a cond runs both branches in every lane: the untaken one (a negative
    # scale, a value outside uniform's support) must not raise; the taken one must.
    @gv.gen
    def guarded(s):
        return jax.lax.cond(s > 0, lambda: gv.normal(0.0, s) @ "x",
                            lambda: gv.uniform(-1.0, 0.0) @ "x")

    s = jnp.array([1.0, -1.0])
    with gv.validation():
        tr = jax.vmap(guarded.simulate, (None, 0))(KEY, s)
        x = tr.choices["x"].at[0].set(3.0)   # fine under normal, outside uniform's support
        jax.vmap(guarded.log_density)(gv.choices({"x": x}), s)
        with pytest.raises(gv.InvalidParameters, match=r"invalid value for gv\.uniform .*got 3\)"):
            jax.vmap(guarded.log_density)(gv.choices({"x": x}), -s)
