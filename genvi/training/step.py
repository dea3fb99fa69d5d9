"""One training step, for a loop of your own: `gv.training_step(objective, optimizer)`
returns `(init, step)` in the shape of optax and blackjax.

    init(params, key) -> TrainState(params, opt_state, step, key)
    step(state, *data) -> (TrainState, objective estimate)        # pure: jit, scan, vmap it

`step` maximizes the objective: it estimates the objective and its gradient with the
key `fold_in(state.key, state.step)`, hands the optimizer the negated gradient (and
`value=` −estimate, for transformations that read the loss), and applies the update.
`gv.fit` runs this same step (`ascent_step`) in its compiled loop, so without minibatches `n` calls
of `step` end with the parameters bit for bit where `gv.fit(..., steps=n)` with the
same key ends. What
`gv.fit` adds: minibatches, schedules, stopping rules, checkpoints, non-finite checks.

Example:
    >>> import genvi as gv, jax, jax.numpy as jnp, optax
    >>> @gv.gen
    ... def model(p, y):
    ...     z = gv.normal(0.0, 1.0) @ "z"
    ...     gv.observe(gv.normal(z, 1.0), y)
    >>> @gv.gen
    ... def guide(p, y):
    ...     gv.normal(p["m"], jnp.exp(p["s"]), grad=gv.REPARAM) @ "z"
    >>> init, step = gv.training_step(gv.elbo(model, guide), optax.adam(0.05))
    >>> state = init({"m": 0.0, "s": 0.0}, jax.random.key(0))
    >>> state, value = jax.jit(step)(state, 1.0)
    >>> int(state.step)
    1
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from genvi.adev.expectation import Expectation
from genvi.training.fit_checks import check_float_params, check_objective


def strongly_typed(tree: Any) -> Any:
    """Arrays without JAX's weak types: a step returns parameters and optimizer state
    strongly typed, so weakly typed ones (from Python floats) would make a second
    compiled call compile again.

    Example:
        >>> from genvi.training.step import strongly_typed
        >>> strongly_typed(1.0).weak_type
        False
    """
    return jax.tree_util.tree_map(lambda a: jnp.asarray(a, jnp.result_type(a)), tree)


def ascend(optimizer: optax.GradientTransformationExtraArgs, params: Any, opt_state: Any,
           value: jax.Array, grads: Any) -> tuple[Any, Any]:
    """One optimizer step up the objective: the optimizer minimizes, so it gets the
    negated gradient, and `value=` −estimate for transformations that read the loss.

    Example:
        >>> import jax.numpy as jnp, optax
        >>> from genvi.training.step import ascend
        >>> opt = optax.with_extra_args_support(optax.sgd(0.5))
        >>> ascend(opt, jnp.float32(0.0), opt.init(jnp.float32(0.0)), 1.0, jnp.float32(2.0))[0]
        Array(1., dtype=float32)
    """
    updates, opt_state = optimizer.update(jax.tree_util.tree_map(jnp.negative, grads),
                                          opt_state, params, value=-value)
    return optax.apply_updates(params, updates), opt_state


def finite(value: jax.Array, grads: Any) -> jax.Array:
    """Whether the value and every gradient entry are finite. `sum(g * 0)` is 0 exactly
    when every entry of `g` is finite (it cannot overflow) and XLA fuses the sums of
    all leaves into one pass: on CPU ~5-9% of a small VAE step, against 12-15% for
    `all(isfinite(g))` per leaf (a concatenation first is slower still).

    Example:
        >>> import jax.numpy as jnp
        >>> bool(finite(jnp.float32(0.5), [jnp.ones(3)]))
        True
    """
    return jnp.isfinite(sum((jnp.sum(g * 0) for g in jax.tree_util.tree_leaves(grads)), value * 0))


def ascent_step(objective: Expectation, optimizer: optax.GradientTransformation
                ) -> Callable[..., tuple[Any, Any, jax.Array, jax.Array]]:
    """The one training step, which `gv.training_step` and `gv.fit` both take:
    `(params, opt_state, key, *data) -> (params, opt_state, estimate, finite)` estimates
    the objective and its gradient with `key` and applies one optimizer update up it
    (`ascend`); `finite` says whether the estimate and every gradient entry are finite
    (`gv.fit` stops or skips on it; unused, it costs nothing in a compiled step).

    Args:
        objective: the objective (a `gv.Expectation`) to maximize.
        optimizer: an optax transformation (the loss is passed as `value=`).

    Returns:
        The step function.

    Example:
        >>> import genvi as gv, jax, optax
        >>> @gv.gen
        ... def model(p, y):
        ...     gv.observe(gv.normal(p, 1.0), y)
        >>> @gv.gen
        ... def guide(p, y):
        ...     pass
        >>> take = ascent_step(gv.elbo(model, guide), optax.sgd(0.5))
        >>> p, _, value, ok = take(0.0, optax.sgd(0.5).init(0.0), jax.random.key(0), 2.0)
        >>> float(p), bool(ok)
        (1.0, True)
    """
    with_value = optax.with_extra_args_support(optimizer)

    def take(params: Any, opt_state: Any, key: jax.Array, *data: Any) -> tuple:
        value, grads = objective.value_and_grad_estimate(key, params, *data)
        params, opt_state = ascend(with_value, params, opt_state, value, grads)
        return params, opt_state, value, finite(value, grads)

    return take


class TrainState(NamedTuple):
    """A training run between steps: parameters, optimizer state, the number of steps
    taken and the run's key (each step's key is `fold_in(key, step)`).

    Example:
        >>> import genvi as gv
        >>> gv.TrainState._fields
        ('params', 'opt_state', 'step', 'key')
    """

    params: Any
    opt_state: Any
    step: jax.Array
    key: jax.Array


class TrainingStep(NamedTuple):
    """`init(params, key) -> TrainState` and `step(state, *data) -> (TrainState,
    estimate)`; see `gv.training_step`.

    Example:
        >>> import genvi as gv
        >>> gv.TrainingStep._fields
        ('init', 'step')
    """

    init: Callable[[Any, jax.Array], TrainState]
    step: Callable[..., tuple[TrainState, jax.Array]]


def advance(take: Callable[..., tuple[Any, Any, jax.Array, jax.Array]], state: TrainState,
            *data: Any) -> tuple[TrainState, jax.Array, jax.Array]:
    """A `TrainState` one step on: `take` (an `ascent_step`) with the key
    `fold_in(state.key, state.step)`; `(state after, estimate, finite)`. The step both
    `gv.training_step` and `gv.fit`'s compiled loop take.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp, optax
        >>> e = gv.expectation(lambda m: -(gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM)) ** 2))
        >>> opt = optax.with_extra_args_support(optax.sgd(0.1))
        >>> state = TrainState(jnp.float32(1.0), opt.init(jnp.float32(1.0)),
        ...                    jnp.zeros((), jnp.int32), jax.random.key(0))
        >>> after, value, ok = advance(ascent_step(e, opt), state)
        >>> int(after.step), bool(ok)
        (1, True)
    """
    params, opt_state, value, ok = take(state.params, state.opt_state,
                                        jax.random.fold_in(state.key, state.step), *data)
    return TrainState(params, opt_state, state.step + 1, state.key), value, ok


def training_step(objective: Expectation, optimizer: optax.GradientTransformation
                  ) -> TrainingStep:
    """The step `gv.fit` takes, as `(init, step)` for a loop of your own (see the module
    docstring): `init(params, key)` starts a run whose randomness is `key`, as
    `gv.fit(..., key=key)` does; `step(state, *data)` takes one step on `data` (a
    minibatch you chose, scheduled values you computed).

    Args:
        objective: the objective to maximize.
        optimizer: an optax `GradientTransformation`.

    Returns:
        a `TrainingStep` `(init, step)`.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp, optax
        >>> @gv.gen
        ... def model(p, y):
        ...     gv.observe(gv.normal(p["mu"], 1.0), y)
        >>> @gv.gen
        ... def guide(p, y):
        ...     pass
        >>> init, step = gv.training_step(gv.elbo(model, guide), optax.sgd(0.1))
        >>> state = init({"mu": 0.0}, jax.random.key(0))
        >>> final, _ = jax.lax.scan(lambda s, _: step(s, 2.0), state, None, length=100)
        >>> round(float(final.params["mu"]), 3)
        2.0
    """
    check_objective(objective, "objective")
    with_value = optax.with_extra_args_support(optimizer)
    take = ascent_step(objective, with_value)

    def init(params: Any, key: jax.Array) -> TrainState:
        check_float_params(params)
        params = strongly_typed(params)
        opt_state = strongly_typed(with_value.init(params))
        step_key, _ = jax.random.split(key)  # as gv.fit: the other half orders minibatches
        return TrainState(params, opt_state, jnp.zeros((), jnp.int32), step_key)

    def step(state: TrainState, *data: Any) -> tuple[TrainState, jax.Array]:
        state, value, _ = advance(take, state, *data)
        return state, value

    return TrainingStep(init, step)
