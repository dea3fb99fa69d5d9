"""Memory and time of an enumerated batch of sequences' gradient step: genvi's
forward algorithm with every step's factors computed at once and kept (what it does
where they fit in `genvi.inference.enumeration.time.FACTORS_BUDGET` numbers), and in blocks
of `BLOCK` steps recomputed in the backward pass (what it does for longer chains:
O(T / BLOCK × states) kept per sequence), beside NumPyro's on the same model
(`genvi_experiments.bench.enumeration.mixture_hmm`'s rows: `TraceEnum_ELBO` of the `scan`, of a
`markov` loop, and the exact enumeration).

Memory is XLA's own account of the compiled step (`memory_analysis()`: the bytes of
temporaries, which hold what the backward pass keeps); time is the warm median of
interleaved rounds.

    python -m genvi_experiments.bench.enumeration.memory [--sequences 50] [--steps 100]
        [--states 5] [--rounds 15]
"""

from __future__ import annotations

import argparse

import jax

import genvi as gv
from genvi.inference.enumeration import time as chain_algebra
from genvi_experiments.bench.enumeration.mixture_hmm import (numpyro_methods, sequences_data,
                                                             sequences_model)
from genvi_experiments.common.timing import describe_machine, interleaved_medians


def genvi_step(data: jax.Array, states: int, blocked: bool):
    """A jitted gradient step of the enumerated model's ELBO, its chain in blocks
    (`blocked`) or all at once."""
    budget = chain_algebra.FACTORS_BUDGET
    chain_algebra.FACTORS_BUDGET = 0 if blocked else budget
    try:
        summed = gv.marginal(sequences_model(states), keep=["trans", "means"],
                             algorithm=gv.enumeration())
        auto = gv.auto_normal(summed)
        params = {"guide": auto.init(jax.random.key(0), {}, data)}
        objective = gv.elbo(summed, auto)
        step = jax.jit(lambda p, k: objective.grad_estimate(k, p, data))
        compiled = step.lower(params, jax.random.key(1)).compile()
        jax.block_until_ready(compiled(params, jax.random.key(1)))
    finally:
        chain_algebra.FACTORS_BUDGET = budget
    return (lambda: compiled(params, jax.random.key(1))), compiled


def temp_bytes(compiled) -> int:
    return int(compiled.memory_analysis().temp_size_in_bytes)


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sequences", type=int, default=50)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--states", type=int, default=5)
    p.add_argument("--rounds", type=int, default=15)
    a = p.parse_args(argv)
    print(describe_machine())
    data = sequences_data(a.sequences, a.steps, a.states)
    kept, kept_c = genvi_step(data, a.states, False)
    blocked, blocked_c = genvi_step(data, a.states, True)
    fns = {"genvi, factors kept": kept, "genvi, blocks recomputed": blocked}
    memory = {"genvi, factors kept": temp_bytes(kept_c),
              "genvi, blocks recomputed": temp_bytes(blocked_c)}
    # NumPyro's TraceEnum_ELBO (not the log marginal on a scan: see `mixture_hmm`), as a
    # markov loop, and its exact enumeration
    rows, _ = numpyro_methods("sequences", data, 0.05, a.states, jax.random.key(0))
    for name, (step, start, _, _) in rows.items():
        compiled = step.lower(start).compile()
        jax.block_until_ready(compiled(start))
        fns[name] = (lambda c=compiled, s=start: c(s))
        memory[name] = temp_bytes(compiled)
    times = interleaved_medians(fns, rounds=a.rounds, reps=5)
    base = times["genvi, factors kept"]
    print(f"\n{a.sequences} sequences × {a.steps} steps, {a.states} states: gradient step")
    print(f"{'method':<30} {'ms/step':>8} {'ratio':>6} {'temporaries MiB':>16}")
    for name in fns:
        print(f"{name:<30} {1e3 * times[name]:8.3f} {times[name] / base:6.2f} "
              f"{memory[name] / 2 ** 20:16.2f}")
    return {name: (times[name], memory[name]) for name in fns}


if __name__ == "__main__":
    main()
