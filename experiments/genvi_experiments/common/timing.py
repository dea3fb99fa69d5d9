"""Interleaved, warm, median timing of alternatives in one process."""

from __future__ import annotations

import os
import pathlib
import platform
import time
from typing import Any, Callable

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
    """The machine a measurement ran on: the CPU's model (where the system names it) and
    architecture, its cores, and JAX's version and device. The model matters beyond
    speed: XLA compiles for the host's CPU, so two CPUs can round one program's floats
    differently, and a long training run (AIR's) amplifies that into different steps.

    Example:
        >>> describe_machine()      # doctest: +SKIP
        'AMD EPYC (x86_64), 2 cores, JAX 0.12.0.1 on cpu (cpu)'
    """
    dev = jax.devices()[0]
    arch = platform.processor() or platform.machine()
    model = _cpu_model()
    cpu = f"{model} ({arch})" if model else arch
    return (f"{cpu}, {os.cpu_count()} cores, "
            f"JAX {jax.__version__} on {dev.platform} ({dev.device_kind})")


def _cpu_model() -> str:
    """The CPU's model name as Linux reports it ("" elsewhere or where it is not given)."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith("model name") and ":" in line), "")


def chunk_timed_fit(finish: Callable, *fit_args: Any, **fit_kwargs: Any) -> Callable[[], Any]:
    """A `() -> finish(gv.fit(*fit_args, **fit_kwargs).params)` that records
    `time.perf_counter()` at the end of each chunk of its last call in its attribute
    `chunk_ends`: a `chunked` run for `fit_step_times`.

    Example:
        >>> from genvi_experiments.common.timing import chunk_timed_fit
        >>> # run = chunk_timed_fit(lambda p: p["loc"], objective, start, x, optimizer=...,
        >>> #                       steps=2000, key=key, chunk_size=1000, progress=False)
    """
    import genvi as gv  # noqa: PLC0415

    def run():
        run.chunk_ends = []
        result = gv.fit(*fit_args, **fit_kwargs,
                        callbacks=[lambda *_: run.chunk_ends.append(time.perf_counter())])
        return finish(result.params)
    return run


def fit_step_times(chunked: dict[str, Callable], reference: tuple[Callable, Callable],
                   steps: int, rounds: int, whole: dict[str, Callable] | None = None,
                   ) -> tuple[dict[str, float], dict[str, float]]:
    """Warm milliseconds per training step, leaving out what a call costs once; for
    comparing `gv.fit` with another system's fused training loop.

    * `chunked[name]`: a `() -> Any` running one `gv.fit` of 2 × `steps` steps in
      chunks of `steps`, recording `time.perf_counter()` at each chunk's end in its
      attribute `chunk_ends` (a callback); its step time is the second chunk's over
      `steps` (one-time costs, such as compiling or a one-time shuffle, are in the first).
    * `reference`: calls of `steps` and 2 × `steps` steps of the other system; its
      step time is their difference over `steps`.
    * `whole[name]`: a call of `steps` steps timed whole, over `steps`.

    Interleaved rounds (after a warm-up call of each), medians. Returns (ms per step
    by name, with the reference as "reference"; each chunked run's median paired
    ratio to the reference).

    Example:
        >>> from genvi_experiments.common.timing import fit_step_times
        >>> # fit_step_times({"genvi": run}, (numpyro_T, numpyro_2T), 1000, rounds=5)
    """
    whole = whole or {}
    chunk_times: dict[str, list[float]] = {name: [] for name in chunked}

    def timed(name):
        def call():
            chunked[name]()
            first, second = chunked[name].chunk_ends[:2]
            chunk_times[name].append(second - first)
        return call

    for fn in (*chunked.values(), *reference, *whole.values()):
        jax.block_until_ready(fn())  # compile
    times = interleaved_samples({**{name: timed(name) for name in chunked},
                                 "reference 0": reference[0], "reference 1": reference[1],
                                 **whole}, rounds=rounds, reps=1)
    per_step = {name: [c / steps for c in chunk_times[name][-rounds:]] for name in chunked}
    per_step["reference"] = [(b - a) / steps
                             for a, b in zip(times["reference 0"], times["reference 1"])]
    per_step.update({name: [t / steps for t in times[name]] for name in whole})
    return ({name: 1e3 * median(v) for name, v in per_step.items()},
            {name: paired_ratio(per_step, name, "reference") for name in chunked})
