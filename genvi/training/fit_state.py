"""Where a `gv.fit` run starts and what it returns: `FitResult`, continuing one, and
the payload of its checkpoints.

A run starts fresh, from a previous `FitResult` (its parameters, optimizer state, step
count, history and key: the steps count on, so 300 + 300 steps are one 600-step run),
or from the newest checkpoint in `checkpoint_dir` (which holds the same things).

Example:
    >>> import genvi as gv
    >>> gv.FitResult._fields
    ('params', 'state', 'history', 'steps', 'stopped', 'key', 'tunings')
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from genvi.training import checkpoints


class FitResult(NamedTuple):
    """What `gv.fit` returns.

    `params`, `state`: the final parameters and optax optimizer state. `history` holds
    numpy arrays: `objective` (the estimate at every step), `skipped` (steps whose
    non-finite update was skipped), and, when evaluating, `eval_step` and `eval`
    (held-out objective means); and `num_skipped`, an int. `steps`: the steps run in
    all (a continued run's included; `len(history["objective"])`). `stopped`: why the
    fit ended (`"ran all 600 steps"`, `"converged after 1400 steps: ..."`, or a
    non-finite step, in a `NonFiniteError`'s result). `key`: the run's key, which a
    continued run reuses. `tunings`: the `gv.Tuning` of each measurement of the
    objective's `gv.AUTO` sites (none without them). Pass the result as `params` to `gv.fit` to continue.

    Example:
        >>> import genvi as gv, jax, optax
        >>> @gv.expectation
        ... def e(m):
        ...     return -(gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM)) - 2.0) ** 2
        >>> first = gv.fit(e, 0.0, optimizer=optax.adam(0.1), steps=30,
        ...                key=jax.random.key(0), progress=False)
        >>> more = gv.fit(e, first, optimizer=optax.adam(0.1), steps=30, progress=False)
        >>> more.steps, more.stopped, more.history["objective"].shape
        (60, 'ran all 60 steps', (60,))
    """

    params: Any
    state: Any
    history: dict
    steps: int = 0
    stopped: str = ""
    key: Any = None
    tunings: tuple = ()


def new_history() -> dict:
    """A run's history before its first step (the form `gv.fit` appends to).

    Example:
        >>> from genvi.training.fit_state import new_history
        >>> new_history()["objective"].shape
        (0,)
    """
    return {"objective": np.zeros(0, np.float32),
            "skipped": np.zeros(0, bool), "eval_step": [], "eval": []}


def finish(params: Any, state: Any, history: dict, key: jax.Array, stopped: str,
           tunings: tuple = ()) -> FitResult:
    """The `FitResult` of a run with this `history`.

    Example:
        >>> import jax
        >>> from genvi.training.fit_state import finish, new_history
        >>> finish({}, (), new_history(), jax.random.key(0), "ran all 0 steps").steps
        0
    """
    history = dict(history, eval_step=np.asarray(history["eval_step"], np.int64),
                   eval=np.asarray(history["eval"], np.float32),
                   num_skipped=int(np.sum(history["skipped"])))
    return FitResult(params, state, history, len(history["objective"]), stopped, key, tunings)


def continued(result: FitResult, optimizer: optax.GradientTransformation,
              key: jax.Array | None) -> tuple[Any, Any, dict, jax.Array]:
    """`(params, optimizer state, history, key)` to continue `result` with
    `optimizer`; `key=None` reuses the result's key (one uninterrupted run).

    Example:
        >>> import genvi as gv, jax, optax
        >>> from genvi.training.fit_state import continued, finish, new_history
        >>> adam = optax.adam(0.1)
        >>> done = finish(0.0, adam.init(0.0), new_history(), jax.random.key(0), "")
        >>> continued(done, optax.sgd(0.1), None)
        Traceback (most recent call last):
        ValueError: gv.fit: the FitResult to continue holds an optimizer state ...
    """
    key = result.key if key is None else key
    if key is None:
        raise ValueError("gv.fit: the FitResult to continue has no key (it was not made by "
                         "gv.fit); pass key=jax.random.key(...)")
    history = dict(result.history)
    history["eval_step"] = [int(s) for s in np.asarray(history.get("eval_step", []))]
    history["eval"] = [float(v) for v in np.asarray(history.get("eval", []))]
    history.pop("num_skipped", None)
    if len(history["objective"]) != result.steps:
        raise ValueError(f"gv.fit: the FitResult to continue says it ran {result.steps} steps "
                         f"but its history records {len(history['objective'])}; continue an "
                         "unmodified gv.fit result")
    expected = jax.eval_shape(optimizer.init, result.params)
    if _layout(expected) != _layout(result.state):
        raise ValueError(
            "gv.fit: the FitResult to continue holds an optimizer state that this optimizer "
            f"does not make (it has {jax.tree_util.tree_structure(result.state)}; this "
            f"optimizer makes {jax.tree_util.tree_structure(expected)}). Pass the same "
            "optimizer as the run that made it, or start afresh from its parameters: "
            "gv.fit(objective, result.params, ...)")
    return result.params, result.state, history, key


def _layout(tree: Any) -> tuple:
    leaves, structure = jax.tree_util.tree_flatten(tree)
    return structure, [(np.shape(x), jnp.result_type(x)) for x in leaves]


def payload(params: Any, state: Any, step: int, key: jax.Array, history: dict) -> dict:
    """What a checkpoint holds: parameters, optimizer state, step, key and history.

    Example:
        >>> import jax
        >>> from genvi.training.fit_state import new_history, payload
        >>> sorted(payload(0.0, (), 0, jax.random.key(0), new_history()))
        ['key', 'objective', 'params', 'skipped', 'state', 'step']
    """
    return {"params": params, "state": state, "step": np.int64(step),
            "key": np.asarray(jax.random.key_data(key)),
            "objective": history["objective"], "skipped": history["skipped"]}


def resume(directory: str, params: Any, state: Any, key: jax.Array) -> tuple[int, Any, Any, dict]:
    """`(step, params, optimizer state, history)` from the newest checkpoint in
    `directory`, checked against this run's structure and key.

    Example:
        >>> from genvi.training.fit_state import resume
        >>> resume.__name__
        'resume'
    """
    def like(step: int) -> dict:  # the history has one entry per step
        return payload(params, state, step, key, {"objective": np.zeros(step, np.float32),
                                                  "skipped": np.zeros(step, bool)})
    step, saved = checkpoints.restore(directory, like)
    if not np.array_equal(saved["key"], like(0)["key"]):
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
