"""`gv.fit`: maximize an objective with an optax optimizer.

Steps run in chunks, each chunk one loop inside one jitted call; the key of step `t`
is `fold_in(key, t)` and minibatches come from a per-epoch permutation, so a run's
result does not depend on how it is chunked, checkpointed or resumed. The chunk's
length is an argument of the compiled loop, not part of its shape, so chunks of every
length (a remainder, the stretch up to an evaluation or a checkpoint) share one
compiled program.

Every step checks that its objective estimate and gradient are finite (one reduction
per gradient leaf). The loop stops at the first step that is not, keeping the
parameters from before it, and `gv.fit` raises `NonFiniteError` naming the step and
the leaves; with `skip_nonfinite=True` such steps are skipped, counted and, past a
fraction of the run, warned about.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from typing import Any, Callable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from genvi.adev.expectation import Expectation
from genvi.training import checkpoints
from genvi.training import minibatch
from genvi.training.distributed import (check_batch, data_parallel, local, per_process,
                                        place_data, reports)
from genvi.training.fit_checks import (NonFiniteError, as_arrays, check_float_params,
                                       check_objective, nonfinite_message, warn_if_skipped)
from genvi.core.compile_cache import use_compilation_cache
from genvi.core.validation import entry_point


class FitResult(NamedTuple):
    """What `gv.fit` returns.

    `history` holds numpy arrays: `objective` (the estimate at every step),
    `skipped` (steps whose non-finite update was skipped), and, when evaluating,
    `eval_step` and `eval` (held-out objective means); and `num_skipped`, an int.

    Example:
        >>> import genvi as gv
        >>> gv.FitResult._fields
        ('params', 'state', 'history')
    """

    params: Any
    state: Any
    history: dict


@entry_point
def fit(objective: Expectation, params: Any, *data: Any,
        optimizer: optax.GradientTransformation, steps: int, key: jax.Array,
        progress: bool = True, batch_size: int | None = None, shuffle: str = "epoch",
        skip_nonfinite: bool = False,
        eval_objective: Expectation | None = None, eval_data: Sequence | None = None,
        eval_every: int | None = None, eval_estimates: int = 64,
        callbacks: Sequence[Callable] = (), chunk_size: int = 1000,
        checkpoint_dir: str | None = None, checkpoint_every: int | None = None,
        resume: bool | None = None, shard: bool = False,
        skip_warn_fraction: float | None = 0.1) -> FitResult:
    """Maximize `objective(params, *data)`; returns `FitResult(params, state, history)`.

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
    * `skip_nonfinite=True`: skip such steps instead (the parameters and optimizer
      state stay as they were), flagged in `history["skipped"]` and counted in
      `history["num_skipped"]`; a `gv.NonFiniteWarning` is issued when more than
      `skip_warn_fraction` of the steps were skipped (`None`: never).
    * `eval_objective` / `eval_data` / `eval_every`: a held-out objective estimated
      (mean of `eval_estimates` estimates) every `eval_every` steps.
    * `callbacks`: functions `(step, params, history)` called between chunks.
    * `chunk_size`: steps per jitted call (the progress bar, callbacks, evaluations
      and checkpoints run between calls). Chunks of every length share one compiled
      program, and a later `gv.fit` given the same `objective` and `optimizer`
      objects reuses it (a freshly built `optax.adam(...)` compiles anew).
    * `checkpoint_dir` / `checkpoint_every`: atomic orbax checkpoints; a run finding a
      checkpoint there resumes from it and ends bit-for-bit where an uninterrupted
      run would. `resume=True` requires a checkpoint (a clear error if there is
      none); `resume=False` ignores existing ones.
    * `shard`: split each batch over all devices (`jax.sharding`), parameters
      replicated. Under `jax.distributed` (several processes) every process calls
      `gv.fit` alike with its own rows of each data argument, and `batch_size` is the
      global batch (see `genvi/training/distributed.py` and docs/distributed.md).
    * Compiled steps are kept in a persistent XLA cache (`~/.cache/genvi/xla`, or
      `$GENVI_CACHE`; `GENVI_CACHE=off` turns it off), so a second run of a script
      loads them instead of compiling again.

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
    use_compilation_cache()
    check_objective(objective, "objective")
    if eval_objective is not None:
        check_objective(eval_objective, "eval_objective")
    check_float_params(params)
    params = _strongly_typed(params)
    data = tuple(as_arrays(d, i) for i, d in enumerate(data))
    step_key, data_key = jax.random.split(key)
    sharding = data_parallel(shard)
    check_batch(batch_size, sharding)
    data = place_data(data, sharding)
    n = _dataset_size(data) if batch_size else None
    order = _check_order(shuffle, batch_size, n)
    if order == "once":
        data = _shuffle_once(data, data_key, batch_size, n, sharding.processes)
    chunk = _compiled_chunk(objective, optimizer, (batch_size, order), n, skip_nonfinite,
                            sharding)
    capacity = max(1, min(chunk_size, steps))
    state = _strongly_typed(optimizer.init(params))
    history = {"objective": np.zeros(0, np.float32), "skipped": np.zeros(0, bool),
               "eval_step": [], "eval": []}
    start = 0
    found = checkpoint_dir is not None and checkpoints.latest_step(checkpoint_dir) is not None
    if resume and not found:
        raise checkpoints.CheckpointError(
            f"resume=True but there is no checkpoint in "
            f"{os.path.abspath(checkpoint_dir) if checkpoint_dir else '(no checkpoint_dir given)'!r}")
    if found and resume is not False:
        start, params, state, history = _resume(checkpoint_dir, params, state, key)
    if shard:
        params, state = jax.device_put((params, state), sharding.replicated)
    evaluate = _make_eval(eval_objective, eval_data, eval_estimates, key)
    bar = _ProgressBar(steps, enabled=progress and reports(sharding))
    bar.advance(start)
    boundaries = _boundaries(start, steps, chunk_size, eval_every, checkpoint_every)
    try:
        for begin, end in boundaries:
            before = (params, state)
            (params, state), (values, skipped), (done, failed) = chunk.run(
                before, begin, end - begin, data, step_key, data_key, capacity=capacity)
            done, values, skipped, failed = local((done, values, skipped, failed), sharding)
            done, values, skipped = int(done), np.asarray(values), np.asarray(skipped)
            history["objective"] = np.concatenate([history["objective"], values[:done]])
            history["skipped"] = np.concatenate([history["skipped"], skipped[:done]])
            if bool(failed):   # the loop stopped at step `begin + done`
                bar.advance(done)
                raise _nonfinite_error(chunk, before, begin, done, data, step_key, data_key,
                                       capacity, history)
            if evaluate and eval_every and end % eval_every == 0:
                history["eval_step"].append(end)
                history["eval"].append(float(evaluate(params)))
            if checkpoint_dir and checkpoint_every and (end % checkpoint_every == 0 or end == steps):
                checkpoints.save(checkpoint_dir, end,
                                 _payload(*local((params, state), sharding), end, key, history),
                                 primary=reports(sharding))
            for callback in callbacks:
                callback(end, params, history)
            bar.advance(end - begin, float(np.mean(values[:done])))
    finally:
        bar.close()
    result = _finish(*local((params, state), sharding), history)
    warn_if_skipped(result.history, skip_warn_fraction)
    return result


def _finish(params, state, history) -> FitResult:
    history = dict(history, eval_step=np.asarray(history["eval_step"], np.int64),
                   eval=np.asarray(history["eval"], np.float32),
                   num_skipped=int(np.sum(history["skipped"])))
    return FitResult(params, state, history)


_CHUNKS: dict = {}  # compiled chunk runners, reused across gv.fit calls
_CHUNKS_KEPT = 16   # the most recent ones; each holds its objective and optimizer alive


def _compiled_chunk(objective, optimizer, batching, n, skip_nonfinite, sharding):
    """`_Chunk(run, leaf_check)`. `run` is a jitted `(carry, begin, length, data,
    step_key, data_key, *, capacity) -> (carry, (values, skipped), (done, failed))`
    running steps `begin .. begin + length - 1`, with `length <= capacity` traced (one
    compile for every chunk length) and per-step outputs in buffers of `capacity`.
    Unless `skip_nonfinite`, it stops at the first non-finite step, `begin + done`
    (`failed`; its carry is then not meaningful). `leaf_check(params, step, data,
    step_key, data_key)` gives that step's value and per-leaf gradient finiteness (for
    the error; compiled only when needed). Data and keys are arguments, never baked-in
    constants, so a second `gv.fit` with the same objective and optimizer objects
    reuses the compiled program."""
    cache_key = (id(objective), id(optimizer), batching, n, skip_nonfinite, sharding.batch,
                 sharding.processes)
    hit = _CHUNKS.get(cache_key)
    if hit is not None and hit[0] is objective and hit[1] is optimizer:
        return hit[2]

    def run_chunk(carry, begin, length, data, step_key, data_key, *, capacity):
        step_fn, _ = _make_step(objective, optimizer, data, batching, n, step_key, data_key,
                                sharding)

        def cond(loop):
            i, failed = loop[:2]
            return (i < length) & ~failed

        def body(loop):
            i, failed, carry, values, skipped = loop
            new_carry, value, ok = step_fn(carry, begin + i)
            values = values.at[i].set(value)
            if skip_nonfinite:
                keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
                new_carry = jax.tree_util.tree_map(keep, new_carry, carry)
                return i + 1, failed, new_carry, values, skipped.at[i].set(~ok)
            # Stop; no select of the old carry here (it costs ~15% of a small step on
            # CPU): gv.fit recomputes the carry from before the failed step instead.
            return jnp.where(ok, i + 1, i), ~ok, new_carry, values, skipped

        # a loop with a traced trip count (XLA's while) that can also stop early
        loop = (jnp.zeros((), jnp.int32), jnp.zeros((), bool), carry,
                jnp.zeros(capacity, jnp.asarray(0.0).dtype), jnp.zeros(capacity, bool))
        done, failed, carry, values, skipped = jax.lax.while_loop(cond, body, loop)
        return carry, (values, skipped), (done, failed)

    def leaf_check(params, step, data, step_key, data_key):
        _, grads_at = _make_step(objective, optimizer, data, batching, n, step_key, data_key,
                                 sharding)
        value, grads = grads_at(params, step)
        return value, [jnp.all(jnp.isfinite(g)) for g in jax.tree_util.tree_leaves(grads)]

    fn = _Chunk(jax.jit(run_chunk, static_argnames="capacity"), jax.jit(leaf_check))
    _CHUNKS[cache_key] = (objective, optimizer, fn)
    while len(_CHUNKS) > _CHUNKS_KEPT:
        _CHUNKS.pop(next(iter(_CHUNKS)))
    return fn


def _check_order(shuffle: str, batch_size: int | None, n: int | None) -> str | None:
    if shuffle not in minibatch.SHUFFLES:
        raise ValueError(f"gv.fit: shuffle={shuffle!r} is not one of {minibatch.SHUFFLES}")
    if shuffle != "epoch" and not batch_size:
        raise ValueError(f"gv.fit: shuffle={shuffle!r} orders minibatches; pass batch_size=B "
                         "too (without it every step sees all the data)")
    if batch_size and n // batch_size < 1:
        raise ValueError(f"gv.fit: batch_size={batch_size} is larger than the dataset ({n})")
    return shuffle if batch_size else None


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def _shuffle_once(data, key, batch_size, n, processes):
    """`shuffle="once"`'s permutation, of each process's rows among themselves."""
    return per_process(lambda block, k, _, rows: minibatch.shuffle_once(block, k, batch_size, rows),
                       data, key, processes, batch_size, n)


def _make_step(objective, optimizer, data, batching, n, step_key, data_key, sharding):
    batch_size, order = batching

    def batch_at(step):
        # O(batch_size) whatever n (genvi/training/minibatch.py); several processes:
        # equal shares, each from one process's rows (genvi/training/distributed.py)
        if order is None:
            return data
        draw = minibatch.epoch_batch if order == "epoch" else minibatch.window_batch
        return per_process(lambda block, k, size, rows: draw(block, k, step, size, rows),
                           data, data_key, sharding.processes, batch_size, n)

    def grads_at(params, step):
        batch = batch_at(step)
        if sharding.batch is not None:
            batch = jax.lax.with_sharding_constraint(batch, sharding.batch)
        return objective.value_and_grad_estimate(
            jax.random.fold_in(step_key, step), params, *batch)

    def step_fn(carry, step):
        params, state = carry
        value, grads = grads_at(params, step)
        updates, new_state = optimizer.update(jax.tree_util.tree_map(jnp.negative, grads),
                                              state, params)
        return (optax.apply_updates(params, updates), new_state), value, _finite(value, grads)

    return step_fn, grads_at


def _finite(value, grads) -> jax.Array:
    """Whether the value and every gradient entry are finite. `sum(g * 0)` is 0 exactly
    when every entry of `g` is finite (it cannot overflow) and XLA fuses the sums of
    all leaves into one pass: on CPU ~5-9% of a small VAE step, against 12-15% for
    `all(isfinite(g))` per leaf (a concatenation first is slower still)."""
    return jnp.isfinite(sum((jnp.sum(g * 0) for g in jax.tree_util.tree_leaves(grads)), value * 0))


class _Chunk(NamedTuple):
    run: Callable
    leaf_check: Callable


def _nonfinite_error(chunk, before, begin, done, data, step_key, data_key, capacity,
                     history) -> NonFiniteError:
    """The error for step `begin + done`, with the carry from before it: the chunk's
    steps before it run again from `before` (the same program and inputs, so the same
    parameters), then that step's gradient is checked leaf by leaf."""
    step, (params, state) = begin + done, before
    if done:
        (params, state), _, _ = chunk.run(before, begin, done, data, step_key, data_key,
                                          capacity=capacity)
    value, leaf_ok = chunk.leaf_check(params, step, data, step_key, data_key)
    value = float(value)
    paths = [jax.tree_util.keystr(path)
             for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    leaves = [p for p, ok in zip(paths, leaf_ok) if not bool(ok)]
    return NonFiniteError(nonfinite_message(step, value, leaves, data), step, value, leaves,
                          _finish(params, state, history))


def _strongly_typed(tree):
    """Arrays without JAX's weak types: a step returns parameters and optimizer state
    strongly typed, so weakly typed ones (from Python floats) would make the second
    chunk compile the loop again."""
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.result_type(a)), tree)


def _dataset_size(data) -> int:
    sizes = {jnp.shape(a)[0] for a in jax.tree_util.tree_leaves(data)}
    if len(sizes) != 1:
        raise ValueError(f"gv.fit: minibatched data arrays need one leading size; got {sorted(sizes)}")
    return sizes.pop()



def _boundaries(start: int, steps: int, chunk: int, *every: int | None) -> list[tuple[int, int]]:
    """Chunk edges: every `chunk` steps and at every multiple of each `every`."""
    edges = set(range(start + chunk, steps, chunk)) | {steps}
    for e in every:
        if e:
            edges |= {s for s in range(e, steps, e) if s > start}
    points = [start] + sorted(s for s in edges if s > start)
    return list(zip(points[:-1], points[1:]))


def _make_eval(objective, data, n, key):
    if objective is None:
        return None
    data = tuple(data or ())
    eval_key = jax.random.fold_in(key, 2 ** 31 - 1)

    @jax.jit
    def evaluate(params):
        keys = jax.random.split(eval_key, n)
        return jnp.mean(jax.vmap(lambda k: objective.estimate(k, params, *data))(keys))

    return evaluate


def _payload(params, state, step, key, history) -> dict:
    return {"params": params, "state": state, "step": np.int64(step),
            "key": np.asarray(jax.random.key_data(key)),
            "objective": history["objective"], "skipped": history["skipped"]}


def _resume(directory, params, state, key):
    step = checkpoints.latest_step(directory)
    like = _payload(params, state, step, key, {"objective": np.zeros(step, np.float32),
                                               "skipped": np.zeros(step, bool)})
    step, saved = checkpoints.restore(directory, like)
    if not np.array_equal(saved["key"], like["key"]):
        raise checkpoints.CheckpointError(
            f"the checkpoint in {os.path.abspath(directory)!r} was written by a run with a "
            "different key; pass the same key to resume, or use another checkpoint_dir")
    history = {"objective": np.asarray(saved["objective"]), "skipped": np.asarray(saved["skipped"]),
               "eval_step": [], "eval": []}
    restored_params = jax.tree_util.tree_map(jnp.asarray, saved["params"])
    restored_state = jax.tree_util.tree_unflatten(
        jax.tree_util.tree_structure(state),
        [jnp.asarray(x) for x in jax.tree_util.tree_leaves(saved["state"])])
    return int(step), restored_params, restored_state, history


class _ProgressBar:
    """A rich progress bar with the running objective; silent when output is not a
    terminal or the CI variable is set."""

    def __init__(self, total: int, enabled: bool):
        self.enabled = enabled and sys.stdout.isatty() and not os.environ.get("CI")
        if self.enabled:
            from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn  # noqa
            self.progress = Progress(TextColumn("gv.fit"), BarColumn(),
                                     TextColumn("{task.completed}/{task.total}"),
                                     TextColumn("objective {task.fields[value]}"),
                                     TimeRemainingColumn())
            self.progress.start()
            self.task = self.progress.add_task("fit", total=total, value="…")

    def advance(self, n: int, value: float | None = None) -> None:
        if self.enabled and n:
            shown = "…" if value is None or not math.isfinite(value) else f"{value:.4g}"
            self.progress.update(self.task, advance=n, value=shown)

    def close(self) -> None:
        if self.enabled:
            self.progress.stop()
