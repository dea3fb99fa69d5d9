"""NumPyro's own autoguides, run by genvi as they are (`gv.from_numpyro(AutoX(model))`)
beside NumPyro's SVI with the same autoguide, on NumPyro's examples: the ELBO each fit
reaches from the same start (the one NumPyro's `SVI.init` draws for the seed), over
seeds, and the warm time of a training
step in a compiled loop of steps (as `gv.fit` and `SVI.run` run them), interleaved,
with the same Adam. The examples are `peers.from_numpyro`'s whose sites are all
continuous (eight schools, horseshoe regression, stochastic volatility).

Each fit's ELBO is the mean of `--draws` single-draw estimates at its final parameters
under its own library's objective (NumPyro's with `num_particles=draws`).

    python -m genvi_experiments.bench.peers.autoguides [--examples eight_schools ...]
        [--guides AutoNormal AutoDiagonalNormal ...] [--steps 2000] [--seeds 2]
        [--rounds 10] [--draws 1000] [--record]

`--record` writes the table to docs/benchmarks/peers.md through `genvi_experiments.bench.results`.
"""

from __future__ import annotations

import argparse
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from numpyro.infer import SVI, Trace_ELBO, autoguide

import genvi as gv
from genvi_experiments.bench.peers.from_numpyro import (LOOP, Example, examples, fit_arguments,
                                                      measured)
from genvi_experiments.bench.results import command, record
from genvi_experiments.common.timing import describe_machine

GUIDES = ("AutoNormal", "AutoDiagonalNormal", "AutoMultivariateNormal",
          "AutoLowRankMultivariateNormal")
EXAMPLES = ("eight_schools", "horseshoe", "stochastic_volatility")


def genvi_setup(ex: Example, guide: str, seed: int) -> tuple[Any, Any]:
    """(objective, initial parameters) of genvi with NumPyro's autoguide `guide`, from
    the start NumPyro's `SVI.init` draws with the same seed (its unconstrained values,
    which genvi stores as NumPyro does), so both libraries start alike."""
    instance = getattr(autoguide, guide)(ex.model)
    svi = SVI(ex.model, instance, optax.adam(ex.lr), Trace_ELBO())
    start = svi.optim.get_params(svi.init(jax.random.key(seed), *ex.data).optim_state)
    q = gv.from_numpyro(instance, strategies=gv.REPARAM)
    params = q.init(jax.random.key(seed), *ex.data)
    params = {name: jax.tree_util.tree_unflatten(jax.tree_util.tree_structure(value),
                                                 [start[name]])
              for name, value in params.items()}
    return gv.elbo(gv.from_numpyro(ex.model), q), params


def genvi_fit(ex: Example, guide: str, steps: int, seed: int, draws: int) -> float:
    objective, params = genvi_setup(ex, guide, seed)
    fit = gv.fit(objective, params, *ex.data, optimizer=optax.adam(ex.lr), steps=steps,
                 key=jax.random.key(seed + 100), progress=False)
    keys = jax.random.split(jax.random.key(seed + 200), draws)
    values = jax.jit(jax.vmap(lambda k: objective.estimate(k, fit.params, *ex.data)))(keys)
    return float(jnp.mean(values))


def numpyro_fit(ex: Example, guide: str, steps: int, seed: int, draws: int) -> float:
    q = getattr(autoguide, guide)(ex.model)
    svi = SVI(ex.model, q, optax.adam(ex.lr), Trace_ELBO())
    result = svi.run(jax.random.key(seed), steps, *ex.data, progress_bar=False)
    many = Trace_ELBO(num_particles=draws, vectorize_particles=True)
    return -float(many.loss(jax.random.key(seed + 200), result.params, ex.model, q, *ex.data))


def step_functions(ex: Example, guide: str) -> dict[str, Callable[[], Any]]:
    """`LOOP` training steps of each library in one compiled `lax.scan`, warm."""
    objective, params = genvi_setup(ex, guide, 0)
    init, step = gv.training_step(objective, optax.adam(ex.lr))
    state = init(params, jax.random.key(1))
    genvi_loop = jax.jit(lambda s: jax.lax.scan(
        lambda s, _: (step(s, *ex.data)[0], None), s, None, length=LOOP)[0])
    jax.block_until_ready(genvi_loop(state))
    svi = SVI(ex.model, getattr(autoguide, guide)(ex.model), optax.adam(ex.lr), Trace_ELBO())
    svi_state = svi.init(jax.random.key(0), *ex.data)
    numpyro_loop = jax.jit(lambda s: jax.lax.scan(
        lambda s, _: (svi.update(s, *ex.data)[0], None), s, None, length=LOOP)[0])
    jax.block_until_ready(numpyro_loop(svi_state))
    return {"genvi": lambda: genvi_loop(state), "NumPyro": lambda: numpyro_loop(svi_state)}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", nargs="*", default=list(EXAMPLES))
    p.add_argument("--guides", nargs="*", default=list(GUIDES))
    fit_arguments(p, steps=2000, seeds=2, rounds=10, draws=1000)
    a = p.parse_args(argv)
    print(describe_machine())
    table = examples()
    out, rows = {}, []
    for name in a.examples:
        for guide in a.guides:
            ex = table[name]
            out[(name, guide)] = result = measured(
                {"genvi": lambda seed: genvi_fit(ex, guide, a.steps, seed, a.draws),
                 "NumPyro": lambda seed: numpyro_fit(ex, guide, a.steps, seed, a.draws)},
                lambda: step_functions(ex, guide), a.seeds, a.rounds)
            print(f"{name}, {guide}: " + " | ".join(result["cells"]))
            rows.append([name, guide] + result["cells"])
    if a.record:
        record("numpyro_autoguides", command("peers.autoguides", argv),
               ["example", "autoguide", "ELBO, genvi (seeds)", "ELBO, NumPyro SVI (seeds)",
                "genvi step (µs)", "NumPyro step (µs)", "genvi ÷ NumPyro"], rows)
    return out


if __name__ == "__main__":
    main()
