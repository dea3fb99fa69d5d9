"""What depends on a summed site alone is computed once per value, not once per lane
(`genvi.inference.enumeration.same`): a mixture's weights and means, a categorical's table
of log probabilities, an HMM step's transition row. Checked on the gradient step's
jaxpr: no gather or scatter of the lanes' extent where every lane holds one value
(a per-lane table, whose reverse is a per-lane scatter, was what made the enumerated
step slower than NumPyro's)."""

import jax
import jax.numpy as jnp
import numpy as np

import pytest

import genvi as gv
from genvi.core import jaxpr as jx
from genvi.core.walk import env_of, walk
from genvi.core.axis_rules import gather_by_select
from genvi.inference.enumeration.same import Same

LANES = 37


def _indexing(jaxpr, lanes: int) -> list:
    """(primitive, shapes) of each gather/scatter with an axis of `lanes`."""
    found = []

    def walk(j):
        for e in j.eqns:
            if e.primitive.name.startswith(("gather", "scatter")):
                shapes = [v.aval.shape for v in list(e.invars) + list(e.outvars)]
                if any(lanes in s for s in shapes):
                    found.append((e.primitive.name, shapes))
            for p in e.params.values():
                for q in p if isinstance(p, (list, tuple)) else [p]:
                    inner = getattr(q, "jaxpr", q)
                    if hasattr(inner, "eqns"):
                        walk(inner)
    walk(jaxpr.jaxpr)
    return found


def _grad_jaxpr(model, keep, data):
    summed = gv.marginal(model, keep=keep, algorithm=gv.enumeration())
    auto = gv.auto_normal(summed)
    params = {"guide": auto.init(jax.random.key(0), {}, data)}
    objective = gv.elbo(summed, auto)
    return jax.make_jaxpr(lambda p: objective.grad_estimate(jax.random.key(1), p, data))(params)


@gv.gen
def point(mu, w, y):
    z = gv.categorical(jnp.log(w)) @ "z"
    gv.observe(gv.normal(mu[z], 0.5), y)


@gv.gen
def mixture(params, y):
    w = gv.dirichlet(jnp.ones(3)) @ "w"
    mu = gv.normal(jnp.zeros(3), 3.0) @ "mu"
    gv.vmap(point, in_axes=(None, None, 0))(mu, w, y) @ "data"


@gv.gen
def hmm_step(carry, y):
    z_prev, trans, means = carry
    z = gv.categorical(jnp.log(trans[z_prev])) @ "z"
    gv.observe(gv.normal(means[z], 0.5), y)
    return (z, trans, means), None


@gv.gen
def sequence(trans, means, ys):
    gv.scan(hmm_step)((0, trans, means), ys) @ "steps"


@gv.gen
def sequences(params, ys):
    trans = gv.dirichlet(jnp.ones((4, 4)) + 2.0 * jnp.eye(4)) @ "trans"
    means = gv.normal(jnp.zeros(4), 3.0) @ "means"
    gv.vmap(sequence, in_axes=(None, None, 0))(trans, means, ys) @ "seqs"


def test_a_mixture_reads_its_weights_and_means_once_per_value():
    y = jnp.asarray(np.random.default_rng(0).normal(size=LANES), jnp.float32)
    assert _indexing(_grad_jaxpr(mixture, ["w", "mu"], y), LANES) == []


def test_a_batch_of_sequences_reads_its_transition_rows_once_per_value_pair():
    ys = jnp.asarray(np.random.default_rng(1).normal(size=(LANES, 6)), jnp.float32)
    # the first step's row too: the initial state (0 in every sequence) stays one value
    assert _indexing(_grad_jaxpr(sequences, ["trans", "means"], ys), LANES) == []


def test_a_same_value_broadcasts_to_its_lanes():
    z = Same(jnp.full((1, 2), 3), axes=(0,), lanes=(5,))
    assert z.shape == (5, 2)
    assert z.local().axes == (0,) and z.local().base.shape == (5, 2)
    assert Same(jnp.ones((1, 2)), (0,), (5,), plain=True).materialized().shape == (5, 2)


def test_the_mixture_and_the_sequences_read_their_tables_without_a_gather():
    # a gather and its transpose (a scatter) cost microseconds a step on a CPU: a table
    # read at a site's value is read by a select over its rows (`same._selected`)
    y = jnp.asarray(np.random.default_rng(0).normal(size=LANES), jnp.float32)
    assert _indexing(_grad_jaxpr(mixture, ["w", "mu"], y), 1) == []
    assert "gather" not in str(_grad_jaxpr(mixture, ["w", "mu"], y))
    ys = jnp.asarray(np.random.default_rng(1).normal(size=(LANES, 6)), jnp.float32)
    assert "gather" not in str(_grad_jaxpr(sequences, ["trans", "means"], ys))


@pytest.mark.parametrize("read", [
    lambda t, i: t[i], lambda t, i: t[:, i], lambda t, i: t[i, :],
    lambda t, i: jnp.take(t, i, axis=0, mode="fill", fill_value=jnp.nan),
    lambda t, i: jnp.take(t, i, axis=0, mode="clip"),
    lambda t, i: jnp.take(t, i, axis=1, mode="fill", fill_value=-1.0),
    lambda t, i: jnp.take_along_axis(t[:1], i[:1, None], axis=-1),
], ids=["index", "column", "row", "fill", "clip", "fill value", "along an axis"])
def test_a_select_over_rows_reads_what_the_gather_reads_with_its_gradient(read):
    table = jnp.asarray(np.random.default_rng(2).normal(size=(4, 4)), jnp.float32)
    index = jnp.array([0, 3, 5, -1, -6, 2])     # in range, beyond, and negative
    selects = []

    def both(t):
        """The gather's value and the select's, stacked, on the gather's own operands."""
        def rule(k, e, ins):
            view = jx.view(e)
            if isinstance(view, jx.CallEqn):
                return walk(view.body.jaxpr, env_of(view.body, ins), rule)
            if e.primitive is not jax.lax.gather_p:
                return jx.eval_eqn(e, ins)
            got = gather_by_select(e, None, *ins, max_rows=64)
            selects.append(got is not None)
            (want,) = jx.eval_eqn(e, ins)
            return [jnp.stack([got[0] if got is not None else want, want])]
        closed = jax.make_jaxpr(read)(t, index)
        (out,) = walk(closed.jaxpr, env_of(closed, [t, index]), rule)
        return out
    pair = both(table)
    assert selects and all(selects)
    np.testing.assert_array_equal(np.asarray(pair[0]), np.asarray(pair[1]))
    grads = jax.jacobian(lambda t: jnp.nan_to_num(both(t), nan=0.0))(table)
    np.testing.assert_array_equal(np.asarray(grads[0]), np.asarray(grads[1]))
