"""Where the automatic guides start, and where their fits end: stochastic volatility
(NumPyro's example model, `--days` simulated days) fitted by a mean-field normal guide
on the ELBO and a low-rank guide (rank 10) on a Rényi bound (α = 0.5, 8 particles),
from genvi's default start (`gv.init_to_uniform()`, as NumPyro's), from the prior
median (`gv.init_to_median()`, genvi's default before 2026-11-26 and Pyro's) and
NumPyro's own default; the same optimizer and steps for all. Each fit's ELBO is
estimated from `--draws` draws of its guide; each row fits from `--seeds` random
starts (seed s: the guide's initialization key and the fit's key) and reports the
mean and standard deviation of their ELBOs and their range, since a fit's end moves
with its start by more than the estimates' standard errors.

    python -m genvi_experiments.bench.peers.guide_starts [--days 2500] [--steps 5000]
        [--draws 2000] [--seeds 4] [--record]

`--record` writes the table to docs/benchmarks/peers.md through `genvi_experiments.bench.results`.
"""

from __future__ import annotations

import argparse
from typing import Callable

import jax
import numpy as np
import optax

import genvi as gv
from genvi_experiments.bench.peers.stochastic_volatility import by_walk, numpyro_model, returns_data
from genvi_experiments.bench.results import command, record
from genvi_experiments.common.timing import describe_machine

RANK = 10
#: a start rule, what `gv.init_to_uniform()` and `gv.init_to_median()` return
InitRule = Callable[..., jax.Array]
FAMILIES = {"mean-field, ELBO": (gv.auto_normal, lambda auto: gv.elbo(by_walk, auto)),
            f"low rank ({RANK}), Rényi α = 0.5, 8 particles": (
                lambda m, **kw: gv.auto_low_rank(m, RANK, **kw),
                lambda auto: gv.renyi(by_walk, auto, 0.5, 8))}


def genvi_fit(family: str, init: InitRule | None, data: jax.Array,
              steps: int, draws: int, seed: int) -> float:
    make, objective = FAMILIES[family]
    auto = make(by_walk) if init is None else make(by_walk, init=init)
    params = {"guide": auto.init(jax.random.key(seed), {}, data)}
    result = gv.fit(objective(auto), params, data, steps=steps, key=jax.random.key(seed + 1),
                    optimizer=optax.adam(optax.cosine_decay_schedule(0.02, steps)),
                    progress=False)
    elbo = gv.elbo(by_walk, auto)
    keys = jax.random.split(jax.random.key(5), draws)
    return float(jax.jit(jax.vmap(lambda k: elbo.estimate(k, result.params, data)))(keys).mean())


def numpyro_fit(family: str, data: jax.Array, steps: int, draws: int, seed: int) -> float:
    from numpyro.infer import SVI, RenyiELBO, Trace_ELBO  # noqa: PLC0415
    from numpyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoNormal  # noqa: PLC0415

    model = numpyro_model
    guide, loss = ((AutoNormal(model), Trace_ELBO()) if family.startswith("mean-field")
                   else (AutoLowRankMultivariateNormal(model, rank=RANK),
                         RenyiELBO(alpha=0.5, num_particles=8)))
    svi = SVI(model, guide, optax.adam(optax.cosine_decay_schedule(0.02, steps)), loss)
    params = svi.run(jax.random.key(seed + 1), steps, data, progress_bar=False).params
    keys = jax.random.split(jax.random.key(5), draws)
    elbo = jax.jit(jax.vmap(lambda k: -Trace_ELBO().loss(k, params, model, guide, data)))
    return float(elbo(keys).mean())


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--days", type=int, default=2500)
    p.add_argument("--steps", type=int, default=5000)
    p.add_argument("--draws", type=int, default=2000)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--record", action="store_true",
                   help="write the table to docs/benchmarks/peers.md")
    a = p.parse_args(argv)
    print(describe_machine())
    data = returns_data(a.days)
    starts = {"genvi, default (init_to_uniform)": lambda f, s: genvi_fit(
                  f, None, data, a.steps, a.draws, s),
              "genvi, init_to_median": lambda f, s: genvi_fit(
                  f, gv.init_to_median(), data, a.steps, a.draws, s),
              "NumPyro, default (init_to_uniform)": lambda f, s: numpyro_fit(
                  f, data, a.steps, a.draws, s)}
    out = {(family, start): np.array([fit(family, seed) for seed in range(a.seeds)])
           for family in FAMILIES for start, fit in starts.items()}
    print(f"\nstochastic volatility, {a.days} days, {a.steps} steps: ELBO of the fitted guide, "
          f"{a.seeds} starts")
    rows = [[family, start, f"{v.mean():,.0f} ± {v.std(ddof=1) if v.size > 1 else 0.0:,.0f}",
             f"{v.min():,.0f} … {v.max():,.0f}"] for (family, start), v in out.items()]
    for row in rows:
        print(f"{row[0]:<44} {row[1]:<36} {row[2]:>16} {row[3]:>20}")
    if a.record:
        record("guide_starts", command("peers.guide_starts", argv),
               ["guide, objective", "start", "ELBO, mean ± sd over starts", "range"], rows)
    return out


if __name__ == "__main__":
    main()
