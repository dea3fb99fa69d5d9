"""Horseshoe regression (NumPyro's sparse-regression example) in genvi and NumPyro: a
mean-field normal guide (`gv.auto_normal`, `AutoNormal`) on the ELBO. The warm time of
one jitted gradient step, interleaved rounds, the median of paired ratios; and the ELBO
of fits from each library's default start (`--seeds` starts, 2,000 draws each).
Synthetic data: `--points` rows, `--dims` features of which 3 have non-zero weights.

    python -m genvi_experiments.bench.peers.horseshoe [--points 500] [--dims 50]
        [--rounds 30] [--steps 3000] [--seeds 4] [--record]

`--record` writes the table to docs/benchmarks/peers.md through `genvi_experiments.bench.results`.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

import genvi as gv
from genvi_experiments.bench.results import command, record
from genvi_experiments.common.timing import describe_machine, interleaved_samples, median, \
    paired_ratio

LR = 0.01


def regression_data(points: int, dims: int, seed: int = 0) -> tuple[jax.Array, jax.Array]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(points, dims))
    beta = np.zeros(dims)
    beta[:3] = [2.0, -1.5, 1.0]
    y = x @ beta + 0.5 * rng.normal(size=points)
    return jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32)


@gv.gen
def horseshoe(x, y):
    dims = x.shape[1]
    lambdas = gv.halfcauchy(jnp.ones(dims)) @ "lambdas"
    tau = gv.halfcauchy(1.0) @ "tau"
    unscaled = gv.normal(jnp.zeros(dims), 1.0) @ "unscaled_betas"
    betas = gv.deterministic("betas", tau * lambdas * unscaled)
    precision = gv.gamma(3.0, 1.0) @ "prec_obs"
    gv.observe(gv.normal(x @ betas, 1.0 / jnp.sqrt(precision)), y)


def numpyro_model():
    import numpyro  # noqa: PLC0415 - the bench's optional comparison
    import numpyro.distributions as dist  # noqa: PLC0415

    def model(x, y):
        dims = x.shape[1]
        lambdas = numpyro.sample("lambdas", dist.HalfCauchy(jnp.ones(dims)))
        tau = numpyro.sample("tau", dist.HalfCauchy(1.0))
        unscaled = numpyro.sample("unscaled_betas", dist.Normal(jnp.zeros(dims), 1.0))
        betas = numpyro.deterministic("betas", tau * lambdas * unscaled)
        precision = numpyro.sample("prec_obs", dist.Gamma(3.0, 1.0))
        numpyro.sample("obs", dist.Normal(x @ betas, 1.0 / jnp.sqrt(precision)), obs=y)
    return model


def genvi_step(x, y, seed: int = 0):
    auto = gv.auto_normal(horseshoe)
    params = auto.init(jax.random.key(seed), x, y)
    return auto, params, jax.jit(lambda p, k: gv.elbo(horseshoe, auto).grad_estimate(k, p, x, y))


def numpyro_step(x, y, seed: int = 0):
    from numpyro.infer import SVI, Trace_ELBO  # noqa: PLC0415
    from numpyro.infer.autoguide import AutoNormal  # noqa: PLC0415
    model = numpyro_model()
    guide = AutoNormal(model)
    svi = SVI(model, guide, optax.adam(LR), Trace_ELBO())
    params = svi.get_params(svi.init(jax.random.key(seed), x, y))
    loss = jax.jit(jax.grad(lambda p, k: Trace_ELBO().loss(k, p, model, guide, x, y)))
    return model, guide, params, loss


def genvi_fit_elbo(x, y, steps: int, seed: int) -> float:
    auto, params, _ = genvi_step(x, y, seed)
    objective = gv.elbo(horseshoe, auto)
    result = gv.fit(objective, params, x, y, steps=steps, optimizer=optax.adam(LR),
                    key=jax.random.key(seed + 1), progress=False)
    keys = jax.random.split(jax.random.key(5), 2000)
    return float(jax.jit(jax.vmap(lambda k: objective.estimate(k, result.params, x, y)))(
        keys).mean())


def numpyro_fit_elbo(x, y, steps: int, seed: int) -> float:
    from numpyro.infer import SVI, Trace_ELBO  # noqa: PLC0415
    from numpyro.infer.autoguide import AutoNormal  # noqa: PLC0415
    model = numpyro_model()
    guide = AutoNormal(model)
    svi = SVI(model, guide, optax.adam(LR), Trace_ELBO())
    params = svi.run(jax.random.key(seed + 1), steps, x, y, progress_bar=False).params
    keys = jax.random.split(jax.random.key(5), 2000)
    return float(jax.jit(jax.vmap(lambda k: -Trace_ELBO().loss(k, params, model, guide, x, y)))(
        keys).mean())


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--points", type=int, default=500)
    p.add_argument("--dims", type=int, default=50)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--record", action="store_true",
                   help="write the table to docs/benchmarks/peers.md")
    a = p.parse_args(argv)
    print(describe_machine())
    x, y = regression_data(a.points, a.dims)
    _, g_params, g_step = genvi_step(x, y)
    _, _, n_params, n_step = numpyro_step(x, y)
    key = jax.random.key(1)
    jax.block_until_ready((g_step(g_params, key), n_step(n_params, key)))
    samples = interleaved_samples({"genvi": lambda: g_step(g_params, key),
                                   "NumPyro": lambda: n_step(n_params, key)},
                                  rounds=a.rounds, reps=5)
    ratio = paired_ratio(samples, "genvi", "NumPyro")
    fits = {"genvi": np.array([genvi_fit_elbo(x, y, a.steps, s) for s in range(a.seeds)]),
            "NumPyro": np.array([numpyro_fit_elbo(x, y, a.steps, s) for s in range(a.seeds)])}
    rows = []
    for system in ("genvi", "NumPyro"):
        v = fits[system]
        rows.append([system, f"{1e3 * median(samples[system]):.3f}",
                     f"{ratio:.2f}" if system == "genvi" else "1.00",
                     f"{v.mean():,.1f} ± {v.std(ddof=1) if v.size > 1 else 0.0:,.1f}"])
    print(f"\nhorseshoe regression, {a.points} points × {a.dims} features")
    for row in rows:
        print(f"{row[0]:<8} {row[1]:>8} ms  ×{row[2]:>5}  ELBO {row[3]}")
    if a.record:
        record("horseshoe", command("peers.horseshoe", argv),
               ["system", "ms / step", "÷ NumPyro (median paired ratio)",
                f"ELBO after {a.steps} steps, mean ± sd over {a.seeds} starts"], rows)
    return {"ratio": ratio, "fits": fits}


if __name__ == "__main__":
    main()
