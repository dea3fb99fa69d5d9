"""The run context: one record of what genvi is asked to do beyond evaluating.

A user's Python code sits between genvi's entry points and its sites (an objective's
body calls `g.sim`, `gv.sample`, a `jax.vmap`), so what the trace is for has to be
known where that code runs: whether it is an objective's body, whether it runs for
values only, whether conds are batched with genvi's rule, whether `explain` is
recording, whether replays may be lane-local, and which program validation names.
Those facts live in one `RunContext`, set by `using(...)` at the entry points.
Interpreters read it once, where a run begins, and pass it down explicitly (the ADEV
interpreter hands `lane_local` to the replay engine in its `Replay` record and `log`
to `explain`'s notes); nothing below reads it again.

Example:
    >>> from genvi.core.context import current, using
    >>> current().lane_local
    True
    >>> with using(lane_local=False):
    ...     current().lane_local
    False
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass, replace
from typing import Any, Iterator


@dataclass(frozen=True)
class RunContext:
    """What the run being traced is for.

    * `in_objective`: an objective's body is being traced (programs' `sim`,
      `gv.sample` and friends are allowed, and emit ADEV sites);
    * `plain`: objective-style code run for its values only (sites need no strategy);
    * `genvi_conds`: a `cond` batched now gets genvi's rule (each branch run with its
      sites masked per lane), even where no site is visible yet;
    * `lane_local`: replays may be lane-local and Markov-local (False: whole-objective
      replays, for comparisons and tests);
    * `log`: `explain`'s per-site records while an estimator is explained (else None);
    * `program`: the program or objective validation names in its messages;
    * `within`: the expectations whose draws (`genvi.core.draws`) the run is inside,
      outermost first (`explain` shows the nesting);
    * `choices`: the strategies `gv.AUTO` sites take, ((address, strategy), ...)
      (a tuning's; sites not named take the first allowed strategy);
    * `auto_sites`: a list that objectives append their `gv.AUTO` sites to while they
      are traced (what a tuning measures), else None.
    """

    in_objective: bool = False
    plain: bool = False
    genvi_conds: bool = False
    lane_local: bool = True
    log: dict | None = None
    program: str | None = None
    within: tuple = ()
    choices: tuple = ()
    auto_sites: list | None = None


_CURRENT: contextvars.ContextVar = contextvars.ContextVar("genvi_run_context",
                                                          default=RunContext())


def current() -> RunContext:
    """The run context in force (read once where a run begins)."""
    return _CURRENT.get()


@contextlib.contextmanager
def using(**changes: Any) -> Iterator[RunContext]:
    """Within this block, the run context with `changes` (fields of `RunContext`)."""
    token = _CURRENT.set(replace(_CURRENT.get(), **changes))
    try:
        yield _CURRENT.get()
    finally:
        _CURRENT.reset(token)
