"""Conditional VAE: complete a handwritten digit from one quadrant (after Sohn et
al. 2015 and Pyro's CVAE tutorial).

Given the top-left quadrant x of a digit, predict the other three quadrants y.
First a deterministic baseline network ŷ = f(x) trained on the Bernoulli
likelihood of y; then the CVAE, whose prior network p(z | x, ŷ) uses the frozen
baseline's prediction, with generation network p(y | z) and recognition network
q(z | x, y) (REPARAM). Both train with `gv.fit` on images binarized afresh.
Test losses, in nats per image: the baseline's −log p(y | x); the CVAE's −ELBO and
−IWELBO(100) (an upper bound on its −log p(y | x), comparable to the baseline's).

    genvi run cvae [--epochs 100] [--data PATH]
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
from genvi_experiments.common.figures import save_grid
from genvi_experiments.common.nets import MLP, apply, gaussian_head, init_params
from genvi_experiments.common.training import chunked_mean
from genvi_experiments.vae import write_table


def quadrant_masks(shape: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Flat indices of the visible (top-left) quadrant and of the other three."""
    h, w = shape
    rows, cols = np.indices(shape)
    visible = (rows < h // 2) & (cols < w // 2)
    return np.flatnonzero(visible.ravel()), np.flatnonzero(~visible.ravel())


class CVAENets:
    def __init__(self, shape: tuple[int, int], hidden: int, latent: int):
        self.visible, self.target = quadrant_masks(shape)
        nx, ny = len(self.visible), len(self.target)
        self.sizes = {"baseline": nx, "prior": nx + ny, "recognition": nx + ny, "generation": latent}
        self.latent = latent
        self.nets = {"baseline": MLP((hidden, hidden, ny)), "prior": MLP((hidden, 2 * latent)),
                     "recognition": MLP((hidden, 2 * latent)), "generation": MLP((hidden, hidden, ny))}

    def init(self, key: jax.Array) -> dict:
        keys = jax.random.split(key, len(self.nets))
        return {name: init_params(net, k, self.sizes[name])
                for k, (name, net) in zip(keys, self.nets.items())}

    def split(self, image: jax.Array) -> tuple[jax.Array, jax.Array]:
        return image[..., self.visible], image[..., self.target]

    def __call__(self, name: str, params: dict, *inputs: jax.Array) -> jax.Array:
        return apply(self.nets[name], params[name], jnp.concatenate(inputs, -1))


def bernoulli_log_lik(logits: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.sum(y * jax.nn.log_sigmoid(logits) + (1 - y) * jax.nn.log_sigmoid(-logits), -1)


def cvae_programs(nets: CVAENets) -> tuple[gv.GenFn, gv.GenFn]:
    """`(model, guide)`, both `(params, x, y)` for one image's visible quadrant x and
    target pixels y; the baseline's parameters are held fixed (stop_gradient)."""

    def prior(params, x):
        guess = jax.nn.sigmoid(nets("baseline", jax.lax.stop_gradient(params), x))
        return gaussian_head(nets("prior", params, x, guess))

    @gv.gen
    def model(params, x, y):
        z = gv.mv_normal_diag(*prior(params, x)) @ "z"
        gv.observe(gv.bernoulli(logits=nets("generation", params, z)), y)

    @gv.gen
    def guide(params, x, y):
        gv.mv_normal_diag(*gaussian_head(nets("recognition", params, x, y)), grad=gv.REPARAM) @ "z"

    return model, guide


def on_images(nets: CVAENets, objective, binarize: bool = True) -> gv.Expectation:
    """`objective(params, x, y)` averaged over a minibatch of images, each split into
    its visible quadrant x and the rest y; grey images are binarized afresh."""

    @gv.expectation
    def per_image(params, image):
        if binarize:
            image = gv.sample(gv.flip(image, grad=gv.REINFORCE)).astype(jnp.float32)
        return objective(params, *nets.split(image))

    return gv.batch_mean(per_image)


def train_cvae(data: Images, *, hidden: int = 200, latent: int = 4, epochs: int = 100,
               batch_size: int = 100, lr: float = 1e-3, eval_particles: int = 100, seed: int = 0,
               progress: bool = True) -> dict:
    nets = CVAENets(data.shape, hidden, latent)
    model, guide = cvae_programs(nets)
    k_init, k_base, k_cvae, k_test, k_eval = jax.random.split(jax.random.key(seed), 5)
    steps = epochs * max(1, len(data.train) // batch_size)
    fit = dict(optimizer=optax.adam(lr), steps=steps, batch_size=batch_size, progress=progress)
    test = jnp.asarray(binarize(k_test, data.test))

    @gv.expectation  # deterministic: an expectation with no sampling sites is a function
    def baseline_log_lik(params, x, y):
        return bernoulli_log_lik(nets("baseline", params, x), y)

    announce(f"baseline network: compiling, then {steps} steps (gv.fit's progress bar shows on a "
             "terminal)")
    t0 = time.perf_counter()
    params = gv.fit(on_images(nets, baseline_log_lik), nets.init(k_init), data.train,
                    key=k_base, **fit).params
    baseline_seconds = time.perf_counter() - t0
    announce(f"CVAE: compiling, then {steps} steps")
    params = gv.fit(on_images(nets, gv.elbo(model, guide)), params, data.train,
                    key=k_cvae, **fit).params
    cvae_seconds = time.perf_counter() - t0 - baseline_seconds

    def test_mean(objective):   # on the fixed binarization of the test images
        return chunked_mean(on_images(nets, objective, binarize=False), params, test, k_eval, 100)

    announce(f"test losses on {len(test)} images, IWELBO({eval_particles}) included")
    losses = {"baseline −log p(y ∣ x)": -test_mean(baseline_log_lik),
              "CVAE −ELBO": -test_mean(gv.elbo(model, guide)),
              f"CVAE −IWELBO({eval_particles})": -test_mean(gv.iwelbo(model, guide, eval_particles))}
    return {"params": params, "nets": nets, "losses": losses,
            "seconds": {"baseline": baseline_seconds, "cvae": cvae_seconds}}


def completions(run: dict, images: np.ndarray, key: jax.Array, samples: int = 3) -> list[np.ndarray]:
    """Rows: input quadrant, baseline completion, `samples` CVAE completions, truth."""
    nets, params = run["nets"], run["params"]
    x, _ = nets.split(jnp.asarray(images))
    guess = jax.nn.sigmoid(nets("baseline", params, x))
    mean, scale = gaussian_head(nets("prior", params, x, guess))

    def assemble(target):
        out = np.full(images.shape, 0.15, np.float32)   # grey: not shown to the network
        out[:, nets.visible] = images[:, nets.visible]
        out[:, nets.target] = np.asarray(target)
        return out

    rows = [assemble(np.full((len(images), len(nets.target)), 0.15)), assemble(guess)]
    for k in jax.random.split(key, samples):
        z = mean + scale * jax.random.normal(k, mean.shape)
        rows.append(assemble(jax.nn.sigmoid(nets("generation", params, z))))
    return rows + [images]


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="genvi run cvae", description=__doc__,
                                 formatter_class=ShowDefaults)
    add_experiment_arguments(ap, latent=4)
    ap.add_argument("--eval-particles", type=positive_int, default=100,
                    help="K of the test IWELBO(K), a bound on the CVAE's −log p(y | x)")
    ap.add_argument("--out", default="out/cvae",
                    help="folder for results.md and the figure completions.png")
    args = ap.parse_args(argv)
    data = images_from_args(args)
    run = train_cvae(data, hidden=args.hidden, latent=args.latent, epochs=args.epochs,
                     batch_size=args.batch_size, lr=args.lr, eval_particles=args.eval_particles,
                     seed=args.seed)
    os.makedirs(args.out, exist_ok=True)
    figure = save_grid(os.path.join(args.out, "completions.png"),
                       completions(run, data.test[:12], jax.random.key(args.seed + 1)), data.shape,
                       row_titles=["input", "baseline", "CVAE 1", "CVAE 2", "CVAE 3", "truth"],
                       title="completing a digit from its top-left quadrant")
    table = [{"model": name, "test loss (nats per image)": value} for name, value in run["losses"].items()]
    write_table(os.path.join(args.out, "results.md"), f"Conditional VAE on {data.name}", table,
                [f"{len(data.train)} training / {len(data.test)} test images, latent {args.latent}, "
                 f"{args.epochs} epochs each, Adam {args.lr}; training {run['seconds']['baseline']:.1f} s "
                 f"(baseline) + {run['seconds']['cvae']:.1f} s (CVAE)."])
    print(f"CVAE on {data.name}: " + ", ".join(f"{k} {v:.2f}" for k, v in run["losses"].items())
          + f" nats per image; wrote {args.out}/results.md, {os.path.basename(figure)}")
    return {"losses": run["losses"], "figures": [figure]}


if __name__ == "__main__":
    main()
