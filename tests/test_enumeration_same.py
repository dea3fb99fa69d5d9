"""What depends on a summed site alone is computed once per value, not once per lane
(`genvi.inference.enumeration.same`): a mixture's weights and means, a categorical's table
of log probabilities, an HMM step's transition row. Checked on the gradient step's
jaxpr: no gather or scatter of the lanes' extent where every lane holds one value
(a per-lane table, whose reverse is a per-lane scatter, was what made the enumerated
step slower than NumPyro's)."""

import jax
import jax.numpy as jnp
import numpy as np

import genvi as gv
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
