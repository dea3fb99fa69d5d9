"""What the replay benches (`replays.plate`, `replays.scan`) share: a strategy's jitted
gradient step with `explain`'s counts, and the timed comparison of such steps against
REINFORCE's (interleaved, warm, median; paired ratios). `explain`'s counts and its CPU
time model are read from the report `objective.explain(...)` returns.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, NamedTuple

import jax

import genvi as gv
from genvi_experiments.common.timing import interleaved_samples, median, paired_ratio


class Step(NamedTuple):
    """A compiled gradient step: `call()` runs it; `flops` is XLA's count for it;
    `ops` (jaxpr operations) and `compiled` (kernels, instructions, elements) are
    `explain`'s counts, loops at their trip counts; `time_model` is `explain`'s CPU time
    model (its report's `time_model`, which prices `compiled` in `microseconds`)."""

    call: Callable[[], Any]
    flops: float
    ops: float
    compiled: Any
    time_model: Any


class Row(NamedTuple):
    """A step against REINFORCE's: ms per step, the measured ratio, and `explain`'s
    ratios (operations, kernels, the time model's estimate)."""

    name: str
    ms: float
    measured: float
    ops: float
    kernels: float
    estimated: float


def gradient_step(objective: Callable[[], gv.Expectation], key: Any, args: tuple,
                  general: bool = False) -> Step:
    """The jitted gradient step of `objective()` at `args`; traced under
    `whole_objective_replays()` (one replay per lane and step) when `general`."""
    with gv.whole_objective_replays() if general else contextlib.nullcontext():
        built = objective()
        compiled = jax.jit(built.grad_estimate).lower(key, *args).compile()
        explained = built.explain(*args, key=key)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return Step(lambda: compiled(key, *args), cost.get("flops", float("nan")),
                explained.work_gradient[0], explained.compiled_gradient, explained.time_model)


def rows_against_reinforce(steps: dict[str, Step], rounds: int,
                           model: Any = None) -> list[Row]:
    """A `Row` per step, `model` for the estimate (default: `explain`'s own time model);
    `steps` holds "REINFORCE"."""
    for step in steps.values():
        jax.block_until_ready(step.call())
    samples = interleaved_samples({n: s.call for n, s in steps.items()}, rounds=rounds, reps=5)
    base = steps["REINFORCE"]
    model = base.time_model if model is None else model
    return [Row(name, median(samples[name]) * 1e3, paired_ratio(samples, name, "REINFORCE"),
                s.ops / base.ops, s.compiled.launches / base.compiled.launches,
                model.microseconds(s.compiled) / model.microseconds(base.compiled))
            for name, s in steps.items()]


def worst_estimate(rows: list[Row]) -> str:
    """How far `explain`'s estimated ratio lies from the measured one, at worst."""
    factor, name = max((max(r.estimated / r.measured, r.measured / r.estimated), r.name)
                       for r in rows)
    return (f"explain's estimated ratio to REINFORCE is within {factor:.2f}× of the measured "
            f"one on every row (furthest: {name})")
