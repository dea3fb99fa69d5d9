"""Bayesian logistic regression at dataset scale with an automatic guide: a `gv.plate`
of N datapoints of which each step sees a minibatch, `gv.auto_normal` for the 50
weights, `gv.fit(batch_size=B)`, and `gv.predictive` for held-out predictions.

Synthetic data: x ~ N(0, I/d), w ~ N(0, I), y ~ Bernoulli(sigmoid(x·w)). Reports how
far the posterior means are from the true weights (in posterior standard deviations),
how many true weights fall in the central 95% interval, and the held-out accuracy of
the posterior predictive, and `gv.diagnose`'s verdict on the fitted guide (the Pareto
shape k̂ of its importance weights on the whole dataset); the figure shows each weight's
interval beside its true value.
`python -m genvi_experiments.bench.peers.logreg` times the same fit against NumPyro.

    genvi run logreg [--points 100000] [--steps 3000]
"""

from __future__ import annotations

import argparse
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import genvi as gv
from genvi_experiments.common.data import positive_int
from genvi_experiments.common.figures import pyplot, save_figure
from genvi.cli import ShowDefaults, announce

D = 50


def make_data(n: int, d: int = D, seed: int = 0) -> tuple[jax.Array, jax.Array, np.ndarray]:
    """(x, y, true weights) of a synthetic logistic regression; the weights depend on
    `seed` only, so datasets of any size share them."""
    w = np.random.default_rng(seed).normal(size=d)
    rng = np.random.default_rng([seed, n])
    x = rng.normal(size=(n, d)) / np.sqrt(d)
    y = rng.random(n) < 1.0 / (1.0 + np.exp(-(x @ w)))
    return jnp.asarray(x, jnp.float32), jnp.asarray(y, jnp.float32), w


def regression(n: int, d: int = D) -> gv.GenFn:
    """w ~ N(0, I); a plate of the n datapoints, y named for `gv.predictive`."""
    @gv.gen
    def point(params, w, x, y):
        gv.observe(gv.bernoulli(logits=x @ w), y, name="y")

    @gv.gen
    def model(params, x, y):
        w = gv.mv_normal_diag(jnp.zeros(d), jnp.ones(d)) @ "w"
        gv.plate(point, n, in_axes=(None, None, 0, 0))(params, w, x, y) @ "data"

    return model


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="genvi run logreg", description=__doc__,
                                 formatter_class=ShowDefaults)
    ap.add_argument("--points", type=positive_int, default=100_000,
                    help="datapoints N of the synthetic training set")
    ap.add_argument("--batch-size", type=positive_int, default=1024,
                    help="datapoints per step's minibatch (the plate stands for all N)")
    ap.add_argument("--steps", type=positive_int, default=3000, help="Adam steps")
    ap.add_argument("--lr", type=float, default=0.01,
                    help="Adam's initial learning rate (decayed to 0 on a cosine schedule)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the data and the fit")
    ap.add_argument("--out", default="out/logreg",
                    help="folder for results.md and the interval figure weights.png")
    args = ap.parse_args(argv)
    x, y, w_true = make_data(args.points, seed=args.seed)
    batch = min(args.batch_size, args.points)
    model = regression(args.points)
    guide = gv.auto_normal(model)
    params = {"guide": guide.init(jax.random.key(args.seed), {}, x[:batch], y[:batch])}
    announce(f"logistic regression, {args.points:,} points: compiling, then {args.steps} Adam "
             f"steps on minibatches of {batch}")
    t0 = time.perf_counter()
    result = gv.fit(gv.elbo(model, guide), params, x, y, batch_size=batch, steps=args.steps,
                    optimizer=optax.adam(optax.cosine_decay_schedule(args.lr, args.steps)),
                    key=jax.random.key(args.seed + 1), progress=False)
    seconds = time.perf_counter() - t0
    lo, mid, hi = np.asarray(guide.quantiles(result.params, [0.025, 0.5, 0.975])["w"])
    sd = (hi - lo) / (2 * 1.96)
    z = np.abs(mid - w_true) / sd
    covered = float(np.mean((lo <= w_true) & (w_true <= hi)))
    # held-out: the posterior predictive's majority vote against fresh labels
    x_test, y_test, _ = make_data(2000, seed=args.seed)
    announce("posterior predictive on 2,000 held-out points: compiling, then 500 draws")
    draws = jax.jit(gv.predictive(model, guide, result.params, 500))(
        jax.random.key(args.seed + 2), x_test, y_test)
    accuracy = float(np.mean((np.asarray(draws["data", "y"]).mean(0) > 0.5) == np.asarray(y_test)))
    best = float(np.mean(((np.asarray(x_test) @ w_true) > 0) == np.asarray(y_test)))
    # did it work? the guide's draws importance-weighted against the model on all N points
    # (50 draws at a time: a chunk holds 50 × N log-likelihood terms, not 1,000 × N)
    announce(f"gv.diagnose: 1,000 guide draws weighted by the full {args.points:,}-point model")
    report = gv.diagnose(model, guide, result.params, x, y, key=jax.random.key(args.seed + 3),
                         num_samples=1000, batch_size=50)
    lines = [f"{args.points:,} points, d = {D}, batch {batch}, {args.steps} steps of Adam from "
             f"{args.lr} (cosine decay): {seconds:.1f} s with compile.", "",
             "| quantity | value |", "|---|---|",
             f"| largest |posterior median − true w| / posterior sd | {z.max():.2f} |",
             f"| true weights inside their central 95% interval | {covered:.0%} |",
             f"| held-out accuracy, posterior predictive (500 draws) | {accuracy:.3f} |",
             f"| held-out accuracy of the true weights | {best:.3f} |",
             f"| gv.diagnose: khat of the guide's weights (1,000 draws) | {report.khat:.2f} "
             f"({report.verdict}) |",
             f"| gv.diagnose: importance ESS | {report.ess:,.0f} of 1,000 |",
             "", "```", str(report), "```"]
    print("\n".join(lines))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    fig, ax = pyplot().subplots(figsize=(8, 3))
    order = np.argsort(w_true)
    ax.errorbar(np.arange(D), mid[order], [mid[order] - lo[order], hi[order] - mid[order]],
                fmt=".", label="posterior median, 95% interval")
    ax.plot(np.arange(D), w_true[order], "k_", ms=8, label="true weight")
    ax.set_xlabel("weight (sorted by true value)"), ax.legend(fontsize=8)
    fig.tight_layout()
    save_figure(fig, os.path.join(args.out, "weights.png"))
    return {"max_z": float(z.max()), "covered": covered, "accuracy": accuracy, "seconds": seconds,
            "khat": report.khat, "ess": report.ess}


if __name__ == "__main__":
    main()
