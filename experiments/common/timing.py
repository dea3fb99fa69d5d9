"""Interleaved, warm, median timing of alternatives in one process."""

from __future__ import annotations

import time
from typing import Callable

import jax

# shared with gv.compare_estimators, so they live in the package
from genvi.training.timing import interleaved_samples, median  # noqa: F401


def compile_time(fn: Callable, *args) -> float:
    """Seconds for the first call (trace + compile + one run)."""
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - t0


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
