"""`gv.fit`'s three parts: `set_up` a run, `loop` over its chunks, `finish` it.

A run (`Run`) holds what the loop steps and what it reads: the `TrainState`
(parameters, optimizer state, step, the steps' key) that `gv.training_step` steps too,
the stopping rule's state, the history, the compiled chunk, the data and the run's
fixed parts. `set_up` checks the arguments and builds the run, fresh, continuing a
`FitResult` or resuming a checkpoint (genvi/training/fit_state.py); `loop` runs the
chunks (genvi/training/fit_loop.py) with signals as requests (signals.py) and, between
chunks, records the history, evaluates, writes checkpoints and hands the boundary to
the callbacks (callbacks.py); `finish` makes the `FitResult`.

Example:
    >>> import genvi as gv, jax, optax
    >>> e = gv.expectation(lambda m: -(gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM)) - 1.0) ** 2)
    >>> gv.fit(e, 0.0, optimizer=optax.sgd(0.1), steps=5, key=jax.random.key(0),
    ...        progress=False).steps
    5
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from genvi.adev.expectation import Expectation
from genvi.auto.fit_tuning import AutoTuning
from genvi.core.mistakes import checked_count, user_stacklevel
from genvi.training import checkpoints as checkpoint_files
from genvi.training import fit_state
from genvi.training.callbacks import FitStart, as_callbacks
from genvi.training.distributed import (DataParallel, agreement, check_batch, data_parallel,
                                        local, place_data, reports)
from genvi.training.fit_checks import (as_arrays, check_float_params, check_objective,
                                       nonfinite_error, warn_if_skipped)
from genvi.training.fit_loop import (Chunk, Setup, batch_at, check_order, chunk_boundaries,
                                     compiled_chunk, dataset_size, shuffle_once)
from genvi.training.fit_options import (FLAT_NAMES, Checkpoints, Evaluation, SkipNonfinite,
                                        from_flat_keywords, held_out_estimator)
from genvi.training.fit_state import FitResult
from genvi.training.pacing import Pacer
from genvi.training.progress import ProgressBar
from genvi.training.schedule import at_step, check_schedules, split_scheduled
from genvi.training.signals import StopNow, StopRequests
from genvi.training.step import TrainState, strongly_typed
from genvi.training.stopping import check_rule, replay


@dataclasses.dataclass
class Run:
    """One `gv.fit` run: the fixed parts first, then what the loop moves on."""

    objective: Expectation      # the user's; `current` is what training runs now
    optimizer: optax.GradientTransformation
    setup: Setup
    sharding: DataParallel
    data: tuple
    data_key: jax.Array
    key: jax.Array
    stop: Any
    base: int                   # steps run before this call (a continued result)
    end: int
    capacity: int               # the compiled loop's buffers: steps per call at most
    chunk_size: int
    evaluate: Evaluation | None
    checkpoint_dir: str | os.PathLike | None
    checkpoint_every: int | None   # None: no checkpoints written (one may be resumed)
    resume: bool | None
    skip_nonfinite: SkipNonfinite | None
    callbacks: tuple
    shard: bool
    progress: bool
    earlier_tunings: tuple      # a continued result's gv.AUTO tunings, kept
    state: TrainState
    rule_state: Any
    history: dict
    start: int = 0              # where this call starts (after a resumed checkpoint)
    current: Expectation | None = None
    chunk: Chunk | None = None
    stopped: str = ""
    reached: int = 0

    @property
    def writes_to(self) -> str | os.PathLike | None:
        """The directory checkpoints are written to (None: none are)."""
        return self.checkpoint_dir if self.checkpoint_every is not None else None

    def arguments_at(self, params: Any, step: int) -> tuple:
        """What step `step` trains on: `params`, its minibatch and scheduled values
        (what `gv.AUTO` measures at when it tunes there)."""
        batch = batch_at(self.data, self.setup, self.data_key, self.sharding.processes, step)
        return (params,) + tuple(at_step(batch, self.setup.scheduled, step))

    def precompile(self, objective: Expectation) -> None:
        """Compile the training chunk for `objective` (on a callback's thread)."""
        run: Any = compiled_chunk(objective, self.optimizer, self.setup, self.sharding).run
        run.lower(   # a jitted function
            self.state, self.rule_state, 0, self.data, self.data_key,
            capacity=self.capacity).compile()

    def train_with(self, objective: Expectation) -> None:
        """Train `objective` from the next call on (its chunk compiled or reused)."""
        self.current = objective
        self.chunk = compiled_chunk(objective, self.optimizer, self.setup, self.sharding)

    def so_far(self, why: str) -> FitResult:
        """The fit so far as a result."""
        params, opt_state = local((self.state.params, self.state.opt_state), self.sharding)
        return fit_state.finish(params, opt_state, self.history, self.key, why,
                                self.earlier_tunings)

    def write(self, step: int) -> None:
        """The checkpoint of step `step` (the fit so far in the error's `result`)."""
        assert self.checkpoint_dir is not None
        params, opt_state = local((self.state.params, self.state.opt_state), self.sharding)
        try:
            checkpoint_files.save(self.checkpoint_dir, step,
                                  fit_state.payload(params, opt_state, step, self.key,
                                                    self.history),
                                  primary=reports(self.sharding))
        except checkpoint_files.CheckpointError as err:
            err.result = self.so_far(f"stopped after step {step}: its checkpoint could not "
                                     "be written")
            raise


_AUTO_FLAT = ("retune_every", "tune_in_background")   # gv.AutoTuning's, of old
#: gv.fit's flat keywords of earlier releases (every other keyword is data)
FLAT_KEYWORDS = FLAT_NAMES | frozenset(_AUTO_FLAT)


def set_up(objective: Expectation, params: Any, data: tuple, *,
           optimizer: optax.GradientTransformation, steps: int, key: jax.Array | None,
           batch_size: int | None, shuffle: str, stop: Any, evaluate: Evaluation | None,
           checkpoints: Checkpoints | None, skip_nonfinite: bool | SkipNonfinite,
           callbacks: Sequence, chunk_size: int, shard: bool, progress: bool,
           deprecated: dict) -> Run:
    """Check `gv.fit`'s arguments and build its run (before any checkpoint is read:
    `start` does that).

    Example:
        >>> set_up.__name__
        'set_up'
    """
    check_objective(objective, "objective")
    steps = checked_count(steps, "steps", "gv.fit", minimum=0, what="steps to run")
    chunk_size = checked_count(chunk_size, "chunk_size", "gv.fit",
                               what="steps per compiled call")
    if batch_size is not None:
        batch_size = checked_count(batch_size, "batch_size", "gv.fit", what="rows per step")
    callbacks = as_callbacks(callbacks) + _auto_from_flat(deprecated)
    if not any(isinstance(c, AutoTuning) for c in callbacks):
        callbacks = (AutoTuning(),) + callbacks   # it does nothing without gv.AUTO sites
    evaluate, checkpoints, skipping = from_flat_keywords(deprecated, evaluate, checkpoints,
                                                         skip_nonfinite)
    check_rule(stop)
    earlier = params.tunings if isinstance(params, FitResult) else ()
    if isinstance(params, FitResult):
        params, opt_state, history, key = fit_state.continued(params, optimizer, key)
    else:
        if key is None:
            raise TypeError("gv.fit: pass key=jax.random.key(seed), the key of the run's "
                            "randomness (only a run continuing a FitResult may leave it out)")
        check_float_params(params)
        params = strongly_typed(params)
        opt_state, history = optimizer.init(params), fit_state.new_history()
    params, opt_state = strongly_typed((params, opt_state))
    base = len(history["objective"])   # steps run before this call (a continued result)
    data, scheduled = split_scheduled(data)
    check_schedules(scheduled, "data")
    taken = {i for i, _ in scheduled}
    positions = [i for i in range(len(data) + len(scheduled)) if i not in taken]
    data = tuple(as_arrays(d, i) for i, d in zip(positions, data))
    step_key, data_key = jax.random.split(key)
    sharding = data_parallel(shard)
    check_batch(batch_size, sharding)
    data = place_data(data, sharding)
    n = dataset_size(data) if batch_size else None
    order = check_order(shuffle, batch_size, n)
    if order == "once":
        data = shuffle_once(data, data_key, batch_size, n, sharding.processes)
    setup = Setup((batch_size, order), n, skipping is not None, stop, scheduled)
    state = TrainState(params, opt_state, jnp.asarray(base, jnp.int32), step_key)
    directory, every, resume = ((None, None, None) if checkpoints is None else
                                (checkpoints.directory, checkpoints.every, checkpoints.resume))
    return Run(objective, optimizer, setup, sharding, data, data_key, key, stop, base,
               base + steps, max(1, min(chunk_size, steps)), chunk_size, evaluate,
               directory, every, resume,
               skipping, callbacks, shard, progress, tuple(earlier), state, (), history,
               start=base, reached=base)


def _auto_from_flat(flat: dict) -> tuple:
    """`retune_every=`, `tune_in_background=` of earlier releases as a `gv.AutoTuning`."""
    given = {name: flat.pop(name) for name in _AUTO_FLAT if name in flat}
    if not given:
        return ()
    record = AutoTuning(given.get("retune_every"), given.get("tune_in_background", True))
    warnings.warn(f"gv.fit's {', '.join(f'{k}=' for k in given)} are gv.AutoTuning's now: "
                  f"pass callbacks=[gv.AutoTuning(retune_every={record.retune_every!r}, "
                  f"background={record.background!r})]", DeprecationWarning,
                  stacklevel=user_stacklevel())
    return (record,)


def start(run: Run) -> None:
    """Resume from a checkpoint where there is one, and start the callbacks and the
    stopping rule where the run starts."""
    directory = run.checkpoint_dir
    latest = checkpoint_files.latest_step(directory) if directory is not None else None
    found = directory is not None and latest is not None and latest > run.base
    if run.resume and not found:
        where = repr(str(directory))
        after = f" past step {run.base}, where the continued FitResult ends" if run.base else ""
        raise checkpoint_files.CheckpointError(
            f"resume=True but there is no checkpoint in {where}{after}")
    if found and run.resume is not False:
        step, params, opt_state, run.history = fit_state.resume(
            str(directory), run.state.params, run.state.opt_state, run.key)
        run.state = TrainState(params, opt_state, jnp.asarray(step, jnp.int32), run.state.key)
        run.start = run.reached = step
    # a resumed or continued run replays its history, so it stops where one run would
    run.rule_state = (() if run.stop is None
                      else replay(run.stop, run.history["objective"], ~run.history["skipped"]))
    fit = FitStart(run.objective, run.state.params, run.start, run.end, run.key,
                   run.sharding.processes, run.arguments_at, run.precompile)
    for callback in run.callbacks:
        callback.start(fit)
    run.train_with(_chosen(run))
    if run.shard:   # the parameters and optimizer state replicated (the step and key
        # are put where the compiled chunk's inputs go, as every other argument)
        params, opt_state, run.rule_state = jax.device_put(
            (run.state.params, run.state.opt_state, run.rule_state), run.sharding.replicated)
        run.state = run.state._replace(params=params, opt_state=opt_state)


def _chosen(run: Run) -> Expectation:
    """The objective the callbacks give (the last that gives one), else the fit's."""
    chosen = run.objective
    for callback in run.callbacks:
        objective = callback.objective()
        if objective is not None:
            chosen = objective
    return chosen


def loop(run: Run, requests: StopRequests) -> bool:
    """Run the chunks from `run.start` to `run.end`; returns whether the loop ended
    normally (all steps, or the stopping rule), not by a signal. Raises
    `NonFiniteError` at a non-finite step (unless skipping them) and `CheckpointError`
    where a checkpoint cannot be written."""
    sharding, history = run.sharding, run.history
    estimate_held_out = held_out_estimator(run.evaluate, run.key)
    eval_every = run.evaluate.every if run.evaluate is not None else 0
    bar = ProgressBar(run.end - run.base, enabled=run.progress and reports(sharding))
    bar.advance(run.start - run.base)
    reason = _converged(run.stop, run.rule_state, sharding)
    converged = reason is not None
    edges = [c.every for c in run.callbacks if c.every]
    boundaries = [] if converged else chunk_boundaries(
        run.start, run.end, run.chunk_size, eval_every, run.checkpoint_every, *edges)
    run.stopped = reason if reason is not None else f"ran all {run.end} steps"
    alone = sharding.processes == 1
    pacer = Pacer(agreement(sharding))
    halted = False   # a signal stopped the fit (agreed by all)
    try:
        for _, until in boundaries:
            while run.reached < until and not halted:
                if alone and requests.stopping:   # it came after the last call
                    halted = True
                    break
                length = pacer.call_length(run.reached, until)
                before = (run.state, run.rule_state)
                try:
                    after, done, values, skipped, failed, seconds = _call(
                        run, before, length, requests, pacer)
                except StopNow:   # a second signal: the steps under way are dropped
                    halted = True
                    break
                _extend(history, values[:done], skipped[:done])
                bar.advance(done, float(np.mean(values[:done])) if done else None)
                if failed:   # the loop stopped at step `reached + done`
                    raise nonfinite_error(run.chunk, before, done, run.data, run.data_key,
                                          run.capacity, history, run.key)
                run.state, run.rule_state = after
                run.reached += done
                reason = _converged(run.stop, run.rule_state, sharding)
                if reason is not None:
                    converged, run.stopped = True, reason
                    break
                # one process reads the request after every call; several agree
                halted = requests.agreed(pacer.look(done, seconds, requests.number))
            if halted:
                break
            reached = run.reached
            if estimate_held_out is not None and reached % eval_every == 0:
                history["eval_step"].append(reached)
                history["eval"].append(float(estimate_held_out(run.state.params, reached)))
            every = run.checkpoint_every
            if every is not None and (reached % every == 0 or reached == run.end or converged):
                run.write(reached)
            last = reached >= run.end or converged
            for callback in run.callbacks:
                callback.boundary(reached, run.state.params, history, last)
            chosen = _chosen(run)
            if chosen is not run.current and not last:
                run.train_with(chosen)
            if converged:
                break
        ended = not halted
        if ended and requests.first is not None:   # too late to stop: say it came
            run.stopped += f" (a {requests.first.name} came as it ended)"
        if halted:
            # a signal: the fit so far is the result, and a checkpointing fit keeps it
            # on disk, so that running the same fit again resumes there
            run.stopped = requests.describe(run.reached, run.end, run.base)
            written = run.writes_to
            if written is not None and run.reached > run.base and checkpoint_files.latest_step(
                    written) != run.reached:
                run.write(run.reached)
        return ended
    finally:
        bar.close(run.stopped if converged or halted else None)


def finish(run: Run) -> FitResult:
    """The run's `FitResult`, with what each callback adds; warns where many steps were
    skipped."""
    result = run.so_far(run.stopped)
    for callback in run.callbacks:
        result = callback.finish(result)
    if run.skip_nonfinite is not None:
        warn_if_skipped(result.history, run.skip_nonfinite.warn_fraction)
    return result


def _call(run: Run, before: tuple, length: int, requests: StopRequests,
          pacer: Pacer) -> tuple:
    """One compiled call of `length` steps from `before` = (`TrainState`, stopping
    rule's state): `(after, done, values, skipped, failed, seconds)`, as this process's
    arrays. A second signal while it runs raises `StopNow` (one process only: several
    must all run the same steps)."""
    began = time.perf_counter()
    assert run.chunk is not None
    (state, rule_state), (values, skipped), (done, failed) = requests.wait_for(
        run.chunk.run(before[0], before[1], length, run.data, run.data_key,
                      capacity=run.capacity),
        pacer.expected_seconds(length), abandonable=run.sharding.processes == 1)
    done, values, skipped, failed = local((done, values, skipped, failed), run.sharding)
    done, values, skipped, failed = int(done), np.asarray(values), np.asarray(skipped), bool(failed)
    # the call's time when its outputs are read (a short call is not waited for before)
    return (state, rule_state), done, values, skipped, failed, time.perf_counter() - began


def _extend(history: dict, values: np.ndarray, skipped: np.ndarray) -> None:
    """Append a chunk's objective estimates and skipped flags to the history."""
    history["objective"] = np.concatenate([history["objective"], values])
    history["skipped"] = np.concatenate([history["skipped"], skipped])


def _converged(stop: Any, rule_state: Any, sharding: Any) -> str | None:
    """Why the stopping rule fired, or None while it has not (or without a rule)."""
    if stop is None:
        return None
    here = local(rule_state, sharding)
    return stop.describe(here) if bool(stop.done(here)) else None


def run_fit(objective: Expectation, params: Any, data: tuple, requests: StopRequests,
            **options: Any) -> FitResult:
    """Set up, start, loop and finish one fit (`gv.fit`'s body, under its signal
    requests); callbacks are closed whatever happens once started.

    Example:
        >>> run_fit.__name__
        'run_fit'
    """
    run = set_up(objective, params, data, **options)
    with checkpoint_files.Writer(run.writes_to,
                                 primary=reports(run.sharding), agree=agreement(run.sharding)):
        ended = False
        try:
            start(run)
            ended = loop(run, requests)
        finally:
            for callback in run.callbacks:
                callback.close(ended)
    return finish(run)

