"""`gv.fit`'s callbacks (genvi/training/callbacks.py): a plain function or a
`gv.FitCallback` at every chunk boundary; a callback's `every` ends chunks and its
`objective` is what training runs from the next chunk on; `close` runs however the fit
leaves. `gv.AUTO` plugs in the same way (`gv.AutoTuning`), and the flat keywords of
earlier releases still reach it, with a `DeprecationWarning`."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv

KEY = jax.random.key(0)


def constant(c):
    @gv.expectation
    def e(m):
        return c + 0.0 * gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM))
    return e


class Switch(gv.FitCallback):
    """Trains `then` from step `at` on; records the boundaries and how it closed."""

    def __init__(self, at, then):
        self.every, self.at, self.then = at, at, then
        self.now, self.seen, self.closed, self.started = None, [], None, None

    def start(self, fit):
        self.started = (fit.step, fit.end)

    def objective(self):
        return self.now

    def boundary(self, step, params, history, last):
        self.seen.append((step, last))
        if step >= self.at:
            self.now = self.then

    def close(self, ended):
        self.closed = ended


def test_a_callback_ends_chunks_and_switches_the_objective_at_a_boundary():
    cb = Switch(5, constant(2.0))
    calls = []
    result = gv.fit(constant(1.0), 0.0, optimizer=optax.sgd(0.1), steps=12, key=KEY,
                    callbacks=[cb, lambda step, params, history: calls.append(step)],
                    progress=False)
    np.testing.assert_array_equal(result.history["objective"], [1.0] * 5 + [2.0] * 7)
    assert cb.started == (0, 12) and cb.closed is True
    assert cb.seen == [(5, False), (10, False), (12, True)] and calls == [5, 10, 12]


def test_a_callback_is_closed_when_the_fit_raises():
    class Fails(Switch):
        def boundary(self, step, params, history, last):
            raise RuntimeError("a callback's own error")
    cb = Fails(3, None)
    with pytest.raises(RuntimeError, match="a callback's own error"):
        gv.fit(constant(1.0), 0.0, optimizer=optax.sgd(0.1), steps=6, key=KEY,
               callbacks=[cb], progress=False)
    assert cb.closed is False


def test_the_loop_steps_the_training_steps_state():
    # without minibatches, n steps of gv.training_step end where gv.fit's n steps end
    e = gv.expectation(lambda m: -(gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM)) - 2.0) ** 2)
    opt = optax.adam(0.05)
    result = gv.fit(e, 0.0, optimizer=opt, steps=30, key=KEY, chunk_size=7, progress=False)
    init, step = gv.training_step(e, opt)
    state = jax.lax.scan(lambda s, _: (step(s)[0], None), init(0.0, KEY), None, length=30)[0]
    assert int(state.step) == 30
    np.testing.assert_array_equal(np.asarray(state.params), np.asarray(result.params))


def test_the_flat_auto_keywords_of_earlier_releases_still_work():
    @gv.expectation
    def e(mu):
        x = gv.sample(gv.normal(mu, 1.0, grad=gv.AUTO), name="x")
        return 3.0 * x - 0.05 * x ** 2
    with pytest.warns(DeprecationWarning, match=r"gv.AutoTuning\(retune_every=5, "
                                                r"background=False\)"):
        result = gv.fit(e, 0.0, optimizer=optax.adam(0.1), steps=10, key=KEY,
                        retune_every=5, tune_in_background=False, progress=False)
    assert [t.step for t in result.tunings] == [0, 5]
    with pytest.raises(ValueError, match="retune_every is a positive int"):
        gv.AutoTuning(retune_every=0)
    assert jnp.isfinite(result.params)
