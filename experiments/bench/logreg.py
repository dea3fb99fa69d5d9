"""Bayesian logistic regression at dataset scale: `gv.plate` + `gv.auto_normal` +
`gv.fit(batch_size=B)` beside NumPyro's `plate(subsample_size=B)` + `AutoNormal` +
`SVI.run`, the same model, data, optimizer (Adam) and number of steps.

Synthetic data: x ~ N(0, I/d) (d = 50), w ~ N(0, I), y ~ Bernoulli(sigmoid(x·w)).
Reports, at each dataset size, the warm per-step time of each (both run their steps
in one compiled loop: `gv.fit` with one chunk, `SVI.run` without a progress bar, which
is a `lax.scan`; interleaved rounds, median of `--time-steps` steps per call); and,
after `--fit-steps` steps with a cosine-decayed learning rate, the posterior means'
largest difference and the exact-data log-likelihood at each posterior mean.

    python -m experiments.bench.logreg [--sizes 10000 1000000] [--fit-sizes 10000]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import optax

import genvi as gv
from experiments.common.timing import describe_machine, interleaved_samples, median, paired_ratio
from experiments.logreg import D, make_data, regression

def schedule(lr: float, steps: int) -> optax.GradientTransformation:
    """Adam whose learning rate decays to zero over `steps` (so the last iterate is a
    posterior mean, not a noisy SGD sample of one), the same for both systems."""
    return optax.adam(optax.cosine_decay_schedule(lr, steps))


def genvi_fit(x, y, batch: int, steps: int, lr: float, key: jax.Array):
    """A function `() -> posterior mean of w` running `steps` steps of `gv.fit` (compiled
    on its first call)."""
    model = regression(len(x), x.shape[1])
    guide = gv.auto_normal(model)
    start = {"guide": guide.init(jax.random.key(0), {}, x[:batch], y[:batch])}
    objective, optimizer = gv.elbo(model, guide), schedule(lr, steps)

    def run():
        result = gv.fit(objective, start, x, y, optimizer=optimizer, steps=steps, key=key,
                        batch_size=batch, progress=False, chunk_size=steps)
        return guide.median(result.params)["w"]
    return run


def numpyro_fit(x, y, batch: int, steps: int, lr: float, key: jax.Array):
    """The same with NumPyro: `() -> posterior mean of w`."""
    import numpyro  # noqa: PLC0415
    import numpyro.distributions as dist  # noqa: PLC0415
    from numpyro.infer import SVI, Trace_ELBO  # noqa: PLC0415
    from numpyro.infer.autoguide import AutoNormal  # noqa: PLC0415

    n, d = x.shape

    def model(x, y):
        w = numpyro.sample("w", dist.Normal(jnp.zeros(d), 1.0).to_event(1))
        with numpyro.plate("data", n, subsample_size=batch) as idx:
            numpyro.sample("y", dist.Bernoulli(logits=x[idx] @ w), obs=y[idx])

    guide = AutoNormal(model)
    svi = SVI(model, guide, schedule(lr, steps), Trace_ELBO())
    fit = jax.jit(lambda key, x, y: svi.run(key, steps, x, y, progress_bar=False).params)

    def run():
        return guide.median(fit(key, x, y))["w"]
    return run


def log_likelihood(x, y, w) -> float:
    """Sum over every datapoint of log Bernoulli(y | sigmoid(x·w))."""
    logits = x @ w
    return float(jnp.sum(y * jax.nn.log_sigmoid(logits) + (1 - y) * jax.nn.log_sigmoid(-logits)))


def time_steps(runs: dict, rounds: int, steps: int) -> tuple[dict, float]:
    """Median warm ms per step of each run, interleaved, and the median paired ratio."""
    for run in runs.values():
        jax.block_until_ready(run())  # compile
    times = interleaved_samples(runs, rounds=rounds, reps=1)
    per_step = {name: [t / steps for t in ts] for name, ts in times.items()}
    return ({name: 1e3 * median(t) for name, t in per_step.items()},
            paired_ratio(times, "genvi", "numpyro"))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 1_000_000])
    ap.add_argument("--fit-sizes", type=int, nargs="*", default=[10_000])
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--time-steps", type=int, default=300)
    ap.add_argument("--fit-steps", type=int, default=5000)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    print(describe_machine())
    print(f"d = {D}, batch {args.batch}, Adam from {args.lr} with cosine decay\n")
    print(f"Warm step time, {args.time_steps} steps per call, {args.rounds} interleaved rounds:\n")
    print("| N | genvi step (ms) | NumPyro step (ms) | genvi / NumPyro |\n|---|---|---|---|")
    key = jax.random.key(1)
    for n in args.sizes:
        x, y, _ = make_data(n)
        ms, ratio = time_steps({"genvi": genvi_fit(x, y, args.batch, args.time_steps, args.lr, key),
                                "numpyro": numpyro_fit(x, y, args.batch, args.time_steps, args.lr, key)},
                               args.rounds, args.time_steps)
        print(f"| {n:,} | {ms['genvi']:.3f} | {ms['numpyro']:.3f} | {ratio:.3f} |", flush=True)
    if not args.fit_sizes:
        return
    print(f"\nAfter {args.fit_steps} steps:\n")
    print("| N | max over w of |genvi mean − NumPyro mean| | log-lik genvi | log-lik NumPyro | "
          "relative difference |\n|---|---|---|---|---|")
    for n in args.fit_sizes:
        x, y, _ = make_data(n)
        means = {"genvi": genvi_fit(x, y, args.batch, args.fit_steps, args.lr, key)(),
                 "numpyro": numpyro_fit(x, y, args.batch, args.fit_steps, args.lr, key)()}
        diff = float(jnp.max(jnp.abs(means["genvi"] - means["numpyro"])))
        ll = {name: log_likelihood(x, y, m) for name, m in means.items()}
        rel = abs(ll["genvi"] - ll["numpyro"]) / abs(ll["numpyro"])
        print(f"| {n:,} | {diff:.3f} | {ll['genvi']:.1f} | {ll['numpyro']:.1f} | {rel:.2%} |",
              flush=True)

if __name__ == "__main__":
    main()
