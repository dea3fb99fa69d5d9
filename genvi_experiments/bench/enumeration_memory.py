"""Memory and time of an enumerated batch of sequences' gradient step: genvi's
forward algorithm with what its backward pass needs recomputed (the default,
`genvi.inference.enum_scan.REMAT`: every step's factors are computed at once and
their intermediates recomputed; a loop over steps keeps only α, O(T × states)) and
stored, beside NumPyro's `TraceEnum_ELBO` on the same model
(`genvi_experiments.bench.enumeration`).

Memory is XLA's own account of the compiled step (`memory_analysis()`: the bytes of
temporaries, which hold what the backward pass keeps); time is the warm median of
interleaved rounds.

    python -m genvi_experiments.bench.enumeration_memory [--sequences 50] [--steps 100]
        [--states 5] [--rounds 15]
"""

from __future__ import annotations

import argparse

import jax

import genvi as gv
from genvi.inference import enum_scan
from genvi_experiments.bench.enumeration import (numpyro_sequences, sequences_data,
                                                 sequences_model)
from genvi_experiments.common.timing import describe_machine, interleaved_medians


def genvi_step(data: jax.Array, states: int, remat: bool):
    """A jitted gradient step of the enumerated model's ELBO, traced with `remat`."""
    enum_scan.REMAT = remat
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
        enum_scan.REMAT = True
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
    remat, remat_c = genvi_step(data, a.states, True)
    stored, stored_c = genvi_step(data, a.states, False)
    svi, _ = numpyro_sequences(data, a.states, 0.05)
    state = svi.init(jax.random.key(0), data)
    update = jax.jit(svi.update)
    numpyro_c = update.lower(state, data).compile()
    jax.block_until_ready(numpyro_c(state, data))
    fns = {"genvi, recomputed": remat, "genvi, stored": stored,
           "NumPyro TraceEnum_ELBO": lambda: numpyro_c(state, data)}
    times = interleaved_medians(fns, rounds=a.rounds, reps=5)
    memory = {"genvi, recomputed": temp_bytes(remat_c),
              "genvi, stored": temp_bytes(stored_c),
              "NumPyro TraceEnum_ELBO": temp_bytes(numpyro_c)}
    base = times["genvi, recomputed"]
    print(f"\n{a.sequences} sequences × {a.steps} steps, {a.states} states: gradient step")
    print(f"{'method':<30} {'ms/step':>8} {'ratio':>6} {'temporaries MiB':>16}")
    for name in fns:
        print(f"{name:<30} {1e3 * times[name]:8.3f} {times[name] / base:6.2f} "
              f"{memory[name] / 2 ** 20:16.2f}")
    return {name: (times[name], memory[name]) for name in fns}


if __name__ == "__main__":
    main()
