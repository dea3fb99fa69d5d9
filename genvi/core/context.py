"""The run context: one record of what genvi is asked to do beyond evaluating.

A user's Python code sits between genvi's entry points and its sites (an objective's
body calls `g.sim`, `gv.sample`, a `jax.vmap`), so what the trace is for has to be
known where that code runs: whether it is an objective's body, whether it runs for
values only, whether conds are batched with genvi's rule, whether `explain` is
recording, whether replays may be lane-local, and which program validation names.
Those facts live in one `RunContext`, set by `using(...)` at the entry points.
Interpreters read it once, where a run begins, and pass it down explicitly (the ADEV
interpreter hands `lane_local` to the replay engine in its `Replay` record and tells
the context's `observer` what it does); nothing below reads it again.

A tool that watches runs (`gv.explain`) is a `RunObserver` in the context: the
interpreter reports its events to whichever observer is there and imports no tool.

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


class RunObserver:
    """What watches a run of an objective's estimator: the ADEV interpreter reports
    each event to the run context's observer (`gv.explain` records them; the default
    observer ignores them). Every method does nothing by default.

    * `site(eqn, dist, strategy, value, steps, draws)`: a differentiated site is about
      to run its rule (`value`: the value's abstract shape; `steps`: the control flow
      around it; `draws`: the expectations whose draws it is within);
    * `path(eqn, text)`: how the site's gradient terms are evaluated, in words;
    * `replays(eqn, alternatives, path)`: replays left to run after a scan;
    * `total(eqn, alternatives, total, scan_steps)`: how the replay engine evaluated
      a site's replays (its `Total`);
    * `enumeration(eqn, values)`: the rest of the program run at `values` values;
    * `defaulted(sites)`: sites with a placeholder strategy (`gv.AUTO`) that took
      their default, as the placeholder's `default_strategies` resolved them;
    * `contraction(program, plan)`: how an exact marginal (`gv.enumeration`) sums its
      discrete sites: the steps of its contraction, in order (printable).

    Example:
        >>> class Count(RunObserver):
        ...     sites = 0
        ...     def site(self, eqn, dist, strategy, value, steps, draws=()):
        ...         self.sites += 1
        >>> import genvi as gv, jax
        >>> e = gv.expectation(lambda p: gv.sample(gv.flip(p, grad=gv.ENUM)) * 1.0)
        >>> counter = Count()
        >>> with using(observer=counter):
        ...     _ = jax.make_jaxpr(lambda p: e.grad_estimate(jax.random.key(0), p))(0.3)
        >>> counter.sites
        1
    """

    def site(self, eqn: Any, dist: Any, strategy: Any, value: Any, steps: tuple,
             draws: tuple = ()) -> None:
        return None

    def path(self, eqn: Any, text: str) -> None:
        return None

    def replays(self, eqn: Any, alternatives: Any, path: str) -> None:
        return None

    def total(self, eqn: Any, alternatives: Any, total: Any, scan_steps: int = 1) -> None:
        return None

    def enumeration(self, eqn: Any, values: int) -> None:
        return None

    def defaulted(self, sites: list) -> None:
        return None

    def contraction(self, program: str, plan: Any) -> None:
        return None


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
    * `observer`: what watches the run (`RunObserver`; `gv.explain` records it);
    * `program`: the program or objective validation names in its messages;
    * `within`: the expectations whose draws (`genvi.core.draws`) the run is inside,
      outermost first (`explain` shows the nesting);
    * `site_strategies`: ((address, strategy), ...): the strategies sites with a
      placeholder strategy (`gv.AUTO`) take in this run (a tuning's choices); an
      objective's estimator rewrites its trace to them where the run begins;
    * `notes`: what the trace of a user's program records for the messages of its
      mistakes (`genvi.core.tracing.TraceNotes`: the distribution calls made, the
      values sites returned), None while genvi traces its own helpers.
    """

    in_objective: bool = False
    plain: bool = False
    genvi_conds: bool = False
    lane_local: bool = True
    observer: RunObserver = RunObserver()
    program: str | None = None
    within: tuple = ()
    site_strategies: tuple = ()
    notes: Any = None


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
