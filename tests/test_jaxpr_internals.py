"""Pins `genvi/core/jaxpr/`, the only package that touches JAX internals.

Each function there is tested against public JAX behaviour, so a JAX upgrade that
changes an internal shows up here first:

* `trace` gives a closed jaxpr computing the function;
* `eval_eqn` reproduces `jax.core.eval_jaxpr`-style evaluation equation by equation
  (ordinary primitives, `jit`, `custom_jvp` such as `jax.nn.relu`, `custom_vjp`,
  `scan`, `cond`, `while`), also on traced values (under `jit`, `vmap`, `grad`);
* `jvp_eqn` with `None` (symbolic-zero) tangents matches `jax.jvp`;
* `kind`, `sub_jaxprs`, `call_body`, `ScanEqn`, `WhileEqn`, `cond_branches` recognise and
  unpack the higher-order primitives; `contains` finds a primitive nested in their
  bodies;
* `make_primitive` gives a primitive that refuses to run outside genvi;
* the batching rule of `register_batching_by_broadcasting` makes `jax.vmap` of a
  `site_p`-binding program add a leading axis even when no operand is batched.
"""

import jax
import jax.extend.core as jcore
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv
from genvi.core import jaxpr as jx
from genvi.core.primitives import SITES, bind_site, observe_p, sample_p, site_p


# --------------------------------------------------------------------------- helpers

def eval_by_eqn(closed, args):
    """Evaluate a closed jaxpr one equation at a time with `jx.eval_eqn`."""
    env = dict(zip(closed.jaxpr.constvars, closed.consts))
    env.update(zip(closed.jaxpr.invars, args))
    for eqn in closed.jaxpr.eqns:
        outs = jx.eval_eqn(eqn, [jx.read(env, v) for v in eqn.invars])
        assert len(outs) == len(eqn.outvars)
        env.update(zip(eqn.outvars, outs))
    return [jx.read(env, v) for v in closed.jaxpr.outvars]


def jvp_by_eqn(closed, primals, tangents):
    """Forward mode one equation at a time with `jx.jvp_eqn` (None = zero tangent)."""
    penv = dict(zip(closed.jaxpr.constvars, closed.consts))
    tenv = {v: None for v in closed.jaxpr.constvars}
    penv.update(zip(closed.jaxpr.invars, primals))
    tenv.update(zip(closed.jaxpr.invars, tangents))

    def tread(v):
        return None if isinstance(v, jx.Literal) else tenv[v]

    for eqn in closed.jaxpr.eqns:
        outs, touts = jx.jvp_eqn(eqn, [jx.read(penv, v) for v in eqn.invars],
                                 [tread(v) for v in eqn.invars])
        assert len(outs) == len(touts) == len(eqn.outvars)
        penv.update(zip(eqn.outvars, outs))
        tenv.update(zip(eqn.outvars, touts))
    return ([jx.read(penv, v) for v in closed.jaxpr.outvars],
            [tread(v) for v in closed.jaxpr.outvars])


def top_eqn(fn, *args, name=None):
    """The first top-level equation of `fn`'s jaxpr (with primitive `name`)."""
    closed = jax.make_jaxpr(fn)(*args)
    for eqn in closed.jaxpr.eqns:
        if name is None or eqn.primitive.name == name:
            return eqn
    raise AssertionError(f"no {name} equation in\n{closed}")


@jax.custom_vjp
def triple_grad(x):
    return jnp.sin(x)


triple_grad.defvjp(lambda x: (jnp.sin(x), x), lambda x, g: (3.0 * g,))


def f_plain(x, y):
    z = jnp.sin(x) * y + jnp.dot(jnp.ones(3), x) - 2.0
    return jnp.where(z > 0, z, -z) ** 2, jnp.argmax(x)


def f_jit(x, y):
    inner = jax.jit(lambda a, b: jnp.tanh(a * b) + jnp.sum(a))
    return inner(x, y) * 2.0


def f_custom_jvp(x, y):
    return jax.nn.relu(x * y) + jax.nn.softplus(x)


def f_custom_vjp(x, y):
    return triple_grad(x) * y


def f_scan(x, y):
    def body(c, xi):
        c = c * 0.9 + jnp.sin(xi) * y
        return c, c ** 2
    c, ys = jax.lax.scan(body, jnp.zeros(()), x)
    return c, ys


def f_cond(x, y):
    return jax.lax.cond(jnp.sum(x) > 0, lambda a: a * y, lambda a: jnp.cos(a) - y, x)


def f_switch(x, y):
    i = jnp.clip(jnp.int32(jnp.sum(x)), 0, 2)
    return jax.lax.switch(i, [lambda a: a, lambda a: a * y, lambda a: jnp.exp(a)], x)


def f_while(x, y):
    return jax.lax.while_loop(lambda c: c[1] < 4, lambda c: (c[0] * y + 1.0, c[1] + 1), (x, 0))


def f_nested(x, y):
    def body(c, xi):
        c = jax.lax.cond(xi > 0, lambda: jax.jit(jax.nn.relu)(c + xi), lambda: c * y)
        return c, c
    return jax.lax.scan(body, 0.0, x)


FUNCS = [f_plain, f_jit, f_custom_jvp, f_custom_vjp, f_scan, f_cond, f_switch, f_while, f_nested]
IDS = [f.__name__[2:] for f in FUNCS]
X = jnp.array([0.3, -1.2, 2.0])
Y = jnp.array(0.7)


def assert_trees_close(a, b, rtol=1e-5, atol=1e-6):
    la, lb = jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)
    assert len(la) == len(lb)
    for u, v in zip(la, lb):
        assert jnp.shape(u) == jnp.shape(v)
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), rtol=rtol, atol=atol)


# --------------------------------------------------------------------------- trace / eval_eqn

@pytest.mark.parametrize("fn", FUNCS, ids=IDS)
def test_trace_gives_closed_jaxpr_of_fn(fn):
    closed = jx.trace(lambda *a: jax.tree_util.tree_leaves(fn(*a)), [X, Y])
    assert isinstance(closed, jx.ClosedJaxpr)
    assert len(closed.jaxpr.invars) == 2
    out = jax.core.eval_jaxpr(closed.jaxpr, closed.consts, X, Y)
    assert_trees_close(out, jax.tree_util.tree_leaves(fn(X, Y)))


@pytest.mark.parametrize("fn", FUNCS, ids=IDS)
def test_eval_eqn_matches_function(fn):
    closed = jax.make_jaxpr(fn)(X, Y)
    assert_trees_close(eval_by_eqn(closed, [X, Y]), jax.tree_util.tree_leaves(fn(X, Y)))


@pytest.mark.parametrize("fn", FUNCS, ids=IDS)
def test_eval_eqn_on_traced_values_jit_and_vmap(fn):
    closed = jax.make_jaxpr(fn)(X, Y)
    expect = jax.tree_util.tree_leaves(fn(X, Y))
    assert_trees_close(jax.jit(lambda x, y: eval_by_eqn(closed, [x, y]))(X, Y), expect)
    ys = jnp.array([0.7, -0.2, 1.5])
    batched = jax.vmap(lambda y: eval_by_eqn(closed, [X, y]))(ys)
    expect_b = jax.vmap(lambda y: jax.tree_util.tree_leaves(fn(X, y)))(ys)
    assert_trees_close(batched, expect_b)


@pytest.mark.parametrize("fn", [f_plain, f_jit, f_custom_jvp, f_custom_vjp, f_scan, f_cond, f_nested],
                         ids=["plain", "jit", "custom_jvp", "custom_vjp", "scan", "cond", "nested"])
def test_eval_eqn_is_differentiable_and_keeps_custom_rules(fn):
    closed = jax.make_jaxpr(fn)(X, Y)

    def loss_eqn(x):
        return sum(jnp.sum(o) for o in eval_by_eqn(closed, [x, Y]) if jnp.issubdtype(o.dtype, jnp.floating))

    def loss_fn(x):
        return sum(jnp.sum(o) for o in jax.tree_util.tree_leaves(fn(x, Y))
                   if jnp.issubdtype(o.dtype, jnp.floating))

    assert_trees_close(jax.grad(loss_eqn)(X), jax.grad(loss_fn)(X))


def test_eval_eqn_custom_vjp_rule_is_used():
    closed = jax.make_jaxpr(triple_grad)(0.5)
    g = jax.grad(lambda x: eval_by_eqn(closed, [x])[0])(0.5)
    assert float(g) == pytest.approx(3.0)  # the custom rule, not cos(0.5)


def test_eval_eqn_custom_jvp_relu_at_zero():
    closed = jax.make_jaxpr(jax.nn.relu)(0.0)
    (eqn,) = closed.jaxpr.eqns
    assert jx.kind(eqn) == "custom"
    g = jax.grad(lambda x: eval_by_eqn(closed, [x])[0])(0.0)
    assert float(g) == float(jax.grad(jax.nn.relu)(0.0))


def test_read_literal_and_var():
    closed = jax.make_jaxpr(lambda x: x + 2.0)(1.0)
    (eqn,) = closed.jaxpr.eqns
    var, lit = eqn.invars
    assert isinstance(lit, jx.Literal)
    assert float(jx.read({}, lit)) == 2.0
    assert float(jx.read({var: 5.0}, var)) == 5.0


def test_is_drop_and_is_float():
    aval = jx.shaped((2,), jnp.float32)
    assert jx.is_drop(jcore.DropVar(aval))
    closed = jax.make_jaxpr(lambda x: x * 2)(1.0)
    assert not jx.is_drop(closed.jaxpr.eqns[0].outvars[0])
    assert jx.is_float(jnp.zeros(3))
    assert jx.is_float(1.0)
    assert not jx.is_float(jnp.zeros(3, jnp.int32))
    assert not jx.is_float(jnp.array(True))


def test_shaped():
    a = jx.shaped([2, 3], jnp.float32)
    assert a.shape == (2, 3) and a.dtype == jnp.float32


# --------------------------------------------------------------------------- jvp_eqn

# (jax.jvp itself refuses custom_vjp functions; they are covered under linearize below.)
JVP_FUNCS = [f_plain, f_jit, f_custom_jvp, f_scan, f_cond, f_switch, f_nested]
JVP_IDS = [f.__name__[2:] for f in JVP_FUNCS]


@pytest.mark.parametrize("fn", JVP_FUNCS, ids=JVP_IDS)
@pytest.mark.parametrize("which", ["x", "y", "both"])
def test_jvp_eqn_with_symbolic_zeros_matches_jax_jvp(fn, which):
    closed = jax.make_jaxpr(fn)(X, Y)
    tx = jnp.array([1.0, -0.5, 2.0]) if which in ("x", "both") else None
    ty = jnp.array(0.3) if which in ("y", "both") else None
    outs, touts = jvp_by_eqn(closed, [X, Y], [tx, ty])
    ref_out, ref_t = jax.jvp(lambda x, y: tuple(jax.tree_util.tree_leaves(fn(x, y))), (X, Y),
                             (jnp.zeros_like(X) if tx is None else tx,
                              jnp.zeros_like(Y) if ty is None else ty))
    assert_trees_close(outs, list(ref_out))
    for o, t, r in zip(outs, touts, ref_t):
        if not jnp.issubdtype(o.dtype, jnp.inexact):
            assert t is None  # integer outputs get a symbolic-zero tangent
        elif t is None:
            np.testing.assert_allclose(np.asarray(r), 0.0, atol=1e-6)
        else:
            np.testing.assert_allclose(np.asarray(t), np.asarray(r), rtol=1e-5, atol=1e-6)


def test_jvp_eqn_all_none_tangents_stays_symbolic():
    closed = jax.make_jaxpr(f_plain)(X, Y)
    outs, touts = jvp_by_eqn(closed, [X, Y], [None, None])
    assert all(t is None for t in touts)
    assert_trees_close(outs, jax.tree_util.tree_leaves(f_plain(X, Y)))
    eqn = closed.jaxpr.eqns[0]
    o, t = jx.jvp_eqn(eqn, [X], [None])
    assert t == [None] * len(eqn.outvars)


def test_jvp_eqn_independent_output_tangent_is_zero():
    # y only affects the second output; a tangent in x alone leaves it (numerically) zero.
    closed = jax.make_jaxpr(lambda x, y: (x * 2.0, y * 3.0))(1.0, 1.0)
    outs, touts = jvp_by_eqn(closed, [1.0, 2.0], [jnp.array(1.0), None])
    assert float(touts[0]) == 2.0
    assert touts[1] is None


@pytest.mark.parametrize("fn", [f_scan, f_cond, f_custom_jvp, f_custom_vjp],
                         ids=["scan", "cond", "custom_jvp", "custom_vjp"])
def test_jvp_eqn_is_linear_and_transposable(fn):
    closed = jax.make_jaxpr(fn)(X, Y)

    def fwd(t):
        return jnp.sum(jvp_by_eqn(closed, [X, Y], [t, None])[1][0])

    # The tangent map is linear: JAX can transpose it into reverse mode.
    (ct,) = jax.linear_transpose(fwd, X)(jnp.ones(()))
    ref = jax.grad(lambda x: jnp.sum(jax.tree_util.tree_leaves(fn(x, Y))[0]))(X)
    np.testing.assert_allclose(np.asarray(ct), np.asarray(ref), rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------- recognisers

@pytest.mark.parametrize("fn,name,expected", [
    (lambda x: jax.lax.scan(lambda c, _: (c + 1.0, c), x, None, length=3), "scan", "scan"),
    (lambda x: jax.lax.cond(x > 0, jnp.sin, jnp.cos, x), "cond", "cond"),
    (lambda x: jax.jit(jnp.sin)(x), None, "call"),
    (jax.nn.relu, None, "custom"),
    (triple_grad, None, "custom"),
    (lambda x: jax.lax.while_loop(lambda c: c < 3, lambda c: c + 1, x), "while", "while"),
    (lambda x: jax.lax.fori_loop(0, 3, lambda i, c: c + i, x), None, "scan"),
    (jnp.sin, "sin", "other"),
], ids=["scan", "cond", "jit", "custom_jvp", "custom_vjp", "while", "fori_loop", "other"])
def test_kind(fn, name, expected):
    assert jx.kind(top_eqn(fn, 1.0, name=name)) == expected


def test_kind_checkpoint_is_call():
    eqn = top_eqn(lambda x: jax.checkpoint(jnp.sin)(x), 1.0)
    assert jx.kind(eqn) == "call"


def test_sub_jaxprs():
    assert jx.sub_jaxprs(top_eqn(jnp.sin, 1.0)) == []
    scan = top_eqn(lambda x: jax.lax.scan(lambda c, _: (c + 1.0, c), x, None, length=3), 1.0)
    assert len(jx.sub_jaxprs(scan)) == 1
    cond = top_eqn(lambda x: jax.lax.switch(jnp.int32(x), [jnp.sin, jnp.cos, jnp.tan], x), 1.0,
                   name="cond")
    assert len(jx.sub_jaxprs(cond)) == 3
    wl = top_eqn(lambda x: jax.lax.while_loop(lambda c: c < 3, lambda c: c + 1, x), 1.0)
    assert len(jx.sub_jaxprs(wl)) == 2  # cond and body
    call = top_eqn(lambda x: jax.jit(jnp.sin)(x), 1.0)
    assert len(jx.sub_jaxprs(call)) == 1


def test_call_body_evaluates_like_the_call():
    eqn = top_eqn(lambda x, y: jax.jit(lambda a, b: a * jnp.sin(b) + 1.0)(x, y), 2.0, 0.5)
    body = jx.call_body(eqn)
    assert isinstance(body, jx.ClosedJaxpr)
    (out,) = jax.core.eval_jaxpr(body.jaxpr, body.consts, 2.0, 0.5)
    assert float(out) == pytest.approx(2.0 * np.sin(0.5) + 1.0)


def test_scan_view():
    eqn = top_eqn(lambda c, xs: jax.lax.scan(lambda c, x: (c + x, c * x), c, xs, reverse=True,
                                             unroll=2), 0.0, jnp.arange(4.0))
    scan = jx.ScanEqn.of(eqn)
    assert scan.length == 4 and scan.carry_count == 1 and scan.const_count == 0
    assert scan.reverse is True and scan.unroll == 2
    assert isinstance(scan.body, jx.ClosedJaxpr)
    # re-emitting the scan from its view reproduces it
    body = scan.body

    def step(c, x):
        outs = jax.core.eval_jaxpr(body.jaxpr, body.consts, c, x)
        carry, ys = scan.split_outs(outs)
        return carry[0], ys[0]

    got = scan.scan(step, 0.0, jnp.arange(4.0))
    ref = jax.lax.scan(lambda c, x: (c + x, c * x), 0.0, jnp.arange(4.0), reverse=True)
    assert_trees_close(got, ref)


def test_scan_view_splits_consts_carries_and_inputs():
    w = jnp.arange(3.0)

    def f(c, xs):
        return jax.lax.scan(lambda c, x: ((c[0] + x * w.sum(), c[1] * x), c[0] * x), c, xs)
    (eqn,) = [e for e in jax.make_jaxpr(f)((1.0, 2.0), jnp.ones(5)).jaxpr.eqns
              if jx.kind(e) == "scan"]
    scan = jx.ScanEqn.of(eqn)
    consts, carry, xs = scan.split(list(range(len(eqn.invars))))
    assert len(carry) == 2 and len(xs) == 1 and len(consts) == scan.const_count >= 1
    assert len(scan.body.jaxpr.invars) == len(eqn.invars)
    assert [len(part) for part in scan.split_outs(eqn.outvars)] == [2, 1]
    # positions agree with the split: a walker asks for them, never computes them
    positions = list(range(len(eqn.invars)))
    assert [scan.carry_input(j) for j in range(scan.carry_count)] == carry
    assert scan.scanned_input(0) == xs[0] and scan.scanned_index(xs[0]) == 0
    assert all(scan.scanned_index(p) is None for p in consts + carry)
    assert scan.split(positions)[2] == [scan.scanned_input(0)]


def test_while_view():
    eqn = top_eqn(lambda x: jax.lax.while_loop(lambda c: c < 3, lambda c: c + 1, x), 1.0)
    loop = jx.WhileEqn.of(eqn)
    assert isinstance(loop.body, jx.ClosedJaxpr) and isinstance(loop.cond, jx.ClosedJaxpr)
    assert [len(part) for part in loop.split(list(eqn.invars))] == [
        loop.cond_const_count, loop.body_const_count, 1]


def test_cond_branches():
    eqn = top_eqn(lambda i, x: jax.lax.switch(i, [jnp.sin, jnp.cos, jnp.exp], x), 1, 0.5,
                  name="cond")
    branches = jx.cond_branches(eqn)
    assert isinstance(branches, tuple) and len(branches) == 3
    for b, f in zip(branches, [np.sin, np.cos, np.exp]):
        (out,) = jax.core.eval_jaxpr(b.jaxpr, b.consts, 0.5)
        assert float(out) == pytest.approx(float(f(0.5)), rel=1e-6)


# --------------------------------------------------------------------------- contains

MARK = jx.make_primitive("test_mark", lambda x: x)


def mark(x):
    return MARK.bind(x)


@pytest.mark.parametrize("fn", [
    lambda x: mark(x),
    lambda x: jax.lax.scan(lambda c, _: (mark(c), None), x, None, length=2)[0],
    lambda x: jax.lax.cond(x > 0, lambda a: a, lambda a: mark(a), x),
    lambda x: jax.jit(lambda a: jax.lax.scan(
        lambda c, _: (jax.lax.cond(c > 0, mark, jnp.sin, c), None), a, None, length=2)[0])(x),
    lambda x: jax.lax.while_loop(lambda c: c < 3, lambda c: mark(c) + 1, x),
], ids=["top", "scan", "cond-branch", "jit-scan-cond", "while"])
def test_contains_finds_nested_primitive(fn):
    closed = jax.make_jaxpr(fn)(1.0)
    assert jx.contains(closed, frozenset({MARK}))
    assert jx.contains(closed.jaxpr, frozenset({MARK}))  # open jaxprs too
    assert not jx.contains(closed, frozenset({site_p}))


def test_contains_negative_and_genvi_sites():
    closed = jax.make_jaxpr(f_nested)(X, Y)
    assert not jx.contains(closed, frozenset({MARK}))

    def prog(x):
        return jax.lax.scan(lambda c, _: (bind_site(site_p, gv.normal, (c, 1.0), None, ("x",)), None),
                            x, None, length=3)[0]

    closed = jax.make_jaxpr(prog)(0.0)
    assert jx.contains(closed, SITES)
    assert not jx.contains(closed, frozenset({sample_p}))
    assert [jx.contains(j, SITES) for j in jx.sub_jaxprs(closed.jaxpr.eqns[0])] == [True]


# --------------------------------------------------------------------------- primitives

def test_make_primitive_refuses_to_run_outside_genvi():
    prim = jx.make_primitive("test_refuse", lambda *a, **p: a[0])
    closed = jax.make_jaxpr(lambda x: prim.bind(x, addr=("here",)))(1.0)
    assert closed.jaxpr.eqns[0].primitive is prim
    with pytest.raises(RuntimeError, match=r"test_refuse.*outside a genvi transformation.*here"):
        prim.bind(jnp.ones(()), addr=("here",))


def test_genvi_site_outside_interpreter_refuses_to_run():
    with pytest.raises(RuntimeError, match="genvi_site"):
        bind_site(site_p, gv.normal, (jnp.zeros(()), jnp.ones(())), None, ("x",))


# --------------------------------------------------------------------------- batching rule

def site_eqns(closed):
    return [e for e in closed.jaxpr.eqns if e.primitive is site_p]


def normal_site(loc, scale, addr=("x",)):
    return bind_site(site_p, gv.normal, (jnp.asarray(loc), jnp.asarray(scale)), None, addr)


def test_batching_adds_leading_axis_when_nothing_is_batched():
    closed = jax.make_jaxpr(jax.vmap(lambda _: normal_site(0.0, 1.0)))(jnp.arange(5))
    (eqn,) = site_eqns(closed)
    assert eqn.outvars[0].aval.shape == (5,)
    assert [v.aval.shape for v in eqn.invars] == [(5,), (5,)]
    assert closed.out_avals[0].shape == (5,)
    assert eqn.params["addr"] == ("x",)


def test_batching_moves_batch_axis_to_front_and_broadcasts_others():
    loc = jnp.zeros((3, 4))  # mapped over axis 1
    closed = jax.make_jaxpr(jax.vmap(lambda m: normal_site(m, jnp.ones(3)), in_axes=1))(loc)
    (eqn,) = site_eqns(closed)
    assert [v.aval.shape for v in eqn.invars] == [(4, 3), (4, 3)]
    assert eqn.outvars[0].aval.shape == (4, 3)
    assert closed.out_avals[0].shape == (4, 3)


def test_batching_nested_vmap_and_unbatched_array_params():
    fn = jax.vmap(jax.vmap(lambda _: normal_site(jnp.zeros(2), jnp.ones(2))))
    closed = jax.make_jaxpr(fn)(jnp.zeros((3, 5)))
    (eqn,) = site_eqns(closed)
    assert eqn.outvars[0].aval.shape == (3, 5, 2)
    assert closed.out_avals[0].shape == (3, 5, 2)


def test_batching_observe_and_sample_primitives():
    def obs(_):
        return observe_p.bind(jnp.zeros(()), jnp.zeros(()), jnp.ones(()), dist=gv.normal,
                              strategy=None, addr=None, n_params=2)

    closed = jax.make_jaxpr(jax.vmap(obs))(jnp.arange(4))
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive is observe_p]
    assert [v.aval.shape for v in eqn.invars] == [(4,), (4,), (4,)]

    def smp(_):
        return bind_site(sample_p, gv.normal, (jnp.zeros(()), jnp.ones(())), gv.REPARAM, ())

    closed = jax.make_jaxpr(jax.vmap(smp))(jnp.arange(4))
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive is sample_p]
    assert eqn.outvars[0].aval.shape == (4,)


def test_batching_rule_on_fresh_primitive():
    prim = jx.make_primitive("test_fresh", lambda x, y: jx.shaped(x.shape, x.dtype))
    jx.register_batching_by_broadcasting(prim)
    closed = jax.make_jaxpr(jax.vmap(lambda _: prim.bind(jnp.zeros(2), jnp.ones(()))))(jnp.arange(7))
    (eqn,) = [e for e in closed.jaxpr.eqns if e.primitive is prim]
    # the scalar gains a singleton axis so it still broadcasts against the vector per lane
    assert [v.aval.shape for v in eqn.invars] == [(7, 2), (7, 1)]
    assert eqn.outvars[0].aval.shape == (7, 2)

    multi = jx.make_primitive("test_multi", lambda x: [x, x], multiple_results=True)
    jx.register_batching_by_broadcasting(multi)
    closed = jax.make_jaxpr(jax.vmap(lambda _: multi.bind(jnp.zeros(()))))(jnp.arange(3))
    assert [a.shape for a in closed.out_avals] == [(3,), (3,)]


def test_batched_site_draws_per_lane_values_when_simulated():
    @gv.gen
    def g():
        return jax.vmap(lambda _: gv.normal(0.0, 1.0) @ "x")(jnp.arange(5))

    x = np.asarray(g.simulate(jax.random.key(0)).choices["x"])
    assert x.shape == (5,) and len(set(x.tolist())) == 5


def test_batching_site_with_mixed_rank_parameters():
    closed = jax.make_jaxpr(jax.vmap(lambda _: normal_site(jnp.zeros(3), 1.0)))(jnp.arange(4))
    assert closed.out_avals[0].shape == (4, 3)


# --------------------------------------------------------------------------- source info

def _user_fn(x):
    with jax.named_scope("outer_scope"):
        return jnp.floor(x) + 1.0


def test_source_line_and_name_stack_point_at_user_code():
    closed = jx.trace(lambda x: [_user_fn(x)], [1.0])
    floor = next(e for e in closed.jaxpr.eqns if e.primitive.name == "floor")
    assert "test_jaxpr_internals.py" in jx.source_line(floor)
    assert "_user_fn" in jx.source_line(floor)
    assert "outer_scope" in jx.name_stack(floor)


def test_eval_eqn_and_emitted_as_keep_source_line_and_scopes():
    """An equation re-emitted by an interpreter keeps the user's line and scopes."""
    closed = jx.trace(lambda x: [_user_fn(x)], [1.0])

    def reemit(x):
        env = {closed.jaxpr.invars[0]: x}
        for eqn in closed.jaxpr.eqns:
            outs = jx.eval_eqn(eqn, [jx.read(env, v) for v in eqn.invars])
            env.update(zip(eqn.outvars, outs))
        with jx.emitted_as(closed.jaxpr.eqns[0]):
            extra = jnp.ceil(x)
        return [env[closed.jaxpr.outvars[0]], extra]

    again = jax.make_jaxpr(reemit)(1.0)
    by_name = {e.primitive.name: e for e in again.jaxpr.eqns}
    for name in ("floor", "ceil"):
        assert "_user_fn" in jx.source_line(by_name[name])
        assert "outer_scope" in jx.name_stack(by_name[name])


def test_is_float_aval():
    assert jx.is_float_aval(jax.core.ShapedArray((), jnp.float32))
    assert not jx.is_float_aval(jax.core.ShapedArray((2,), jnp.int32))
    assert not jx.is_float_aval(jax.core.ShapedArray((), jnp.bool_))


def test_the_rule_registry_is_keyed_by_primitive_objects():
    """`genvi.core.rules`: every structural primitive genvi's lane evaluators handle is
    found as an object in this JAX release, and both evaluators' tables are keyed by
    the registry's structures (one registry, no names)."""
    import jax.extend.core as jcore

    from genvi.core.axis_rules import AXIS_RULES
    from genvi.core.rules import REDUCE_SUM, SORT, STRUCTURE, Structure, structure_of
    from genvi.inference.enumeration.same import SAME_STRUCTURES
    from genvi.replays.lane_rules import RULES

    assert all(isinstance(p, jcore.Primitive) for p in STRUCTURE)
    assert set(STRUCTURE.values()) == set(Structure)
    for prim in (jax.lax.add_p, jax.lax.sin_p, jax.lax.select_n_p, jax.lax.convert_element_type_p):
        assert STRUCTURE[prim] is Structure.ELEMENTWISE
    assert STRUCTURE[REDUCE_SUM] is Structure.REDUCE and STRUCTURE[SORT] is Structure.ALONG_AXIS
    assert set(AXIS_RULES) == set(RULES) == set(Structure) and SAME_STRUCTURES <= set(Structure)
    eqns = jax.make_jaxpr(lambda x: jax.lax.sort(x.T, dimension=0).reshape(-1))(
        jnp.ones((2, 3))).eqns
    assert [structure_of(e) for e in eqns] == [Structure.TRANSPOSE, Structure.ALONG_AXIS,
                                               Structure.RESHAPE]
    # a call is no structural primitive (its body is walked)
    (call,) = jax.make_jaxpr(lambda x: jnp.cumsum(x))(jnp.ones(3)).eqns
    assert structure_of(call) is None and isinstance(jx.view(call), jx.CallEqn)


@pytest.mark.parametrize("fn, shape, lanes", [
    (lambda x: x * 2.0, (4, 3), (0,)),
    (lambda x: jax.lax.reduce_sum(x, (1,)), (4, 3), (0,)),
    (lambda x: jax.lax.cumsum(x, axis=1), (4, 3), (0,)),
    (lambda x: jax.lax.broadcast_in_dim(x, (4, 5, 3), (0, 2)), (4, 3), (0,)),
    (lambda x: jax.lax.transpose(x, (1, 0)), (4, 3), (0,)),
    (lambda x: jax.lax.transpose(x, (1, 0)), (4, 3), (1,)),
    (lambda x: jax.lax.squeeze(x, (1,)), (4, 1, 3), (0,)),
    (lambda x: jax.lax.reshape(x, (4, 3, 1)), (4, 3), (0,)),
    (lambda x: jax.lax.concatenate([x, x], 1), (4, 3), (0,)),
])
def test_the_lane_and_enumeration_evaluators_read_one_axis_rule(fn, shape, lanes):
    """Both lane evaluators take where an equation moves the lanes from the registry
    (`genvi.core.axis_rules.lane_axes`): on the same equation, a lane-tracked value and a
    value the same in every lane come out with their lanes at the same axes, and the
    same values."""
    import math

    from genvi.core.axis_rules import Operand, lane_axes
    from genvi.inference.enumeration.same import Same, same_rule
    from genvi.replays.lane_rules import rule_for
    from genvi.replays.values import Local

    one = jnp.arange(math.prod(s for a, s in enumerate(shape) if a not in lanes),
                     dtype=jnp.float32).reshape(tuple(1 if a in lanes else n
                                                      for a, n in enumerate(shape)))
    full = jnp.broadcast_to(one, shape)
    closed = jax.make_jaxpr(fn)(full)
    eqn = closed.jaxpr.eqns[0]
    ins = [full if v is closed.jaxpr.invars[0] else v.val for v in eqn.invars]
    tracked = [Local(full, full, lanes) if i is full else i for i in ins]
    same = [Same(one, lanes, tuple(shape[a] for a in lanes)) if i is full else i for i in ins]
    want = lane_axes(eqn, [Operand(shape, lanes) if i is full else Operand(jnp.shape(i), None)
                           for i in ins])
    (by_lanes,) = rule_for(eqn)(eqn, tracked)
    (by_same,) = same_rule(eqn, same)
    assert want is not None and by_lanes.axes == by_same.axes == want
    assert jnp.array_equal(by_lanes.base, by_same.local().base)
