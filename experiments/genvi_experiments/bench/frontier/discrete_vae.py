"""Gradient estimators of discrete-latent VAEs at their initial parameters: the DisARM
and RELAX papers' binary-latent VAE and a categorical-latent one, at digits size.

* binary: 20 binary latents with a Bernoulli(½) prior;
* categorical: 10 latents of 10 categories each with a uniform prior, one-hot into
  the decoder.

8×8 digits (binarized once), one-hidden-layer MLPs (hidden 200), batch-mean ELBO over
a batch; one strategy at the guide's latent site per row. `gv.compare_estimators`
measures each strategy's gradient variance on the encoder (the only parameters the
site's strategy changes), seconds per gradient estimate and their product, and
checks that the means agree.

    python -m genvi_experiments.bench.frontier.discrete_vae [--latents binary categorical]
        [--batch 64] [--samples 2000] [--train-seconds 10 --seeds 5] [--record]
    python -m genvi_experiments.bench.frontier.discrete_vae --time-to-target 30 --seeds 3 [--record]

With `--train-seconds S`, each strategy also trains for S seconds from each of
`--seeds` starts (as many steps as S holds at its measured time per estimate), and
the table gains the test ELBO reached. DisARM and RELAX take their whole-site forms
here, the decoder reading every latent; `-per-lane` rows replay it once per latent.
RELAX's surrogate (one per form) is a small network of the relaxed latents and the image, trained
in the same step; AUTO's row is what `gv.tune`
chooses at the initial parameters (and `gv.fit` when it trains).

With `--time-to-target S`, each strategy trains for S wall-clock seconds from each
start (compiling, and AUTO's measurements, counted), and the table (as
`binary_vae_auto`, `categorical_vae_auto`) gives the seconds each took to reach a
target training objective: what the best strategy reached a quarter into its run.

`--record` writes each table (as `binary_vae` and `categorical_vae`, `_gpu` appended
on a GPU) to docs/benchmarks/frontier.md through `genvi_experiments.bench.results`.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import genvi as gv
from genvi_experiments.bench.frontier.harness import (
    RELAX, RELAX_FORMS, RELAX_PER_LANE, measure, record_lab, relax_init, relax_note, site_strategy,
    surrogate_value, record_time_to_target, time_to_target, train_in_budget, trajectories)
from genvi_experiments.common.data import binarize, load_images
from genvi_experiments.common.nets import MLP, apply, init_params
from genvi_experiments.common.timing import describe_machine

STRATEGIES = {
    # the decoder reads every latent, so DisARM and RELAX take their whole-site forms
    # (`k.lanes_couple`); the per-lane rows replay the decoder once per latent
    "binary": {"REINFORCE": gv.REINFORCE, "RLOO(2)": gv.RLOO(2), "DisARM": gv.DisARM,
               "DisARM-per-lane": gv.DisARM.per_lane(), "MVD": gv.MVD, "ENUM": gv.ENUM,
               "SD": gv.SD, "RELAX": RELAX, "RELAX-per-lane": RELAX_PER_LANE, "AUTO": gv.AUTO},
    "categorical": {"REINFORCE": gv.REINFORCE, "RLOO(2)": gv.RLOO(2), "SWOR(2)": gv.SWOR(2),
                    "SWOR(4)": gv.SWOR(4), "MVD": gv.MVD, "ENUM": gv.ENUM, "SD": gv.SD,
                    "RELAX": RELAX, "RELAX-per-lane": RELAX_PER_LANE, "AUTO": gv.AUTO},
}


class DiscreteVAE:
    """Encoder pixels→hidden→latent logits and decoder latent→hidden→pixel logits;
    `categories` None: binary latents, else that many categories per latent. A
    `harness.FrontierModel`: the site's strategy changes the encoder's gradient only."""

    leaves = ("enc",)
    lr = 1e-3

    def __init__(self, pixels: int = 64, hidden: int = 200, latent: int = 20,
                 categories: int | None = None):
        self.pixels, self.latent, self.categories = pixels, latent, categories
        self.name = "binary" if categories is None else "categorical"
        self.strategies = STRATEGIES[self.name]
        self.width = latent * (categories or 1)   # logits out of the encoder, into the decoder
        self.encoder, self.decoder = MLP((hidden, self.width)), MLP((hidden, pixels))
        # RELAX's control variate: a small network of the relaxed latents and the
        # encoder's logits (what it knows of the image)
        self.surrogate = MLP((32, 1))
        self.score = self.objective(gv.REINFORCE)  # its value does not depend on the strategy

    def init(self, key: jax.Array) -> dict:
        k1, k2, k3 = jax.random.split(key, 3)
        return {"enc": init_params(self.encoder, k1, self.pixels),
                "dec": init_params(self.decoder, k2, self.width),
                "relax": relax_init(lambda: init_params(self.surrogate, k3, 2 * self.width))}

    def strategy(self, strategy, params: dict, logits: jax.Array):
        """The site's strategy for a row (`harness.site_strategy`: RELAX's forms take
        the surrogate network and the encoder's `logits`)."""
        return site_strategy(strategy, self._control_variate, params, logits)

    def _control_variate(self, phi: dict, z: jax.Array) -> jax.Array:
        return surrogate_value(self.surrogate, phi, z)

    def _latent(self, logits: jax.Array, strategy=None) -> gv.DistCall:
        if self.categories is None:
            return gv.bernoulli(logits=logits, grad=strategy)
        return gv.categorical(logits.reshape(self.latent, self.categories), grad=strategy)

    def _code(self, z: jax.Array) -> jax.Array:
        if self.categories is None:
            return z * 1.0
        return jax.nn.one_hot(z, self.categories).reshape(-1)

    def objective(self, strategy) -> gv.Expectation:
        """The batch-mean ELBO with `strategy` at the guide's latent site."""
        @gv.gen
        def model(params, x):
            z = self._latent(jnp.zeros(self.width)) @ "z"
            gv.observe(gv.bernoulli(logits=apply(self.decoder, params["dec"], self._code(z))), x)

        @gv.gen
        def guide(params, x):
            logits = apply(self.encoder, params["enc"], x)
            self._latent(logits, self.strategy(strategy, params, logits)) @ "z"

        return gv.batch_mean(gv.elbo(model, guide))


def make_vae(latents: str, pixels: int) -> DiscreteVAE:
    """The binary (20 latents) or categorical (10 × 10) VAE of the tables."""
    return (DiscreteVAE(pixels) if latents == "binary"
            else DiscreteVAE(pixels, latent=10, categories=10))


def _note(lab: gv.EstimatorComparison, trained: dict | None, budget: float, samples: int,
          batch: int) -> str:
    note = (f"{samples} gradient estimates per strategy at the initial parameters, batch "
            f"{batch}; variance summed over the encoder's entries.")
    if any(form in lab.labels for form in RELAX_FORMS):
        note += relax_note("latent", "the relaxed latents and the encoder's logits",
                           "initial encoder and decoder, which are held",
                           "the papers' form (the decoder couples the latents)")
    if trained:
        seeds = len(next(iter(trained.values()))[1])  # (steps, scores, stops)
        note += (f" Training: Adam(1e-3) on minibatches of {batch} of the binarized training "
                 f"digits, for as many steps as {budget:g} s hold at the strategy's time per "
                 f"estimate, from {seeds} starts (mean ± sd); the test ELBO per image is the "
                 "mean of 20 estimates over the test digits.")
    return note


def main(argv: list[str] | None = None) -> dict[str, gv.EstimatorComparison]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latents", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--strategies", nargs="+", default=None,
                    help="a subset of the strategies (the same names for every VAE)")
    ap.add_argument("--train-seconds", type=float, default=0.0,
                    help="also train each strategy for this many seconds (0: do not)")
    ap.add_argument("--seeds", type=int, default=5, help="training starts per strategy")
    ap.add_argument("--time-to-target", type=float, default=0.0,
                    help="train each strategy this many wall-clock seconds and report the "
                         "time to a target training objective (0: do not)")
    ap.add_argument("--record", action="store_true",
                    help="write the tables to docs/benchmarks/frontier.md")
    args = ap.parse_args(argv)
    images = load_images()
    x = jnp.asarray(binarize(jax.random.key(1), images.train[:args.batch]))
    labs = {}
    for latents in args.latents:
        if args.time_to_target > 0:
            chosen = STRATEGIES[latents] if args.strategies is None else \
                {a: STRATEGIES[latents][a] for a in args.strategies}
            runs = trajectories(make_vae(latents, x.shape[-1]), chosen, args.time_to_target,
                                jnp.asarray(binarize(jax.random.key(3), images.train)),
                                args.seeds, args.batch)
            target, reach = time_to_target(runs)
            print(f"# {latents}: target {target:.2f}; seconds to it: {reach}")
            if args.record:
                record_time_to_target(f"{latents}_vae_auto", "frontier.discrete_vae", runs,
                                      args.time_to_target, argv, args.batch)
            continue
        vae = make_vae(latents, x.shape[-1])
        labs[latents] = lab = measure(vae, x, args.samples, args.rounds, args.strategies)
        print(f"# {latents}-latent VAE, batch {args.batch}, {describe_machine()}")
        print(lab.table(leaves=["enc"]))
        trained = None
        if args.train_seconds > 0:
            chosen = {a: STRATEGIES[latents][a] for a in lab.labels}
            trained = train_in_budget(
                vae, chosen, lab.seconds, args.train_seconds,
                jnp.asarray(binarize(jax.random.key(3), images.train)),
                jnp.asarray(binarize(jax.random.key(4), images.test)), args.seeds, args.batch)
            for a, (steps, elbos, stops) in trained.items():
                print(f"{a}: test ELBO {np.mean(elbos):.2f} ± {np.std(elbos):.2f} after "
                      f"{steps} steps; non-finite stops at {stops}")
        if args.record:
            record_lab(f"{latents}_vae", "frontier.discrete_vae", lab, trained,
                       args.train_seconds, argv,
                       _note(lab, trained, args.train_seconds, args.samples, args.batch),
                       "encoder", "test ELBO")
    return labs


if __name__ == "__main__":
    main()
