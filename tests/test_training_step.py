"""`gv.training_step`: the step `gv.fit` takes, for a loop of one's own. n steps end with
the parameters bit for bit where `gv.fit(..., steps=n)` ends; it runs under `jax.jit` and `jax.lax.scan`,
takes minibatches a loop chooses, and hands `value=` to optax transformations that
read the loss."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv
from programs import guide, model

ELBO = gv.elbo(model, guide)
START = {"m": 0.0, "s": 0.0}


def test_n_steps_end_where_gv_fit_ends():
    adam = optax.adam(optax.cosine_decay_schedule(0.05, 300))
    fitted = gv.fit(ELBO, START, 1.0, optimizer=adam, steps=300, key=jax.random.key(4),
                    progress=False)
    init, step = gv.training_step(ELBO, adam)
    state = init(START, jax.random.key(4))
    values = []
    jitted = jax.jit(step)
    for _ in range(300):
        state, value = jitted(state, 1.0)
        values.append(value)
    for name in ("m", "s"):
        assert np.array_equal(np.asarray(fitted.params[name]), np.asarray(state.params[name]))
    # the estimates agree to rounding (XLA fuses a single step and gv.fit's loop
    # differently); the parameters, bit for bit
    np.testing.assert_allclose(fitted.history["objective"], np.asarray(values), rtol=1e-5)
    assert int(state.step) == 300


def test_a_scanned_loop_over_minibatches_reaches_the_optimum():
    data = jnp.linspace(-1.0, 3.0, 40)           # the optimum: m = mean(y) / 2 = 0.5
    objective = gv.batch_mean(ELBO, in_axes=(None, 0))
    init, step = gv.training_step(objective, optax.adam(optax.cosine_decay_schedule(0.05, 2000)))

    def one(state, batch_key):
        rows = jax.random.choice(batch_key, 40, (8,), replace=False)
        return step(state, data[rows])
    state = init(START, jax.random.key(0))
    state, values = jax.jit(lambda s: jax.lax.scan(
        one, s, jax.random.split(jax.random.key(1), 2000)))(state)
    assert abs(float(state.params["m"]) - 0.5) < 0.05 and values.shape == (2000,)


def test_transformations_that_read_the_loss_get_it():
    plateau = optax.chain(optax.adam(0.05),
                          optax.contrib.reduce_on_plateau(patience=2, accumulation_size=20))
    init, step = gv.training_step(ELBO, plateau)
    state = init(START, jax.random.key(0))
    state, _ = jax.jit(lambda s: jax.lax.scan(lambda c, _: step(c, 1.0), s, None,
                                              length=1500))(state)
    assert float(optax.tree_utils.tree_get(state.opt_state, "scale")) < 1.0


def test_bad_inputs_are_refused():
    with pytest.raises(TypeError):
        gv.training_step(lambda p: 0.0, optax.adam(0.1))
    init, _ = gv.training_step(ELBO, optax.adam(0.1))
    with pytest.raises((TypeError, ValueError)):
        init({"m": 0, "s": 0}, jax.random.key(0))              # integer parameters
