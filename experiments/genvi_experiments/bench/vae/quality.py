"""VAE quality, genvi beside NumPyro: the same networks, initial parameters, data
order, dynamic binarization, number of steps and Adam learning rate; both final
parameter sets scored by the same evaluator (test ELBO, test IWELBO-1000). The
objectives are the same, so the test ELBOs must agree up to training noise.

    python -m genvi_experiments.bench.vae.quality [--epochs 100] [--data PATH]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import optax

from genvi_experiments.bench import systems
from genvi_experiments.common.data import Images, add_experiment_arguments, images_from_args
from genvi_experiments.vae import train_vae


def train_numpyro(data: Images, nets, params: dict, *, epochs: int, batch_size: int, lr: float,
                  seed: int) -> dict:
    """NumPyro's SVI, one jitted scan per epoch over a fresh permutation, each batch
    binarized afresh; returns the trained parameters in genvi's layout."""
    state, step = systems.numpyro_vae(nets, params, optax.adam(lr), batch_size)
    train = jnp.asarray(data.train)
    steps = max(1, len(train) // batch_size)

    @jax.jit
    def epoch(state, key):
        k_perm, k_bin = jax.random.split(key)
        order = jax.random.permutation(k_perm, len(train))[:steps * batch_size]
        batches = order.reshape(steps, batch_size)

        def body(state, args):
            idx, k = args
            x = jax.random.bernoulli(k, train[idx]).astype(jnp.float32)
            return step(state, k, x)

        return jax.lax.scan(body, state, (batches, jax.random.split(k_bin, steps)))

    key = jax.random.key(seed + 100)
    for e in range(epochs):
        state, _ = epoch(state, jax.random.fold_in(key, e))
    return step.get_params(jax.block_until_ready(state))


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_experiment_arguments(ap)
    ap.add_argument("--eval-particles", type=int, default=1000)
    args = ap.parse_args(argv)
    data = images_from_args(args)
    run = train_vae(data, latent=args.latent, hidden=args.hidden, epochs=args.epochs,
                    batch_size=args.batch_size, lr=args.lr, eval_particles=args.eval_particles,
                    eval_every=args.epochs, seed=args.seed, progress=False)
    nets, evaluate = run["nets"], run["evaluate"]
    numpyro_params = train_numpyro(data, nets, run["init"],
                                   epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                                   seed=args.seed)
    eval_key = jax.random.key(args.seed + 7)
    scores = {"genvi": evaluate(run["params"], eval_key), "numpyro": evaluate(numpyro_params, eval_key)}
    print(f"# VAE on {data.name}: {args.epochs} epochs, batch {args.batch_size}, Adam {args.lr}, "
          f"hidden {args.hidden}, latent {args.latent}")
    print("| system | test ELBO | test log-lik (IWELBO-1000) |")
    print("|---|---|---|")
    for name, s in scores.items():
        print(f"| {name} | {s['test ELBO']:.3f} | {s['test log-lik (IWELBO-1000)']:.3f} |")
    gap = scores["genvi"]["test ELBO"] - scores["numpyro"]["test ELBO"]
    print(f"genvi − NumPyro test ELBO: {gap:+.3f} nats per image")
    return {"scores": scores, "gap": gap}


if __name__ == "__main__":
    main()
