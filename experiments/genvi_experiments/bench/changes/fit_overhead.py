"""`gv.fit`'s cost beyond its steps: a fit of a tiny model (the conjugate Gaussian pair,
a step of a few microseconds, where any per-call cost shows) against the same steps in
one hand-written `jax.lax.scan` over `gv.training_step`, and with a checkpoint every
1,000 steps. Interleaved, warm, median; prints microseconds per step and the ratio to
the hand-written loop. Run it at two commits with `genvi_experiments.bench.against`
to see what a change to the loop costs.

    python -m genvi_experiments.bench.changes.fit_overhead [--steps 20000] [--rounds 7]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile

import jax
import jax.numpy as jnp
import optax

import genvi as gv
from genvi_experiments.common.timing import describe_machine, interleaved_samples, median


@gv.gen
def model(p, y):
    z = gv.normal(0.0, 1.0) @ "z"
    gv.observe(gv.normal(z, 1.0), y)


@gv.gen
def guide(p, y):
    gv.normal(p["m"], jnp.exp(p["s"]), grad=gv.REPARAM) @ "z"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)
    objective, optimizer, start = gv.elbo(model, guide), optax.adam(0.01), {"m": 0.0, "s": 0.0}
    folder = tempfile.mkdtemp()

    def fit(**kw):
        return jax.block_until_ready(gv.fit(objective, start, 1.0, optimizer=optimizer,
                                            steps=args.steps, key=jax.random.key(0),
                                            progress=False, **kw).params)

    def checkpointed():
        shutil.rmtree(folder, ignore_errors=True)
        return fit(checkpoints=gv.Checkpoints(folder, every=1000))

    init, step = gv.training_step(objective, optimizer)
    scanned = jax.jit(lambda s: jax.lax.scan(lambda s, _: step(s, 1.0), s, None,
                                             length=args.steps))

    def by_hand():
        return jax.block_until_ready(scanned(init(start, jax.random.key(0)))[0].params)

    runs = {"hand-written lax.scan": by_hand, "gv.fit": fit,
            "gv.fit, a checkpoint every 1,000": checkpointed}
    samples = interleaved_samples(runs, rounds=args.rounds, reps=1)
    base = median(samples["hand-written lax.scan"])
    print(f"{args.steps} steps of the conjugate Gaussian pair; {describe_machine()}\n")
    print("| run | µs per step | × hand-written |")
    print("|---|---|---|")
    for name, times in samples.items():
        print(f"| {name} | {1e6 * median(times) / args.steps:.2f} | "
              f"{median(times) / base:.2f} |")
    shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
