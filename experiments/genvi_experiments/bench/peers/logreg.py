"""Bayesian logistic regression at dataset scale: `gv.plate` + `gv.auto_normal` +
`gv.fit(batch_size=B)` beside NumPyro's `plate(subsample_size=B)` + `AutoNormal` +
`SVI.run`, the same model, data, optimizer (Adam) and number of steps.

Synthetic data: x ~ N(0, I/d) (d = 50), w ~ N(0, I), y ~ Bernoulli(sigmoid(x·w)).
Reports, at each dataset size, the warm per-step time of each: genvi with both
minibatch orders (`shuffle="epoch"`, `"once"`) and NumPyro. Each runs its steps in one
compiled loop (`gv.fit` with one chunk, `SVI.run` without a progress bar, which is a
`lax.scan`); what a call costs once is left out (see `time_steps`); interleaved
rounds, medians. Then, after
`--fit-steps` steps with a cosine-decayed learning rate, the posterior means' largest
difference and the exact-data log-likelihood at each posterior mean.

    python -m genvi_experiments.bench.peers.logreg [--sizes 10000 1000000] [--fit-sizes 10000]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import optax

import genvi as gv
from genvi_experiments.common.timing import chunk_timed_fit, describe_machine, fit_step_times
from genvi_experiments.logreg import D, make_data, regression

def schedule(lr: float, steps: int) -> optax.GradientTransformation:
    """Adam whose learning rate decays to zero over `steps` (so the last iterate is a
    posterior mean, not a noisy SGD sample of one), the same for both systems."""
    return optax.adam(optax.cosine_decay_schedule(lr, steps))


def genvi_fit(x, y, batch: int, steps: int, lr: float, key: jax.Array, shuffle: str = "epoch",
              chunk: int | None = None):
    """A function `() -> posterior mean of w` running `steps` steps of `gv.fit` (compiled
    on its first call) with minibatches in the `shuffle` order, in chunks of `chunk`
    steps (default: one), timed by `chunk_timed_fit`."""
    model = regression(len(x), x.shape[1])
    guide = gv.auto_normal(model)
    start = {"guide": guide.init(jax.random.key(0), {}, x[:batch], y[:batch])}
    return chunk_timed_fit(lambda params: guide.median(params)["w"], gv.elbo(model, guide),
                           start, x, y, optimizer=schedule(lr, steps), steps=steps, key=key,
                           batch_size=batch, shuffle=shuffle, progress=False,
                           chunk_size=chunk or steps)


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


def handwritten_floor(x, y, batch: int, steps: int):
    """A function `() -> w`: hand-written JAX SGD on the log-likelihood alone, one
    contiguous slice of `batch` rows per step at a pseudo-random offset, in one
    `fori_loop`; the least a step touching `batch` rows of this data can cost, which
    shows how much of a step's growth with N is the memory holding the data."""
    n = len(x)

    def neg_log_lik(w, xb, yb):
        logits = xb @ w
        return -jnp.sum(yb * jax.nn.log_sigmoid(logits) + (1 - yb) * jax.nn.log_sigmoid(-logits))

    @jax.jit
    def run(x, y):
        def body(t, w):
            start = (t * 7919 * batch) % (n - batch + 1)
            xb, yb = (jax.lax.dynamic_slice_in_dim(a, start, batch) for a in (x, y))
            return w - 1e-4 * jax.grad(neg_log_lik)(w, xb, yb)
        return jax.lax.fori_loop(0, steps, body, jnp.zeros(x.shape[1], x.dtype))
    return lambda: run(x, y)


def log_likelihood(x, y, w) -> float:
    """Sum over every datapoint of log Bernoulli(y | sigmoid(x·w))."""
    logits = x @ w
    return float(jnp.sum(y * jax.nn.log_sigmoid(logits) + (1 - y) * jax.nn.log_sigmoid(-logits)))


def time_steps(x, y, args, key) -> tuple[dict, dict]:
    """Warm ms per step of genvi's two orders, NumPyro and the hand-written floor, and
    each genvi order's median paired ratio to NumPyro's (`fit_step_times`: genvi's
    one-time costs, such as `shuffle="once"`'s shuffle, and NumPyro's set-up are
    left out)."""
    t = args.time_steps
    chunked = {order: genvi_fit(x, y, args.batch, 2 * t, args.lr, key, order, chunk=t)
               for order in ("epoch", "once")}
    numpyro = tuple(numpyro_fit(x, y, args.batch, k * t, args.lr, key) for k in (1, 2))
    ms, ratio = fit_step_times(chunked, numpyro, t, args.rounds,
                               whole={"floor": handwritten_floor(x, y, args.batch, t)})
    ms["numpyro"] = ms.pop("reference")
    return ms, ratio


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
    print(f"Warm step time, calls of {args.time_steps} and {2 * args.time_steps} steps, "
          f"{args.rounds} interleaved rounds:\n")
    print("| N | genvi, shuffle=\"epoch\" (ms) | genvi, shuffle=\"once\" (ms) | NumPyro (ms) | "
          "epoch / NumPyro | once / NumPyro | hand-written floor (ms) |\n|---|---|---|---|---|---|---|")
    key = jax.random.key(1)
    for n in args.sizes:
        x, y, _ = make_data(n)
        ms, ratio = time_steps(x, y, args, key)
        print(f"| {n:,} | {ms['epoch']:.3f} | {ms['once']:.3f} | {ms['numpyro']:.3f} | "
              f"{ratio['epoch']:.3f} | {ratio['once']:.3f} | {ms['floor']:.3f} |", flush=True)
    if not args.fit_sizes:
        return
    print(f"\nAfter {args.fit_steps} steps:\n")
    print("| N | genvi shuffle | max over w of |genvi mean − NumPyro mean| | log-lik genvi | "
          "log-lik NumPyro | relative difference |\n|---|---|---|---|---|---|")
    for n in args.fit_sizes:
        x, y, _ = make_data(n)
        reference = numpyro_fit(x, y, args.batch, args.fit_steps, args.lr, key)()
        ll_ref = log_likelihood(x, y, reference)
        for shuffle in ("epoch", "once"):
            mean = genvi_fit(x, y, args.batch, args.fit_steps, args.lr, key, shuffle)()
            diff = float(jnp.max(jnp.abs(mean - reference)))
            ll = log_likelihood(x, y, mean)
            print(f"| {n:,} | {shuffle} | {diff:.3f} | {ll:.1f} | {ll_ref:.1f} | "
                  f"{abs(ll - ll_ref) / abs(ll_ref):.2%} |", flush=True)


if __name__ == "__main__":
    main()
