"""A Gaussian mixture at dataset scale: genvi's `genvi_experiments.gmm` step (the assignments
enumerated exactly inside a `gv.plate`, `grad=gv.ENUM`, the means reparameterized)
beside NumPyro's, the same model, data, start, optimizer (Adam 0.05) and batch (1,024).

NumPyro has no enumeration without funsor (not installed here, so no `TraceEnum_ELBO`);
its way is to marginalize the assignment by hand, `MixtureSameFamily` in a subsampled
`plate`, with a guide over the means only (`Trace_ELBO`). That estimates the same ELBO:
genvi's guide over z is the exact conditional given the means, so its ELBO is the
z-marginalized one. Reports, at each dataset size, the warm per-step time of each, both
running their steps in one compiled loop (`gv.fit` with `shuffle="epoch"`; `SVI.run`
without a progress bar, jitted); what a call costs once is left out (see `time_steps`);
interleaved rounds, medians. Then, after `--fit-steps` steps of each, the largest error
of a fitted mean against the true means (`genvi_experiments.gmm.match_means`).

    python -m genvi_experiments.bench.peers.gmm [--sizes 100000 1000000] [--time-steps 1000] [--rounds 5]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import optax

import genvi as gv
from genvi_experiments.common.timing import chunk_timed_fit, describe_machine, fit_step_times
from genvi_experiments.gmm import K, SD, make_points, match_means, programs, start_params


def genvi_fit(x, batch: int, steps: int, lr: float, key: jax.Array, chunk: int | None = None):
    """A function `() -> fitted means` running `steps` steps of `gv.fit` (compiled on its
    first call) in chunks of `chunk` steps (default: one), timed by `chunk_timed_fit`."""
    mixture, guide = programs(len(x))
    return chunk_timed_fit(lambda params: params["loc"], gv.elbo(mixture, guide),
                           start_params(x), x, optimizer=optax.adam(lr), steps=steps, key=key,
                           batch_size=batch, progress=False, chunk_size=chunk or steps)


def numpyro_fit(x, batch: int, steps: int, lr: float, key: jax.Array):
    """The same with NumPyro, z marginalized by hand: `() -> fitted means`."""
    import numpyro  # noqa: PLC0415
    import numpyro.distributions as dist  # noqa: PLC0415
    from numpyro.infer import SVI, Trace_ELBO  # noqa: PLC0415

    n, start = len(x), start_params(x)

    def model(x):
        means = numpyro.sample("means", dist.Normal(jnp.zeros((K, 2)), 5.0).to_event(2))
        with numpyro.plate("data", n, subsample_size=batch) as idx:
            numpyro.sample("x", dist.MixtureSameFamily(dist.Categorical(logits=jnp.zeros(K)),
                                                       dist.Normal(means, SD).to_event(1)),
                           obs=x[idx])

    def guide(x):
        loc = numpyro.param("loc", start["loc"])
        log_scale = numpyro.param("log_scale", start["log_scale"])
        numpyro.sample("means", dist.Normal(loc, jnp.exp(log_scale)).to_event(2))

    svi = SVI(model, guide, optax.adam(lr), Trace_ELBO())
    fit = jax.jit(lambda key, x: svi.run(key, steps, x, progress_bar=False).params["loc"])
    return lambda: fit(key, x)


def time_steps(x, args, key) -> tuple[dict, float]:
    """Warm ms per step of genvi and NumPyro, and the median paired ratio genvi /
    NumPyro (`fit_step_times`: one-time costs of either are left out)."""
    t = args.time_steps
    numpyro = tuple(numpyro_fit(x, args.batch, k * t, args.lr, key) for k in (1, 2))
    ms, ratio = fit_step_times({"genvi": genvi_fit(x, args.batch, 2 * t, args.lr, key, chunk=t)},
                               numpyro, t, args.rounds)
    return {"genvi": ms["genvi"], "numpyro": ms["reference"]}, ratio["genvi"]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100_000])
    ap.add_argument("--fit-size", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--time-steps", type=int, default=1000)
    ap.add_argument("--fit-steps", type=int, default=1500)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    print(describe_machine())
    print(f"K = {K} components in 2-D, sd {SD}, batch {args.batch}, Adam {args.lr}\n")
    print(f"Warm step time, calls of {args.time_steps} and {2 * args.time_steps} steps, "
          f"{args.rounds} interleaved rounds:\n")
    print("| N | genvi, z enumerated (ms) | NumPyro, z marginalized by hand (ms) | "
          "genvi / NumPyro |\n|---|---|---|---|")
    key = jax.random.key(1)
    for n in args.sizes:
        x, _ = make_points(n)
        ms, ratio = time_steps(x, args, key)
        print(f"| {n:,} | {ms['genvi']:.3f} | {ms['numpyro']:.3f} | {ratio:.3f} |", flush=True)
    x, _ = make_points(args.fit_size)
    print(f"\nAfter {args.fit_steps} steps at N = {args.fit_size:,}:\n")
    print("| system | largest error of a fitted mean |\n|---|---|")
    for name, make in (("genvi", genvi_fit), ("NumPyro", numpyro_fit)):
        loc = make(x, args.batch, args.fit_steps, args.lr, key)()
        print(f"| {name} | {match_means(loc)[1]:.3f} |", flush=True)


if __name__ == "__main__":
    main()
