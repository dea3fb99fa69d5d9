"""A chain's steps multiplied one after another or in parallel: `gv.enumeration(time=
"sequential")` beside `time="parallel"` on a hidden Markov model (`--states` states,
T steps for each T of `--steps`) and on a batch of `--sequences` such chains, one
jitted gradient of the exact log marginal each, and each value's error against a
float64 numpy forward algorithm (both forms are float32: the error is rounding, which
grows with the number of steps).

Time is the warm median of interleaved rounds; memory is XLA's own account of the
compiled gradient (`memory_analysis()`: the bytes of temporaries, which hold what the
backward pass keeps).

    python -m genvi_experiments.bench.enumeration.chain_time [--steps 1000 10000]
        [--states 3] [--sequences 20] [--rounds 15] [--record]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import genvi as gv
from scipy.special import logsumexp
from scipy.stats import norm

from genvi_experiments.bench.enumeration.mixture_hmm import SD, hmm_step, sticky
from genvi_experiments.bench.results import command, record
from genvi_experiments.common.timing import describe_machine, interleaved_samples, median

TIMES = ("sequential", "parallel")


def model(states: int, batch: bool):
    @gv.gen
    def chain(trans, means, ys):
        gv.scan(hmm_step)((0, trans, means), ys) @ "steps"

    @gv.gen
    def hmm(ys):
        means = gv.normal(jnp.linspace(-2.0, 2.0, states), 1.0) @ "means"
        trans = jnp.asarray(sticky(states), jnp.float32)
        if batch:
            gv.vmap(chain, in_axes=(None, None, 0))(trans, means, ys) @ "seqs"
        else:
            chain(trans, means, ys) @ "chain"
    return hmm


def exact(states: int, ys: np.ndarray) -> float:
    """The log joint at `true_means(states)`, float64: the prior and, per chain, the forward
    algorithm from state 0."""
    means, trans = true_means(states).astype(np.float64), np.log(sticky(states))
    total = norm.logpdf(means, np.linspace(-2.0, 2.0, states), 1.0).sum()
    for y in np.atleast_2d(np.asarray(ys, np.float64)):
        emit = norm.logpdf(y[:, None], means, SD)
        alpha = trans[0] + emit[0]
        for t in range(1, len(y)):
            alpha = logsumexp(alpha[:, None] + trans, axis=0) + emit[t]
        total += logsumexp(alpha)
    return float(total)


def true_means(states: int) -> np.ndarray:
    """Where the gradient is taken: means spread over [-1.5, 1.5]."""
    return np.linspace(-1.5, 1.5, states, dtype=np.float32)


def gradient(states: int, ys: jax.Array, time: str):
    """The compiled value and gradient of the log marginal in the means."""
    summed = gv.marginal(model(states, ys.ndim == 2), keep=["means"],
                         algorithm=gv.enumeration(time=time))
    f = jax.jit(jax.value_and_grad(lambda mu: summed.log_density(gv.choices({"means": mu}), ys)))
    means = jnp.asarray(true_means(states))
    compiled = f.lower(means).compile()
    return (lambda: compiled(means)), compiled


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, nargs="+", default=[1000, 10000])
    p.add_argument("--states", type=int, default=3)
    p.add_argument("--sequences", type=int, default=20)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--record", action="store_true",
                   help="write the table to docs/benchmarks/enumeration.md")
    a = p.parse_args(argv)
    print(describe_machine())
    rng = np.random.default_rng(0)
    rows = []
    for steps in a.steps:
        for batch in (False, True):
            shape = (a.sequences, steps) if batch else (steps,)
            ys = jnp.asarray(rng.normal(size=shape), jnp.float32)
            fns, memory, values = {}, {}, {}
            for time in TIMES:
                fns[time], compiled = gradient(a.states, ys, time)
                memory[time] = compiled.memory_analysis().temp_size_in_bytes
                values[time] = jax.block_until_ready(fns[time]())
            truth = exact(a.states, np.asarray(ys))
            samples = interleaved_samples(fns, rounds=a.rounds, reps=1)
            label = f"{a.sequences} chains × {steps:,} steps" if batch else f"{steps:,} steps"
            for time in TIMES:
                ms = 1e3 * median(samples[time])
                ratio = median([x / y for x, y in zip(samples[time], samples["sequential"])])
                error = abs(float(values[time][0]) - truth) / abs(truth)
                rows.append([label, time, f"{ms:.3f}", f"{ratio:.2f}",
                             f"{memory[time] / 2 ** 20:.2f}", f"{error:.1e}"])
                print(" | ".join(rows[-1]), flush=True)
    header = ["chain", "time product", "ms / gradient", "× sequential", "temporaries MiB",
              "relative error of log p"]
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    if a.record:
        record("enumeration_time", command("enumeration.chain_time", argv), header, rows)
    return {"rows": rows}


if __name__ == "__main__":
    main()
