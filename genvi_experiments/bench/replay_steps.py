"""What the replay benches (`plate_replays`, `scan_replays`) share: a strategy's jitted
gradient step with `explain`'s counts, and the timed comparison of such steps against
REINFORCE's (interleaved, warm, median; paired ratios).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, NamedTuple

import jax

import genvi as gv
from genvi.adev.lanes import whole_objective_replays
from genvi_experiments.common.timing import interleaved_samples, median, paired_ratio


class Step(NamedTuple):
    """A compiled gradient step: `call()` runs it; `flops` is XLA's count for it;
    `ops` and `kernels` are `explain`'s counts (loops at their trip counts)."""

    call: Callable[[], Any]
    flops: float
    ops: float
    kernels: int


def gradient_step(objective: Callable[[], gv.Expectation], key: Any, args: tuple,
                  general: bool = False) -> Step:
    """The jitted gradient step of `objective()` at `args`; traced under
    `whole_objective_replays()` (one replay per lane and step) when `general`."""
    with whole_objective_replays() if general else contextlib.nullcontext():
        built = objective()
        compiled = jax.jit(built.grad_estimate).lower(key, *args).compile()
        explained = built.explain(*args, key=key)
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    return Step(lambda: compiled(key, *args), cost.get("flops", float("nan")),
                explained.work_gradient[0], explained.launches_gradient)


def rows_against_reinforce(steps: dict[str, Step], rounds: int) -> list[tuple]:
    """Per step: (name, ms per step, × REINFORCE measured, explain's operations ×
    REINFORCE's, explain's kernels × REINFORCE's). `steps` holds "REINFORCE"."""
    for step in steps.values():
        jax.block_until_ready(step.call())
    samples = interleaved_samples({n: s.call for n, s in steps.items()}, rounds=rounds, reps=5)
    base = steps["REINFORCE"]
    return [(name, median(samples[name]) * 1e3, paired_ratio(samples, name, "REINFORCE"),
             s.ops / base.ops, s.kernels / base.kernels) for name, s in steps.items()]
