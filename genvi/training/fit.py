"""`gv.fit`: maximize an objective with an optax optimizer.

Steps run in chunks, each chunk one compiled loop (genvi/training/fit_loop.py); this
module runs the chunks: it sets a run up (fresh, continuing a `FitResult`, or resuming
a checkpoint: genvi/training/fit_state.py), and between chunks records the history,
evaluates, checkpoints, calls callbacks and moves the progress bar. A stopping rule
(genvi/training/stopping.py) stops the loop inside a chunk; a step whose estimate or
gradient is not finite stops it too and `gv.fit` raises `NonFiniteError`, naming the
step and the leaves, with the parameters from before it.

Example:
    >>> import genvi as gv, jax, optax
    >>> @gv.expectation
    ... def e(m):
    ...     return -(gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM)) - 1.0) ** 2
    >>> gv.fit(e, 0.0, optimizer=optax.sgd(0.1), steps=5, key=jax.random.key(0),
    ...        progress=False).stopped
    'ran all 5 steps'
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

import jax
import numpy as np
import optax

from genvi.adev.expectation import Expectation
from genvi.core.compile_cache import use_compilation_cache
from genvi.core.mistakes import checked_count
from genvi.core.validation import entry_point
from genvi.training import checkpoints as checkpoint_files
from genvi.training import fit_state
from genvi.training.distributed import (agreement, check_batch, data_parallel, local,
                                        place_data, reports)
from genvi.training.fit_checks import (as_arrays, check_float_params, check_objective,
                                       nonfinite_error, warn_if_skipped)
from genvi.training.fit_options import (Checkpoints, Evaluation, SkipNonfinite,
                                        from_flat_keywords, held_out_estimator)
from genvi.training.fit_loop import (Setup, batch_at, check_order, chunk_boundaries,
                                     compiled_chunk, dataset_size, shuffle_once)
from genvi.training.fit_state import FitResult
from genvi.training.pacing import Pacer
from genvi.training.progress import ProgressBar
from genvi.training.schedule import at_step, check_schedules, split_scheduled
from genvi.training.signals import StopNow, StopRequests
from genvi.training.step import strongly_typed
from genvi.training.stopping import check_rule, replay
from genvi.auto.fit_tuning import fit_tuning


@entry_point
def fit(objective: Expectation, params: Any, *data: Any,
        optimizer: optax.GradientTransformation, steps: int, key: jax.Array | None = None,
        batch_size: int | None = None, shuffle: str = "epoch", stop: Any = None,
        evaluate: Evaluation | None = None, checkpoints: Checkpoints | None = None,
        skip_nonfinite: bool | SkipNonfinite = False, callbacks: Sequence[Callable] = (),
        chunk_size: int = 1000, shard: bool = False, progress: bool = True,
        retune_every: int | None = None, tune_in_background: bool = True,
        **deprecated: Any) -> FitResult:
    """Maximize `objective(params, *data)`; returns a `FitResult` (`params`, `state`,
    `history`, `steps`, `stopped`, `key`).

    * `params`: the starting parameters (any pytree of floats), or a previous
      `FitResult` to continue: its parameters, optimizer state (pass the same
      `optimizer`), history and key carry on, and `steps` counts the steps to run on
      top, numbered on from the previous ones; so 300 steps, then 300 more, end
      bit-for-bit where one 600-step run ends (learning-rate schedules, minibatch order
      and annealing included). `key` may then be left out; a new key draws fresh
      randomness for the new steps.
    * `stop`: a stopping rule, e.g. `gv.converged(window=100, patience=3)`: stop once
      the mean objective of `patience` windows in a row moved by at most `tolerance`
      standard errors (a noise-aware test: the estimates are stochastic). The rule
      runs inside the compiled loop and `result.stopped` says why the fit ended.
    * Data arguments given as `gv.schedule(fn)` get `fn(step)` at each step
      (annealing, e.g. a KL weight `gv.schedule(optax.linear_schedule(0.0, 1.0, 1000))`).
    * Every step passes the loss, −(objective estimate), to the optimizer as optax's
      `value` argument, so transformations that take one work, e.g.
      `optax.chain(optax.adam(lr), optax.contrib.reduce_on_plateau(accumulation_size=50))`
      (average over many steps: one estimate is noisy); others ignore it.
    * `batch_size`: minibatch every data array along its leading axis (use a
      `gv.batch_mean` objective, or a model whose data sit in a `gv.plate`). Every
      datapoint is in a step's batch with probability `batch_size / n`, so objectives
      scaled by n / batch_size stay unbiased; a step costs O(batch_size) whatever n.
    * `shuffle`: the minibatches' order. `"epoch"`: a fresh permutation of the rows
      each epoch, a batch gathers scattered rows. `"once"`: the rows are permuted once
      when the fit starts (a copy of the data) and each batch is a window of adjacent
      rows at a random offset, which is faster on big datasets, where gathering
      scattered rows waits on memory (at n = 10⁶: see BENCHMARKS.md, "Logistic
      regression at dataset scale"). See `genvi/training/minibatch.py`.
    * Non-finite steps: by default `gv.fit` stops at the first step whose objective
      estimate or gradient is not finite (NaN or ±inf) and raises `gv.NonFiniteError`
      naming the step and the parameter leaves whose gradient is not finite; its
      `result` holds the parameters from before that step. Run the objective under
      `with gv.validation():` to find the site that produced it.
    * `skip_nonfinite=True` (or `gv.SkipNonfinite(warn_fraction=...)`): skip such
      steps instead (the parameters and optimizer state stay as they were), flagged in
      `history["skipped"]` and counted in `history["num_skipped"]`, with a warning
      past a fraction of skipped steps.
    * `evaluate=gv.Evaluation(objective, *data, every=500)`: a held-out objective
      estimated (mean of `estimates` estimates) every `every` steps, in
      `history["eval"]`.
    * `callbacks`: functions `(step, params, history)` called between chunks.
    * Sites with `grad=gv.AUTO`: at its start `gv.fit` measures each site's candidate
      strategies at the starting parameters on the first step's minibatch (`gv.tune`)
      and trains with the least gradient variance × step time; `retune_every=n`
      measures again every n steps (at the current parameters, on that step's
      minibatch). Each `gv.Tuning` is in
      `result.tunings`; `print` one for its table. The candidates compile on a thread
      of their own while training starts with each site's untuned choice, or where
      that step is costly by the cost model its first cheap candidate in rank order
      (`Tuning.before`), and training switches to the choice at a chunk
      boundary once it has compiled (`Tuning.applied`, a step that depends on the
      machine's speed; a site keeps what training runs where that measured within
      `tune.KEEP_MARGIN` of the best);
      `tune_in_background=False` measures first and then trains, in order
      (`genvi/auto/fit_tuning.py`).
    * `chunk_size`: steps per jitted call (the progress bar, callbacks, evaluations
      and checkpoints run between calls). Chunks of every length share one compiled
      program, and a later `gv.fit` given the same `objective` and `optimizer`
      objects reuses it (a freshly built `optax.adam(...)` compiles anew).
    * `checkpoints=gv.Checkpoints(directory, every=1000)`: atomic orbax checkpoints;
      a run finding a checkpoint there resumes from it and ends bit-for-bit where an
      uninterrupted run would (`resume=True` requires one, `resume=False` ignores them).
    * Signals are requests: on the main thread, Ctrl-C (SIGINT) and SIGTERM (a
      scheduler's preemption) stop the fit at the end of the compiled steps under way
      (the chunk is cut into calls of about half a second, so within about a second,
      or one step where a step is longer; not during a compile) and it returns the
      `FitResult` so far, its `stopped` naming the signal and the step; a
      checkpointing fit first writes the checkpoint of that step, so running it again
      resumes there. A second signal while it stops drops the steps under way
      instead of waiting for them; no signal ever cuts a checkpoint write. The
      previous handlers are back when `gv.fit` returns; a fit on another thread
      installs none (see docs/training.md, "Faults").
    * A checkpoint that cannot be written (disk full, no permission) raises
      `gv.CheckpointError` naming the directory and the cause, with the fit so far
      in its `result`; the checkpoints before it are intact. A second live fit
      writing the same directory is refused, naming the process that writes it.
    * `steps` (≥ 0), `chunk_size` and `batch_size` (≥ 1) are integers; anything else
      is refused, naming the argument.
    * `shard`: split each batch over all devices (`jax.sharding`), parameters
      replicated. Under `jax.distributed` (several processes) every process calls
      `gv.fit` alike with its own rows of each data argument, and `batch_size` is the
      global batch (see `genvi/training/distributed.py` and docs/distributed.md).
    * Compiled steps are kept in a persistent XLA cache (`~/.cache/genvi/xla`, or
      `$GENVI_CACHE`; `GENVI_CACHE=off` turns it off), so a second run of a script
      loads them instead of compiling again.
    * The flat keywords of earlier releases (`eval_objective`, `eval_data`, `eval_every`,
      `eval_estimates`, `checkpoint_dir`, `checkpoint_every`, `resume`,
      `skip_warn_fraction`) still work, with a `DeprecationWarning` naming the record.

    Args:
        objective: the objective to maximize, called as `objective(params, *data)`.
        params: the starting parameters, or a `FitResult` to continue.
        *data: the data arguments (arrays minibatched along their leading axis, or
            scheduled values: `gv.schedule`).
        optimizer: an optax `GradientTransformation`.
        steps: the number of steps to run (≥ 0).
        key: the fit's randomness (optional when continuing a `FitResult`).
        batch_size: rows per minibatch; the whole data every step when None.
        shuffle: `"epoch"` or `"once"`: the minibatches' order.
        stop: a stopping rule such as `gv.converged()`.
        evaluate: a held-out `gv.Evaluation`.
        checkpoints: a `gv.Checkpoints` record.
        skip_nonfinite: True or a `gv.SkipNonfinite` to skip non-finite steps instead of
            stopping.
        callbacks: functions `(step, params, history)` called between chunks.
        chunk_size: steps per compiled call.
        shard: split each batch over all devices.
        progress: show a progress bar.
        retune_every: measure `gv.AUTO` sites again every n steps.
        tune_in_background: measure `gv.AUTO` sites while training starts.
        **deprecated: the flat keywords of earlier releases.

    Returns:
        a `FitResult` (`params`, `state`, `history`, `steps`, `stopped`, `key`,
        `tunings`).

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp, optax
        >>> @gv.gen
        ... def model(p, y):
        ...     z = gv.normal(0.0, 1.0) @ "z"
        ...     gv.observe(gv.normal(z, 1.0), y)
        >>> @gv.gen
        ... def guide(p, y):
        ...     gv.normal(p["m"], jnp.exp(p["s"]), grad=gv.REPARAM) @ "z"
        >>> result = gv.fit(gv.elbo(model, guide), {"m": 0.0, "s": 0.0}, 1.0,
        ...                 optimizer=optax.adam(0.05), steps=500, key=jax.random.key(0),
        ...                 progress=False)
        >>> round(float(result.params["m"]), 1)   # posterior mean y / 2
        0.5
    """
    with StopRequests() as requests:   # signals are requests from here on
        use_compilation_cache()
        check_objective(objective, "objective")
        steps = checked_count(steps, "steps", "gv.fit", minimum=0, what="steps to run")
        chunk_size = checked_count(chunk_size, "chunk_size", "gv.fit",
                                   what="steps per compiled call")
        if batch_size is not None:
            batch_size = checked_count(batch_size, "batch_size", "gv.fit", what="rows per step")
        evaluate, checkpoints, skip_nonfinite = from_flat_keywords(
            deprecated, evaluate, checkpoints, skip_nonfinite)
        checkpoint_dir, checkpoint_every, resume = (
            (None, None, None) if checkpoints is None
            else (checkpoints.directory, checkpoints.every, checkpoints.resume))
        eval_every = evaluate.every if evaluate is not None else None
        check_rule(stop)
        earlier = params.tunings if isinstance(params, FitResult) else ()  # gv.AUTO's, kept
        if isinstance(params, FitResult):
            params, state, history, key = fit_state.continued(params, optimizer, key)
        else:
            if key is None:
                raise TypeError("gv.fit: pass key=jax.random.key(seed), the key of the run's "
                                "randomness (only a run continuing a FitResult may leave it out)")
            check_float_params(params)
            params = strongly_typed(params)
            state, history = optimizer.init(params), fit_state.new_history()
        params, state = strongly_typed((params, state))
        base = len(history["objective"])   # steps run before this call (a continued result)
        end = base + steps
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
        setup = Setup((batch_size, order), n, skip_nonfinite is not None, stop, scheduled)
        capacity = max(1, min(chunk_size, steps))

        def precompile(chosen: Expectation) -> None:
            # gv.AUTO's choice, compiled on its worker for the training thread to find
            compiled_chunk(chosen, optimizer, setup, sharding).run.lower(
                (params, state), rule_state, 0, 0, data, step_key, data_key,
                capacity=capacity).compile()

        def measured_at(at_params: Any, step: int) -> tuple:
            # what gv.AUTO measures at when it tunes at `step`: the parameters, and the
            # minibatch and scheduled arguments that step trains on
            batch = batch_at(data, setup, data_key, sharding.processes, step)
            return (at_params,) + tuple(at_step(batch, scheduled, step))
        writes = checkpoint_dir is not None and checkpoint_every is not None
        with checkpoint_files.Writer(checkpoint_dir if writes else None,
                                     primary=reports(sharding), agree=agreement(sharding)):
            start = base
            latest = (checkpoint_files.latest_step(checkpoint_dir) if checkpoint_dir is not None
                      else None)
            found = latest is not None and latest > base
            if resume and not found:
                where = repr(str(checkpoint_dir))
                after = f" past step {base}, where the continued FitResult ends" if base else ""
                raise checkpoint_files.CheckpointError(
                    f"resume=True but there is no checkpoint in {where}{after}")
            if found and resume is not False:
                start, params, state, history = fit_state.resume(checkpoint_dir, params, state, key)
            # a resumed run measures gv.AUTO's sites where it resumes, not at the start it skips
            first = measured_at(params, start)
            tuning = fit_tuning(objective, retune_every, key, first, sharding.processes,
                                tune_in_background, precompile)
            if tuning is not None:
                tuning.begin(first, start)
            chunk = compiled_chunk(objective if tuning is None else tuning.current, optimizer,
                                   setup, sharding)
            # a resumed or continued run replays its history, so it stops where one run would
            rule_state = () if stop is None else replay(stop, history["objective"],
                                                         ~history["skipped"])
            if shard:
                params, state, rule_state = jax.device_put((params, state, rule_state),
                                                           sharding.replicated)
            estimate_held_out = held_out_estimator(evaluate, key)
            bar = ProgressBar(end - base, enabled=progress and reports(sharding))
            bar.advance(start - base)
            reason = _converged(stop, rule_state, sharding)
            converged = reason is not None
            boundaries = [] if converged else chunk_boundaries(start, end, chunk_size, eval_every,
                                                               checkpoint_every, retune_every)
            stopped = reason if converged else f"ran all {end} steps"
            alone = sharding.processes == 1
            pacer = Pacer(agreement(sharding))
            halted = False   # a signal stopped the fit (agreed by all)
            ended, reached = False, start

            def so_far(why: str) -> FitResult:
                return fit_state.finish(*local((params, state), sharding), history, key, why)

            def write(step: int) -> None:
                try:
                    checkpoint_files.save(checkpoint_dir, step,
                                          fit_state.payload(*local((params, state), sharding),
                                                            step, key, history),
                                          primary=reports(sharding))
                except checkpoint_files.CheckpointError as err:
                    err.result = so_far(f"stopped after step {step}: its checkpoint could not "
                                        "be written")
                    raise
            try:
                for begin, until in boundaries:
                    while reached < until and not halted:
                        if alone and requests.stopping:   # it came after the last call
                            halted = True
                            break
                        length = pacer.call_length(reached, until)
                        before = (params, state, rule_state)
                        try:
                            after, done, values, skipped, failed, seconds = _call(
                                chunk, before, reached, length, data, step_key, data_key,
                                capacity, sharding, requests, pacer)
                        except StopNow:   # a second signal: the steps under way are dropped
                            halted = True
                            break
                        _extend(history, values[:done], skipped[:done])
                        bar.advance(done, float(np.mean(values[:done])) if done else None)
                        if failed:   # the loop stopped at step `reached + done`
                            raise nonfinite_error(chunk, before, reached, done, data, step_key,
                                                  data_key, capacity, history, key)
                        params, state, rule_state = after
                        reached += done
                        reason = _converged(stop, rule_state, sharding)
                        if reason is not None:
                            converged, stopped = True, reason
                            break
                        # one process reads the request after every call; several agree
                        halted = requests.agreed(pacer.look(done, seconds, requests.number))
                    if halted:
                        break
                    if estimate_held_out and reached % eval_every == 0:
                        history["eval_step"].append(reached)
                        history["eval"].append(float(estimate_held_out(params, reached)))
                    if writes and (reached % checkpoint_every == 0 or reached == end or converged):
                        write(reached)
                    for callback in callbacks:
                        callback(reached, params, history)
                    if tuning is not None and reached < end and not converged:
                        if tuning.due(reached):
                            tuning.begin(measured_at(params, reached), reached)
                        else:
                            tuning.poll(reached)
                        chunk = compiled_chunk(tuning.current, optimizer, setup, sharding)
                    if converged:
                        break
                ended = not halted
                if ended and requests.stopping:   # too late to stop: say it came
                    stopped += f" (a {requests.first.name} came as it ended)"
                if halted:
                    # a signal: the fit so far is the result, and a checkpointing fit keeps
                    # it on disk, so that running the same fit again resumes there
                    stopped = requests.describe(reached, end, base)
                    if writes and reached > base and checkpoint_files.latest_step(
                            checkpoint_dir) != reached:
                        write(reached)
            finally:
                if tuning is not None:
                    tuning.close(ended)
                bar.close(stopped if converged or halted else None)
        tunings = tuple(earlier) + (() if tuning is None else tuple(tuning.tunings))
        result = fit_state.finish(*local((params, state), sharding), history, key, stopped,
                                  tunings)
        if skip_nonfinite is not None:
            warn_if_skipped(result.history, skip_nonfinite.warn_fraction)
        return result


def _call(chunk: Any, before: tuple, at: int, length: int, data: tuple, step_key: jax.Array,
          data_key: jax.Array, capacity: int, sharding: Any, requests: StopRequests,
          pacer: Pacer) -> tuple:
    """One compiled call of `length` steps from step `at` and carry `before` = (params,
    optimizer state, rule state): `(after, done, values, skipped, failed, seconds)`,
    as this process's arrays. A second signal while it runs raises `StopNow` (one
    process only: several must all run the same steps)."""
    began = time.perf_counter()
    ((params, state), rule_state), (values, skipped), (done, failed) = requests.wait_for(
        chunk.run(before[:2], before[2], at, length, data, step_key, data_key,
                  capacity=capacity),
        pacer.expected_seconds(length), abandonable=sharding.processes == 1)
    done, values, skipped, failed = local((done, values, skipped, failed), sharding)
    done, values, skipped, failed = int(done), np.asarray(values), np.asarray(skipped), bool(failed)
    # the call's time when its outputs are read (a short call is not waited for before)
    return (params, state, rule_state), done, values, skipped, failed, time.perf_counter() - began


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
