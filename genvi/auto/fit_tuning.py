"""`gv.fit`'s `gv.AUTO`, a fit callback (`AutoTuning`): train with a cheap starting
choice while the candidates compile on a thread of their own, measure them between
chunks, and switch to the choice once its training program has compiled.

Compiling is most of what measuring costs (a site's candidates make one program of
several estimators), and on a short run it can be most of the run. So a fit does not
wait for it: it starts at once, and until the measurement has chosen it trains with
`tune.starting_choices`: each site's untuned choice (the first candidate in rank
order) where that step is cheap by the cost model, else each site's first candidate in
rank order whose step is. The untuned choice can replay the rest of the objective once
per lane of a latent vector (ENUM on a VAE's code: 7 times the score function's
elements, and 1.55 times a two-evaluation estimator's step time), and that pace would
last the whole measurement. Looking further traces candidates before training starts,
so it is done only where that pays. It hands the measurement to a worker thread and at
each chunk boundary takes what has finished. The worker traces the candidates in the
background (`_yield_to_training`: on Linux, the idle scheduling class, which runs only
on a core the training leaves idle; tracing holds Python's lock, which the training
thread needs at every chunk boundary, but with the interpreter's switch interval at
`SWITCH_INTERVAL` the holder gives it up at once: AIR's chunks kept ENUM's pace, where
at the normal priority they took 1.8 times as long while five candidates were traced,
and the tracing took 30 s of idle time rather than 11) and, on a CPU, has their
measuring program compiled by a helper process in the same class
(`genvi.auto.compile_aside`; XLA:CPU generates code on process-wide threads at the
priority of the thread that first compiled, so in this process about half of a
compile's work would compete with training as an equal). A choice's training chunk
compiles here, on a thread in the background too (XLA compiles without holding
Python's lock). The timing runs on the training thread, with nothing else running, at
the parameters and batch of the step the tuning was due at, its race held to a share
of the fit's time so far (`RACE_SHARE`, as training waits for it); once the choice is
known, the compiling thread compiles that choice's chunk and training switches to it at
the next boundary. Nothing compiles where training already runs the choice: a site
keeps what training runs while that measures within `tune.KEEP_MARGIN` of the best.
Each `Tuning` records the step it measured (`step`), the step training took its choices
from (`applied`; None where the fit ended first) and the choices it trained with before
(`before`). That step depends on how fast
the machine compiles, as the choice depends on its timings: a run that must repeat
exactly passes `callbacks=[gv.AutoTuning(background=False)]` (measure, then train) or
fits `gv.tune(...).apply(objective)`.

Example:
    >>> import genvi as gv, jax, optax
    >>> @gv.expectation
    ... def e(mu):
    ...     x = gv.sample(gv.normal(mu, 1.0, grad=gv.AUTO), name="x")
    ...     return 3.0 * x - 0.05 * x ** 2   # nearly linear: the pathwise gradient is almost exact
    >>> r = gv.fit(e, 0.0, optimizer=optax.adam(0.1), steps=200, key=jax.random.key(0),
    ...            progress=False)
    >>> r.tunings[0].choice("x"), r.tunings[0].step
    (gv.REPARAM, 0)
"""

from __future__ import annotations

import contextvars
import dataclasses
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable

import jax

from genvi.adev.expectation import Expectation
from genvi.auto.choices import Tuned
from genvi.auto.compile_aside import Helpers
from genvi.auto.tune import (KEEP_MARGIN, Tuning, auto_sites, has_auto_sites, run_now,
                             starting_choices, tuning_steps)

ESTIMATES = 64  # a candidate's measurement: up to twice this many (`race.race`)
# The race (`race.race`) pauses training, so in a background measurement it spends at
# most this share of the fit's time so far: its batches sized to fit its first round in
# that (down to `race.FEWEST` estimates each), a measurement early in a fit chooses
# from its first round, a later one (`retune_every`) races more. On AIR (a 33-ms
# estimate, five candidates within 1.13 times of each other's variance × time) the
# race paused training for 22 s unbudgeted, 6.4 s with its first round of 32 each.
RACE_SHARE = 0.05
# While the worker traces (Python, holding the interpreter's lock), the training thread
# waits for the lock at every dispatch of a chunk; Python's default 5 ms between thread
# switches made a mixture's 10-ms chunks take 40-120 ms. Restored when the fit ends.
SWITCH_INTERVAL = 0.0005


class FitTuning:
    """A fit's `gv.AUTO` sites: `current`, the objective to train with now (the
    user's with the choices in force, `choices`; one object per set of choices, so
    compiled chunks are reused when a retuning returns to earlier choices); `begin(args, step)`
    starts a measurement, `poll(step)` advances it at a chunk boundary, `close(ended)`
    ends the fit's part. `precompile(objective)` compiles that objective's chunk (run on
    the compiling thread); `background=False` measures in place, before training goes on.

    Example:
        >>> FitTuning.__name__
        'FitTuning'
    """

    def __init__(self, objective: Expectation, every: int | None, key: jax.Array,
                 background: bool, precompile: Callable[[Expectation], Any]):
        self.base, self.every, self.precompile = objective, every, precompile
        self.key = jax.random.fold_in(key, 2 ** 31 - 2)
        self.current = objective       # AUTO sites at their untuned choices, until begin
        self.choices: tuple = ()
        self.tunings: list[Tuning] = []
        self._objectives: dict = {}
        self._measured: dict = {}      # each candidate's objective and each site's program
        # the measurement (tracing) and the compiles here, both in the background
        self._worker = (ThreadPoolExecutor(1, "genvi-tune", initializer=_yield_to_training)
                        if background else None)
        self._compiler = (ThreadPoolExecutor(1, "genvi-tune-compile",
                                             initializer=_yield_to_training)
                          if background else None)
        # the helper processes compiling the measuring programs: stopped if the fit fails
        self._helpers = Helpers() if background else None
        self._pending: _Pending | None = None
        self._interval: float | None = None   # the interpreter's, while the worker runs
        self._began = time.perf_counter()

    def due(self, step: int) -> bool:
        return self.every is not None and step % self.every == 0

    def begin(self, args: tuple, step: int) -> None:
        """Measure at `args` (step `step`'s parameters, then a batch of the data); a
        measurement still under way is finished first and applied at `step`."""
        if self._pending is not None:
            self._finish(step, apply=True)
        if not self._objectives:   # choices equal to the untuned ones keep the user's objective
            self.choices = untuned(self.base, args)
            self._objectives[self.choices] = self.base
            if self._worker is not None:   # trained with while the measurement runs
                self._switch(starting_choices(self.base, args, self.key, self._measured))
        # what training runs is compiled, unless the fit measures before it trains
        running = dict(self.choices) if self._worker is not None or step > 0 else None
        steps = tuning_steps(self.base, args, jax.random.fold_in(self.key, step), ESTIMATES,
                             step, self._measured, self._race_budget, running,
                             aside=self._helpers)
        if self._worker is None:
            self._adopt(run_now(steps), step)
        else:   # handed to the worker at the next boundary: the training thread traces
            # its own chunk first, without the worker's tracing taking turns at the GIL
            self._pending = _Pending(steps, next(steps))

    def poll(self, step: int) -> None:
        """At the boundary before step `step`: take every piece of work the worker has
        finished (measure with it, hand it the next), without waiting."""
        if self._pending is not None and not isinstance(self._pending.work, Future):
            self._pending.work = self._submit(self._pending.work)
        while self._pending is not None and self._pending.work.done():
            self._advance(step, apply=True)

    def close(self, ended: bool) -> None:
        """The fit's end: a measurement under way is finished (waiting for its compiles)
        and recorded, not applied, when the fit `ended` normally; dropped when it
        raised, its helper processes killed so that the fit's error is not held back
        by a compile nobody will use. The worker is stopped either way (the fit leaves
        nothing running)."""
        if not ended and self._helpers is not None:
            self._helpers.stop()
        try:
            if ended and self._pending is not None:
                self._finish(None, apply=False)
        finally:
            self._pending = None
            for executor in (self._worker, self._compiler):
                if executor is not None:
                    executor.shutdown(wait=True, cancel_futures=True)
            if self._interval is not None:
                sys.setswitchinterval(self._interval)
                self._interval = None

    def _race_budget(self) -> float | None:
        """Seconds a site's race may spend (`RACE_SHARE` of the fit's time so far);
        None (no limit) where the fit measures first and then trains."""
        if self._worker is None:
            return None
        return RACE_SHARE * (time.perf_counter() - self._began)

    def _finish(self, step: int | None, apply: bool) -> None:
        while self._pending is not None:
            if not isinstance(self._pending.work, Future):
                self._pending.work = self._submit(self._pending.work)
            self._pending.work.result()    # waits; raises what the work raised
            self._advance(step, apply)

    def _advance(self, step: int | None, apply: bool) -> None:
        """The worker's piece of work is done: measure with it and submit the next one,
        or, the tuning done, compile its choice's chunk; that done, switch to it."""
        pending = self._pending
        assert pending is not None   # called only while a measurement is under way
        done = pending.work.result()
        if pending.tuning is not None:   # the choice's chunk has compiled
            self._adopt(pending.tuning, step)
            return
        try:
            pending.work = self._submit(pending.steps.send(done))
        except StopIteration as finished:
            tuning = finished.value
            if not apply:
                self._adopt(tuning, None)
                return
            target = self._objective(tuning.choices, tuning)
            if target is self.current:
                self._adopt(tuning, step)
            else:
                pending.tuning = tuning
                pending.work = self._submit(lambda: self.precompile(target), compiles=True)

    def _adopt(self, tuning: Tuning, step: int | None) -> None:
        self.tunings.append(dataclasses.replace(tuning, applied=step, before=self.choices))
        if step is not None:
            self._switch(tuning.choices, tuning)
        self._pending = None

    def _switch(self, choices: tuple, tuning: Tuning | None = None) -> None:
        self.choices, self.current = choices, self._objective(choices, tuning)

    def _objective(self, choices: tuple, tuning: Tuning | None = None) -> Expectation:
        """The user's objective at `choices` (with `tuning`'s table for `explain`)."""
        objective = self._objectives.get(choices)
        if objective is None:
            objective = self._objectives[choices] = (
                Tuned(self.base, choices) if tuning is None else tuning.apply(self.base))
        return objective

    def _submit(self, work: Callable[[], Any], compiles: bool = False) -> Future:
        """Hand `work` to the worker (a measurement's step: tracing, with its compile
        aside on a CPU), or where it `compiles` here (a choice's chunk), to the thread at
        the lowest priority."""
        if self._interval is None:
            self._interval = sys.getswitchinterval()
            sys.setswitchinterval(min(self._interval, SWITCH_INTERVAL))
        # the work traces with the fit's run context (genvi's context variables)
        executor = self._compiler if compiles else self._worker
        assert executor is not None   # work is submitted only in the background
        return executor.submit(contextvars.copy_context().run, work)


class _Pending:
    """A measurement under way: its steps (`tune.tuning_steps`), the worker's piece of
    work (a `Future` once submitted), and once chosen, the `Tuning` whose chunk is
    compiling."""

    def __init__(self, steps: Any, work: Any):
        self.steps, self.work, self.tuning = steps, work, None


def _yield_to_training() -> None:
    """Run the calling thread (the measurement's worker, or the compiling thread and
    the threads its compiles start) in the background, on Linux: at niceness 19 and in
    the idle scheduling class (`SCHED_IDLE`), which runs only on a core the training
    leaves idle. Its work is background work, and on a machine with few cores it took a
    core from the training (a mixture's time to its target: 1.45 times the starting
    choice's at normal priority, 0.97 times at niceness 19; AIR's chunks, while five
    candidates were traced at the normal priority, 1.8 times as long). Elsewhere, or
    where the system refuses, it runs at the normal priority."""
    if sys.platform.startswith("linux"):
        thread = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, thread, 19)
            os.sched_setscheduler(thread, os.SCHED_IDLE, os.sched_param(0))
        except OSError:
            pass


def untuned(objective: Expectation, args: tuple) -> tuple:
    """The choices `objective`'s AUTO sites take before any tuning: ((address,
    strategy), ...)."""
    return tuple((site.addr, site.default) for site in auto_sites(objective, args))


class AutoTuning:
    """`gv.AUTO`'s part in a `gv.fit`: a fit callback (the protocol of
    `genvi.training.callbacks.FitCallback`) that measures the objective's AUTO sites
    as the fit starts and, with `retune_every=n`, again every n steps (at that step's
    parameters and minibatch), and hands the fit the objective with the chosen
    strategies at a chunk boundary (see the module docstring). `gv.fit` adds one with
    the defaults where the objective has AUTO sites; pass your own to change them.
    `background=False` measures first and then trains, in order, so that a run
    repeats exactly. The fit's `result.tunings` holds each `gv.Tuning`.

    Args:
        retune_every: measure again every this many steps (None: at the start only).
        background: measure while training starts (True), or before it (False).

    Example:
        >>> import genvi as gv, jax, optax
        >>> @gv.expectation
        ... def e(mu):
        ...     x = gv.sample(gv.normal(mu, 1.0, grad=gv.AUTO), name="x")
        ...     return 3.0 * x - 0.05 * x ** 2
        >>> r = gv.fit(e, 0.0, optimizer=optax.adam(0.1), steps=20, key=jax.random.key(0),
        ...            callbacks=[gv.AutoTuning(retune_every=10, background=False)],
        ...            progress=False)
        >>> [t.step for t in r.tunings]
        [0, 10]
    """

    #: a site keeps the strategy training runs where that measures within this factor
    #: of the best's variance × time (closer than a measurement tells apart)
    keep_margin: float = KEEP_MARGIN

    def __init__(self, retune_every: int | None = None, background: bool = True):
        if retune_every is not None and (isinstance(retune_every, bool)
                                         or not isinstance(retune_every, int) or retune_every < 1):
            raise ValueError("gv.AutoTuning: retune_every is a positive int (steps), got "
                             f"{retune_every!r}")
        self.retune_every, self.background = retune_every, bool(background)
        self.every = retune_every   # chunks end where a measurement is due
        self.tuning: FitTuning | None = None
        self._arguments_at: Callable[[Any, int], tuple] | None = None

    def start(self, fit: Any) -> None:
        """The fit starts (`fit`: a `genvi.training.callbacks.FitStart`): measure at
        its first step, in the background or at once."""
        first = fit.arguments_at(fit.params, fit.step)
        self._arguments_at = fit.arguments_at
        self.tuning = fit_tuning(fit.objective, self.retune_every, fit.key, first,
                                 fit.processes, self.background, fit.precompile)
        if self.tuning is not None:
            self.tuning.begin(first, fit.step)

    def objective(self) -> Expectation | None:
        """The objective with the choices in force (None without AUTO sites)."""
        return None if self.tuning is None else self.tuning.current

    def boundary(self, step: int, params: Any, history: dict, last: bool) -> None:
        """Between chunks: measure again where due, else take what the measurement
        has finished (nothing after the last step)."""
        if self.tuning is None or last:
            return
        if self.tuning.due(step):
            assert self._arguments_at is not None   # set by start
            self.tuning.begin(self._arguments_at(params, step), step)
        else:
            self.tuning.poll(step)

    def close(self, ended: bool) -> None:
        if self.tuning is not None:
            self.tuning.close(ended)

    def finish(self, result: Any) -> Any:
        """The fit's `FitResult` with this fit's tunings after those it continued."""
        if self.tuning is None:
            return result
        return result._replace(tunings=tuple(result.tunings) + tuple(self.tuning.tunings))


def fit_tuning(objective: Expectation, every: int | None, key: jax.Array, measured: tuple,
               processes: int, background: bool, precompile: Callable) -> FitTuning | None:
    """gv.AUTO's tuning for a `gv.fit` of `processes` processes, or None where the
    objective has no AUTO site (`measured`: the arguments a tuning measures at).

    Example:
        >>> import genvi as gv, jax
        >>> @gv.expectation
        ... def e(m):
        ...     return gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM))
        >>> fit_tuning(e, None, jax.random.key(0), (0.0,), 1, True, None) is None
        True
    """
    if not has_auto_sites(objective, measured):
        if every is not None:
            raise ValueError("gv.AutoTuning: retune_every= measures the strategies of sites "
                             "with grad=gv.AUTO, and the objective has none")
        return None
    if processes > 1:
        raise ValueError(
            "gv.fit with grad=gv.AUTO sites under several processes: each would measure on "
            "its own machine and could choose differently. Tune first (tuning = gv.tune("
            "objective, params, *batch, key=...)) on one process and fit "
            "tuning.apply(objective) on all of them.")
    return FitTuning(objective, every, key, background, precompile)
