"""Stochastic volatility (NumPyro's example model) with its latent log-volatility path
as one `gv.gaussian_random_walk` site, as a `gv.scan` of normal steps, and in NumPyro
(`dist.GaussianRandomWalk`): the warm time of one jitted gradient step of the ELBO
and of a Rényi bound (α = 0.5) with 8 particles, under a mean-field normal guide
(`gv.auto_normal`, NumPyro's `AutoNormal`) and a low-rank one (`gv.auto_low_rank`,
`AutoLowRankMultivariateNormal`, rank `--rank`); interleaved rounds, medians, ratios to
the walk's step with the same guide and objective. The returns are simulated from the
model (`--steps` days, seed 0).

    python -m genvi_experiments.bench.peers.stochastic_volatility [--steps 500] [--rounds 20]
        [--rank 10] [--record]

`--record` writes the summary table to docs/benchmarks/peers.md through
`genvi_experiments.bench.results`.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import genvi as gv
from genvi_experiments.bench.results import command, record
from genvi_experiments.common.timing import describe_machine, interleaved_medians


def returns_data(days: int, seed: int = 0) -> jax.Array:
    rng = np.random.default_rng(seed)
    s = np.cumsum(0.05 * rng.normal(size=days)) - 4.0
    return jnp.asarray(np.exp(s) * rng.standard_t(8.0, size=days), jnp.float32)


@gv.gen
def by_walk(params, returns):
    sigma = gv.exponential(50.0) @ "sigma"
    s = gv.gaussian_random_walk(sigma, num_steps=returns.shape[0]) @ "s"
    nu = gv.exponential(0.1) @ "nu"
    gv.observe(gv.student_t(nu, 0.0, jnp.exp(s)), returns)


@gv.gen
def volatility_step(carry, _):
    s_prev, sigma = carry
    s = gv.normal(s_prev, sigma) @ "s"
    return (s, sigma), s


@gv.gen
def by_scan(params, returns):
    sigma = gv.exponential(50.0) @ "sigma"
    _, s = gv.scan(volatility_step)((0.0, sigma), jnp.zeros(returns.shape[0])) @ "path"
    nu = gv.exponential(0.1) @ "nu"
    gv.observe(gv.student_t(nu, 0.0, jnp.exp(s)), returns)


def genvi_guides(rank: int) -> dict:
    return {"mean-field": gv.auto_normal, "low rank": lambda m: gv.auto_low_rank(m, rank)}


def genvi_steps(model, data: jax.Array, rank: int) -> dict:
    out = {}
    for guide_name, make in genvi_guides(rank).items():
        auto = make(model)
        params = {"guide": auto.init(jax.random.key(0), {}, data)}
        for name, objective in (("ELBO", gv.elbo(model, auto)),
                                ("Rényi α=0.5, 8 particles", gv.renyi(model, auto, 0.5, 8))):
            step = jax.jit(lambda p, k, objective=objective: objective.grad_estimate(k, p, data))
            jax.block_until_ready(step(params, jax.random.key(1)))
            out[f"{guide_name}, {name}"] = (lambda step=step, params=params:
                                            step(params, jax.random.key(1)))
    return out


def numpyro_model(returns: jax.Array) -> None:
    """The same model in NumPyro (`dist.GaussianRandomWalk`)."""
    import numpyro  # noqa: PLC0415 - the bench's optional comparison
    import numpyro.distributions as dist  # noqa: PLC0415

    sigma = numpyro.sample("sigma", dist.Exponential(50.0))
    s = numpyro.sample("s", dist.GaussianRandomWalk(scale=sigma, num_steps=returns.shape[0]))
    nu = numpyro.sample("nu", dist.Exponential(0.1))
    numpyro.sample("r", dist.StudentT(df=nu, loc=0.0, scale=jnp.exp(s)), obs=returns)


def numpyro_steps(data: jax.Array, rank: int) -> dict:
    import optax  # noqa: PLC0415
    from numpyro.infer import SVI, RenyiELBO, Trace_ELBO  # noqa: PLC0415
    from numpyro.infer.autoguide import AutoLowRankMultivariateNormal, AutoNormal  # noqa: PLC0415

    model = numpyro_model
    out = {}
    for guide_name, guide in (("mean-field", AutoNormal(model)),
                              ("low rank", AutoLowRankMultivariateNormal(model, rank=rank))):
        svi = SVI(model, guide, optax.adam(0.01), Trace_ELBO())
        params = svi.get_params(svi.init(jax.random.key(0), data))
        for name, loss in (("ELBO", Trace_ELBO()),
                           ("Rényi α=0.5, 8 particles", RenyiELBO(alpha=0.5, num_particles=8))):
            step = jax.jit(jax.grad(lambda p, k, loss=loss, guide=guide:
                                    loss.loss(k, p, model, guide, data)))
            jax.block_until_ready(step(params, jax.random.key(1)))
            out[f"{guide_name}, {name}"] = (lambda step=step, params=params:
                                            step(params, jax.random.key(1)))
    return out


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=500)
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--rank", type=int, default=10)
    p.add_argument("--record", action="store_true",
                   help="write the table to docs/benchmarks/peers.md")
    a = p.parse_args(argv)
    print(describe_machine())
    data = returns_data(a.steps)
    fns = {}
    for system, steps in (("genvi, gv.gaussian_random_walk", genvi_steps(by_walk, data, a.rank)),
                          ("genvi, gv.scan", genvi_steps(by_scan, data, a.rank)),
                          ("NumPyro, GaussianRandomWalk", numpyro_steps(data, a.rank))):
        for objective, fn in steps.items():
            fns[(system, objective)] = fn
    times = interleaved_medians({f"{s} | {o}": f for (s, o), f in fns.items()},
                                rounds=a.rounds, reps=5)
    print(f"\nstochastic volatility, {a.steps} days: one gradient step")
    print(f"{'system':<34} {'guide, objective':<38} {'ms/step':>8} {'× walk':>7}")
    out = {}
    for (system, objective) in fns:
        t = times[f"{system} | {objective}"]
        base = times[f"genvi, gv.gaussian_random_walk | {objective}"]
        print(f"{system:<34} {objective:<38} {1e3 * t:8.3f} {t / base:7.2f}")
        out[(system, objective)] = t
    if a.record:
        walk, scan, numpyro = ("genvi, gv.gaussian_random_walk", "genvi, gv.scan",
                               "NumPyro, GaussianRandomWalk")
        rows = [[*objective.split(", ", 1), f"{1e3 * out[walk, objective]:.3f}",
                 f"{1e3 * out[scan, objective]:.3f}", f"{1e3 * out[numpyro, objective]:.3f}",
                 f"{out[walk, objective] / out[numpyro, objective]:.2f}"]
                for (system, objective) in fns if system == walk]
        record("stochastic_volatility",
               command("peers.stochastic_volatility", argv),
               ["guide", "objective", "genvi, `gv.gaussian_random_walk` (ms)",
                "genvi, `gv.scan` (ms)", "NumPyro, `GaussianRandomWalk` (ms)",
                "walk ÷ NumPyro"], rows)
    return out


if __name__ == "__main__":
    main()
