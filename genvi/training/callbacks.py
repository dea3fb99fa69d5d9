"""What plugs into `gv.fit` between its compiled chunks: a `FitCallback`.

`gv.fit` runs its steps in compiled chunks. Between two chunks it records the history,
evaluates, writes a checkpoint, and then hands the boundary to each callback. A
callback may also end chunks at steps of its own (`every`), and give the objective
training runs from the next chunk on (`objective`): that is how `gv.AUTO`'s
measurement switches a fit to the strategies it chose
(`genvi.auto.fit_tuning.AutoTuning`, which `gv.fit` adds where the objective has
`gv.AUTO` sites); the fit itself knows nothing of AUTO.

A callback is any object with these methods (`FitCallback` is the protocol, and a
base class whose methods do nothing), or a plain function `(step, params, history)`,
called at every boundary.

Example:
    >>> import genvi as gv, jax, optax
    >>> class Every(gv.FitCallback):
    ...     every = 3                      # a chunk ends at every multiple of 3 steps
    ...     seen = []
    ...     def boundary(self, step, params, history, last):
    ...         self.seen.append(step)
    >>> e = gv.expectation(lambda m: -(gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM))) ** 2)
    >>> cb = Every()
    >>> _ = gv.fit(e, 0.0, optimizer=optax.sgd(0.1), steps=7, key=jax.random.key(0),
    ...            callbacks=[cb], progress=False)
    >>> cb.seen
    [3, 6, 7]
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

from genvi.adev.expectation import Expectation
from genvi.training.fit_state import FitResult


class FitStart(NamedTuple):
    """What a callback is told as a fit starts (`FitCallback.start`).

    * `objective`: the objective the fit was given;
    * `params`: the parameters training starts from (a resumed or continued run's);
    * `step`: the step it starts at (later than 0 where it resumes or continues);
    * `end`: the step it ends at, unless it stops earlier;
    * `key`: the fit's key;
    * `processes`: how many processes run the fit alike (`jax.distributed`);
    * `arguments_at(params, step)`: what step `step` trains on: `params`, then that
      step's minibatch and scheduled values;
    * `precompile(objective)`: compile the fit's training program for `objective`
      (to switch to it without waiting for a compile at a boundary).

    Example:
        >>> FitStart._fields[:3]
        ('objective', 'params', 'step')
    """

    objective: Expectation
    params: Any
    step: int
    end: int
    key: jax.Array
    processes: int
    arguments_at: Callable[[Any, int], tuple]
    precompile: Callable[[Expectation], None]


class FitCallback:
    """A callback of `gv.fit` (see the module docstring). Every method does nothing by
    default; override those you need.

    * `every`: end a chunk at every multiple of this many steps (None: no edges of
      its own);
    * `start(fit)`: the fit starts (`fit`: a `FitStart`);
    * `objective()`: the objective training runs from the next chunk on; None leaves
      it as it is (the fit's own, or an earlier callback's);
    * `boundary(step, params, history, last)`: between chunks, after the history,
      evaluation and checkpoint of `step`; `last`: no step follows (the fit ran all
      its steps or stopped);
    * `close(ended)`: the fit leaves, normally (`ended`) or by an error or a signal;
      called whatever happened, once started;
    * `finish(result)`: the `FitResult` with what the callback adds to it.

    Example:
        >>> FitCallback().objective() is None
        True
    """

    every: int | None = None

    def start(self, fit: FitStart) -> None:
        return None

    def objective(self) -> Expectation | None:
        return None

    def boundary(self, step: int, params: Any, history: dict, last: bool) -> None:
        return None

    def close(self, ended: bool) -> None:
        return None

    def finish(self, result: FitResult) -> FitResult:
        return result


class _Function(FitCallback):
    """A plain function `(step, params, history)` as a callback: called at every
    boundary."""

    def __init__(self, fn: Callable[[int, Any, dict], Any]):
        self.fn = fn

    def boundary(self, step: int, params: Any, history: dict, last: bool) -> None:
        self.fn(step, params, history)


def as_callbacks(given: Any) -> tuple:
    """`gv.fit`'s `callbacks=` as callback objects: functions wrapped, others as given.

    Example:
        >>> [type(c).__name__ for c in as_callbacks([print, FitCallback()])]
        ['_Function', 'FitCallback']
    """
    return tuple(c if hasattr(c, "boundary") else _Function(c) for c in given)
