"""Fit `explain`'s CPU time model on this machine, and check it on steps it was not fitted on.

The model is the `time_model` of the report `objective.explain(...)` returns (genvi's
`CpuTimeModel`); the fitted one is that model with this machine's weights.

The model prices what a compiled step executes (`compiled_work`: kernels launched one
after another, the instructions in them, elements, and the instructions of loops XLA:CPU
compiled whole, loops at their trip counts) with five weights: a fixed cost per call,
and a cost per kernel, per instruction, per element and per instruction in a loop
compiled whole. They are fitted (non-negative least squares on relative error) to the
measured times of the gradient steps of `replays.plate` (B = 1,000) and
`replays.scan` (T = 100; flip, 2- and 3-state chains) with every strategy, replays
per step and whole-objective replays included; then checked on the same programs at
B = 4,000 and T = 400, where the question `explain` answers is "how much slower than
REINFORCE?": each step's estimated ratio to REINFORCE's against the measured one
(interleaved, warm, median; paired ratios). The model's defaults come from this script.

    python -m genvi_experiments.bench.replays.explain_calibration [--rounds 12]
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import numpy as np
from scipy.optimize import nnls

from genvi_experiments.bench.replays import plate as plate_replays, scan as scan_replays
from genvi_experiments.bench.replays.steps import Row, Step, rows_against_reinforce, worst_estimate
from genvi_experiments.common.timing import describe_machine

def bench_steps(fitting: bool) -> dict[str, dict[str, Step]]:
    """Program → strategy → compiled step: the fitting set (smaller sizes, with the
    general replay paths) or the checking set."""
    size, length = (1000, 100) if fitting else (4000, 400)
    programs = {f"plate, B = {size}": plate_replays.steps(size, general=fitting)}
    for states in ("flip", 2, 3):
        programs[f"HMM {states}, T = {length}"] = scan_replays.steps(states, length,
                                                                     general=fitting)
    return programs


def fit(steps: list[Step], ms: list[float]) -> Any:
    """`explain`'s time model with the non-negative weights minimizing the squared
    relative error of its times (its fields in order: the fixed cost, then one weight per
    entry of a step's `compiled` work)."""
    design = np.array([[1.0, *(1e-3 * np.array(s.compiled, dtype=float))] for s in steps])
    target = np.array(ms) * 1e3
    weights, _ = nnls(design / target[:, None], np.ones(len(steps)))
    default = steps[0].time_model
    names = [f.name for f in dataclasses.fields(default)]
    return dataclasses.replace(default, **{n: float(w) for n, w in zip(names, weights)})


def timed_rows(programs: dict[str, dict[str, Step]], rounds: int,
               model: Any = None) -> list[Row]:
    return [r._replace(name=f"{program}, {r.name}") for program, steps in programs.items()
            for r in rows_against_reinforce(steps, rounds, model)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=12)
    args = ap.parse_args()
    print(f"# explain's CPU time model; {describe_machine()}")
    fitting = bench_steps(fitting=True)
    rows = timed_rows(fitting, args.rounds)
    steps = [s for program in fitting.values() for s in program.values()]
    default = steps[0].time_model  # explain's defaults
    model = fit(steps, [r.ms for r in rows])
    print(f"fitted on {len(steps)} steps: CpuTimeModel(fixed_us={model.fixed_us:.1f}, "
          f"launch_ns={model.launch_ns:.1f}, instruction_ns={model.instruction_ns:.3f}, "
          f"element_ns={model.element_ns:.4f}, looped_ns={model.looped_ns:.3f})")
    print("the fitted steps: " + worst_estimate(timed_rows(fitting, args.rounds, model)))
    print("the same, with the defaults (" + repr(default) + "): "
          + worst_estimate(timed_rows(fitting, args.rounds, default)))
    print("\n| step | ms | µs estimated | × REINFORCE measured | × REINFORCE estimated |")
    print("|---|---|---|---|---|")
    checking = bench_steps(fitting=False)
    rows = timed_rows(checking, args.rounds, model)
    checked = [s for program in checking.values() for s in program.values()]
    for r, s in zip(rows, checked):
        print(f"| {r.name} | {r.ms:.3f} | {model.microseconds(s.compiled):.0f} | "
              f"{r.measured:.2f} | {r.estimated:.2f} |")
    print("the steps it was not fitted on: " + worst_estimate(rows))
    print("the same, with the defaults: "
          + worst_estimate(timed_rows(checking, args.rounds, default)))


if __name__ == "__main__":
    main()
