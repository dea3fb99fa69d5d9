"""Objectives written as programs: `@gv.expectation` and `ProgramExpectation`.

An objective program's jaxpr (traced once per argument shapes) is run by the ADEV
interpreter (`genvi.adev.interpreter`) as a forward-mode estimator; the smoothness
check (`genvi.adev.smoothness`) and an objective's own requirements are checked once
per trace and set of differentiated inputs.

Example:
    >>> import genvi as gv, jax
    >>> @gv.expectation
    ... def e(mu):
    ...     return gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM)) ** 2
    >>> float(e.grad_estimate(jax.random.key(0), 0.0)) != 0.0
    True
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any, Callable

import jax
import jax.numpy as jnp

from genvi.adev import placeholders, smoothness, variance_training
from genvi.adev.expectation import Expectation
from genvi.adev.interpreter import estimate_jvp
from genvi.core.context import RunContext, RunObserver, current
from genvi.core.keywords import call_with_keywords
from genvi.core.mistakes import arg_names
from genvi.core.tracing import IN_OBJECTIVE, split_args, trace_cached


class ProgramExpectation(Expectation):
    """An expectation defined by a Python function (see `gv.expectation`)."""

    def __init__(self, fn: Callable, name: str | None = None,
                 requires: Callable[..., None] | None = None, keywords: bool = False):
        super().__init__()
        self.fn = fn
        # the user's own function takes keyword arguments as keywords (a library
        # objective passes them on to its programs as its last argument)
        self._traced_fn = (lambda *args: call_with_keywords(fn, args)) if keywords else fn
        # `requires(*args)` raises when the strategies it is given make the objective's
        # gradient estimator biased (checked when differentiating, like smoothness)
        self.requires = requires
        self.name = name or getattr(fn, "__name__", "expectation")
        self._traces: dict = {}
        self._checked: set = set()  # (trace, differentiated inputs) that passed the check
        # placeholder (gv.AUTO) sites per trace, and their default strategies
        self._placeholders: dict = {}
        self._resolutions: dict = {}  # (trace, choices) -> the trace at those choices
        functools.update_wrapper(self, fn, updated=())

    def trace(self, *args: Any):
        """The traced objective: `(closed jaxpr, dynamic argument leaves)`."""
        traced, dyn = trace_cached(self._traces, self._traced_fn, args, IN_OBJECTIVE.set,
                                   name=("objective", self.name, self.fn))
        out = traced.closed.jaxpr.outvars
        if len(out) != 1 or out[0].aval.shape != () or not jnp.issubdtype(out[0].aval.dtype, jnp.floating):
            raise TypeError(f"the objective {self.name!r} must return one float scalar; "
                            f"it returned {[v.aval.str_short() for v in out]}")
        return traced.closed, dyn

    def __call__(self, *args: Any) -> jax.Array:
        """Inside another objective program, the value of this one (its program is
        inlined, so its sampling sites become part of the caller's estimator).

        Example:
            >>> import genvi as gv, jax
            >>> @gv.expectation
            ... def square(mu):
            ...     x = gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
            ...     return x * x
            >>> @gv.expectation
            ... def shifted(mu):                    # E[(mu + 1 + eps)^2] = (mu + 1)^2 + 1
            ...     return square(mu + 1.0)
            >>> g = shifted.grad_estimate(jax.random.key(0), 0.5)   # unbiased for 2 (mu + 1)
        """
        if not IN_OBJECTIVE:
            raise TypeError(f"the objective {self.name!r} was called outside an objective "
                            "program; use .estimate(key, *args) for its value")
        return self.fn(*args)

    def dual_estimate(self, key, args, targs):
        # a run begins: what it is for (a tuning's choices, its observer) is read once,
        # here, and passed down
        return self._estimate(current(), key, args, targs)

    def _estimate(self, run: RunContext, key: Any, args: tuple, targs: Any) -> Any:
        closed, dyn = self.trace(*args)
        closed = self._resolved(closed, run.site_strategies)
        sites = self._placeholder_sites(closed)
        if sites:  # placeholder sites (gv.AUTO) nothing chose for: their defaults
            closed = self._resolved(closed, self._defaults(run, closed, sites, key, args, targs))
        if targs is None:
            tdyn = [None] * len(dyn)
        else:
            _, _, treedef, mask = split_args(args)
            # an argument given no tangent as a whole (None) has none at any leaf
            targs = tuple(jax.tree_util.tree_map(lambda _: None, a) if t is None else t
                          for a, t in zip(args, targs))
            tleaves = treedef.flatten_up_to(targs)
            tdyn = [t for t, m in zip(tleaves, mask) if m]
            tdyn = [None if (t is None or not jnp.issubdtype(jnp.result_type(p), jnp.inexact)) else t
                    for t, p in zip(tdyn, dyn)]
            differentiated = tuple(t is not None for t in tdyn)
            if (id(closed), differentiated) not in self._checked:  # once per trace and mask
                if any(differentiated) and self.requires is not None:
                    self.requires(*args)
                smoothness.check(closed, differentiated)
                variance_training.check(closed, differentiated, self._input_names(args, mask))
                self._checked.add((id(closed), differentiated))
        return estimate_jvp(closed, key, dyn, tdyn, context=run)

    def _resolved(self, closed: Any, choices: tuple) -> Any:
        """`closed` with its placeholder sites at `choices` (cached per trace and
        choices; the cache keeps the rewritten jaxprs, whose ids key the checks)."""
        if not choices:
            return closed
        return _per_trace(self._resolutions, (id(closed), choices), closed,
                          lambda: placeholders.resolved(closed, choices))

    def _input_names(self, args: tuple, mask: tuple) -> list[str]:
        """The dynamic inputs' names (`mask`: which leaves of `args` are dynamic), for
        messages: `params['enc']['w']`."""
        written = arg_names(self.fn) or []
        names = []
        for (path, _), dynamic in zip(jax.tree_util.tree_flatten_with_path(args)[0], mask):
            if dynamic:
                first, rest = path[0].idx, path[1:]
                head = written[first] if first < len(written) else f"argument {first}"
                names.append(head + jax.tree_util.keystr(rest))
        return names

    def _placeholder_sites(self, closed: Any) -> list:
        return _per_trace(self._placeholders, id(closed), closed,
                          lambda: placeholders.placeholder_sites(closed))

    def _defaults(self, run: RunContext, closed: Any, sites: list, key: Any, args: tuple,
                  targs: Any) -> tuple:
        """The default strategies at placeholder `sites` (cached per trace and
        differentiated inputs), reported to the run's observer (a tuning collects the
        sites so)."""
        differentiated = None if targs is None else tuple(
            t is not None for t in jax.tree_util.tree_leaves(targs))
        cache_key = (id(closed), differentiated)
        hit = self._placeholders.get(cache_key)
        if hit is None:
            def allowed(trial):
                # a trial: nothing of it is reported to the observer
                quiet = replace(run, site_strategies=run.site_strategies + trial,
                                observer=RunObserver())
                return placeholders.refusal(lambda: jax.eval_shape(
                    lambda k, a, t: _dual_pair(self._estimate(quiet, k, a, t)),
                    key, args, targs))
            hit = placeholders.default_strategies(sites, allowed)
            self._placeholders[cache_key] = hit
        choices, resolved = hit
        run.observer.defaulted(resolved)
        return choices

    def __repr__(self) -> str:
        return f"<gv.expectation {self.name}>"


def _per_trace(cache: dict, key: Any, closed: Any, compute: Callable[[], Any]) -> Any:
    """`compute()` cached under `key` (which holds `id(closed)`), kept with `closed` so
    that an id reused by a later trace is not mistaken for it."""
    hit = cache.get(key)
    if hit is None or hit[0] is not closed:
        hit = cache[key] = (closed, compute())
    return hit[1]


def _dual_pair(out: Any) -> tuple:
    return out.primal, out.tangent


def expectation(fn: Callable) -> ProgramExpectation:
    """Decorate an objective program; returns an `Expectation`.

    Args:
        fn: a Python function of the objective's arguments that draws with `gv.sample`
            (or a program's `.sim`) and returns a number.

    Returns:
        an `Expectation`: call it for an estimate, or use `.grad_estimate`,
        `.value_and_grad_estimate`, `.explain`.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.expectation
        ... def e(mu):
        ...     x = gv.sample(gv.normal(mu, 1.0, grad=gv.REPARAM))
        ...     return x * x
        >>> g = e.grad_estimate(jax.random.key(1), 0.5)   # unbiased for 2 * mu
    """
    return ProgramExpectation(fn, keywords=True)
