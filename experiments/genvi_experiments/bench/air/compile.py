"""Where compiling AIR's training step goes: for each estimator, the seconds spent
tracing the objective (genvi's ADEV interpreter runs here), lowering to StableHLO and
compiling in XLA's CPU backend, the program's size, the warm step time, and the
compile of the evaluation function (`genvi run air` compiles both); optionally under
other XLA flags, each in a fresh process. With `--phases`, the XLA compile runs under
JAX's profiler and the table adds where XLA:CPU spends it: its HLO passes, emitting the
thunk program, and generating machine code for each kernel (wall seconds, the number of
kernels and the CPU milliseconds per kernel). The phases are read from XLA's own trace
events, whose names are those of the pinned jaxlib.

    python -m genvi_experiments.bench.air.compile [--estimators reinforce mvd iwelbo_mvd]
    python -m genvi_experiments.bench.air.compile --xla-flags "--xla_backend_optimization_level=0"
    python -m genvi_experiments.bench.air.compile --phases
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import os
import subprocess
import sys
import tempfile
import time

DEFAULT = ["reinforce", "mvd", "iwelbo_mvd"]


def xla_phases(trace_dir: str) -> dict:
    """XLA:CPU's compile phases from a profiler trace of one compile: seconds of HLO
    passes and of thunk emission, wall seconds of kernel code generation, the kernels
    compiled, and CPU milliseconds per kernel (its fusion emitter and LLVM together)."""
    from jax.profiler import ProfileData

    (path,) = glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True)
    wall: dict = {}
    kernels, kernel_ns = 0, 0
    for plane in ProfileData.from_file(path).planes:
        for line in plane.lines:
            for ev in line.events:
                wall[ev.name] = wall.get(ev.name, 0) + ev.duration_ns
                if ev.name == "FusionCompiler::Compile":
                    kernels += 1
                if ev.name in ("FusionCompiler::Compile", "TaskDispatcher::dispatch"):
                    kernel_ns += ev.duration_ns
    passes = sum(ns for n, ns in wall.items() if n.startswith("HLO passes"))
    return {"hlo_passes": passes / 1e9, "thunks": wall.get("ThunkEmitter::EmitEntryComputation", 0) / 1e9,
            "codegen": wall.get("Codegen", 0) / 1e9, "kernels": kernels,
            "ms_per_kernel": kernel_ns / 1e6 / max(kernels, 1)}


def measure(name: str, chunk: int = 100, phases: bool = False) -> dict:
    """Phase times (seconds) of one estimator's jitted chunk of `chunk` steps."""
    import jax
    import jax.numpy as jnp

    import genvi as gv
    from genvi_experiments.air.config import AIRConfig
    from genvi_experiments.air.data import make_canvases
    from genvi_experiments.air.estimators import ESTIMATORS, air_objective, count_objects
    from genvi_experiments.air.model import AIRNets
    from genvi_experiments.air.train import air_optimizer, make_step

    cfg = AIRConfig()
    data = make_canvases(train=500, test=200, seed=0)
    nets = AIRNets(cfg)
    objective, model, guide = air_objective(cfg, nets, name)
    params = nets.init(jax.random.key(0), baseline=ESTIMATORS[name].baseline)
    optimizer = air_optimizer(cfg)
    state = optimizer.init(params)
    step = make_step(objective, optimizer, jnp.asarray(data.train), 64)
    run = jax.jit(lambda p, s, k: jax.lax.scan(step, (p, s), jax.random.split(k, chunk)))
    t0 = time.perf_counter()
    traced = run.trace(params, state, jax.random.key(1))
    t1 = time.perf_counter()
    lowered = traced.lower()
    trace_dir = tempfile.mkdtemp() if phases else None
    with jax.profiler.trace(trace_dir) if phases else contextlib.nullcontext():
        t2 = time.perf_counter()
        compiled = lowered.compile()
        t3 = time.perf_counter()
    jax.block_until_ready(compiled(params, state, jax.random.key(2)))
    t4 = time.perf_counter()
    jax.block_until_ready(compiled(params, state, jax.random.key(3)))
    t5 = time.perf_counter()
    elbo = gv.batch_mean(gv.elbo(model, guide))
    test = jnp.asarray(data.test)
    evaluate = jax.jit(lambda p, k: (count_objects(guide, p, test, k), elbo.estimate(k, p, test)))
    t6 = time.perf_counter()
    evaluate.lower(params, jax.random.key(0)).compile()
    t7 = time.perf_counter()
    return {"trace": t1 - t0, "lower": t2 - t1, "xla": t3 - t2, "hlo_lines": lowered.as_text().count("\n"),
            "step_ms": 1e3 * (t5 - t4) / chunk, "eval_compile": t7 - t6,
            **(xla_phases(trace_dir) if phases else {})}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--estimators", nargs="+", default=DEFAULT)
    ap.add_argument("--xla-flags", default=None, help="run in a fresh process with these XLA_FLAGS")
    ap.add_argument("--phases", action="store_true",
                    help="profile the XLA compile and add its phases to the table")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # the child process
    args = ap.parse_args(argv)
    if args.one:
        r = measure(args.one, phases=args.phases)
        row = (f"| {args.one} | {os.environ.get('XLA_FLAGS') or '(none)'} | {r['trace']:.1f} | "
               f"{r['lower']:.1f} | {r['xla']:.1f} | {r['hlo_lines']} | {r['step_ms']:.1f} | "
               f"{r['eval_compile']:.1f} |")
        if args.phases:
            row += (f" {r['hlo_passes']:.2f} | {r['thunks']:.2f} | {r['codegen']:.2f} | "
                    f"{r['kernels']} | {r['ms_per_kernel']:.1f} |")
        print(row, flush=True)
        return
    head = ("| estimator | XLA_FLAGS | trace s | lower s | XLA compile s | StableHLO lines | "
            "step ms | evaluation compile s |")
    if args.phases:
        head += (" HLO passes s | thunk emission s | kernel codegen s (wall) | kernels | "
                 "CPU ms per kernel |")
    print(head + "\n" + "|---" * (head.count("|") - 1) + "|", flush=True)
    env = dict(os.environ, **({"XLA_FLAGS": args.xla_flags} if args.xla_flags else {}))
    for name in args.estimators:  # a fresh process each: no cache shared between them
        subprocess.run([sys.executable, "-m", "genvi_experiments.bench.air.compile", "--one", name]
                       + (["--phases"] if args.phases else []), env=env, check=True)


if __name__ == "__main__":
    main()
