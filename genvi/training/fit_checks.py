"""`gv.fit`'s checks and errors: the objective, parameter and data mistakes it refuses
up front, and what it raises or warns when steps are not finite."""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from genvi.core.mistakes import user_stacklevel
from genvi.adev.expectation import Expectation, non_float_leaves
from genvi.gen.language import GenFn
from genvi.training.fit_state import finish


class NonFiniteError(FloatingPointError):
    """`gv.fit` met a step whose objective estimate or gradient is not finite.

    Attributes: `step` (counting from 0), `value` (that step's objective estimate),
    `leaves` (pytree paths of the parameters whose gradient is not finite) and
    `result`, a `FitResult` holding the parameters, optimizer state and history from
    before that step.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp, optax
        >>> @gv.gen
        ... def model(p, y):
        ...     z = gv.normal(0.0, 1.0) @ "z"
        ...     gv.observe(gv.normal(z, 1.0), y)
        >>> @gv.gen
        ... def guide(p, y):
        ...     gv.normal(p["m"], 1.0, grad=gv.REPARAM) @ "z"
        >>> try:
        ...     gv.fit(gv.elbo(model, guide), {"m": 0.0}, jnp.nan, optimizer=optax.adam(0.1),
        ...            steps=10, key=jax.random.key(0), progress=False)
        ... except gv.NonFiniteError as e:
        ...     print(e.step, e.leaves, float(e.result.params["m"]))
        0 ["['m']"] 0.0
    """

    def __init__(self, message: str, step: int, value: float, leaves: list,
                 result: Any):
        super().__init__(message)
        self.step, self.value, self.leaves, self.result = step, value, leaves, result


class NonFiniteWarning(RuntimeWarning):
    """`gv.fit(..., skip_nonfinite=True)` skipped more than `SkipNonfinite.warn_fraction` of its
    steps because their objective estimate or gradient was not finite.

    Example:
        >>> import warnings, genvi as gv
        >>> with warnings.catch_warnings():   # an error inside this block
        ...     warnings.simplefilter("error", gv.NonFiniteWarning)
    """


def check_objective(objective: Any, name: str) -> None:
    """Raise a `TypeError` unless `objective` is a `gv.Expectation`; a `@gv.gen`
    program is named as a program, not an objective.

    Example:
        >>> import genvi as gv
        >>> from genvi.training.fit_checks import check_objective
        >>> @gv.gen
        ... def model(p):
        ...     gv.normal(p, 1.0) @ "x"
        >>> check_objective(model, "objective")
        Traceback (most recent call last):
        TypeError: gv.fit: objective must be an objective (a gv.Expectation), ...
    """
    if isinstance(objective, Expectation):
        return
    if isinstance(objective, GenFn):
        what = (f"the @gv.gen program {objective.name!r}, which is a program, not an "
                f"objective; build one from it, e.g. gv.elbo(model, {objective.name})")
    elif inspect.isfunction(objective):  # a forgotten decorator
        what = (f"{objective!r}, a plain Python function: decorate it with "
                "@gv.expectation if it is an objective; if it is a model or a guide, decorate "
                "it with @gv.gen and build an objective from them, e.g. gv.elbo(model, guide)")
    else:
        what = f"{objective!r} (a {type(objective).__name__})"
    raise TypeError(
        f"gv.fit: {name} must be an objective (a gv.Expectation), such as "
        "gv.elbo(model, guide), gv.batch_mean(gv.elbo(model, guide)) or an @gv.expectation "
        f"function; got {what}")


def check_float_params(params: Any) -> None:
    """Raise a `TypeError` naming every parameter leaf that is not floating point.

    Example:
        >>> from genvi.training.fit_checks import check_float_params
        >>> check_float_params({"m": 0.0, "n": 0})
        Traceback (most recent call last):
        TypeError: gv.fit: parameters must be floating point to be trained; these are not: ['n'] ...
    """
    bad = non_float_leaves(params)
    if bad:
        leaves = ", ".join(f"{path or 'the parameters'} ({dtype})" for path, dtype in bad)
        raise TypeError(
            f"gv.fit: parameters must be floating point to be trained; these are not: "
            f"{leaves}. Use floats (e.g. 0.0 instead of 0, or jnp.asarray(x, jnp.float32)); "
            "keep integer or boolean values out of the parameters (close over them, or "
            "pass them as data)")


def as_arrays(d: Any, position: int) -> Any:
    """A data argument as arrays; a Python list (of numbers, or of equal-shaped
    arrays) becomes one array, as `jnp.asarray` makes it.

    Example:
        >>> from genvi.training.fit_checks import as_arrays
        >>> as_arrays([1.0, 2.0], 0).shape
        (2,)
    """
    def convert(x):
        if not isinstance(x, list):
            return jnp.asarray(x)
        try:
            return jnp.asarray(x)
        except (TypeError, ValueError) as e:
            raise TypeError(
                f"gv.fit: data argument {position} is a Python list that cannot become one "
                f"array ({e}); pass an array (jnp.asarray(...)), or a tuple or dict of "
                "arrays") from None
    return jax.tree_util.tree_map(convert, d, is_leaf=lambda x: isinstance(x, list))


def nonfinite_message(step: int, value: float, leaves: list[str], data: tuple) -> str:
    """`NonFiniteError`'s message: the step, its value, the non-finite gradient leaves,
    any non-finite data, and what to do.

    Example:
        >>> from genvi.training.fit_checks import nonfinite_message
        >>> print(nonfinite_message(3, float("nan"), ["['w']"], ())[:70])
        gv.fit: step 3 (counting from 0) gave the objective estimate nan and a
    """
    if leaves:
        named = ", ".join(p or "the parameters" for p in leaves[:8])
        more = f" and {len(leaves) - 8} more" if len(leaves) > 8 else ""
        grads = f"a non-finite gradient at {named}{more}"
    else:
        grads = "a finite gradient"
    bad_data = [f"data argument {i} has {n} non-finite value(s)" for i, n in
                ((i, sum(int(np.size(a)) - int(np.isfinite(np.asarray(a)).sum())
                         for a in jax.tree_util.tree_leaves(d)
                         if jnp.issubdtype(jnp.result_type(a), jnp.inexact)))
                 for i, d in enumerate(data)) if n]
    hint = f" ({'; '.join(bad_data)})" if bad_data else ""
    return (
        f"gv.fit: step {step} (counting from 0) gave the objective estimate {value:.6g} and "
        f"{grads}{hint}. The parameters and optimizer state in the error's `.result` are "
        f"those from before step {step}. To find the site that produced it, run the "
        "objective inside `with gv.validation():` (e.g. `with gv.validation(): "
        "objective.value_and_grad_estimate(key, params, *data)`), which names the "
        "distribution given invalid parameters; or pass skip_nonfinite=True to skip such "
        "steps.")


def warn_if_skipped(history: dict, fraction: float | None) -> None:
    """Warn (`NonFiniteWarning`) when more than `fraction` of the steps in `history`
    were skipped; `fraction=None` never warns.

    Example:
        >>> import numpy as np
        >>> from genvi.training.fit_checks import warn_if_skipped
        >>> warn_if_skipped({"skipped": np.zeros(10, bool), "num_skipped": 0}, 0.1)
    """
    total, skipped = len(history["skipped"]), history["num_skipped"]
    if fraction is None or not total or skipped <= fraction * total:
        return
    first = int(np.argmax(history["skipped"]))
    warnings.warn(
        f"gv.fit skipped {skipped} of {total} steps ({skipped / total:.1%}, the first at "
        f"step {first}) because their objective estimate or gradient was not finite; the "
        "parameters moved only on the other steps. Find the site that produces it by "
        "running the objective inside `with gv.validation():`, or raise "
        f"the fraction (skip_nonfinite=gv.SkipNonfinite(warn_fraction=...), now {fraction}) "
        "to silence this.",
        NonFiniteWarning, stacklevel=user_stacklevel())


def nonfinite_error(chunk: Any, before: tuple, done: int, data: tuple, data_key: jax.Array,
                    capacity: int, history: dict, key: jax.Array) -> NonFiniteError:
    """The error for the `done`-th step of a call that began at `before` =
    (`TrainState`, stopping rule's state), with the state from before that step: the
    call's steps before it run again (the same program and inputs, so the same
    parameters), then that step's gradient is checked leaf by leaf (`chunk`: the
    fit's `genvi.training.fit_loop.Chunk`).

    Example:
        >>> from genvi.training.fit_checks import nonfinite_error
        >>> nonfinite_error.__name__
        'nonfinite_error'
    """
    train, rule_state = before
    step = int(train.step) + done
    if done:
        (train, _), _, _ = chunk.run(train, rule_state, done, data, data_key, capacity=capacity)
    params, state = train.params, train.opt_state
    value, leaf_ok = chunk.leaf_check(params, step, data, train.key, data_key)
    value = float(value)
    paths = [jax.tree_util.keystr(path)
             for path, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
    leaves = [p for p, ok in zip(paths, leaf_ok) if not bool(ok)]
    stopped = (f"stopped before step {step} (counting from 0), whose objective estimate or "
               "gradient is not finite")
    return NonFiniteError(nonfinite_message(step, value, leaves, data), step, value, leaves,
                          finish(params, state, history, key, stopped))
