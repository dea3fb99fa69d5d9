"""`gv.fit`'s compiled loop: one jitted `while_loop` running a chunk of steps of a
`TrainState`, each `gv.training_step`'s step (`genvi.training.step.advance`) on that
step's key and minibatch.

The key of step `t` is `fold_in(state.key, t)` and its minibatch comes from the epoch's
permutation (genvi/training/minibatch.py), so a run's result does not depend on how it
is chunked. A chunk's length is an argument of the loop, not part of its shape, so
chunks of every length share one compiled program. The loop's condition stops at the
first non-finite step (unless skipping them) and when a stopping rule fires; each step
passes the loss (−objective) to the optimizer as optax's `value` extra argument.

Example:
    >>> import jax.numpy as jnp
    >>> from genvi.training.step import finite
    >>> bool(finite(jnp.float32(1.0), {"w": jnp.array([1.0, jnp.inf])}))
    False
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterator, NamedTuple

import jax
import jax.numpy as jnp
import optax

from genvi.adev.expectation import Expectation
from genvi.training import minibatch
from genvi.training.distributed import DataParallel, per_process
from genvi.training.schedule import at_step
from genvi.training.step import TrainState, advance, ascent_step


class Chunk(NamedTuple):
    """A compiled chunk runner and its per-leaf finiteness check (see `compiled_chunk`).

    Example:
        >>> from genvi.training.fit_loop import Chunk
        >>> Chunk._fields
        ('run', 'leaf_check')
    """

    run: Callable
    leaf_check: Callable


class Setup(NamedTuple):
    """What the compiled program depends on besides the objective and optimizer:
    `batching` = (batch_size, order), the dataset size `n`, `skip_nonfinite`, the
    stopping rule (or None) and the scheduled arguments ((position, Schedule) pairs).

    Example:
        >>> from genvi.training.fit_loop import Setup
        >>> Setup((None, None), None, False, None, ()).stop is None
        True
    """

    batching: tuple
    n: int | None
    skip_nonfinite: bool
    stop: Any
    scheduled: tuple


_CHUNKS: dict = {}  # compiled chunk runners, reused across gv.fit calls
_CHUNKS_KEPT = 16   # the most recent ones; each holds its objective and optimizer alive


def compiled_chunk(objective: Expectation, optimizer: optax.GradientTransformation,
                   setup: Setup, sharding: DataParallel) -> Chunk:
    """`Chunk(run, leaf_check)`. `run` is a jitted `(state, rule_state, length, data,
    data_key, *, capacity) -> ((state, rule_state), (values, skipped), (done, failed))`
    running `length` steps of `gv.training_step`'s step from `state` (a `TrainState`:
    its step `state.step` is the first one's number, each step's key
    `fold_in(state.key, step)`), with `length <= capacity` traced (one compile for every
    chunk length) and per-step outputs in buffers of `capacity`. Unless
    `skip_nonfinite`, it stops at the first non-finite step, `state.step + done`
    (`failed`; its state is then not meaningful); it also stops after the step where
    `setup.stop` fires. `leaf_check(params, step, data, step_key, data_key)` gives that
    step's value and per-leaf gradient finiteness (for the error; compiled only when
    needed). Data and keys are arguments, never baked-in constants, so a second
    `gv.fit` with the same objective and optimizer objects reuses the compiled program.

    Example:
        >>> from genvi.training.fit_loop import compiled_chunk
        >>> compiled_chunk.__name__
        'compiled_chunk'
    """
    cache_key = (id(objective), id(optimizer), setup, sharding.batch, sharding.processes)
    hit = _CHUNKS.get(cache_key)
    if hit is not None and hit[0] is objective and hit[1] is optimizer:
        return hit[2]
    stop, skip_nonfinite = setup.stop, setup.skip_nonfinite
    # the loss, −objective, goes to transformations that take one (reduce_on_plateau);
    # the others ignore it
    with_value = optax.with_extra_args_support(optimizer)

    def run_chunk(state, rule_state, length, data, data_key, *, capacity):
        step_fn, _ = make_step(objective, with_value, data, setup, state.key, data_key,
                               sharding)

        def cond(loop):
            i, failed, _, rule_state = loop[:4]
            go = (i < length) & ~failed
            return go if stop is None else go & ~stop.done(rule_state)

        def body(loop):
            i, failed, state, rule_state, values, skipped = loop
            new_state, value, ok = step_fn(state)
            values = values.at[i].set(value)
            if stop is not None:
                rule_state = stop.update(rule_state, value, ok)
            if skip_nonfinite:   # the step is taken, its update is not
                keep = lambda new, old: jnp.where(ok, new, old)  # noqa: E731
                params, opt_state = jax.tree_util.tree_map(
                    keep, (new_state.params, new_state.opt_state), (state.params, state.opt_state))
                new_state = new_state._replace(params=params, opt_state=opt_state)
                return i + 1, failed, new_state, rule_state, values, skipped.at[i].set(~ok)
            # Stop; no select of the old state here (it costs ~15% of a small step on
            # CPU): gv.fit recomputes the state from before the failed step instead.
            return jnp.where(ok, i + 1, i), ~ok, new_state, rule_state, values, skipped

        # a loop with a traced trip count (XLA's while) that can also stop early
        loop = (jnp.zeros((), jnp.int32), jnp.zeros((), bool), state, rule_state,
                jnp.zeros(capacity, jnp.asarray(0.0).dtype), jnp.zeros(capacity, bool))
        done, failed, state, rule_state, values, skipped = jax.lax.while_loop(cond, body, loop)
        return (state, rule_state), (values, skipped), (done, failed)

    def leaf_check(params, step, data, step_key, data_key):
        _, grads_at = make_step(objective, with_value, data, setup, step_key, data_key, sharding)
        value, grads = grads_at(params, step)
        return value, [jnp.all(jnp.isfinite(g)) for g in jax.tree_util.tree_leaves(grads)]

    fn = Chunk(jax.jit(run_chunk, static_argnames="capacity"), jax.jit(leaf_check))
    _CHUNKS[cache_key] = (objective, optimizer, fn)
    while len(_CHUNKS) > _CHUNKS_KEPT:
        _CHUNKS.pop(next(iter(_CHUNKS)))
    return fn


def make_step(objective: Expectation, optimizer: optax.GradientTransformationExtraArgs,
              data: tuple, setup: Setup, step_key: jax.Array, data_key: jax.Array,
              sharding: DataParallel) -> tuple[Callable, Callable]:
    """`(step_fn, grads_at)`: `step_fn(state) -> (state, value, ok)` takes
    `gv.training_step`'s step (`advance`) from a `TrainState` on its step's minibatch
    and scheduled arguments; `grads_at(params, step)` is that step's objective
    estimate and gradient (its key `fold_in(step_key, step)`).

    Example:
        >>> from genvi.training.fit_loop import make_step
        >>> make_step.__name__
        'make_step'
    """
    def args_at(step):  # step `step`'s data: its minibatch, scheduled arguments
        batch = batch_at(data, setup, data_key, sharding.processes, step)
        if sharding.batch is not None:
            batch = jax.lax.with_sharding_constraint(batch, sharding.batch)
        return at_step(batch, setup.scheduled, step)

    def grads_at(params, step):
        return objective.value_and_grad_estimate(jax.random.fold_in(step_key, step), params,
                                                 *args_at(step))

    take = ascent_step(objective, optimizer)   # gv.training_step's step

    def step_fn(state: TrainState) -> tuple[TrainState, jax.Array, jax.Array]:
        return advance(take, state, *args_at(state.step))

    return step_fn, grads_at


def batch_at(data: tuple, setup: Setup, data_key: jax.Array, processes: int,
             step: jax.Array | int) -> tuple:
    """Step `step`'s minibatch of `data` (all of it without minibatches): what that
    step trains on, and what `gv.AUTO` measures at when it tunes there. O(batch_size)
    whatever n (genvi/training/minibatch.py); several processes: equal shares, each
    from one process's rows (genvi/training/distributed.py).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from genvi.training.fit_loop import Setup, batch_at
        >>> setup = Setup((4, "epoch"), 10, False, None, ())
        >>> batch_at((jnp.arange(10.0),), setup, jax.random.key(0), 1, 3)[0].shape
        (4,)
    """
    batch_size, order = setup.batching
    if order is None:
        return data
    assert setup.n is not None   # minibatches: the dataset's size is known
    draw = minibatch.epoch_batch if order == "epoch" else minibatch.window_batch
    return per_process(lambda block, k, size, rows: draw(block, k, step, size, rows),
                       data, data_key, processes, batch_size, setup.n)


def check_order(shuffle: str, batch_size: int | None, n: int | None) -> str | None:
    """The minibatch order (`"epoch"`, `"once"`, or None without minibatches), checked.

    Example:
        >>> from genvi.training.fit_loop import check_order
        >>> check_order("epoch", None, None) is None
        True
    """
    if shuffle not in minibatch.SHUFFLES:
        raise ValueError(f"gv.fit: shuffle={shuffle!r} is not one of {minibatch.SHUFFLES}")
    if shuffle != "epoch" and not batch_size:
        raise ValueError(f"gv.fit: shuffle={shuffle!r} orders minibatches; pass batch_size=B "
                         "too (without it every step sees all the data)")
    if batch_size and n is not None and n // batch_size < 1:
        raise ValueError(f"gv.fit: batch_size={batch_size} is larger than the dataset ({n})")
    return shuffle if batch_size else None


@functools.partial(jax.jit, static_argnums=(2, 3, 4))
def shuffle_once(data: tuple, key: jax.Array, batch_size: int, n: int, processes: int) -> tuple:
    """`shuffle="once"`'s permutation, of each process's rows among themselves.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from genvi.training.fit_loop import shuffle_once
        >>> shuffle_once((jnp.arange(4.0),), jax.random.key(0), 2, 4, 1)[0].shape
        (6,)
    """
    return per_process(lambda block, k, _, rows: minibatch.shuffle_once(block, k, batch_size, rows),
                       data, key, processes, batch_size, n)


def dataset_size(data: tuple) -> int:
    """The leading size shared by every minibatched data array.

    Example:
        >>> import jax.numpy as jnp
        >>> from genvi.training.fit_loop import dataset_size
        >>> dataset_size((jnp.zeros(5), jnp.zeros((5, 2))))
        5
    """
    sizes = {jnp.shape(a)[0] for a in jax.tree_util.tree_leaves(data)}
    if len(sizes) != 1:
        raise ValueError(f"gv.fit: minibatched data arrays need one leading size; got {sorted(sizes)}")
    return sizes.pop()


def chunk_boundaries(start: int, end: int, chunk: int,
                     *every: int | None) -> Iterator[tuple[int, int]]:
    """Chunk edges from step `start` to `end`: every `chunk` steps and at every
    multiple of each `every`, made as they are reached (a fit of 10⁹ steps with a
    checkpoint every 100 lists none in advance).

    Example:
        >>> from genvi.training.fit_loop import chunk_boundaries
        >>> list(chunk_boundaries(5, 30, 10, 12))
        [(5, 12), (12, 15), (15, 24), (24, 25), (25, 30)]
    """
    at = start
    while at < end:
        edge = min([start + ((at - start) // chunk + 1) * chunk, end]
                   + [(at // e + 1) * e for e in every if e])
        yield at, edge
        at = edge
