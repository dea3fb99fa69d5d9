"""Gradient estimators of a binary-latent VAE at its initial parameters: the DisARM
and RELAX papers' benchmark at digits size. 8×8 digits (binarized once), 20 binary
latents with a Bernoulli(½) prior, one-hidden-layer MLPs (64-200-20 encoder logits,
20-200-64 decoder logits), batch-mean ELBO over a batch; one strategy at the guide's
latent site per row. `gv.compare_estimators` measures each strategy's gradient
variance on the encoder (the only parameters the site's strategy changes), seconds
per gradient estimate and their product, and checks the means agree.

    python -m genvi_experiments.bench.binary_vae [--batch 64] [--samples 2000] [--record]

`--record` writes the table (as `binary_vae`, `_gpu` appended on a GPU) to
BENCHMARKS.md through `genvi_experiments.bench.results`.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import genvi as gv
from genvi_experiments.bench.results import command, on_platform, record
from genvi_experiments.common.data import binarize, load_images
from genvi_experiments.common.nets import MLP, apply, init_params
from genvi_experiments.common.timing import describe_machine

STRATEGIES = {"REINFORCE": gv.REINFORCE, "RLOO(2)": gv.RLOO(2), "DisARM": gv.DisARM,
              "DisARM-whole-site": gv.DisARM.whole_site(), "MVD": gv.MVD, "ENUM": gv.ENUM,
              "SD": gv.SD}


class BinaryVAE:
    """Encoder pixels→hidden→latent logits and decoder latent→hidden→pixel logits."""

    def __init__(self, pixels: int = 64, hidden: int = 200, latent: int = 20):
        self.pixels, self.latent = pixels, latent
        self.encoder, self.decoder = MLP((hidden, latent)), MLP((hidden, pixels))

    def init(self, key: jax.Array) -> dict:
        k1, k2 = jax.random.split(key)
        return {"enc": init_params(self.encoder, k1, self.pixels),
                "dec": init_params(self.decoder, k2, self.latent)}

    def objective(self, strategy) -> gv.Expectation:
        """The batch-mean ELBO with `strategy` at the guide's latent site."""
        @gv.gen
        def model(params, x):
            z = gv.bernoulli(jnp.zeros(self.latent)) @ "z"
            gv.observe(gv.bernoulli(apply(self.decoder, params["dec"], z * 1.0)), x)

        @gv.gen
        def guide(params, x):
            gv.bernoulli(apply(self.encoder, params["enc"], x), grad=strategy) @ "z"

        return gv.batch_mean(gv.elbo(model, guide))


def main(argv: list[str] | None = None) -> gv.EstimatorComparison:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    ap.add_argument("--record", action="store_true", help="write the table to BENCHMARKS.md")
    args = ap.parse_args(argv)
    images = load_images()
    x = jnp.asarray(binarize(jax.random.key(1), images.train[:args.batch]))
    vae = BinaryVAE(images.pixels)
    params = vae.init(jax.random.key(0))
    lab = gv.compare_estimators({name: STRATEGIES[name] for name in args.strategies},
                                jax.random.key(2), params, x, make=vae.objective,
                                samples=args.samples, rounds=args.rounds, leaves=["enc"])
    print(f"# binary-latent VAE, batch {args.batch}, {describe_machine()}")
    print(lab.table(leaves=["enc"]))
    if args.record:
        names = [f for f in lab.leaves if f.startswith("enc")]
        variance = {a: sum(lab.variance[a][f] for f in names) for a in lab.labels}
        rows = [[a, f"{variance[a]:.3g}", f"{lab.seconds[a] * 1e3:.2f}",
                 f"{lab.seconds[a] / lab.seconds['REINFORCE']:.2f}"
                 if "REINFORCE" in lab.labels else "–",
                 f"{variance[a] * lab.seconds[a]:.3g}",
                 "yes" if any(lab.biased[a][f] for f in names) else "no"] for a in lab.labels]
        record(on_platform("binary_vae"), command("binary_vae", argv),
               ["strategy", "encoder gradient variance", "ms / estimate", "÷ REINFORCE's time",
                "variance × seconds", "mean flagged?"], rows,
               note=f"{args.samples} gradient estimates per strategy at the initial parameters, "
                    f"batch {args.batch}; variance summed over the encoder's entries.")
    return lab


if __name__ == "__main__":
    main()
