"""Bad input gets a clear error that names the address (SPEC §2, §6).

Covers: an address reused in one execution (top level, sub-programs, scan, cond,
combinators); a site sampled inside an objective without a `grad=` strategy (the
message names the address and lists the distribution's strategies); unsupported
strategies; `g.log_density` with missing, never-visited or wrongly shaped choices;
`g.sim`, `gv.sample`, `dist @ "x"` and `gv.observe` used in the wrong place;
objectives that do not return one float scalar; and opt-in validation mode
(`gv.validation()`), which reports invalid parameters by address even under
`jax.jit`, `jax.vmap` and `gv.scan`.
"""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv

KEY = jax.random.key(0)


@gv.gen
def sub():
    return gv.normal(0.0, 1.0) @ "x"


@gv.gen
def model(y):
    z = gv.normal(0.0, 1.0) @ "z"
    gv.observe(gv.normal(z, 1.0), y)
    return z


def q(s):
    """A regex that matches `s` literally, quoted or not."""
    return re.escape(s)


# --------------------------------------------------------------------------- reused addresses

def test_reused_address_top_level():
    @gv.gen
    def twice():
        gv.normal(0, 1) @ "x"
        gv.normal(0, 1) @ "x"

    with pytest.raises(ValueError, match=r"'x'.*twice"):
        twice.simulate(KEY)
    with pytest.raises(ValueError, match=r"'x'.*twice"):
        twice.log_density(gv.choices({"x": 0.0}))


def test_reused_address_different_distributions():
    @gv.gen
    def twice():
        gv.normal(0.0, 1.0) @ "site"
        gv.flip(0.5) @ "site"

    with pytest.raises(ValueError, match=q("'site'")):
        twice.simulate(KEY)


def test_reused_subprogram_address_names_full_path():
    @gv.gen
    def twice_sub():
        sub() @ "s"
        sub() @ "s"

    with pytest.raises(ValueError, match=q("'s/x'")):
        twice_sub.simulate(KEY)


def test_reused_address_inside_scan_body():
    @gv.gen
    def body(c, _):
        gv.normal(0, 1) @ "x"
        gv.normal(0, 1) @ "x"
        return c, None

    with pytest.raises(ValueError, match=q("'x'")):
        gv.scan(body, length=3).simulate(KEY, 0.0)


def test_reused_address_between_scan_and_outside():
    @gv.gen
    def m():
        gv.normal(0.0, 1.0) @ "x"
        jax.lax.scan(lambda c, _: (c, gv.normal(0.0, 1.0) @ "x"), 0.0, length=3)

    with pytest.raises(ValueError, match=q("'x'")):
        m.simulate(KEY)


def test_reused_address_between_cond_branch_and_outside():
    @gv.gen
    def m(p):
        gv.normal(0.0, 1.0) @ "x"
        return jax.lax.cond(p, lambda: gv.normal(0.0, 1.0) @ "x", lambda: 0.0)

    with pytest.raises(ValueError, match=q("'x'")):
        m.simulate(KEY, True)


def test_reused_address_of_repeat_subcalls():
    @gv.gen
    def m():
        gv.repeat(sub, 3)() @ "r"
        gv.repeat(sub, 3)() @ "r"

    with pytest.raises(ValueError, match=q("'r/x'")):
        m.simulate(KEY)


def test_same_address_in_both_cond_branches_is_fine():
    @gv.gen
    def m(p):
        return jax.lax.cond(p, lambda: gv.normal(1.0, 1.0) @ "x", lambda: gv.normal(-1.0, 1.0) @ "x")

    assert m.simulate(KEY, True).choices["x"].shape == ()


def test_address_used_as_site_and_as_subprogram_prefix():
    @gv.gen
    def clash():
        gv.normal(0.0, 1.0) @ "s"
        sub() @ "s"

    with pytest.raises(ValueError, match=q("'s'")):
        clash.simulate(KEY)


# --------------------------------------------------------------------------- missing strategy

@gv.gen
def guide_no_grad(y):
    gv.normal(0.0, 1.0) @ "z"


STRATS_NORMAL = r"gv\.REPARAM.*gv\.REINFORCE.*gv\.MVD"


def test_missing_strategy_in_guide_sim_inside_expectation():
    @gv.expectation
    def e(y):
        _, log_q = guide_no_grad.sim(y)
        return log_q

    with pytest.raises(ValueError, match=r"'z'.*gv\.normal.*" + STRATS_NORMAL):
        e.estimate(KEY, 1.0)
    with pytest.raises(ValueError, match=r"'z'.*" + STRATS_NORMAL):
        e.grad_estimate(KEY, 1.0)


def test_missing_strategy_in_builtin_objectives():
    with pytest.raises(ValueError, match=r"'z'.*" + STRATS_NORMAL):
        gv.elbo(model, guide_no_grad).grad_estimate(KEY, 1.0)
    with pytest.raises(ValueError, match=r"'z'.*" + STRATS_NORMAL):
        gv.iwelbo(model, guide_no_grad, particles=4).estimate(KEY, 1.0)


def test_missing_strategy_names_nested_and_scanned_addresses():
    @gv.gen
    def nested(y):
        sub() @ "inner"

    with pytest.raises(ValueError, match=r"'inner/x'.*" + STRATS_NORMAL):
        gv.elbo(nested, nested).grad_estimate(KEY, 1.0)

    @gv.gen
    def step(c, _):
        return c, gv.normal(c, 1.0) @ "x"

    @gv.gen
    def scanned(y):
        gv.scan(step, length=3)(0.0) @ "ts"

    with pytest.raises(ValueError, match=r"'ts/x'.*" + STRATS_NORMAL):
        gv.elbo(scanned, scanned).grad_estimate(KEY, 1.0)


def test_missing_strategy_lists_discrete_strategies():
    @gv.gen
    def g(y):
        gv.flip(0.3) @ "b"

    with pytest.raises(ValueError, match=r"'b'.*gv\.flip.*gv\.ENUM.*gv\.REINFORCE.*gv\.MVD"):
        gv.elbo(g, g).grad_estimate(KEY, 1.0)


def test_missing_strategy_for_gv_sample():
    @gv.expectation
    def e(m):
        return gv.sample(gv.normal(m, 1.0), name="foo")

    with pytest.raises(ValueError, match=r"'foo'.*" + STRATS_NORMAL):
        e.grad_estimate(KEY, 1.0)

    @gv.expectation
    def unnamed(m):
        return gv.sample(gv.normal(m, 1.0))

    with pytest.raises(ValueError, match=r"gv\.sample.*" + STRATS_NORMAL):
        unnamed.grad_estimate(KEY, 1.0)


def test_scored_model_sites_need_no_strategy():
    @gv.gen
    def guide(y):
        gv.normal(0.5, 1.0, grad=gv.REPARAM) @ "z"

    val = gv.elbo(model, guide).estimate(KEY, 1.0)
    assert np.isfinite(float(val))


# --------------------------------------------------------------------------- unsupported strategy

def _site(call):
    """Sample `call` at address "a" inside a program (strategies are checked there)."""
    gv.gen(lambda: call @ "a").simulate(jax.random.key(0))


def test_unsupported_strategy_lists_supported():
    with pytest.raises(ValueError, match=r"gv\.flip.*REPARAM.*gv\.ENUM.*gv\.REINFORCE.*gv\.MVD"):
        _site(gv.flip(0.3, grad=gv.REPARAM))
    with pytest.raises(ValueError, match=r"gv\.categorical.*REPARAM.*gv\.ENUM"):
        _site(gv.categorical(jnp.zeros(3), grad=gv.REPARAM))
    with pytest.raises(ValueError, match=r"gv\.normal.*ENUM.*gv\.REPARAM"):
        _site(gv.normal(0.0, 1.0, grad=gv.ENUM))


def test_non_strategy_grad_is_rejected():
    with pytest.raises(TypeError, match=r"'reparam'.*gv\.REPARAM"):
        _site(gv.normal(0.0, 1.0, grad="reparam"))


def test_unsupported_strategy_names_address():
    @gv.gen
    def bad():
        return gv.flip(0.3, grad=gv.REPARAM) @ "b"

    with pytest.raises(ValueError, match=r"'b'.*gv\.ENUM"):
        bad.simulate(KEY)


# --------------------------------------------------------------------------- log_density choices

def test_log_density_missing_address():
    with pytest.raises(KeyError, match=r"'z'.*gv\.normal"):
        model.log_density(gv.choices({}), 1.0)


def test_log_density_missing_nested_address():
    @gv.gen
    def top():
        return sub() @ "s"

    with pytest.raises(KeyError, match=q("'s/x'")):
        top.log_density(gv.choices({"s": {"y": 0.0}}))


def test_log_density_missing_address_in_scan():
    @gv.gen
    def step(c, _):
        return c, gv.normal(c, 1.0) @ "x"

    with pytest.raises(KeyError, match=q("'x'")):
        gv.scan(step, length=4).log_density(gv.choices({}), 0.0)


def test_log_density_unvisited_address():
    with pytest.raises(KeyError, match=r"never visits.*'w'"):
        model.log_density(gv.choices({"z": 0.0, "w": 1.0}), 1.0)
    with pytest.raises(KeyError, match=q("t/x")):
        gv.gen(lambda: sub() @ "s").log_density(gv.choices({"s": {"x": 0.0}, "t": {"x": 1.0}}))


def test_log_density_wrong_shape():
    with pytest.raises(ValueError, match=r"'z'.*gv\.normal.*\(3,\)"):
        model.log_density(gv.choices({"z": jnp.zeros(3)}), 1.0)
    rep = gv.repeat(sub, 4)
    with pytest.raises(ValueError, match=r"'x'.*\(3,\).*\(4,\)"):
        rep.log_density(gv.choices({"x": jnp.zeros(3)}))


def test_log_density_wrong_trailing_shape_in_scan():
    @gv.gen
    def step(c, _):
        return c, gv.normal(c, 1.0) @ "x"

    with pytest.raises(ValueError, match=q("'x'")):
        gv.scan(step, length=4).log_density(gv.choices({"x": jnp.zeros((4, 2))}), 0.0)


def test_log_density_wrong_scan_length_names_address():
    @gv.gen
    def step(c, _):
        return c, gv.normal(c, 1.0) @ "x"

    with pytest.raises(ValueError, match=q("'x'")):
        gv.scan(step, length=4).log_density(gv.choices({"x": jnp.zeros(3)}), 0.0)


# --------------------------------------------------------------------------- wrong place

def test_sim_outside_objective():
    @gv.gen
    def guide(m):
        gv.normal(m, 1.0, grad=gv.REPARAM) @ "z"

    with pytest.raises(RuntimeError, match=r"guide\.sim.*inside an @gv\.expectation"):
        guide.sim(0.0)


def test_sim_inside_jit_outside_objective():
    @gv.gen
    def guide(m):
        gv.normal(m, 1.0, grad=gv.REPARAM) @ "z"

    with pytest.raises(RuntimeError, match=r"@gv\.expectation"):
        jax.jit(guide.sim)(0.0)


def test_sample_outside_objective():
    with pytest.raises(RuntimeError, match=r"gv\.sample.*inside an @gv\.expectation"):
        gv.sample(gv.normal(0.0, 1.0, grad=gv.REPARAM))

    @gv.gen
    def g():
        return gv.sample(gv.normal(0.0, 1.0, grad=gv.REPARAM))

    with pytest.raises(RuntimeError, match=r"gv\.sample"):
        g.simulate(KEY)


def test_address_outside_gen_program():
    with pytest.raises(RuntimeError, match=r"'x'.*inside a @gv\.gen program"):
        gv.normal(0.0, 1.0) @ "x"
    with pytest.raises(RuntimeError, match=r"'s'.*@gv\.gen"):
        sub() @ "s"
    with pytest.raises(RuntimeError, match=r"gv\.observe.*@gv\.gen"):
        gv.observe(gv.normal(0.0, 1.0), 0.0)


def test_address_inside_objective_without_program():
    @gv.expectation
    def e(m):
        return gv.normal(m, 1.0, grad=gv.REPARAM) @ "x"

    with pytest.raises(RuntimeError, match=r"'x'.*gv\.sample"):
        e.estimate(KEY, 0.0)


def test_non_string_address():
    @gv.gen
    def g():
        return gv.normal(0.0, 1.0) @ 3

    with pytest.raises(TypeError, match="string"):
        g.simulate(KEY)


def test_sampling_inside_while_loop_is_rejected():
    @gv.gen
    def wl():
        return jax.lax.while_loop(lambda c: c < 1.0, lambda c: c + gv.normal(0.0, 1.0) @ "x", 0.0)

    with pytest.raises(NotImplementedError, match=r"while.*scan"):
        wl.simulate(KEY)


# --------------------------------------------------------------------------- objective output

@pytest.mark.parametrize("body,shown", [
    (lambda m: gv.sample(gv.normal(m * jnp.ones(3), 1.0, grad=gv.REPARAM)), r"float32\[3\]"),
    (lambda m: (m, m), r"float32\[\].*float32\[\]"),
    (lambda m: jnp.int32(1), r"int32\[\]"),
], ids=["vector", "tuple", "integer"])
def test_objective_must_return_float_scalar(body, shown):
    e = gv.expectation(body)
    with pytest.raises(TypeError, match=r"one float scalar.*" + shown):
        e.estimate(KEY, 1.0)
    with pytest.raises(TypeError, match="one float scalar"):
        e.grad_estimate(KEY, 1.0)


# --------------------------------------------------------------------------- validation mode

@gv.gen
def scaled(s):
    return gv.normal(0.0, s) @ "x"


@gv.gen
def flipper(p):
    return gv.flip(p) @ "b"


NORMAL_SCALE_X = r"(?s)gv\.normal at address 'x'.*scale"


def run(f, *args):
    return jax.block_until_ready(f(*args))


def test_validation_negative_scale_under_jit():
    with gv.validation():
        with pytest.raises(Exception, match=NORMAL_SCALE_X):
            run(jax.jit(scaled.simulate), KEY, -1.0)


def test_validation_negative_scale_eager_is_invalid_parameters():
    with gv.validation():
        with pytest.raises(gv.InvalidParameters, match=NORMAL_SCALE_X):
            run(scaled.simulate, KEY, -1.0)


def test_validation_valid_parameters_pass():
    with gv.validation():
        tr = run(jax.jit(scaled.simulate), KEY, 2.0)
    assert np.isfinite(float(tr.log_density))


def test_validation_flip_probability_out_of_range():
    with gv.validation():
        with pytest.raises(Exception, match=r"(?s)gv\.flip at address 'b'.*probability"):
            run(jax.jit(flipper.simulate), KEY, 1.5)
        with pytest.raises(Exception, match=r"(?s)gv\.flip at address 'b'.*probability"):
            run(jax.jit(flipper.simulate), KEY, -0.1)
        run(jax.jit(flipper.simulate), KEY, 1.0)  # boundary values are valid


def test_validation_inside_scan():
    @gv.gen
    def step(c, s):
        return c, gv.normal(c, s) @ "x"

    with gv.validation():
        with pytest.raises(Exception, match=NORMAL_SCALE_X):
            run(jax.jit(gv.scan(step).simulate), KEY, 0.0, jnp.array([1.0, -1.0, 1.0]))
        run(jax.jit(gv.scan(step).simulate), KEY, 0.0, jnp.array([1.0, 2.0, 1.0]))


def test_validation_nested_address_under_vmap():
    @gv.gen
    def top(s):
        return scaled(s) @ "inner"

    with gv.validation():
        with pytest.raises(Exception, match=r"(?s)gv\.normal at address 'inner/x'.*scale"):
            run(jax.jit(jax.vmap(top.simulate, in_axes=(None, 0))), KEY, jnp.array([1.0, -1.0]))


def test_validation_log_density_and_observe():
    with gv.validation():
        with pytest.raises(Exception, match=NORMAL_SCALE_X):
            run(jax.jit(scaled.log_density), gv.choices({"x": 0.0}), -1.0)

        @gv.gen
        def obs(s):
            gv.observe(gv.normal(0.0, s), 1.0)

        with pytest.raises(Exception, match=r"(?s)gv\.normal at .*observation.*scale"):
            run(jax.jit(obs.simulate), KEY, -1.0)


def test_no_validation_no_error():
    tr = run(jax.jit(scaled.simulate), KEY, -1.0)
    assert np.isnan(float(tr.log_density))
    run(jax.jit(flipper.simulate), KEY, 1.5)
    with gv.validation(False):
        run(jax.jit(scaled.simulate), KEY, -1.0)


def test_validation_context_restores_state():
    with gv.validation():
        pass
    run(jax.jit(scaled.simulate), KEY, -1.0)  # traced after the block: no check
