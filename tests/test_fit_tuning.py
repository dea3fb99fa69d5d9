"""`gv.fit`'s `gv.AUTO` in the background: training starts at once with each site's
untuned choice (or, where that step is costly, its cheapest candidate by the cost
model) while the candidates compile on a worker thread, and switches to the choice
at a chunk boundary once that choice's chunk has compiled. Whatever the step of the
switch (it depends on the machine's speed), the run is exactly that objective's up to
that step and the chosen objective's from it; `gv.AutoTuning(background=False)`
measures first and repeats exactly; a fit that ends or fails leaves no thread
running."""

import os
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv
from genvi.auto import fit_tuning, race, tune
from genvi.training.fit_loop import Setup, batch_at
from genvi.auto.fit_tuning import FitTuning, _yield_to_training

KEY = jax.random.key(3)
DATA = jax.random.normal(jax.random.key(1), (64, 2))
CHUNK = 50


@gv.gen
def model(params, x):
    z = gv.bernoulli(logits=jnp.full(3, 0.3)) @ "z"
    gv.observe(gv.normal((z * 1.0) @ params["w"], 1.0), x)


def guide_with(strategy):
    @gv.gen
    def guide(params, x):
        gv.bernoulli(logits=jax.nn.sigmoid(x @ params["enc"]), grad=strategy) @ "z"
    return guide


def objective(strategy):
    return gv.batch_mean(gv.elbo(model, guide_with(strategy)))


PARAMS = {"w": jnp.ones((3, 2)), "enc": jnp.zeros((2, 3))}


@pytest.fixture(autouse=True)
def measured_at_normal_priority(request, monkeypatch):
    """The suite runs a test on each core (`pytest -n 2`), so a measurement at the idle
    priority would wait for the other core's test to end (minutes): here it runs at
    the normal priority and compiles in the test's process, except in the two tests of
    that priority (the helper process is tested in tests/test_compile_aside.py)."""
    if request.node.name not in ("test_the_worker_yields_to_the_training",
                                 "test_the_measurement_traces_and_compiles_in_the_background"):
        monkeypatch.setattr(fit_tuning, "_yield_to_training", lambda: None)
        monkeypatch.setattr(fit_tuning, "Helpers", lambda: None)


def fit(obj, params, steps, **kw):
    return gv.fit(obj, params, DATA, optimizer=optax.adam(1e-2), steps=steps,
                  batch_size=16, chunk_size=CHUNK, progress=False, **kw)


def tune_threads():
    return [t for t in threading.enumerate() if t.name.startswith("genvi-tune")]


def slow_callback(step, params, history):
    # gives the worker time to finish, so that runs on an idle machine switch in the fit
    threading.Event().wait(0.3)


def done_at_once(self, work, compiles=False):
    future = Future()
    future.set_result(work())
    return future


def another_than_running(site, usable, running):
    # the least variance x time among the candidates training does not run
    return min((m for m in usable if m.strategy != running), key=lambda m: m.work).strategy, ""


@pytest.mark.parametrize("worker", ["thread", "inline", "inline-another"])
def test_the_run_is_the_starting_objective_then_the_choice(worker, monkeypatch):
    if worker != "thread":   # each piece of work done when handed over: a switch at the
        monkeypatch.setattr(FitTuning, "_submit", done_at_once)  # first boundary
    if worker == "inline-another":   # the choice is not the running one: its chunk
        monkeypatch.setattr(tune, "_choose", another_than_running)  # compiles, then switch
    steps = 8 * CHUNK
    result = fit(objective(gv.AUTO), PARAMS, steps, key=KEY, callbacks=[slow_callback])
    (tuning,) = result.tunings
    assert tuning.step == 0
    switch = tuning.applied
    assert switch is None or (0 < switch < steps and switch % CHUNK == 0)
    if worker != "thread":
        assert switch == CHUNK
    if worker == "inline-another":
        assert tuning.choice("z") != gv.ENUM
    assert not tune_threads()
    # the same run, rebuilt: the starting choice up to the switch, then the choice,
    # continuing the same FitResult (same keys, same batches)
    (before,) = tuning.before
    assert before == (("z",), gv.ENUM)   # a few of the score function's step: kept
    first = fit(objective(before[1]), PARAMS, steps if switch is None else switch, key=KEY)
    if switch is not None:
        first = fit(objective(tuning.choice("z")), first, steps - switch)
    np.testing.assert_array_equal(result.history["objective"], first.history["objective"])
    for a, b in zip(jax.tree_util.tree_leaves(result.params),
                    jax.tree_util.tree_leaves(first.params)):
        np.testing.assert_array_equal(a, b)


def test_measuring_first_repeats_exactly():
    runs = [fit(objective(gv.AUTO), PARAMS, 4 * CHUNK, key=KEY,
                callbacks=[gv.AutoTuning(background=False)])
            for _ in range(2)]
    assert [t.applied for t in runs[0].tunings] == [0]
    assert runs[0].tunings[0].step == 0
    # both measured the same variances from the same batches (common keys): which
    # candidates race on past their first batch, and the choices, could differ only by
    # timing, and where the choices agree the runs agree bit for bit
    pairs = list(zip(runs[0].tunings[0].measured, runs[1].tunings[0].measured))
    assert all(a.variance == b.variance for a, b in pairs if a.estimates == b.estimates)
    assert any(a.estimates == b.estimates and a.refused is None for a, b in pairs)
    if runs[0].tunings[0].choices == runs[1].tunings[0].choices:
        np.testing.assert_array_equal(runs[0].history["objective"],
                                      runs[1].history["objective"])


def test_a_fit_shorter_than_the_measurement_records_it_unapplied():
    result = fit(objective(gv.AUTO), PARAMS, CHUNK, key=KEY)
    (tuning,) = result.tunings
    assert tuning.step == 0 and tuning.applied is None
    assert tuning.choice("z") in (gv.ENUM, gv.RLOO(2), gv.MVD, gv.DisARM, gv.SD)
    assert "trained with" not in str(tuning)
    assert "not applied: the fit ended first, training with z gv.ENUM" in str(tuning)
    assert not tune_threads()


def test_a_fits_tuning_explains_its_choice_on_the_objective(monkeypatch):
    monkeypatch.setattr(FitTuning, "_submit", done_at_once)
    result = fit(objective(gv.AUTO), PARAMS, 2 * CHUNK, key=KEY)
    tuning = result.tunings[-1]
    text = str(tuning.apply(objective(gv.AUTO)).explain(result.params, DATA[:16]))
    assert f"gv.AUTO → {tuning.choice('z')!r}" in text
    assert "gv.AUTO, measured at step 0" in text and "variance × seconds" in text


def test_each_tuning_measures_on_the_minibatch_its_step_trains_on(monkeypatch):
    # not the first rows every time: a retuning sees other data, as training does
    seen = []
    begin = FitTuning.begin

    def recorded(self, args, step):
        seen.append((step, args))
        return begin(self, args, step)
    monkeypatch.setattr(FitTuning, "begin", recorded)
    monkeypatch.setattr(FitTuning, "_submit", done_at_once)
    fit(objective(gv.AUTO), PARAMS, 3 * CHUNK, key=KEY,
        callbacks=[gv.AutoTuning(retune_every=CHUNK)])
    assert [step for step, _ in seen] == [0, CHUNK, 2 * CHUNK]
    setup = Setup((16, "epoch"), 64, False, None, ())
    data_key = jax.random.split(KEY)[1]
    for step, (params, batch) in seen:
        (expected,) = batch_at((DATA,), setup, data_key, 1, step)
        np.testing.assert_array_equal(batch, expected)
    assert not np.array_equal(seen[0][1][1], seen[1][1][1])


def test_a_background_measurement_races_within_a_share_of_the_fit(monkeypatch):
    # with no share of the fit's time to spend, every candidate takes one batch of the
    # fewest estimates; measured first (not in the background), they race on
    monkeypatch.setattr(fit_tuning, "RACE_SHARE", 0.0)
    (background,) = fit(objective(gv.AUTO), PARAMS, 2 * CHUNK, key=KEY).tunings
    taken = [m.estimates for m in background.measured if m.refused is None]
    assert taken and set(taken) == {race.FEWEST}
    (first,) = fit(objective(gv.AUTO), PARAMS, 2 * CHUNK, key=KEY,
                   callbacks=[gv.AutoTuning(background=False)]).tunings
    assert max(m.estimates for m in first.measured) > fit_tuning.ESTIMATES // 2


def test_a_failing_fit_leaves_no_thread_running():
    class Stop(Exception):
        pass

    def stop(step, params, history):
        if step >= 2 * CHUNK:
            raise Stop
    interval = sys.getswitchinterval()
    with pytest.raises(Stop):
        fit(objective(gv.AUTO), PARAMS, 20 * CHUNK, key=KEY, callbacks=[stop])
    assert not tune_threads()
    assert sys.getswitchinterval() == interval   # shortened while the worker ran


def test_a_retuning_due_while_one_is_under_way_finishes_it_first():
    result = fit(objective(gv.AUTO), PARAMS, 3 * CHUNK, key=KEY,
                 callbacks=[gv.AutoTuning(retune_every=CHUNK)])
    assert [t.step for t in result.tunings] == [0, CHUNK, 2 * CHUNK]
    # each earlier one was finished and applied, at the latest, where the next was due
    assert [t.applied is not None and t.applied <= t.step + CHUNK
            for t in result.tunings[:-1]] == [True, True]
    assert not tune_threads()


def background_class() -> tuple[int, bool]:
    """The calling thread's niceness, and whether it is in the idle scheduling class."""
    thread = threading.get_native_id()
    return os.getpriority(os.PRIO_PROCESS, thread), \
        os.sched_getscheduler(thread) == os.SCHED_IDLE


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's priority: Linux")
def test_the_worker_yields_to_the_training():
    def yielded():
        _yield_to_training()
        return background_class()
    here = background_class()
    with ThreadPoolExecutor(1) as worker:
        assert worker.submit(yielded).result() == (19, True)
    # the training thread's own priority and class are untouched
    assert background_class() == here
    assert here[0] < 19 and not here[1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="a thread's priority: Linux")
def test_the_measurement_traces_and_compiles_in_the_background():
    # both run only on a core the training leaves idle: tracing five AIR candidates at
    # the normal priority slowed its chunks 1.8 times on two cores
    tuning = FitTuning(objective(gv.AUTO), None, KEY, True, precompile=lambda o: None)
    try:
        assert tuning._submit(background_class).result() == (19, True)
        assert tuning._submit(background_class, compiles=True).result() == (19, True)
    finally:
        tuning.close(ended=False)
    assert not tune_threads()


def test_a_resumed_fit_measures_where_it_resumes(monkeypatch, tmp_path):
    # at the checkpoint's parameters and the batch of the step it resumes at, not at
    # the parameters the call was given (those of the run's start)
    seen = []
    begin = FitTuning.begin

    def recorded(self, args, step):
        seen.append((step, args))
        return begin(self, args, step)
    monkeypatch.setattr(FitTuning, "_submit", done_at_once)
    checkpoints = gv.Checkpoints(str(tmp_path), every=CHUNK)
    first = fit(objective(gv.AUTO), PARAMS, 2 * CHUNK, key=KEY, checkpoints=checkpoints)
    monkeypatch.setattr(FitTuning, "begin", recorded)
    resumed = fit(objective(gv.AUTO), PARAMS, 3 * CHUNK, key=KEY,
                  checkpoints=gv.Checkpoints(str(tmp_path), every=CHUNK, resume=True))
    assert [step for step, _ in seen] == [2 * CHUNK]
    assert [t.step for t in resumed.tunings] == [2 * CHUNK]
    params, batch = seen[0][1]
    for a, b in zip(jax.tree_util.tree_leaves(params), jax.tree_util.tree_leaves(first.params)):
        np.testing.assert_array_equal(a, b)
    setup = Setup((16, "epoch"), 64, False, None, ())
    (expected,) = batch_at((DATA,), setup, jax.random.split(KEY)[1], 1, 2 * CHUNK)
    np.testing.assert_array_equal(batch, expected)
