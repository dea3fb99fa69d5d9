"""NumPyro's examples, written once in NumPyro, fitted by NumPyro's SVI and by genvi
through `gv.from_numpyro`: the ELBO each fit reaches from its library's default start,
over seeds, and the warm time of a training step in a compiled loop of steps (as
`gv.fit` and `SVI.run` run them), interleaved, with the same guide
family (a mean-field normal: NumPyro's `AutoNormal`, genvi's `gv.auto_normal`) and
the same Adam.

The examples: eight schools (non-centred), horseshoe regression, a Gaussian mixture
whose assignments are summed out (NumPyro's `TraceEnum_ELBO`; genvi's
`gv.marginal(..., gv.enumeration())`), stochastic volatility (`GaussianRandomWalk`), and
an HMM written with `contrib.control_flow.scan` whose states are summed out. NumPyro's
`TraceEnum_ELBO` on a `scan` is not exact (docs/from_numpyro.md), so NumPyro fits the
same HMM written as a Python loop under `markov`, its exact form; genvi runs the `scan`
model as written.

Each fit's ELBO is the mean of `--draws` single-draw estimates at its final parameters
under its own library's objective (NumPyro's with `num_particles=draws`).

    python -m genvi_experiments.bench.peers.from_numpyro [--examples eight_schools ...]
        [--steps 3000] [--seeds 3] [--rounds 20] [--draws 2000] [--record]

`--record` writes the table to docs/benchmarks/peers.md through `genvi_experiments.bench.results`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
from numpyro.contrib.control_flow import scan
from numpyro.infer import SVI, Trace_ELBO, TraceEnum_ELBO
from numpyro.infer.autoguide import AutoNormal

import genvi as gv
from genvi_experiments.bench.peers.horseshoe import regression_data
from genvi_experiments.bench.peers.stochastic_volatility import returns_data
from genvi_experiments.bench.results import command, record
from genvi_experiments.common.timing import describe_machine, interleaved_samples, median, \
    paired_ratio


# ---- the examples, in NumPyro ----------------------------------------------------------
def eight_schools(sigma, y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", y.shape[0]):
        theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0))
        numpyro.sample("y", dist.Normal(mu + tau * theta_tilde, sigma), obs=y)


def horseshoe(x, y):
    with numpyro.plate("features", x.shape[1]):
        lambdas = numpyro.sample("lambdas", dist.HalfCauchy(1.0))
        unscaled = numpyro.sample("unscaled_betas", dist.Normal(0.0, 1.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(1.0))
    betas = numpyro.deterministic("betas", tau * lambdas * unscaled)
    precision = numpyro.sample("prec_obs", dist.Gamma(3.0, 1.0))
    with numpyro.plate("data", x.shape[0]):
        numpyro.sample("obs", dist.Normal(x @ betas, 1.0 / jnp.sqrt(precision)), obs=y)


def mixture(y):
    k = 3
    weights = numpyro.sample("weights", dist.Dirichlet(0.5 * jnp.ones(k)))
    locs = numpyro.sample("locs", dist.Normal(0.0, 10.0).expand([k]).to_event(1))
    scale = numpyro.sample("scale", dist.LogNormal(0.0, 2.0))
    with numpyro.plate("data", y.shape[0]):
        z = numpyro.sample("z", dist.Categorical(weights), infer={"enumerate": "parallel"})
        numpyro.sample("obs", dist.Normal(locs[z], scale), obs=y)


def volatility(returns):
    sigma = numpyro.sample("sigma", dist.Exponential(50.0))
    s = numpyro.sample("s", dist.GaussianRandomWalk(scale=sigma, num_steps=returns.shape[0]))
    nu = numpyro.sample("nu", dist.Exponential(0.1))
    numpyro.sample("r", dist.StudentT(df=nu, loc=0.0, scale=jnp.exp(s)), obs=returns)


STATES = 3


def _hmm_parameters():
    probs = numpyro.sample("probs", dist.Dirichlet(0.9 * jnp.eye(STATES) + 0.1).to_event(1))
    locs = numpyro.sample("locs", dist.Normal(0.0, 3.0).expand([STATES]).to_event(1))
    return probs, locs


def hmm(ys):
    probs, locs = _hmm_parameters()

    def step(z, y):
        z = numpyro.sample("z", dist.Categorical(probs[z]), infer={"enumerate": "parallel"})
        numpyro.sample("y", dist.Normal(locs[z], 1.0), obs=y)
        return z, None
    scan(step, 0, ys)


def hmm_markov(ys):
    """The same HMM as a Python loop under `markov`: NumPyro's exact enumerated form."""
    from numpyro.contrib.funsor import markov  # noqa: PLC0415 - funsor: enumeration only
    probs, locs = _hmm_parameters()
    z = 0
    for t in markov(range(ys.shape[0])):
        z = numpyro.sample(f"z_{t}", dist.Categorical(probs[z]),
                           infer={"enumerate": "parallel"})
        numpyro.sample(f"y_{t}", dist.Normal(locs[z], 1.0), obs=ys[t])


# ---- data ---------------------------------------------------------------------------------
def hmm_data(t: int = 100, seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    trans = 0.8 * np.eye(STATES) + 0.2 / STATES
    z, out = 0, []
    for _ in range(t):
        z = rng.choice(STATES, p=trans[z])
        out.append(rng.normal([-2.0, 0.0, 2.5][z], 1.0))
    return jnp.asarray(out, jnp.float32)


def mixture_data(n: int = 300, seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    z = rng.choice(3, n, p=[0.3, 0.5, 0.2])
    return jnp.asarray(rng.normal(np.array([-4.0, 0.0, 5.0])[z], 1.0), jnp.float32)


@dataclass
class Example:
    model: Callable
    data: tuple
    summed: tuple = ()              # discrete sites summed out (enumerated)
    numpyro_model: Callable | None = None   # NumPyro's exact form where it differs
    lr: float = 0.01


def examples() -> dict[str, Example]:
    x, y = regression_data(200, 20)
    sigma = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
    schools = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
    return {"eight_schools": Example(eight_schools, (sigma, schools), lr=0.02),
            "horseshoe": Example(horseshoe, (x, y)),
            "mixture": Example(mixture, (mixture_data(),), ("z",), lr=0.05),
            "stochastic_volatility": Example(volatility, (returns_data(500),)),
            "hmm_scan": Example(hmm, (hmm_data(),), ("z",), hmm_markov, lr=0.02)}


# ---- the two libraries ---------------------------------------------------------------
def genvi_setup(ex: Example) -> tuple[Any, Any]:
    """(objective, guide) of genvi on the example as NumPyro wrote it."""
    program = gv.from_numpyro(ex.model)
    if ex.summed:
        kept = [name for name in program.simulate(jax.random.key(0), {}, *ex.data).choices
                .flat() if name[0] not in ex.summed]
        program = gv.marginal(program, keep=["/".join(k) for k in kept],
                              algorithm=gv.enumeration())
    auto = gv.auto_normal(program)
    return gv.elbo(program, auto), auto


def numpyro_setup(ex: Example) -> tuple[Any, Any, Any]:
    """(model, guide, loss) of NumPyro's SVI on the example."""
    model = ex.numpyro_model or ex.model
    if ex.summed:
        hidden = numpyro.handlers.block(
            model, hide_fn=lambda site: any(site.get("name", "").split("_")[0] == s for s in ex.summed))
        return model, AutoNormal(hidden), TraceEnum_ELBO()
    return model, AutoNormal(model), Trace_ELBO()


def genvi_fit(ex: Example, steps: int, seed: int, draws: int) -> float:
    objective, auto = genvi_setup(ex)
    params = {"guide": auto.init(jax.random.key(seed), {}, *ex.data)}
    fit = gv.fit(objective, params, *ex.data, optimizer=optax.adam(ex.lr), steps=steps,
                 key=jax.random.key(seed + 100), progress=False)
    keys = jax.random.split(jax.random.key(seed + 200), draws)
    values = jax.jit(jax.vmap(lambda k: objective.estimate(k, fit.params, *ex.data)))(keys)
    return float(jnp.mean(values))


def numpyro_fit(ex: Example, steps: int, seed: int, draws: int) -> float:
    model, guide, loss = numpyro_setup(ex)
    svi = SVI(model, guide, optax.adam(ex.lr), loss)
    result = svi.run(jax.random.key(seed), steps, *ex.data, progress_bar=False)
    many = type(loss)(num_particles=draws, vectorize_particles=True)  # the mean of draws
    return -float(many.loss(jax.random.key(seed + 200), result.params, model, guide, *ex.data))


LOOP = 200   # steps per timed call: both libraries fit in a compiled loop of steps


def step_functions(ex: Example) -> dict[str, Callable[[], Any]]:
    """`LOOP` training steps of each library in one compiled `lax.scan` (as `gv.fit` and
    NumPyro's `SVI.run` loop), warm: a closure that runs them."""
    objective, auto = genvi_setup(ex)
    init, step = gv.training_step(objective, optax.adam(ex.lr))
    state = init({"guide": auto.init(jax.random.key(0), {}, *ex.data)}, jax.random.key(1))
    genvi_loop = jax.jit(lambda s: jax.lax.scan(
        lambda s, _: (step(s, *ex.data)[0], None), s, None, length=LOOP)[0])
    jax.block_until_ready(genvi_loop(state))
    model, guide, loss = numpyro_setup(ex)
    svi = SVI(model, guide, optax.adam(ex.lr), loss)
    svi_state = svi.init(jax.random.key(0), *ex.data)
    numpyro_loop = jax.jit(lambda s: jax.lax.scan(
        lambda s, _: (svi.update(s, *ex.data)[0], None), s, None, length=LOOP)[0])
    jax.block_until_ready(numpyro_loop(svi_state))
    return {"genvi": lambda: genvi_loop(state), "NumPyro": lambda: numpyro_loop(svi_state)}


def measured(fits: dict[str, Callable[[int], float]], steps: Callable[[], dict],
             seeds: int, rounds: int) -> dict:
    """Each library's ELBO over seeds (`fits[library](seed)`) and the warm time of its
    step (`steps()`: `step_functions`' closures), interleaved: `elbo`, `ms` per step,
    the paired `ratio` genvi ÷ NumPyro, and the table's `cells` (ELBOs, µs, ratio)."""
    elbos = {name: [fit(seed) for seed in range(seeds)] for name, fit in fits.items()}
    samples = interleaved_samples(steps(), rounds=rounds, reps=2)
    ms = {k: 1e3 * median(v) / LOOP for k, v in samples.items()}
    ratio = paired_ratio(samples, "genvi", "NumPyro")
    shown = {k: " / ".join(f"{v:,.1f}" for v in vals) for k, vals in elbos.items()}
    cells = [shown["genvi"], shown["NumPyro"], f"{1e3 * ms['genvi']:.1f}",
             f"{1e3 * ms['NumPyro']:.1f}", f"{ratio:.2f}"]
    return {"elbo": elbos, "ms": ms, "ratio": ratio, "cells": cells}


def fit_arguments(p: argparse.ArgumentParser, steps: int, seeds: int, rounds: int,
                  draws: int) -> None:
    """The options these comparisons share, with their defaults."""
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--seeds", type=int, default=seeds)
    p.add_argument("--rounds", type=int, default=rounds)
    p.add_argument("--draws", type=int, default=draws)
    p.add_argument("--record", action="store_true",
                   help="write the table to docs/benchmarks/peers.md")


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--examples", nargs="*", default=list(examples()))
    fit_arguments(p, steps=3000, seeds=3, rounds=20, draws=2000)
    a = p.parse_args(argv)
    print(describe_machine())
    table = examples()
    out, rows = {}, []
    for name in a.examples:
        ex = table[name]
        out[name] = result = measured(
            {"genvi": lambda seed: genvi_fit(ex, a.steps, seed, a.draws),
             "NumPyro": lambda seed: numpyro_fit(ex, a.steps, seed, a.draws)},
            lambda: step_functions(ex), a.seeds, a.rounds)
        print(f"{name}: " + " | ".join(result["cells"]))
        rows.append([name] + result["cells"])
    if a.record:
        record("from_numpyro", command("peers.from_numpyro", argv),
               ["example", "ELBO, genvi (seeds)", "ELBO, NumPyro SVI (seeds)",
                "genvi step (µs)", "NumPyro step (µs)", "genvi ÷ NumPyro"], rows)
    return out


if __name__ == "__main__":
    main()
