"""Variational autoencoder on handwritten digits (the paper's appendix D workload).

Model: z ~ N(0, I) (10 dimensions), pixels ~ Bernoulli(decoder(z)); guide:
z ~ N(encoder(x)) with REPARAM; MLPs (Flax). Trained with `gv.fit` on the ELBO, or
on IWELBO(K) with `--objective iwelbo --particles K`, pixels binarized dynamically.
Each epoch reports the test-set ELBO and an importance-sampled log-likelihood
estimate (IWELBO with K = 1000); figures: samples, reconstructions, curves.

    genvi run vae [--epochs 100] [--objective elbo|iwelbo] [--particles 5] [--data PATH]
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
from genvi.cli import ShowDefaults, announce
from genvi_experiments.common.data import (Images, add_experiment_arguments, binarize, binarized,
                                          images_from_args, positive_int)
from genvi_experiments.common.figures import save_curves, save_grid
from genvi_experiments.common.nets import VAENets
from genvi_experiments.common.training import chunked_mean


def vae_programs(nets: VAENets) -> tuple[gv.GenFn, gv.GenFn]:
    """`(model, guide)`, both `(params, x)` for one image `x`."""

    @gv.gen
    def model(params, x):
        z = gv.mv_normal_diag(jnp.zeros(nets.latent), jnp.ones(nets.latent)) @ "z"
        gv.observe(gv.bernoulli(logits=nets.decode(params, z)), x)

    @gv.gen
    def guide(params, x):
        mean, scale = nets.encode(params, x)
        gv.mv_normal_diag(mean, scale, grad=gv.REPARAM) @ "z"

    return model, guide


class Evaluator:
    """Held-out metrics of a VAE: test ELBO (mean over images of `samples` single-
    sample estimates) and test IWELBO(`particles`), per image, in nats."""

    def __init__(self, model: gv.GenFn, guide: gv.GenFn, test: np.ndarray,
                 particles: int = 1000, samples: int = 10, chunk: int = 100):
        self.test = jnp.asarray(test)
        self.elbo = gv.batch_mean(gv.elbo(model, guide))
        self.iwelbo = gv.batch_mean(gv.iwelbo(model, guide, particles=particles))
        self.samples, self.chunk = samples, chunk

    def __call__(self, params, key: jax.Array) -> dict[str, float]:
        k1, k2 = jax.random.split(key)
        repeated = jnp.tile(self.test, (self.samples, 1))
        return {"test ELBO": chunked_mean(self.elbo, params, repeated, k1, 10 * self.chunk),
                "test log-lik (IWELBO-1000)": chunked_mean(self.iwelbo, params, self.test, k2,
                                                           self.chunk)}


def train_vae(data: Images, *, latent: int = 10, hidden: int = 200, epochs: int = 100,
              batch_size: int = 100, lr: float = 1e-3, objective: str = "elbo",
              particles: int = 5, eval_particles: int = 1000, eval_every: int = 1,
              seed: int = 0, progress: bool = True) -> dict:
    """Train a VAE with `gv.fit`; returns params, nets, programs and the eval log."""
    nets = VAENets(data.pixels, hidden, latent)
    model, guide = vae_programs(nets)
    base = gv.elbo(model, guide) if objective == "elbo" else gv.iwelbo(model, guide, particles)
    train_objective = gv.batch_mean(binarized(base))
    key = jax.random.key(seed)
    k_init, k_fit, k_test, k_eval = jax.random.split(key, 4)
    evaluate = Evaluator(model, guide, binarize(k_test, data.test), eval_particles)
    steps_per_epoch = max(1, len(data.train) // batch_size)
    log: list[dict] = []

    def per_epoch(step, params, history):
        epoch = step // steps_per_epoch
        if epoch % eval_every == 0 or epoch == epochs:
            row = {"epoch": epoch,
                   "train objective": float(np.mean(history["objective"][-steps_per_epoch:]))}
            row.update(evaluate(params, jax.random.fold_in(k_eval, epoch)))
            log.append(row)
            announce(f"epoch {epoch} of {epochs}: test ELBO {row['test ELBO']:.2f}")

    params = init = nets.init(k_init)
    announce(f"VAE: compiling, then {epochs} epochs of {steps_per_epoch} steps, evaluated every "
             f"{eval_every} (gv.fit's progress bar shows on a terminal)")
    t0 = time.perf_counter()
    result = gv.fit(train_objective, params, data.train, optimizer=optax.adam(lr),
                    steps=epochs * steps_per_epoch, batch_size=batch_size, key=k_fit,
                    chunk_size=steps_per_epoch, callbacks=[per_epoch], progress=progress)
    return {"params": result.params, "nets": nets, "model": model, "guide": guide,
            "log": log, "seconds": time.perf_counter() - t0, "history": result.history,
            "evaluate": evaluate, "init": init}


def save_figures(out: str, run: dict, data: Images, key: jax.Array) -> list[str]:
    nets, params = run["nets"], run["params"]
    z = jax.random.normal(key, (40, nets.latent))
    samples = jax.nn.sigmoid(nets.decode(params, z))
    originals = data.test[:16]
    mean, _ = nets.encode(params, jnp.asarray(originals))
    recon = jax.nn.sigmoid(nets.decode(params, mean))
    log = run["log"]
    return [
        save_grid(os.path.join(out, "samples.png"), [samples[i:i + 10] for i in range(0, 40, 10)],
                  data.shape, title="decoder means at z ~ N(0, I)"),
        save_grid(os.path.join(out, "reconstructions.png"), [originals, recon], data.shape,
                  row_titles=["test", "reconstructed"]),
        save_curves(os.path.join(out, "curves.png"), [r["epoch"] for r in log],
                    {name: [r[name] for r in log] for name in log[0] if name != "epoch"}),
    ]


def write_table(path: str, title: str, log: list[dict], notes: list[str] = ()) -> str:
    names = list(log[0])
    lines = [f"# {title}", "", *notes, "", "| " + " | ".join(names) + " |",
             "|" + "---|" * len(names)]
    for row in log:
        lines.append("| " + " | ".join(f"{row[n]:.3f}" if isinstance(row[n], float) else str(row[n])
                                       for n in names) + " |")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="genvi run vae", description=__doc__,
                                 formatter_class=ShowDefaults)
    add_experiment_arguments(ap)
    ap.add_argument("--objective", choices=["elbo", "iwelbo"], default="elbo",
                    help="the training objective: the ELBO or IWELBO(K) with K = --particles")
    ap.add_argument("--particles", type=positive_int, default=5, help="K of IWELBO(K) training")
    ap.add_argument("--eval-particles", type=positive_int, default=1000,
                    help="K of the IWELBO(K) that estimates the test log-likelihood")
    ap.add_argument("--eval-every", type=positive_int, default=1, help="epochs between evaluations")
    ap.add_argument("--out", default="out/vae",
                    help="folder for results.md and the sample, reconstruction and curve figures")
    args = ap.parse_args(argv)
    data = images_from_args(args)
    run = train_vae(data, latent=args.latent, hidden=args.hidden, epochs=args.epochs,
                    batch_size=args.batch_size, lr=args.lr, objective=args.objective,
                    particles=args.particles, eval_particles=args.eval_particles,
                    eval_every=args.eval_every, seed=args.seed)
    os.makedirs(args.out, exist_ok=True)
    figures = save_figures(args.out, run, data, jax.random.key(args.seed + 1))
    label = "ELBO" if args.objective == "elbo" else f"IWELBO({args.particles})"
    final = run["log"][-1]
    write_table(os.path.join(args.out, "results.md"), f"VAE on {data.name}, trained on {label}",
                run["log"], [f"{len(data.train)} training / {len(data.test)} test images, "
                             f"latent {args.latent}, hidden {args.hidden}, batch {args.batch_size}, "
                             f"Adam {args.lr}, {run['seconds']:.1f} s of training."])
    print(f"VAE ({label}) on {data.name}: test ELBO {final['test ELBO']:.2f}, "
          f"test log-likelihood ≥ {final['test log-lik (IWELBO-1000)']:.2f} nats per image "
          f"after {args.epochs} epochs ({run['seconds']:.1f} s); wrote {args.out}/results.md, "
          + ", ".join(os.path.basename(f) for f in figures))
    return {"log": run["log"], "final": final, "figures": figures, "seconds": run["seconds"]}


if __name__ == "__main__":
    main()
