"""`gv.tune`: measure each `gv.AUTO` site's candidate strategies at the current
parameters and choose the one with the least gradient variance × step time (the
rule of Geffner and Domke 2020: the variance of the average of the estimates one
second buys). `gv.fit` tunes at its start and every `retune_every` steps (`gv.AutoTuning`).

A site's candidates are measured by one compiled program (`lax.switch` on the
candidate, so a site compiles once rather than once per candidate: compiling is most of
what measuring costs; in a fit, on a CPU, by a helper process, `compile_aside`), whose
estimates run in one loop (a `fori_loop` over keys, no dispatch between estimates, as
in a fit's compiled chunk): the loop's gradient variance, summed over every entry of
every leaf (a running Welford update, so memory stays at one gradient), and its time
per estimate (warm, its fastest batch). The estimates come in batches, run as a race
(`genvi.auto.race`): a batch of every candidate, then more batches, interleaved, of those whose
variance × time is within twice the best's, so that a candidate far behind costs one
batch rather than four (in a fit, whose training waits for the race, the race spends at
most a share of the fit's time so far, `genvi.auto.fit_tuning.RACE_SHARE`, its
batches sized to fit). A candidate the objective refuses, or whose estimates are not
finite, is ruled out with its reason. In a fit, a site keeps the candidate training
runs where it measures within `KEEP_MARGIN` of the best (`_choose`). Sites are tuned
one after another, each with the sites before it at their choices and the ones after it
at their untuned choices (one pass of coordinate descent). The choice depends on
timings, so two machines may choose differently.

`tuning_steps` is the same measurement in steps, the compiling apart from the timing,
so that `gv.fit` can compile on a thread of its own while it trains
(`genvi.auto.fit_tuning`).

Example:
    >>> import genvi as gv, jax
    >>> @gv.expectation
    ... def e(mu):          # nearly linear in x: the pathwise gradient is almost exact
    ...     x = gv.sample(gv.normal(mu, 1.0, grad=gv.AUTO), name="x")
    ...     return 3.0 * x - 0.05 * x ** 2
    >>> tuning = gv.tune(e, 0.0, key=jax.random.key(0), estimates=32)
    >>> tuning.choice("x")
    gv.REPARAM
"""

from __future__ import annotations

import functools
import math
import weakref
from collections.abc import Callable, Generator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from genvi.adev.placeholders import refusal
from genvi.adev.cost import work
from genvi.adev.expectation import Expectation
from genvi.core.context import RunObserver, using
from genvi.core.mistakes import check_key
from genvi.core.strategy import PlaceholderSite
from genvi.core.tracing import shapes_key
from genvi.auto import choices as auto
from genvi.auto.compile_aside import Helpers, compile_program
from genvi.auto.race import BATCHES, batch_size, race, variance_program
from genvi.auto.report import Measured, Tuning


_SITES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def auto_sites(objective: Expectation, args: tuple) -> list:
    """The `gv.AUTO` sites of `objective` at `args` (gradient in `args[0]`), with their
    untuned choices: a trial trace (nothing runs), once per objective and argument
    shapes."""
    return _untuned_trace(objective, args)[0]


def _untuned_trace(objective: Expectation, args: tuple) -> tuple[list, Any]:
    """`auto_sites`' trial trace, kept: (the AUTO sites, the forward-mode jaxpr of
    `objective` with them at their untuned choices)."""
    seen = _SITES.setdefault(objective, {})
    shapes = shapes_key(args)
    if shapes not in seen:
        found = _Defaulted()
        with using(observer=found):
            jaxpr = forward_trace(objective, jax.random.key(0), args)
        seen[shapes] = (found.sites, jaxpr)
    return seen[shapes]


class _Defaulted(RunObserver):
    """Collects the placeholder (`gv.AUTO`) sites a trace resolved to their defaults."""

    def __init__(self) -> None:
        self.sites: list = []

    def defaulted(self, sites: list) -> None:
        self.sites.extend(s for s in sites if all(s.addr != t.addr for t in self.sites))


def forward_trace(objective: Expectation, key: jax.Array, args: tuple) -> Any:
    """The jaxpr of `objective`'s forward-mode estimator at `args`, differentiated in
    `args[0]`: the sites and replays its gradient step has, traced without JAX's
    linearization and transposition (about half the tracing)."""
    tangents = (jax.tree_util.tree_map(jnp.ones_like, args[0]),) + (None,) * (len(args) - 1)
    return jax.make_jaxpr(lambda k, a: objective.jvp_estimate(k, a, tangents))(key, args)


def tune(objective: Expectation, params: Any, *data: Any, key: jax.Array,
         estimates: int = 64, step: int = 0, compiled: dict | None = None) -> Tuning:
    """Choose a strategy at each `gv.AUTO` site of `objective(params, *data)` by
    measured gradient variance (in `params`) × time per estimate (see the module
    docstring), from up to 2 × `estimates` estimates per candidate (`estimates` / 2
    for one that falls out of the race in its first batch). `compiled`, a dict kept
    across calls, holds each choice's objective so that measuring again (a fit's
    retuning) compiles nothing anew.

    Args:
        objective: an objective with `gv.AUTO` sites.
        params: the parameters at which the candidates are measured.
        *data: the objective's other arguments (a minibatch, as a step of `gv.fit`
            gets).
        key: the randomness of the measurement.
        estimates: estimates per candidate in the race's first batch (at most twice as
            many in all).
        step: the training step recorded with the measurement.
        compiled: a dict kept across calls to reuse compiled candidates (optional).

    Returns:
        a `gv.Tuning`: `tuning.choice(address)`, `tuning.apply(objective)`,
        `print(tuning)` for the table.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.expectation
        ... def e(p):
        ...     b = gv.sample(gv.flip(p, grad=gv.AUTO), name="b")
        ...     return jax.numpy.where(b, 1.0, 3.0)
        >>> gv.tune(e, 0.3, key=jax.random.key(0), estimates=32).choice("b")   # exact and cheap
        gv.ENUM
    """
    check_key(key, "gv.tune")
    return run_now(tuning_steps(objective, (params,) + tuple(data), key, estimates, step,
                                {} if compiled is None else compiled))


def tuning_steps(objective: Expectation, args: tuple, key: jax.Array, estimates: int,
                 step: int, compiled: dict,
                 race_budget: Callable[[], float | None] = lambda: None,
                 running: dict | None = None, aside: Helpers | None = None,
                 ) -> Generator[Callable[[], Any], Any, Tuning]:
    """`gv.tune` in steps: a generator that yields each piece of work that compiles (a
    site's candidates traced and its measuring program compiled), is sent that work's
    result back, measures with it, and returns the `Tuning`. `run_now` does the work
    in place; a fit hands it to a thread of its own and trains meanwhile
    (`genvi.auto.fit_tuning`), while the measuring itself, which times the
    candidates, runs between its chunks. `race_budget()`, asked as each site's
    measurement starts, is the seconds its race may spend (None: no limit; `race.race`).
    `running` ({address: strategy}) is what training runs now, compiled: a site keeps
    it where it measured within `KEEP_MARGIN` of the best (`_choose`). `aside`: the
    helper processes (at the lowest priority, on a CPU) in which the measuring
    programs compile (`genvi.auto.compile_aside`; a fit's background
    measurement); None: in this process."""
    sites = auto_sites(objective, args)
    if not sites:
        raise ValueError("gv.tune: the objective has no site with grad=gv.AUTO to tune")
    chosen = {site.addr: site.default for site in sites}
    measured, notes = [], []
    # one key per site (indexing, not iterating: unstacking a key array compiles)
    keys = jax.random.split(key, len(sites))
    for i, site in enumerate(sites):
        if auto.only_reinforce(site.dist):
            notes.append(f"{site.name}: gv.{site.dist.name} supports only REINFORCE; took "
                         "RLOO with the number of samples measured")
        prepared = yield functools.partial(_prepare_site, objective, site, dict(chosen), args,
                                           keys[i], estimates, compiled, aside)
        results = _measure_site(site, prepared, args, race_budget())
        usable = [m for m in results if m.refused is None]
        if usable:
            choice, note = _choose(site, usable, (running or {}).get(site.addr))
            chosen[site.addr] = choice
            notes += [note] if note else []
        measured += results
    return Tuning(tuple(chosen.items()), tuple(measured), step, tuple(notes))


# Where training already runs a candidate (a fit's starting choice, or its last
# tuning's), it is kept while its measured variance × time is within this factor of
# the best's: a variance of 16 to 64 draws is known to a fifth to a third, so closer
# candidates are not told apart, and switching compiles another step (on AIR, whose
# five candidates measure within 1.13 times of each other, 18 s of compiling that
# slowed training by a fifth).
KEEP_MARGIN = 1.25


def _choose(site: PlaceholderSite, usable: list[Measured], running: Any) -> tuple[Any, str]:
    """The strategy for `site` from its `usable` measurements: the least variance ×
    time, or `running` where that is within `KEEP_MARGIN` of it; and a note where it
    kept `running`."""
    best = min(usable, key=lambda m: m.work)
    kept = next((m for m in usable if m.strategy == running), None)
    if kept is None or kept is best or kept.work > KEEP_MARGIN * best.work:
        return best.strategy, ""
    return kept.strategy, (f"{site.name}: kept {kept.strategy!r}, which training runs: its "
                           f"variance × time is {kept.work / best.work:.2f} times "
                           f"{best.strategy!r}'s (within {KEEP_MARGIN:g}, closer than "
                           "the measurement tells apart; switching would compile a step)")


# A step is cheap enough to start with where it writes at most this many times the
# elements of the score function's (one evaluation of the objective): a few
# evaluations, as ENUM's over a small support, lane-local replays in a plate, or a
# whole-site estimator's two. Beyond it lies a replay per coupled lane.
CHEAP_ENOUGH = 4.0


def starting_choices(objective: Expectation, args: tuple, key: jax.Array,
                     compiled: dict) -> tuple:
    """What a fit trains with while it measures. The untuned choices, where their
    gradient step is cheap enough by the cost model (the elements its traced
    forward-mode estimator writes, `genvi.adev.cost.work`, at most `CHEAP_ENOUGH` times
    those of the score function's step); otherwise, at each `gv.AUTO` site, the first
    candidate in rank order that the objective allows and whose step is cheap enough;
    where none is, the one writing the fewest elements, a score-function candidate
    (RLOO) only where no other is allowed. The measurement may choose
    otherwise; until it has, training moves at that step's pace. Sites in order, each
    with the sites before it at these choices and those after at their untuned ones.
    Nothing runs: forward traces (`forward_trace`), two where the untuned step is
    cheap, else one per candidate up to the first cheap one.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.expectation
        ... def e(mu):
        ...     return gv.sample(gv.normal(mu, 1.0, grad=gv.AUTO), name="x") ** 2
        >>> starting_choices(e, (0.5,), jax.random.key(0), {})
        ((('x',), gv.REPARAM),)
    """
    sites, untuned = _untuned_trace(objective, args)
    chosen = {site.addr: site.default for site in sites}
    score = _candidate(objective, {s.addr: auto.placeholder(s.dist) for s in sites}, compiled)
    cheap_enough = CHEAP_ENOUGH * work(forward_trace(score, key, args))[1]
    if work(untuned)[1] <= cheap_enough:
        return tuple(chosen.items())

    def elements(site: PlaceholderSite, candidate: Any) -> float | None:
        # its step's, or None where the objective refuses it
        tuned = _candidate(objective, {**chosen, site.addr: candidate}, compiled)
        traced: list = []
        if refusal(lambda: traced.append(forward_trace(tuned, key, args))) is None:
            return work(traced[0])[1]
        return None

    for site in sites:
        refused = dict(site.refused)
        priced: list = []   # (score function?, elements, candidate), in rank order
        for candidate in auto.candidates(site.dist):
            cost = None if candidate in refused else elements(site, candidate)
            if cost is None:
                continue
            priced.append((candidate.score_function, cost, candidate))
            if cost <= cheap_enough:   # the first cheap one is taken
                priced = priced[-1:]
                break
        if priced:
            chosen[site.addr] = min(priced, key=lambda c: c[:2])[2]
    return tuple(chosen.items())


def _candidate(objective: Expectation, choices: dict, compiled: dict) -> auto.Tuned:
    """`objective` at `choices`, one object per set of choices (kept in `compiled`:
    its jitted estimator keeps its trace)."""
    key = tuple(choices.items())
    tuned = compiled.get(key)
    if tuned is None:
        tuned = compiled[key] = auto.Tuned(objective, key)
    return tuned


def run_now(steps: Generator[Callable[[], Any], Any, Tuning]) -> Tuning:
    """Run a `tuning_steps` generator to its end, each piece of work in place."""
    try:
        work = next(steps)
        while True:
            work = steps.send(work())
    except StopIteration as done:
        return done.value


class _Prepared(NamedTuple):
    """A site made ready to measure: the candidates refused (Measured rows), those
    allowed ((candidate, objective) pairs), their measuring program, compiled (None
    when none is allowed) and its keys (a warm-up's batch and `BATCHES` more)."""

    refused: dict
    allowed: list
    program: Any
    keys: jax.Array


def _prepare_site(objective: Expectation, site: PlaceholderSite, chosen: dict, args: tuple,
                  key: jax.Array, estimates: int, compiled: dict,
                  aside: Helpers | None = None) -> _Prepared:
    """Trace every candidate at `site` (the other sites at `chosen`): those the
    objective refuses, with their reasons, and the rest, compiled into one measuring
    program (`lax.switch` on the candidate, so the site compiles once, not once per
    candidate; `aside`: in these helper processes, `compile_aside`)."""
    refused = dict(site.refused)
    results: dict = {}
    allowed = []
    batch = batch_size(estimates)
    keys = jax.random.split(key, (1 + BATCHES) * batch).reshape(1 + BATCHES, batch)
    for candidate in auto.candidates(site.dist):
        if candidate in refused:
            results[candidate] = Measured(site.name, candidate, refused=refused[candidate])
            continue
        tuned = _candidate(objective, {**chosen, site.addr: candidate}, compiled)
        # the jitted estimator's trace is kept, so the program below traces it no more
        # mypy cannot infer the type of a lambda with a default argument (a mypy limitation)
        message = refusal(lambda t=tuned: jax.eval_shape(  # type: ignore[misc]
            t.value_and_grad_estimate, key, *args))
        if message is None:
            allowed.append((candidate, tuned))
        else:
            results[candidate] = Measured(site.name, candidate, refused=message)
    program = None
    if allowed:   # kept per argument shapes, so that a fit's retuning compiles nothing
        program_key = ("measure", shapes_key(args)) + tuple(t.choices for _, t in allowed)
        program = compiled.get(program_key)
        if program is None:
            program = compiled[program_key] = compile_program(
                variance_program([t for _, t in allowed]), 0, keys[0], 2, args, aside=aside)
    return _Prepared(results, allowed, program, keys)


def _measure_site(site: PlaceholderSite, prepared: _Prepared, args: tuple,
                  budget: float | None = None) -> list[Measured]:
    """Every candidate at `site`, in rank order: the refused ones as prepared, the
    allowed ones measured by the prepared program (racing for at most `budget` seconds
    beyond the first round)."""
    results = dict(prepared.refused)
    if prepared.allowed:
        timed = race(prepared.program, len(prepared.allowed), args, prepared.keys, budget)
        for (candidate, _), (variance, seconds, taken) in zip(prepared.allowed, timed):
            results[candidate] = (
                Measured(site.name, candidate, variance, seconds, taken)
                if math.isfinite(variance) else
                Measured(site.name, candidate, estimates=taken,
                         refused="its gradient estimates are not finite here"))
    return [results[c] for c in auto.candidates(site.dist)]


def has_auto_sites(objective: Expectation, args: tuple) -> bool:
    """Whether `objective(*args)` has a `gv.AUTO` site (`auto_sites`' trial trace)."""
    return bool(auto_sites(objective, args))
