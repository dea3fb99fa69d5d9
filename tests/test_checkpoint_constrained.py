"""gv.fit checkpoints with `gv.Constrained` leaves (gv.positive, gv.simplex,
gv.unit_interval, gv.lower_cholesky): a run interrupted halfway and resumed from its
checkpoint ends bit-for-bit where the uninterrupted run does, and the restored
parameters keep their `Constrained` nodes (same pytree structure, same domains)."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv
from programs import Crash, crash_after

Y = jnp.array([0.3, 1.1, 0.8, 2.0])
STEPS = 60


@gv.gen
def model(params, y):
    z = gv.normal(0.0, 2.0) @ "z"
    w = gv.dirichlet(jnp.ones(3)) @ "w"
    gv.observe(gv.normal(z + w[0], 1.0), y)


@gv.gen
def guide(params, y):
    p = gv.constrain(params)
    gv.normal(p["m"], p["s"], grad=gv.REPARAM) @ "z"
    gv.dirichlet(p["conc"] * p["w"] * 10.0 + p["frac"], grad=gv.REPARAM) @ "w"


def start():
    return {"m": jnp.array(0.0), "s": gv.positive(1.0), "w": gv.simplex(jnp.array([0.2, 0.3, 0.5])),
            "conc": gv.positive(jnp.ones(3)), "frac": gv.unit_interval(0.5),
            "tril": gv.lower_cholesky(jnp.eye(2))}      # untouched by the guide: zero gradient


def run(**kw):
    return gv.fit(gv.elbo(model, guide), start(), Y, optimizer=optax.adam(0.05), steps=STEPS,
                  key=jax.random.key(0), progress=False, **kw)


def assert_same_constrained_tree(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for name in ("s", "w", "conc", "frac", "tril"):
        assert isinstance(b[name], gv.Constrained)
        assert (b[name].domain, b[name].bounds) == (a[name].domain, a[name].bounds)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        assert np.array_equal(np.asarray(x), np.asarray(y))


def test_resume_with_constrained_leaves_is_bit_for_bit(tmp_path):
    full = run()
    directory = str(tmp_path / "ckpt")
    with pytest.raises(Crash):
        run(checkpoints=gv.Checkpoints(directory, every=STEPS // 2),
            callbacks=[crash_after(STEPS // 2)])
    assert gv.training.checkpoints.latest_step(directory) == STEPS // 2
    resumed = run(checkpoints=gv.Checkpoints(directory, every=STEPS // 2))
    assert_same_constrained_tree(full.params, resumed.params)
    np.testing.assert_array_equal(full.history["objective"], resumed.history["objective"])
    w = gv.constrain(resumed.params)["w"]
    assert float(jnp.sum(w)) == pytest.approx(1.0, abs=1e-6) and bool(jnp.all(w > 0))


def test_restore_keeps_constrained_nodes(tmp_path):
    """`checkpoints.restore` alone returns `Constrained` nodes where `like` has them."""
    params = start()
    directory = str(tmp_path / "raw")
    gv.training.checkpoints.save(directory, 3, {"params": params})
    step, restored = gv.training.checkpoints.restore(directory, {"params": start()})
    assert step == 3
    assert_same_constrained_tree(params, restored["params"])
