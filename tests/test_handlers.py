"""The public interpreter API: `g.interpret(handler, ...)`, `g.jaxpr(...)` and the
handlers of `gv.handlers` give what `simulate` and `log_density` give."""

import jax
import jax.numpy as jnp
import pytest

import genvi as gv
from genvi.gen.sites import site_addresses, site_strategies


@gv.gen
def step(z, _):
    z = gv.normal(z, 1.0, grad=gv.REPARAM) @ "z"
    return z, z


@gv.gen
def model(y):
    scale = gv.gamma(2.0, 1.0) @ "scale"
    gv.scan(step, length=3)(0.0) @ "chain"
    gv.vmap(gv.gen(lambda m: gv.normal(m, scale) @ "x"))(jnp.arange(2.0)) @ "plate"
    gv.observe(gv.normal(scale, 1.0), y)
    return scale


def test_simulate_handler_matches_simulate():
    key = jax.random.key(3)
    trace = model.simulate(key, 0.4)
    run = model.interpret(gv.handlers.Simulate(), 0.4, key=key)
    assert set(run.choices.flat()) == set(trace.choices.flat())
    for addr, value in trace.choices.flat().items():
        assert jnp.array_equal(run.choices[addr], value)
    assert jnp.allclose(run.log_density, trace.log_density)
    assert run.retval == trace.retval and run.visited == frozenset()


def test_assess_handler_reads_choices_and_reports_them_visited():
    trace = model.simulate(jax.random.key(0), 0.4)
    run = model.interpret(gv.handlers.Assess(), 0.4, choices=trace.choices)
    assert jnp.allclose(run.log_density, model.log_density(trace.choices, 0.4))
    assert run.visited == frozenset(trace.choices.flat())


def test_a_missing_choice_names_the_address():
    with pytest.raises(gv.handlers.MissingChoice, match="'scale'"):
        model.interpret(gv.handlers.Assess(), 0.4, choices={})


def test_jaxpr_and_site_queries():
    closed = model.jaxpr(0.4)
    assert site_addresses(closed) == {("scale",), ("chain", "z"), ("plate", "x")}
    assert site_strategies(closed)[("chain", "z")] is gv.REPARAM


def test_handlers_import_by_their_public_path():
    """`import genvi.handlers` (in a fresh interpreter) is `gv.handlers` itself."""
    import subprocess
    import sys
    code = ("import genvi.handlers, genvi as gv\n"
            "from genvi.handlers import Simulate, Handler\n"
            "assert genvi.handlers is gv.handlers and Simulate is gv.handlers.Simulate\n"
            "assert issubclass(Simulate, Handler)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**__import__("os").environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
