"""`gv.fit`: maximize an objective with an optax optimizer.

`gv.fit` is a shell: under its signal requests (genvi/training/signals.py) it sets a
run up, loops over compiled chunks of `gv.training_step`'s step on a `TrainState`, and
finishes it (genvi/training/fit_run.py: `set_up`, `start`, `loop`, `finish`; each
chunk one compiled loop, genvi/training/fit_loop.py). Between chunks the loop records
the history, evaluates, checkpoints and hands the boundary to the callbacks
(genvi/training/callbacks.py), `gv.AUTO`'s tuning among them. A stopping rule
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

from typing import Any, Sequence

import jax
import optax

from genvi.adev.expectation import Expectation
from genvi.core.compile_cache import use_compilation_cache
from genvi.core.keywords import pack_keywords
from genvi.core.tracing import as_constants
from genvi.core.validation import entry_point
from genvi.training.fit_options import Checkpoints, Evaluation, SkipNonfinite
from genvi.training.fit_run import FLAT_KEYWORDS, run_fit
from genvi.training.fit_state import FitResult
from genvi.training.signals import StopRequests


@entry_point
def fit(objective: Expectation, params: Any, *data: Any,
        optimizer: optax.GradientTransformation, steps: int, key: jax.Array | None = None,
        batch_size: int | None = None, shuffle: str = "epoch", stop: Any = None,
        evaluate: Evaluation | None = None, checkpoints: Checkpoints | None = None,
        skip_nonfinite: bool | SkipNonfinite = False, callbacks: Sequence[Any] = (),
        chunk_size: int = 1000, shard: bool = False, progress: bool = True,
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
      scattered rows waits on memory (at n = 10⁶: see docs/benchmarks/peers.md, "Logistic
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
    * `callbacks`: functions `(step, params, history)` called between chunks, or
      `gv.FitCallback` objects (which may also end chunks at steps of their own and give the
      objective training runs from the next chunk on).
    * Sites with `grad=gv.AUTO`: at its start `gv.fit` measures each site's candidate
      strategies at the starting parameters on the first step's minibatch (`gv.tune`)
      and trains with the least gradient variance × step time. Each `gv.Tuning` is in
      `result.tunings`; `print` one for its table. The candidates compile on a thread
      of their own while training starts with each site's untuned choice, or where
      that step is costly by the cost model its first cheap candidate in rank order
      (`Tuning.before`), and training switches to the choice at a chunk
      boundary once it has compiled (`Tuning.applied`, a step that depends on the
      machine's speed; a site keeps what training runs where that measured within
      `tune.KEEP_MARGIN` of the best). This is the callback `gv.AutoTuning`, which
      `gv.fit` adds with its defaults; pass
      `callbacks=[gv.AutoTuning(retune_every=n)]` to measure again every n steps (at
      the current parameters, on that step's minibatch), or
      `gv.AutoTuning(background=False)` to measure first and then train, in order
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
    * With `GENVI_CACHE=FOLDER` in the environment, compiled steps are kept in a
      persistent XLA cache there, so a second run of a script loads them instead of
      compiling again. Without it `gv.fit` leaves JAX's process-wide configuration
      alone (the cache would change every compile of the process, NumPyro's too);
      `genvi run` turns the cache on by default.
    * The flat keywords of earlier releases (`eval_objective`, `eval_data`, `eval_every`,
      `eval_estimates`, `checkpoint_dir`, `checkpoint_every`, `resume`,
      `skip_warn_fraction`, `retune_every`, `tune_in_background`) still work, with a
      `DeprecationWarning` naming the record.

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
        callbacks: functions `(step, params, history)` or `gv.FitCallback` objects, called
            between chunks.
        chunk_size: steps per compiled call.
        shard: split each batch over all devices.
        progress: show a progress bar.
        **deprecated: the flat keywords of earlier releases; any other keyword is a
            data argument by name, as NumPyro's `svi.run(key, n, X=X, Y=Y)` takes it.

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
    # keywords that are no option of gv.fit's, of old or new, are the data's
    flat = {k: deprecated.pop(k) for k in list(deprecated) if k in FLAT_KEYWORDS}
    data = as_constants(pack_keywords(data, deprecated))   # ints and bools: constants
    with StopRequests() as requests:   # signals are requests from here on
        use_compilation_cache()
        return run_fit(objective, params, data, requests, optimizer=optimizer, steps=steps,
                       key=key, batch_size=batch_size, shuffle=shuffle, stop=stop,
                       evaluate=evaluate, checkpoints=checkpoints,
                       skip_nonfinite=skip_nonfinite, callbacks=callbacks,
                       chunk_size=chunk_size, shard=shard, progress=progress,
                       deprecated=flat)
