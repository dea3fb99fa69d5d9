"""Interleaved, warm, median timing of alternatives in one process.

Used by `gv.compare_estimators` and by the benchmark scripts in
`experiments/genvi_experiments/bench` (which import it through `genvi_experiments.common.timing`).
"""

from __future__ import annotations

import time
from typing import Callable

import jax


def interleaved_samples(fns: dict[str, Callable[[], object]], rounds: int = 30,
                        reps: int = 5, warmup: int = 0) -> dict[str, list[float]]:
    """Seconds per call of each zero-argument function, one sample per round,
    alternating between them round by round so that machine noise hits all alike.
    `warmup` untimed calls before each timed block absorb the cost of switching from
    the other function: another runtime's threads handing the cores back (torch's
    OpenMP pool beside XLA's), caches refilled. Measured on our 2-core machine, they
    bring a JAX step timed beside Pyro back to its time alone (a pause instead made
    both sides slower: the first calls after an idle core run up to 80% slower).

    Example:
        >>> from genvi.training.timing import interleaved_samples
        >>> s = interleaved_samples({"a": lambda: 1, "b": lambda: 2}, rounds=3, reps=1)
        >>> sorted(s), len(s["a"])
        (['a', 'b'], 3)
    """
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            for _ in range(warmup):
                jax.block_until_ready(fn())
            t0 = time.perf_counter()
            for _ in range(reps):
                out = fn()
            jax.block_until_ready(out)
            samples[name].append((time.perf_counter() - t0) / reps)
    return samples


def median(xs: list[float]) -> float:
    """The median (the upper one for an even count: one of the measured values).

    Example:
        >>> from genvi.training.timing import median
        >>> median([3.0, 1.0, 2.0])
        2.0
    """
    xs = sorted(xs)
    return xs[len(xs) // 2]
