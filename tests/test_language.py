"""The generative language (SPEC §2).

Pins `@gv.gen` programs, addressing (`dist(...) @ "addr"`, nested sub-program
addresses), `gv.observe`, choice maps (`gv.choices`, `|`, indexing, pytree), the plain
transformations `g.simulate` / `g.log_density` (checked against log joints computed
by hand with scipy), their behaviour under `jax.jit` / `jax.vmap`, the combinators
`gv.vmap`, `gv.repeat`, `gv.scan` (top level and as addressed sub-calls), sampling
inside `jax.lax.cond` / `jax.lax.switch`, per-lane sampling under `jax.vmap`, and the
absence of Python unrolling (jaxpr size independent of the particle count).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import genvi as gv

KEY = jax.random.key(0)
RTOL = 1e-5
ATOL = 1e-4


def npf(x):
    return np.asarray(x, dtype=np.float64)


def count_eqns(jaxpr) -> int:
    """Equations in a jaxpr, counted recursively through every sub-jaxpr."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    n = 0
    for eqn in jaxpr.eqns:
        n += 1
        for p in eqn.params.values():
            for q in (p if isinstance(p, (tuple, list)) else (p,)):
                if hasattr(q, "eqns") or hasattr(getattr(q, "jaxpr", None), "eqns"):
                    n += count_eqns(q)
    return n


# --------------------------------------------------------------------------- programs

@gv.gen
def sub(m):
    x = gv.normal(m, 1.0) @ "x"
    return x


@gv.gen
def model(y):
    a = gv.normal(0.0, 2.0) @ "a"
    b = sub(a) @ "sub"
    gv.observe(gv.normal(b, 0.5), y)
    return a + b


def model_logjoint(a, b, y):
    return (stats.norm(0, 2).logpdf(a) + stats.norm(a, 1).logpdf(b)
            + stats.norm(b, 0.5).logpdf(y))


@gv.gen
def point(mu):
    x = gv.normal(mu, 1.0) @ "x"
    gv.observe(gv.normal(x, 0.5), 0.3)
    return x


def point_logjoint(x, mu):
    x = npf(x)
    return np.sum(stats.norm(mu, 1).logpdf(x) + stats.norm(x, 0.5).logpdf(0.3))


@gv.gen
def step(z, y):
    z = gv.normal(0.9 * z, 1.0) @ "z"
    gv.observe(gv.normal(z, 0.5), y)
    return z, 2.0 * z


def step_logjoint(zs, z0, ys):
    zs, ys = npf(zs), npf(ys)
    prev = np.concatenate([[z0], zs[:-1]])
    return np.sum(stats.norm(0.9 * prev, 1).logpdf(zs) + stats.norm(zs, 0.5).logpdf(ys))


# --------------------------------------------------------------------------- basics

def test_simulate_returns_trace_with_hand_computed_log_joint():
    tr = model.simulate(KEY, 1.0)
    assert isinstance(tr, gv.Trace)
    choices, log_density, retval = tr  # a named triple
    assert sorted(choices.paths()) == [("a",), ("sub", "x")]
    a, b = float(choices["a"]), float(choices["sub"]["x"])
    np.testing.assert_allclose(float(log_density), model_logjoint(a, b, 1.0), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(retval), a + b, rtol=1e-6)


def test_nested_addresses_both_spellings():
    tr = model.simulate(KEY, 1.0)
    assert float(tr.choices["sub"]["x"]) == float(tr.choices["sub", "x"])
    assert isinstance(tr.choices["sub"], gv.ChoiceMap)
    assert "sub" in tr.choices and ("sub", "x") in tr.choices


def test_deeply_nested_subprograms():
    @gv.gen
    def mid(m):
        return sub(m) @ "inner" + gv.normal(0.0, 1.0) @ "w"

    @gv.gen
    def top():
        return mid(1.0) @ "outer"

    tr = top.simulate(KEY)
    assert sorted(tr.choices.paths()) == [("outer", "inner", "x"), ("outer", "w")]
    x, w = float(tr.choices["outer", "inner", "x"]), float(tr.choices["outer"]["w"])
    assert float(tr.choices["outer"]["inner"]["x"]) == x
    expect = stats.norm(1, 1).logpdf(x) + stats.norm(0, 1).logpdf(w)
    np.testing.assert_allclose(float(tr.log_density), expect, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(tr.retval), x + w, rtol=1e-6)


def test_same_subprogram_at_two_addresses():
    @gv.gen
    def two():
        return sub(0.0) @ "s1", sub(5.0) @ "s2"

    tr = two.simulate(KEY)
    x1, x2 = float(tr.choices["s1", "x"]), float(tr.choices["s2", "x"])
    assert x1 != x2
    expect = stats.norm(0, 1).logpdf(x1) + stats.norm(5, 1).logpdf(x2)
    np.testing.assert_allclose(float(tr.log_density), expect, rtol=RTOL, atol=ATOL)


def test_observe_scores_without_recording():
    @gv.gen
    def only_obs(y):
        gv.observe(gv.normal(1.0, 2.0), y)
        gv.observe(gv.flip(0.3), True)

    tr = only_obs.simulate(KEY, 0.5)
    assert len(tr.choices) == 0
    expect = stats.norm(1, 2).logpdf(0.5) + np.log(0.3)
    np.testing.assert_allclose(float(tr.log_density), expect, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(only_obs.log_density(gv.choices({}), 0.5)), expect,
                               rtol=RTOL, atol=ATOL)


def test_observe_array_value_is_product():
    @gv.gen
    def m(ys):
        mu = gv.normal(0.0, 1.0) @ "mu"
        gv.observe(gv.normal(mu, 1.0), ys)

    ys = jnp.array([0.1, -0.4, 2.0])
    tr = m.simulate(KEY, ys)
    mu = float(tr.choices["mu"])
    expect = stats.norm(0, 1).logpdf(mu) + np.sum(stats.norm(mu, 1).logpdf(npf(ys)))
    np.testing.assert_allclose(float(tr.log_density), expect, rtol=RTOL, atol=ATOL)


def test_discrete_and_array_sites_log_density():
    @gv.gen
    def m():
        b = gv.flip(0.3) @ "b"
        v = gv.normal(jnp.zeros(3), jnp.array([1.0, 2.0, 3.0])) @ "v"
        k = gv.categorical(jnp.log(jnp.array([0.2, 0.5, 0.3]))) @ "k"
        return b, v, k

    tr = m.simulate(KEY)
    b, v, k = tr.retval
    assert v.shape == (3,)
    expect = (np.log(0.3 if bool(b) else 0.7)
              + np.sum(stats.norm(0, [1.0, 2.0, 3.0]).logpdf(npf(v)))
              + np.log([0.2, 0.5, 0.3][int(k)]))
    np.testing.assert_allclose(float(tr.log_density), expect, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(m.log_density(tr.choices)), expect, rtol=RTOL, atol=ATOL)


def test_log_density_matches_simulate():
    tr = model.simulate(KEY, 1.0)
    np.testing.assert_allclose(float(model.log_density(tr.choices, 1.0)), float(tr.log_density),
                               rtol=RTOL, atol=ATOL)


def test_log_density_from_nested_dict_and_hand_values():
    ld = model.log_density(gv.choices({"a": 0.3, "sub": {"x": -0.2}}), 1.0)
    np.testing.assert_allclose(float(ld), model_logjoint(0.3, -0.2, 1.0), rtol=RTOL, atol=ATOL)
    # A nested plain dict is accepted too, as is a tuple-keyed one.
    ld2 = model.log_density({"a": 0.3, "sub": {"x": -0.2}}, 1.0)
    np.testing.assert_allclose(float(ld2), float(ld), rtol=1e-6)
    ld3 = model.log_density(gv.choices({"a": 0.3, ("sub", "x"): -0.2}), 1.0)
    np.testing.assert_allclose(float(ld3), float(ld), rtol=1e-6)


def test_same_key_same_result_different_key_different_result():
    t1, t2 = model.simulate(KEY, 1.0), model.simulate(KEY, 1.0)
    assert float(t1.choices["a"]) == float(t2.choices["a"])
    assert float(t1.log_density) == float(t2.log_density)
    t3 = model.simulate(jax.random.key(1), 1.0)
    assert float(t3.choices["a"]) != float(t1.choices["a"])


def test_simulate_and_log_density_under_jit():
    tr = model.simulate(KEY, 1.0)
    trj = jax.jit(model.simulate)(KEY, 1.0)
    assert isinstance(trj.choices, gv.ChoiceMap)
    np.testing.assert_allclose(float(trj.choices["a"]), float(tr.choices["a"]), rtol=1e-5)
    np.testing.assert_allclose(float(trj.log_density), float(tr.log_density), rtol=RTOL, atol=ATOL)
    ld = jax.jit(model.log_density)(trj.choices, 1.0)
    np.testing.assert_allclose(float(ld), float(tr.log_density), rtol=RTOL, atol=ATOL)


def test_simulate_under_vmap_over_keys():
    keys = jax.random.split(KEY, 8)
    trs = jax.jit(jax.vmap(model.simulate, in_axes=(0, None)))(keys, 1.0)
    a, b = npf(trs.choices["a"]), npf(trs.choices["sub", "x"])
    assert a.shape == (8,) and len(set(a.tolist())) == 8
    np.testing.assert_allclose(npf(trs.log_density), model_logjoint(a, b, 1.0), rtol=RTOL, atol=ATOL)
    # lane i equals the unbatched run with key i
    one = model.simulate(keys[3], 1.0)
    np.testing.assert_allclose(a[3], float(one.choices["a"]), rtol=1e-5)
    lds = jax.vmap(model.log_density, in_axes=(0, None))(trs.choices, 1.0)
    np.testing.assert_allclose(npf(lds), npf(trs.log_density), rtol=RTOL, atol=ATOL)


def test_log_density_vmapped_over_data():
    ys = jnp.array([0.0, 1.0, -2.0])
    lds = jax.vmap(lambda y: model.log_density(gv.choices({"a": 0.1, "sub": {"x": 0.2}}), y))(ys)
    np.testing.assert_allclose(npf(lds), model_logjoint(0.1, 0.2, npf(ys)), rtol=RTOL, atol=ATOL)


def test_log_density_is_differentiable():
    def f(a):
        return model.log_density(gv.choices({"a": a, "sub": {"x": 0.2}}), 1.0)

    # d/da [log N(a; 0, 2) + log N(0.2; a, 1)] = -a/4 + (0.2 - a)
    a = 0.7
    np.testing.assert_allclose(float(jax.grad(f)(a)), -a / 4 + (0.2 - a), rtol=1e-5)


def test_pytree_arguments():
    @gv.gen
    def m(params, y):
        z = gv.normal(params["loc"], jnp.exp(params["log_scale"])) @ "z"
        gv.observe(gv.normal(z, 1.0), y)
        return z

    params = {"loc": jnp.array(1.0), "log_scale": jnp.array(0.5)}
    tr = m.simulate(KEY, params, 2.0)
    z = float(tr.retval)
    expect = stats.norm(1.0, np.exp(0.5)).logpdf(z) + stats.norm(z, 1).logpdf(2.0)
    np.testing.assert_allclose(float(tr.log_density), expect, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------- choice maps

def test_choices_nested_dict_indexing_and_merge():
    cm = gv.choices({"x": 1.0, "layer": {"z": 2.0, "w": {"q": 3.0}}})
    assert isinstance(cm, gv.ChoiceMap)
    assert float(cm["x"]) == 1.0
    assert float(cm["layer"]["z"]) == 2.0 == float(cm["layer", "z"])
    assert float(cm["layer", "w", "q"]) == 3.0 == float(cm["layer"]["w"]["q"])
    assert sorted(cm.paths()) == [("layer", "w", "q"), ("layer", "z"), ("x",)]
    merged = cm | gv.choices({"y": 4.0, "x": 5.0})
    assert float(merged["y"]) == 4.0
    assert float(merged["x"]) == 5.0  # right operand wins
    assert float(merged["layer", "z"]) == 2.0
    assert sorted(cm.paths()) == [("layer", "w", "q"), ("layer", "z"), ("x",)]  # immutable
    with pytest.raises(KeyError, match="nope"):
        cm["nope"]


def test_choices_merge_of_disjoint_subtrees():
    a = gv.choices({"layer": {"z": 1.0}})
    b = gv.choices({"layer": {"w": 2.0}})
    m = a | b
    assert sorted(m.paths()) == [("layer", "w"), ("layer", "z")]
    assert sorted(m["layer"].paths()) == [("w",), ("z",)]


def test_choices_are_pytrees():
    cm = gv.choices({"x": jnp.array(1.0), "layer": {"z": jnp.arange(3.0)}})
    leaves = jax.tree_util.tree_leaves(cm)
    assert len(leaves) == 2
    assert sorted(float(jnp.sum(leaf)) for leaf in leaves) == [1.0, 3.0]
    doubled = jax.tree_util.tree_map(lambda v: 2 * v, cm)
    assert isinstance(doubled, gv.ChoiceMap)
    np.testing.assert_allclose(npf(doubled["layer", "z"]), [0.0, 2.0, 4.0])

    @jax.jit
    def f(c):
        return c | gv.choices({"y": c["x"] + 1.0})

    out = f(cm)
    assert isinstance(out, gv.ChoiceMap)
    assert float(out["y"]) == 2.0
    np.testing.assert_allclose(npf(out["layer"]["z"]), [0.0, 1.0, 2.0])
    # structure is static: flatten/unflatten round-trips
    flat, tree = jax.tree_util.tree_flatten(cm)
    back = jax.tree_util.tree_unflatten(tree, flat)
    assert sorted(back.paths()) == sorted(cm.paths())


def test_choice_map_traced_through_vmap():
    cms = gv.choices({"a": jnp.arange(3.0), "sub": {"x": jnp.zeros(3)}})
    out = jax.vmap(lambda c: c["a"] + c["sub", "x"])(cms)
    np.testing.assert_allclose(npf(out), [0.0, 1.0, 2.0])


# --------------------------------------------------------------------------- combinators

def test_vmap_top_level():
    mus = jnp.arange(4.0)
    g = gv.vmap(point, in_axes=0)
    tr = g.simulate(KEY, mus)
    x = tr.choices["x"]
    assert x.shape == (4,)
    np.testing.assert_allclose(npf(tr.retval), npf(x))
    np.testing.assert_allclose(float(tr.log_density), point_logjoint(x, npf(mus)), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(g.log_density(tr.choices, mus)), float(tr.log_density),
                               rtol=RTOL, atol=ATOL)


def test_vmap_in_axes_none_and_pytree():
    @gv.gen
    def lin(w, x):
        return gv.normal(w * x, 1.0) @ "y"

    xs = jnp.arange(5.0)
    tr = gv.vmap(lin, in_axes=(None, 0)).simulate(KEY, 2.0, xs)
    y = tr.choices["y"]
    assert y.shape == (5,)
    expect = np.sum(stats.norm(2.0 * npf(xs), 1).logpdf(npf(y)))
    np.testing.assert_allclose(float(tr.log_density), expect, rtol=RTOL, atol=ATOL)


def test_repeat_top_level_independent_particles():
    tr = gv.repeat(point, 6).simulate(KEY, 0.5)
    x = npf(tr.choices["x"])
    assert x.shape == (6,)
    assert len(set(x.tolist())) == 6
    np.testing.assert_allclose(float(tr.log_density), point_logjoint(x, 0.5), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(gv.repeat(point, 6).log_density(tr.choices, 0.5)),
                               float(tr.log_density), rtol=RTOL, atol=ATOL)


def test_repeat_of_multi_site_program_nested_choices():
    tr = gv.repeat(model, 3).simulate(KEY, 1.0)
    a, b = npf(tr.choices["a"]), npf(tr.choices["sub", "x"])
    assert a.shape == b.shape == (3,)
    np.testing.assert_allclose(float(tr.log_density), np.sum(model_logjoint(a, b, 1.0)),
                               rtol=RTOL, atol=ATOL)


def test_scan_top_level():
    ys = jnp.array([0.5, -0.2, 1.0, 0.3, 0.0])
    g = gv.scan(step)
    tr = g.simulate(KEY, 0.1, ys)
    zs = tr.choices["z"]
    assert zs.shape == (5,)
    carry, out = tr.retval
    np.testing.assert_allclose(float(carry), float(zs[-1]))
    np.testing.assert_allclose(npf(out), 2 * npf(zs), rtol=1e-6)
    np.testing.assert_allclose(float(tr.log_density), step_logjoint(zs, 0.1, ys), rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(g.log_density(tr.choices, 0.1, ys)), float(tr.log_density),
                               rtol=RTOL, atol=ATOL)
    assert len(set(npf(zs).tolist())) == 5


def test_scan_with_length_and_no_xs():
    @gv.gen
    def walk(z, _):
        z = gv.normal(z, 1.0) @ "z"
        return z, z

    tr = gv.scan(walk, length=4).simulate(KEY, 0.0)
    zs = npf(tr.choices["z"])
    assert zs.shape == (4,)
    prev = np.concatenate([[0.0], zs[:-1]])
    np.testing.assert_allclose(float(tr.log_density), np.sum(stats.norm(prev, 1).logpdf(zs)),
                               rtol=RTOL, atol=ATOL)


def test_combinators_as_addressed_subcalls():
    @gv.gen
    def outer(mus, ys):
        a = gv.vmap(point)(mus) @ "pts"
        b = gv.repeat(point, 3)(0.5) @ "rep"
        c, zs = gv.scan(step)(0.0, ys) @ "ts"
        return a, b, c, zs

    mus, ys = jnp.arange(4.0), jnp.linspace(-1, 1, 6)
    tr = outer.simulate(KEY, mus, ys)
    assert sorted(tr.choices.paths()) == [("pts", "x"), ("rep", "x"), ("ts", "z")]
    pts, rep, zs = tr.choices["pts"]["x"], tr.choices["rep", "x"], tr.choices["ts", "z"]
    assert pts.shape == (4,) and rep.shape == (3,) and zs.shape == (6,)
    expect = point_logjoint(pts, npf(mus)) + point_logjoint(rep, 0.5) + step_logjoint(zs, 0.0, ys)
    np.testing.assert_allclose(float(tr.log_density), expect, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(outer.log_density(tr.choices, mus, ys)), expect,
                               rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(npf(tr.retval[3]), 2 * npf(zs), rtol=1e-6)


def test_nested_combinators_stack_axes():
    g = gv.vmap(gv.repeat(point, 3))
    tr = g.simulate(KEY, jnp.arange(2.0))
    x = npf(tr.choices["x"])
    assert x.shape == (2, 3)
    assert len(set(x.ravel().tolist())) == 6
    np.testing.assert_allclose(float(tr.log_density),
                               point_logjoint(x, np.arange(2.0)[:, None]), rtol=RTOL, atol=ATOL)


def test_scan_of_subprogram_with_nested_address():
    @gv.gen
    def body(c, _):
        x = sub(c) @ "s"
        return x, x

    tr = gv.scan(body, length=3).simulate(KEY, 0.0)
    xs = npf(tr.choices["s", "x"])
    assert xs.shape == (3,)
    prev = np.concatenate([[0.0], xs[:-1]])
    np.testing.assert_allclose(float(tr.log_density), np.sum(stats.norm(prev, 1).logpdf(xs)),
                               rtol=RTOL, atol=ATOL)


def test_repeat_of_scan_stacks_particles_on_leading_axis():
    @gv.gen
    def walk(c, _):
        z = gv.normal(c, 1.0) @ "z"
        return z, z

    program = gv.repeat(gv.scan(walk, length=5), 3)
    tr = program.simulate(KEY, 0.0)
    zs = tr.choices["z"]
    assert tr.retval[1].shape == (3, 5)
    assert zs.shape == (3, 5)
    np.testing.assert_allclose(npf(zs), npf(tr.retval[1]))
    # log_density reads the same (particles, steps) layout back
    np.testing.assert_allclose(program.log_density(tr.choices, 0.0), tr.log_density, rtol=1e-5)


def test_scan_of_vmap_and_vmap_of_scan_of_vmap_layouts():
    @gv.gen
    def point(c):
        return gv.normal(c, 1.0) @ "x"

    @gv.gen
    def step(c, _):
        xs = gv.vmap(point)(jnp.full(2, c)) @ "p"
        return jnp.mean(xs), xs

    inner = gv.scan(step, length=4)
    tr = inner.simulate(KEY, 0.0)
    assert tr.choices["p", "x"].shape == (4, 2)           # (steps, lanes)
    np.testing.assert_allclose(npf(tr.choices["p", "x"]), npf(tr.retval[1]))
    outer = gv.vmap(inner, in_axes=(0,))
    tr = outer.simulate(KEY, jnp.zeros(3))
    assert tr.choices["p", "x"].shape == (3, 4, 2)        # (batch, steps, lanes)
    np.testing.assert_allclose(npf(tr.choices["p", "x"]), npf(tr.retval[1]))
    np.testing.assert_allclose(outer.log_density(tr.choices, jnp.zeros(3)), tr.log_density,
                               rtol=1e-5)


def test_combinators_under_jit_and_vmap_over_keys():
    g = gv.repeat(point, 4)
    keys = jax.random.split(KEY, 5)
    trs = jax.jit(jax.vmap(g.simulate, in_axes=(0, None)))(keys, 0.5)
    x = npf(trs.choices["x"])
    assert x.shape == (5, 4)
    expect = np.array([point_logjoint(row, 0.5) for row in x])
    np.testing.assert_allclose(npf(trs.log_density), expect, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------- cond / switch

@gv.gen
def branchy(pred):
    def yes(_):
        return gv.normal(5.0, 1.0) @ "u"

    def no(_):
        return jnp.where(gv.flip(0.3) @ "v", 1.0, -1.0)

    out = jax.lax.cond(pred, yes, no, 0.0)
    gv.observe(gv.normal(out, 1.0), 0.0)
    return out


def test_cond_true_branch():
    tr = branchy.simulate(KEY, True)
    assert sorted(tr.choices.paths()) == [("u",), ("v",)]
    u = float(tr.choices["u"])
    assert not bool(tr.choices["v"])  # untaken branch holds zeros
    expect = stats.norm(5, 1).logpdf(u) + stats.norm(u, 1).logpdf(0.0)
    np.testing.assert_allclose(float(tr.log_density), expect, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(branchy.log_density(tr.choices, True)), expect, rtol=RTOL, atol=ATOL)


def test_cond_false_branch():
    tr = branchy.simulate(KEY, False)
    assert float(tr.choices["u"]) == 0.0  # untaken branch holds zeros
    v = bool(tr.choices["v"])
    out = 1.0 if v else -1.0
    expect = np.log(0.3 if v else 0.7) + stats.norm(out, 1).logpdf(0.0)
    np.testing.assert_allclose(float(tr.log_density), expect, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(float(branchy.log_density(tr.choices, False)), expect,
                               rtol=RTOL, atol=ATOL)


def test_cond_both_values_of_flip_scored():
    for v in (True, False):
        ld = branchy.log_density(gv.choices({"u": 0.0, "v": v}), False)
        out = 1.0 if v else -1.0
        expect = np.log(0.3 if v else 0.7) + stats.norm(out, 1).logpdf(0.0)
        np.testing.assert_allclose(float(ld), expect, rtol=RTOL, atol=ATOL)


def test_cond_on_sampled_predicate_under_vmap():
    @gv.gen
    def mix():
        b = gv.flip(0.5) @ "b"
        return jax.lax.cond(b, lambda: gv.normal(10.0, 1.0) @ "hi",
                            lambda: gv.normal(-10.0, 1.0) @ "lo")

    keys = jax.random.split(KEY, 64)
    trs = jax.jit(jax.vmap(mix.simulate))(keys)
    b = np.asarray(trs.choices["b"])
    hi, lo = npf(trs.choices["hi"]), npf(trs.choices["lo"])
    assert 0 < b.sum() < 64
    np.testing.assert_array_equal(hi[~b], 0.0)
    np.testing.assert_array_equal(lo[b], 0.0)
    np.testing.assert_allclose(npf(trs.retval), np.where(b, hi, lo))
    expect = np.log(0.5) + np.where(b, stats.norm(10, 1).logpdf(hi), stats.norm(-10, 1).logpdf(lo))
    np.testing.assert_allclose(npf(trs.log_density), expect, rtol=RTOL, atol=ATOL)




def test_cond_with_batched_predicate_under_gv_vmap():
    @gv.gen
    def pick(pred):
        return jax.lax.cond(pred, lambda: gv.normal(5.0, 1.0) @ "u",
                            lambda: gv.normal(0.0, 1.0) @ "v")

    preds = jnp.array([True, False])
    g = gv.vmap(pick)
    ld = g.log_density(gv.choices({"u": jnp.array([5.0, 0.0]), "v": jnp.array([0.0, 0.0])}), preds)
    expect = stats.norm(5, 1).logpdf(5.0) + stats.norm(0, 1).logpdf(0.0)
    np.testing.assert_allclose(float(ld), expect, rtol=RTOL, atol=ATOL)


def test_cond_on_sampled_predicate_inside_repeat():
    @gv.gen
    def mix():
        b = gv.flip(0.5) @ "b"
        return jax.lax.cond(b, lambda: gv.normal(10.0, 1.0) @ "hi",
                            lambda: gv.normal(-10.0, 1.0) @ "lo")

    tr = gv.repeat(mix, 8).simulate(KEY)
    b = np.asarray(tr.choices["b"])
    hi, lo = npf(tr.choices["hi"]), npf(tr.choices["lo"])
    expect = np.sum(np.log(0.5) + np.where(b, stats.norm(10, 1).logpdf(hi),
                                           stats.norm(-10, 1).logpdf(lo)))
    np.testing.assert_allclose(float(tr.log_density), expect, rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(hi[~b], 0.0)
    np.testing.assert_array_equal(lo[b], 0.0)


def test_switch_three_branches_union_of_addresses():
    @gv.gen
    def sw(i):
        return jax.lax.switch(i, [
            lambda: gv.normal(0.0, 1.0) @ "a",
            lambda: gv.normal(1.0, 2.0) @ "b",
            lambda: gv.normal(0.0, 1.0) @ "a" + gv.normal(3.0, 1.0) @ "c",
        ])

    expected_sites = {0: {"a"}, 1: {"b"}, 2: {"a", "c"}}
    params = {"a": (0.0, 1.0), "b": (1.0, 2.0), "c": (3.0, 1.0)}
    for i in range(3):
        tr = sw.simulate(KEY, i)
        assert sorted(tr.choices.paths()) == [("a",), ("b",), ("c",)]
        expect = 0.0
        for name in "abc":
            val = float(tr.choices[name])
            if name in expected_sites[i]:
                expect += stats.norm(*params[name]).logpdf(val)
            else:
                assert val == 0.0
        np.testing.assert_allclose(float(tr.log_density), expect, rtol=RTOL, atol=ATOL)
        np.testing.assert_allclose(float(sw.log_density(tr.choices, i)), expect, rtol=RTOL, atol=ATOL)


def test_cond_inside_scan():
    @gv.gen
    def body(c, flag):
        x = jax.lax.cond(flag, lambda: gv.normal(c, 1.0) @ "x",
                         lambda: gv.normal(0.0, 1.0) @ "x")
        return x, x

    flags = jnp.array([True, False, True, False])
    tr = gv.scan(body).simulate(KEY, 0.5, flags)
    xs = npf(tr.choices["x"])
    assert xs.shape == (4,)
    prev = np.concatenate([[0.5], xs[:-1]])
    locs = np.where(np.asarray(flags), prev, 0.0)
    np.testing.assert_allclose(float(tr.log_density), np.sum(stats.norm(locs, 1).logpdf(xs)),
                               rtol=RTOL, atol=ATOL)


def test_jit_inside_program():
    @gv.gen
    def m():
        return jax.jit(lambda: gv.normal(1.0, 1.0) @ "x")()

    tr = m.simulate(KEY)
    x = float(tr.choices["x"])
    np.testing.assert_allclose(float(tr.log_density), stats.norm(1, 1).logpdf(x), rtol=RTOL, atol=ATOL)


def test_checkpoint_inside_program():
    @gv.gen
    def m():
        return jax.checkpoint(lambda: gv.normal(1.0, 1.0) @ "x")()

    tr = m.simulate(KEY)
    x = float(tr.choices["x"])
    np.testing.assert_allclose(float(tr.log_density), stats.norm(1, 1).logpdf(x), rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------- vmap lanes

def test_vmap_inside_program_draws_per_lane_with_shared_params():
    @gv.gen
    def m():
        return jax.vmap(lambda _: gv.normal(0.0, 1.0) @ "x")(jnp.arange(5))

    tr = m.simulate(KEY)
    x = npf(tr.choices["x"])
    assert x.shape == (5,)
    assert len(set(x.tolist())) == 5
    np.testing.assert_allclose(float(tr.log_density), np.sum(stats.norm(0, 1).logpdf(x)),
                               rtol=RTOL, atol=ATOL)


def test_vmap_inside_program_mixed_batched_and_shared():
    @gv.gen
    def m(mus):
        return jax.vmap(lambda mu: gv.normal(mu, 1.0) @ "x" + gv.normal(0.0, 1.0) @ "e")(mus)

    tr = m.simulate(KEY, jnp.zeros(4))
    e = npf(tr.choices["e"])
    assert e.shape == (4,) and len(set(e.tolist())) == 4




def test_repeat_of_vector_site_with_scalar_scale():
    @gv.gen
    def vec():
        return gv.normal(jnp.zeros(3), 1.0) @ "x"

    tr = gv.repeat(vec, 4).simulate(KEY)
    x = npf(tr.choices["x"])
    assert x.shape == (4, 3)
    np.testing.assert_allclose(float(tr.log_density), np.sum(stats.norm(0, 1).logpdf(x)),
                               rtol=RTOL, atol=ATOL)


def test_vmap_of_vector_site_with_scalar_scale():
    @gv.gen
    def vec(mu):
        return gv.normal(mu, 1.0) @ "x"

    mus = jnp.arange(12.0).reshape(4, 3)
    tr = gv.vmap(vec).simulate(KEY, mus)
    x = npf(tr.choices["x"])
    np.testing.assert_allclose(float(tr.log_density), np.sum(stats.norm(npf(mus), 1).logpdf(x)),
                               rtol=RTOL, atol=ATOL)


def test_vmap_of_vector_site_with_matching_param_shapes():
    @gv.gen
    def vec(mu):
        return gv.normal(mu, jnp.ones(3)) @ "x"

    mus = jnp.arange(12.0).reshape(4, 3)
    tr = gv.vmap(vec).simulate(KEY, mus)
    x = npf(tr.choices["x"])
    assert x.shape == (4, 3)
    np.testing.assert_allclose(float(tr.log_density), np.sum(stats.norm(npf(mus), 1).logpdf(x)),
                               rtol=RTOL, atol=ATOL)


def test_repeat_with_constant_params_draws_independently():
    @gv.gen
    def const():
        return gv.flip(0.5) @ "b"

    b = np.asarray(gv.repeat(const, 200).simulate(KEY).choices["b"])
    assert b.shape == (200,)
    assert 50 < b.sum() < 150


# --------------------------------------------------------------------------- no unrolling

@pytest.mark.parametrize("g_of_n,args", [
    (lambda n: gv.repeat(point, n), (0.5,)),
    (lambda n: gv.repeat(model, n), (1.0,)),
    (lambda n: gv.vmap(gv.repeat(point, n)), (jnp.zeros(3),)),
], ids=["repeat", "repeat-with-subprogram", "vmap-of-repeat"])
def test_no_unrolling_simulate(g_of_n, args):
    def size(n):
        closed = jax.make_jaxpr(g_of_n(n).simulate)(KEY, *args)
        return count_eqns(closed), len(str(closed))

    (e2, s2), (e256, s256) = size(2), size(256)
    assert e256 <= 1.5 * e2, (e2, e256)
    assert s256 <= 1.5 * s2, (s2, s256)


def test_no_unrolling_scan_and_log_density():
    def sizes(n):
        ys = jnp.zeros(n)
        sim = jax.make_jaxpr(gv.scan(step).simulate)(KEY, 0.0, ys)
        choices = gv.choices({"z": jnp.zeros(n)})
        ld = jax.make_jaxpr(gv.scan(step).log_density)(choices, 0.0, ys)
        rep = jax.make_jaxpr(gv.repeat(point, n).log_density)(gv.choices({"x": jnp.zeros(n)}), 0.5)
        return count_eqns(sim), count_eqns(ld), count_eqns(rep)

    for small, big in zip(sizes(2), sizes(256)):
        assert big <= 1.5 * small, (small, big)


def test_a_scan_body_jax_cached_is_retraced_under_each_address():
    # JAX caches a lax.scan body's trace per function; the address prefix is part of
    # that cache's key (a jax.make_user_context), so the second call is not given the
    # first call's addresses
    def body(c, _):
        z = gv.normal(c, 1.0) @ "z"
        return z, z

    @gv.gen
    def chain(c0):
        return jax.lax.scan(body, c0, None, length=3)[1]

    @gv.gen
    def two():
        return chain(0.0) @ "a", chain(0.0) @ "b"

    tr = two.simulate(jax.random.key(0))
    assert tr.choices["a", "z"].shape == (3,) and tr.choices["b", "z"].shape == (3,)
    assert jnp.allclose(two.log_density(tr.choices), tr.log_density)


def test_addresses_are_written_and_read_by_one_type():
    """`genvi.core.address.Address`: the tuple of a site's names, shown "outer/inner",
    parsed back from what a user writes; no module joins or splits addresses by hand."""
    import pathlib
    import re

    from genvi.core.address import Address
    a = Address.parse("enc/z")
    assert a == ("enc", "z") and hash(a) == hash(("enc", "z")) and str(a) == "enc/z"
    assert Address.parse(("a", 1)) == ("a", 1) and Address.parse("z") == ("z",)
    assert Address(()).shown() == "(gv.sample)" and Address(("x",)).shown() == "x"
    root = pathlib.Path(__file__).resolve().parents[1] / "genvi"
    by_hand = re.compile(r'"/"\.join\(map\(str|\.split\("/"\)')
    found = [str(p.relative_to(root)) for p in root.rglob("*.py")
             if p.name != "address.py" and by_hand.search(p.read_text())]
    assert not found, f"addresses joined or split by hand in {found}: use Address"
