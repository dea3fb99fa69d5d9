"""Interleaved, warm, median timing of alternatives in one process."""

from __future__ import annotations

import time
from typing import Callable

import jax


def compile_time(fn: Callable, *args) -> float:
    """Seconds for the first call (trace + compile + one run)."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


def interleaved_samples(fns: dict[str, Callable[[], object]], rounds: int = 30,
                        reps: int = 5, warmup: int = 0) -> dict[str, list[float]]:
    """Seconds per call of each zero-argument function, one sample per round,
    alternating between them round by round so that machine noise hits all alike.
    `warmup` untimed calls before each timed block absorb the cost of switching from
    the other function: another runtime's threads handing the cores back (torch's
    OpenMP pool beside XLA's), caches refilled. Measured on our 2-core machine, they
    bring a JAX step timed beside Pyro back to its time alone (a pause instead made
    both sides slower: the first calls after an idle core run up to 80% slower)."""
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
    xs = sorted(xs)
    return xs[len(xs) // 2]


def interleaved_medians(fns: dict[str, Callable[[], object]], rounds: int = 30,
                        reps: int = 5) -> dict[str, float]:
    """Median seconds per call of each function (see `interleaved_samples`)."""
    return {name: median(s) for name, s in interleaved_samples(fns, rounds, reps).items()}


def paired_ratio(samples: dict[str, list[float]], num: str, den: str) -> float:
    """Median over rounds of time[num] / time[den] measured in the same round:
    robust to the machine speeding up or slowing down between rounds."""
    return median([a / b for a, b in zip(samples[num], samples[den])])


def describe_machine() -> str:
    import os
    import platform
    dev = jax.devices()[0]
    return (f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
            f"JAX {jax.__version__} on {dev.platform} ({dev.device_kind})")
