"""`gv.vmap` / `gv.repeat` of programs whose `lax.cond` / `lax.switch` branches sample
the same address: each lane visits the address once, as in the unbatched program.

The batched program must agree with the unbatched one lane by lane: the same choice
layout (a shared address holds the taken branch's value, an address of untaken
branches only holds zeros), the same log densities (`jax.vmap` of the unbatched
`log_density`), and, inside objectives, unbiased gradients. Reusing an address in
one execution (twice inside one branch, or in two conds one after the other) is
still refused, as it is without the combinator."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv

KEY = jax.random.key(0)
P_B = 0.4
RE, RF = gv.REPARAM, gv.REINFORCE


@gv.gen
def two_way(c):
    b = gv.flip(P_B, grad=RF) @ "b"

    def yes():
        u = gv.normal(0.0, 1.0, grad=RE) @ "u"  # only in this branch
        return gv.normal(c + 2.0 + 0.1 * u, 0.5, grad=RE) @ "x"

    return jax.lax.cond(b, yes, lambda: gv.normal(c - 2.0, 0.5, grad=RE) @ "x")


@gv.gen
def three_way(c):
    k = gv.categorical(jnp.log(jnp.array([0.2, 0.3, 0.5])), grad=RF) @ "k"
    return jax.lax.switch(k, [lambda: gv.normal(c - 5.0, 1.0, grad=RE) @ "x",
                              lambda: gv.normal(c, 0.5, grad=RE) @ "x",
                              lambda: gv.uniform(c + 4.0, c + 6.0, grad=RE) @ "x"])


@gv.gen
def nested(c):
    b = gv.flip(P_B, grad=RF) @ "b"

    def outer_yes():
        b2 = gv.flip(0.5, grad=RF) @ "b2"
        return jax.lax.cond(b2, lambda: gv.normal(c + 10.0, 1.0, grad=RE) @ "x",
                            lambda: gv.normal(c + 20.0, 1.0, grad=RE) @ "x")

    return jax.lax.cond(b, outer_yes, lambda: gv.normal(c - 10.0, 1.0, grad=RE) @ "x")


@gv.gen
def step(z, c):
    b = gv.flip(jax.nn.sigmoid(z), grad=RF) @ "b"
    z = jax.lax.cond(b, lambda: gv.normal(c + 1.0, 0.5, grad=RE) @ "z",
                     lambda: gv.normal(c - 1.0, 1.0, grad=RE) @ "z")
    return z, z


@gv.gen
def chain(c):
    _, zs = gv.scan(step)(0.0, c + jnp.arange(3.0)) @ "steps"
    return zs


@gv.gen
def up(z, _):
    z = gv.normal(z + 1.0, 0.5, grad=RE) @ "x"
    return z, z


@gv.gen
def down(z, _):
    z = gv.normal(z - 1.0, 0.5, grad=RE) @ "x"
    return z, z


@gv.gen
def inner(c):
    k = gv.flip(0.5, grad=RF) @ "k"
    return jax.lax.cond(k, lambda: gv.normal(c + 5.0, 1.0, grad=RE) @ "y",
                        lambda: gv.normal(c - 5.0, 1.0, grad=RE) @ "y")


@gv.gen
def combinators_in_branches(c):
    # a scan and a vmap (with its own shared address) at the same addresses in both branches
    b = gv.flip(P_B, grad=RF) @ "b"

    def branch(step, shift):
        def run():
            _, xs = gv.scan(step, length=3)(c, None) @ "s"
            ys = gv.vmap(inner)(c + shift + jnp.zeros(2)) @ "v"
            return xs[-1] + ys.sum()
        return run

    return jax.lax.cond(b, branch(up, 0.0), branch(down, 50.0))


PROGRAMS = {"cond": two_way, "switch": three_way, "nested cond": nested,
            "scan body": chain, "combinators in branches": combinators_in_branches}
N_LANES = 64
ARGS = jnp.linspace(-1.0, 1.0, N_LANES)


def _batched(name, how):
    g = PROGRAMS[name]
    return (gv.vmap(g), ARGS) if how == "vmap" else (gv.repeat(g, N_LANES), 0.3)


def _lane_args(how):
    return ARGS if how == "vmap" else jnp.full(N_LANES, 0.3)


def _lane_assess(g, flat, lane_args):
    """(log density, return value) of each lane under the unbatched program."""
    return jax.vmap(lambda cm, a: g.assess(gv.ChoiceMap(cm), a))(flat, lane_args)


CASES = [(name, "vmap") for name in PROGRAMS] + [("cond", "repeat")]


@functools.cache
def _run(name, how):
    """Everything the three tests below compare, computed in one compiled function."""
    g = PROGRAMS[name]
    batched, args = _batched(name, how)
    lane_args = _lane_args(how)
    sim_shapes = {}

    @gv.expectation
    def sim_gap(a):
        cm, log_q = batched.sim(a)
        sim_shapes.update({k: v.shape for k, v in cm.flat().items()})  # at trace time
        return log_q - jnp.sum(_lane_assess(g, cm.flat(), lane_args)[0])

    def run(key):
        tr = batched.simulate(key, args)
        # choices the batched program did not make: lanes shuffled (with their
        # arguments), normal values moved (the switch's uniform has a bounded support)
        k1, k2 = jax.random.split(key)
        perm = jax.random.permutation(k1, N_LANES)
        other = {a: v[perm] for a, v in tr.choices.flat().items()}
        if name != "switch":
            other = {a: v + jax.random.normal(k2, v.shape) if a[-1] in ("x", "y", "z") else v
                     for a, v in other.items()}
        other_args = args[perm] if how == "vmap" else args
        one_lane = jax.vmap(lambda c, a: gv.vmap(g).log_density(  # batches of one
            jax.tree_util.tree_map(lambda v: v[None], gv.ChoiceMap(c)), a[None]))
        return dict(sim=(tr.choices.flat(), tr.log_density, tr.retval,
                         _lane_assess(g, tr.choices.flat(), lane_args)),
                    log_density=(batched.assess(gv.ChoiceMap(other), other_args),
                                 _lane_assess(g, other, lane_args[perm]),
                                 one_lane(other, lane_args[perm])),
                    gap=sim_gap.estimate(key, args))

    out = jax.jit(run)(KEY)
    unbatched = jax.eval_shape(jax.vmap(g.simulate), jax.random.split(KEY, N_LANES), lane_args)
    return out, sim_shapes, lane_args, unbatched.choices.flat()


@pytest.mark.parametrize("name,how", CASES)
def test_simulate_agrees_with_the_unbatched_program_lane_by_lane(name, how):
    out, _, lane_args, unbatched = _run(name, how)
    flat, log_density, retval, (lps, rets) = out["sim"]
    assert {a: v.shape for a, v in flat.items()} == {a: v.shape for a, v in unbatched.items()}
    # every lane replayed through the unbatched program: the same return value, and
    # log densities that add up to the batched trace's
    np.testing.assert_allclose(rets, retval, rtol=1e-6, atol=1e-6)
    assert bool(jnp.all(jnp.isfinite(lps)))
    np.testing.assert_allclose(log_density, jnp.sum(lps), rtol=1e-5)
    if name == "cond":  # the branch taken decides where x lies; u is zero elsewhere
        b = flat[("b",)]
        assert bool(jnp.all((flat[("x",)] > lane_args) == b))
        assert bool(jnp.all(jnp.where(b, True, flat[("u",)] == 0.0)))
        assert 0 < int(b.sum()) < N_LANES


@pytest.mark.parametrize("name,how", CASES)
def test_log_density_agrees_with_the_unbatched_program_lane_by_lane(name, how):
    out, _, _, _ = _run(name, how)
    (lp, ret), (lps, rets), one_lane = out["log_density"]
    assert bool(jnp.all(jnp.isfinite(lps)))
    np.testing.assert_allclose(lp, jnp.sum(lps), rtol=1e-5)
    np.testing.assert_allclose(ret, rets, rtol=1e-6)
    np.testing.assert_allclose(one_lane, lps, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name,how", CASES)
def test_sim_agrees_with_the_unbatched_program_lane_by_lane(name, how):
    out, sim_shapes, _, _ = _run(name, how)
    assert sim_shapes == {a: v.shape for a, v in out["sim"][0].items()}
    assert abs(float(out["gap"])) < 1e-3


N_MEAN = 20000


def test_repeat_simulate_and_sim_sample_each_lane_from_its_branch():
    # E[x] = P_B (c + 2) + (1 − P_B)(c − 2); d/dc E[x] = 1 through both branches' sites
    c = 0.3
    exact = P_B * (c + 2.0) + (1 - P_B) * (c - 2.0)
    x = jax.jit(gv.repeat(two_way, N_MEAN).simulate)(KEY, c).retval
    assert abs(float(x.mean()) - exact) < 5 * float(x.std()) / math.sqrt(N_MEAN)

    @gv.expectation
    def mean_x(c):
        cm, _ = gv.repeat(two_way, N_MEAN).sim(c)
        return jnp.mean(cm["x"])

    v, g = jax.jit(mean_x.value_and_grad_estimate)(KEY, c)
    assert abs(float(v) - exact) < 5 * float(x.std()) / math.sqrt(N_MEAN)
    np.testing.assert_allclose(g, 1.0, rtol=1e-5)  # REPARAM: x − c does not depend on c


# ELBO under gv.vmap with a guide and a model that share "x" across cond branches.
YS = jnp.array([-1.5, 0.2, 2.5])
MU, SD, P_MODEL = (-1.0, 1.0), (2.0, 1.0), 0.3
PARAMS = {"logit": jnp.array(0.4), "m": jnp.array([-0.5, 0.8])}
N_ELBO = 10000


@gv.gen
def model_point(params, y):
    b = gv.flip(P_MODEL) @ "b"
    x = jax.lax.cond(b, lambda: gv.normal(MU[1], SD[1]) @ "x",
                     lambda: gv.normal(MU[0], SD[0]) @ "x")
    gv.observe(gv.normal(x, 1.0), y)


def guide_point(b_grad, x_grad):
    @gv.gen
    def guide(params, y):
        b = gv.flip(jax.nn.sigmoid(params["logit"]), grad=b_grad) @ "b"
        return jax.lax.cond(b, lambda: gv.normal(params["m"][1], 1.0, grad=x_grad) @ "x",
                            lambda: gv.normal(params["m"][0], 1.0, grad=x_grad) @ "x")
    return guide


def exact_elbo(params):
    """Σ_lanes Σ_b q(b) (log p(b) − log q(b)
    + E_{x ~ N(m_b, 1)}[log p(x|b) + log p(y|x) − log q(x|b)]), each term in closed form."""
    q1 = jax.nn.sigmoid(params["logit"])
    total = 0.0
    for y in YS:
        for b, qb, pb in ((0, 1 - q1, 1 - P_MODEL), (1, q1, P_MODEL)):
            m = params["m"][b]
            var = SD[b] ** 2
            prior = -0.5 * jnp.log(2 * jnp.pi * var) - ((m - MU[b]) ** 2 + 1) / (2 * var)
            lik = -0.5 * jnp.log(2 * jnp.pi) - ((y - m) ** 2 + 1) / 2
            entropy = 0.5 * jnp.log(2 * jnp.pi) + 0.5
            total = total + qb * (jnp.log(pb) - jnp.log(qb) + prior + lik + entropy)
    return total


@pytest.mark.parametrize("b_grad,x_grad", [(gv.REINFORCE, gv.REPARAM), (gv.ENUM, gv.REINFORCE)],
                         ids=["REINFORCE-REPARAM", "ENUM-REINFORCE"])
def test_vmapped_elbo_gradient_is_unbiased(b_grad, x_grad):
    obj = gv.elbo(gv.vmap(model_point, in_axes=(None, 0)),
                  gv.vmap(guide_point(b_grad, x_grad), in_axes=(None, 0)))
    keys = jax.random.split(jax.random.key(1), N_ELBO)
    values, grads = jax.jit(jax.vmap(lambda k: obj.value_and_grad_estimate(k, PARAMS, YS)))(keys)
    v = np.asarray(values)
    assert abs(v.mean() - float(exact_elbo(PARAMS))) < 5 * v.std() / math.sqrt(N_ELBO)
    exact = jax.grad(exact_elbo)(PARAMS)
    for name in exact:
        g = np.asarray(grads[name]).reshape(N_ELBO, -1)
        e = np.asarray(exact[name]).reshape(-1)
        se = g.std(0) / math.sqrt(N_ELBO)
        assert np.all(np.abs(g.mean(0) - e) < 5 * se), (name, g.mean(0), e, se)


# A genuine reuse stays an error, batched or not.
@gv.gen
def reuse_in_branch(c):
    b = gv.flip(0.5) @ "b"
    return jax.lax.cond(b, lambda: (gv.normal(c, 1.0) @ "x") + (gv.normal(c, 1.0) @ "x"),
                        lambda: gv.normal(c, 1.0) @ "x")


@gv.gen
def reuse_across_conds(c):
    b = gv.flip(0.5) @ "b"
    x = jax.lax.cond(b, lambda: gv.normal(c, 1.0) @ "x", lambda: c)
    return jax.lax.cond(b, lambda: gv.normal(x, 1.0) @ "x", lambda: gv.normal(x, 2.0) @ "x")


@pytest.mark.parametrize("g", [reuse_in_branch, reuse_across_conds])
@pytest.mark.parametrize("combinator", ["none", "vmap", "repeat"])
def test_reusing_an_address_in_one_execution_still_raises(g, combinator):
    if combinator == "none":
        prog, args = g, 0.0
    else:
        prog, args = (gv.vmap(g), jnp.zeros(4)) if combinator == "vmap" else (gv.repeat(g, 4), 0.0)
    with pytest.raises(ValueError, match=r"'x'.*used twice"):
        jax.eval_shape(prog.simulate, KEY, args)  # raised while tracing
    if combinator != "none":
        cm = gv.choices({"b": jnp.zeros(4, bool), "x": jnp.zeros(4)})
        with pytest.raises(ValueError, match=r"'x'.*used twice"):
            jax.eval_shape(prog.log_density, cm, args)


def test_branches_giving_an_address_different_shapes_are_refused_when_batched():
    @gv.gen
    def shapes(c):
        b = gv.flip(0.5) @ "b"
        return jax.lax.cond(b, lambda: jnp.sum(gv.normal(jnp.zeros(2), 1.0) @ "x"),
                            lambda: gv.normal(c, 1.0) @ "x")

    for prog, args in ((shapes, 0.0), (gv.vmap(shapes), jnp.zeros(3))):
        with pytest.raises(ValueError, match=r"'x' has different shapes"):
            jax.eval_shape(prog.simulate, KEY, args)
