"""Semi-supervised VAE, Kingma et al.'s M2, on handwritten digits.

Model: y ~ Categorical(uniform over 10 classes), z ~ N(0, I), pixels ~
Bernoulli(decoder(z, y)). Guide: y ~ Categorical(classifier(x)) with
`grad=gv.ENUM` (the 10 classes are summed exactly: no score-function noise), then
z ~ N(encoder(x, y)) with REPARAM. Labelled images observe y instead; they also
train the classifier directly (weight `--alpha`, as in M2). A small labelled
fraction (10% by default); each unlabelled image is paired with a labelled one
(the labelled set cycled), so every minibatch holds both kinds.

    genvi run ssvae [--epochs 100] [--labelled 0.1] [--alpha 10] [--data PATH]
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
from genvi_experiments.common.data import (Images, add_experiment_arguments, binarize,
                                          images_from_args, positive_int)
from genvi_experiments.common.figures import save_curves, save_grid
from genvi_experiments.common.nets import MLP, apply, gaussian_head, init_params
from genvi_experiments.common.training import chunked_mean
from genvi_experiments.vae import write_table

CLASSES = 10


class M2Nets:
    """Classifier x→y logits, encoder (x, y)→z, decoder (z, y)→pixel logits."""

    def __init__(self, pixels: int, hidden: int, latent: int):
        self.pixels, self.latent = pixels, latent
        self.classifier = MLP((hidden, CLASSES))
        self.encoder = MLP((hidden, 2 * latent))
        self.decoder = MLP((hidden, pixels))

    def init(self, key: jax.Array) -> dict:
        k1, k2, k3 = jax.random.split(key, 3)
        return {"clf": init_params(self.classifier, k1, self.pixels),
                "enc": init_params(self.encoder, k2, self.pixels + CLASSES),
                "dec": init_params(self.decoder, k3, self.latent + CLASSES)}

    def classify(self, params, x):
        return apply(self.classifier, params["clf"], x)

    def encode(self, params, x, y):
        return gaussian_head(apply(self.encoder, params["enc"],
                                   jnp.concatenate([x, jax.nn.one_hot(y, CLASSES)], -1)))

    def decode(self, params, z, y):
        return apply(self.decoder, params["dec"], jnp.concatenate([z, jax.nn.one_hot(y, CLASSES)], -1))


def m2_programs(nets: M2Nets) -> dict[str, gv.GenFn]:
    """Unsupervised model/guide `(params, x)` (y latent, enumerated) and supervised
    model/guide `(params, x, y)` (y observed)."""
    prior_logits = jnp.zeros(CLASSES)

    def generate_pixels(params, x, y):
        z = gv.mv_normal_diag(jnp.zeros(nets.latent), jnp.ones(nets.latent)) @ "z"
        gv.observe(gv.bernoulli(logits=nets.decode(params, z, y)), x)

    def infer_z(params, x, y):
        mean, scale = nets.encode(params, x, y)
        gv.mv_normal_diag(mean, scale, grad=gv.REPARAM) @ "z"

    @gv.gen
    def model(params, x):
        generate_pixels(params, x, gv.categorical(prior_logits) @ "y")

    @gv.gen
    def guide(params, x):
        infer_z(params, x, gv.categorical(nets.classify(params, x), grad=gv.ENUM) @ "y")

    @gv.gen
    def model_labelled(params, x, y):
        gv.observe(gv.categorical(prior_logits), y)
        generate_pixels(params, x, y)

    @gv.gen
    def guide_labelled(params, x, y):
        infer_z(params, x, y)

    return {"model": model, "guide": guide, "model_labelled": model_labelled,
            "guide_labelled": guide_labelled}


def m2_objective(nets: M2Nets, programs: dict, alpha: float, binarize: bool = True) -> gv.Expectation:
    """Per (unlabelled image, labelled image, label): ELBO(x_u) + ELBO(x_l, y_l)
    + alpha · log q(y_l | x_l), every image binarized afresh (unless `binarize` is
    off: then the images must already be binary)."""
    unsupervised = gv.elbo(programs["model"], programs["guide"])
    supervised = gv.elbo(programs["model_labelled"], programs["guide_labelled"])

    def draw(grey):
        return gv.sample(gv.flip(grey, grad=gv.REINFORCE)).astype(jnp.float32) if binarize else grey

    @gv.expectation
    def m2(params, grey_u, grey_l, y_l):
        x_u, x_l = draw(grey_u), draw(grey_l)
        log_q_y = jax.nn.log_softmax(nets.classify(params, x_l))[y_l]
        return unsupervised(params, x_u) + supervised(params, x_l, y_l) + alpha * log_q_y

    return gv.batch_mean(m2, in_axes=(None, 0, 0, 0))


def split_labels(data: Images, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(unlabelled images, labelled images, labels)`, the labelled set stratified
    (equal counts per class) and cycled to the unlabelled set's length."""
    rng = np.random.default_rng(seed)
    per_class = max(1, int(round(fraction * len(data.train) / CLASSES)))
    labelled = np.concatenate([rng.permutation(np.flatnonzero(data.train_labels == c))[:per_class]
                               for c in range(CLASSES)])
    unlabelled = np.setdiff1d(np.arange(len(data.train)), labelled)
    cycled = np.resize(rng.permutation(labelled), len(unlabelled))
    return data.train[unlabelled], data.train[cycled], data.train_labels[cycled]


def train_m2(data: Images, *, labelled: float = 0.1, alpha: float = 10.0, latent: int = 10,
             hidden: int = 200, epochs: int = 100, batch_size: int = 100, lr: float = 1e-3,
             eval_every: int = 5, seed: int = 0, progress: bool = True) -> dict:
    nets = M2Nets(data.pixels, hidden, latent)
    programs = m2_programs(nets)
    objective = m2_objective(nets, programs, alpha)
    x_u, x_l, y_l = split_labels(data, labelled, seed)
    key = jax.random.key(seed)
    k_init, k_fit, k_test, k_eval = jax.random.split(key, 4)
    test = jnp.asarray(binarize(k_test, data.test))
    test_elbo = gv.batch_mean(gv.elbo(programs["model"], programs["guide"]))
    draws = jax.random.bernoulli(k_test, jnp.asarray(data.test), (16, *data.test.shape))

    @jax.jit
    def classify(params, draws):
        """argmax of q(y | x) averaged over binarizations of each test image (the
        classifier was trained on binarized images)."""
        return jnp.argmax(jnp.mean(jax.nn.softmax(nets.classify(params, draws.astype(jnp.float32))), 0), -1)

    steps_per_epoch = max(1, len(x_u) // batch_size)
    log: list[dict] = []

    def per_epoch(step, params, history):
        epoch = step // steps_per_epoch
        if epoch % eval_every == 0 or epoch == epochs:
            accuracy = float(jnp.mean(classify(params, draws) == data.test_labels))
            log.append({"epoch": epoch,
                        "train objective": float(np.mean(history["objective"][-steps_per_epoch:])),
                        "test ELBO": chunked_mean(test_elbo, params, test,
                                                  jax.random.fold_in(k_eval, epoch), 500),
                        "test accuracy": accuracy})
            announce(f"epoch {epoch} of {epochs}: test accuracy {accuracy:.3f}, test ELBO "
                     f"{log[-1]['test ELBO']:.2f}")

    announce(f"M2: compiling, then {epochs} epochs of {steps_per_epoch} steps, evaluated every "
             f"{eval_every} (gv.fit's progress bar shows on a terminal)")
    t0 = time.perf_counter()
    result = gv.fit(objective, nets.init(k_init), x_u, x_l, y_l, optimizer=optax.adam(lr),
                    steps=epochs * steps_per_epoch, batch_size=batch_size, key=k_fit,
                    chunk_size=steps_per_epoch, callbacks=[per_epoch], progress=progress)
    return {"params": result.params, "nets": nets, "log": log, "labelled": len(data.train) - len(x_u),
            "seconds": time.perf_counter() - t0}


def save_figures(out: str, run: dict, data: Images, key: jax.Array) -> list[str]:
    """Each row a class: the decoder at 8 prior draws of z (style varies, digit fixed)."""
    nets, params = run["nets"], run["params"]
    z = jax.random.normal(key, (8, nets.latent))
    rows = [jax.nn.sigmoid(nets.decode(params, z, jnp.full(8, c))) for c in range(CLASSES)]
    log = run["log"]
    return [save_grid(os.path.join(out, "samples_by_class.png"), rows, data.shape,
                      row_titles=[f"y = {c}" for c in range(CLASSES)],
                      title="decoder means, one class per row, shared z per column"),
            save_curves(os.path.join(out, "accuracy.png"), [r["epoch"] for r in log],
                        {"test accuracy": [r["test accuracy"] for r in log]}, ylabel="accuracy")]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="genvi run ssvae", description=__doc__,
                                 formatter_class=ShowDefaults)
    add_experiment_arguments(ap)
    ap.add_argument("--labelled", type=float, default=0.1, help="labelled fraction")
    ap.add_argument("--alpha", type=float, default=10.0, help="classifier weight")
    ap.add_argument("--eval-every", type=positive_int, default=5,
                    help="epochs between evaluations of the test ELBO and accuracy")
    ap.add_argument("--out", default="out/ssvae",
                    help="folder for results.md and the samples and accuracy figures")
    args = ap.parse_args(argv)
    data = images_from_args(args)
    run = train_m2(data, labelled=args.labelled, alpha=args.alpha, latent=args.latent,
                   hidden=args.hidden, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                   eval_every=args.eval_every, seed=args.seed)
    os.makedirs(args.out, exist_ok=True)
    figures = save_figures(args.out, run, data, jax.random.key(args.seed + 1))
    final = run["log"][-1]
    write_table(os.path.join(args.out, "results.md"), f"Semi-supervised VAE (M2) on {data.name}",
                run["log"], [f"{run['labelled']} labelled of {len(data.train)} training images "
                             f"({args.labelled:.0%}), {len(data.test)} test images, alpha "
                             f"{args.alpha}, Adam {args.lr}, {run['seconds']:.1f} s."])
    print(f"M2 on {data.name} with {run['labelled']} labels: test accuracy "
          f"{final['test accuracy']:.3f}, test ELBO {final['test ELBO']:.2f} after {args.epochs} "
          f"epochs ({run['seconds']:.1f} s); wrote {args.out}/results.md, "
          + ", ".join(os.path.basename(f) for f in figures))
    return {"log": run["log"], "final": final, "figures": figures}


if __name__ == "__main__":
    main()
