"""VAE training step: genvi against the same step hand-written in JAX.

784-400-10 MLPs, Bernoulli pixels, `mv_normal_diag` REPARAM guide, `gv.batch_mean`
over the batch, Adam. Both sides share network code and optimizer; the hand-written
step is `jax.grad` of the reparameterized single-sample ELBO (log q evaluated at the
sample, as genvi's `gv.elbo` does). Timed interleaved, warm, median.

    python -m experiments.bench.vae_step [--batches 64 256 1024] [--rounds 30]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import optax

import genvi as gv
from experiments.common.nets import encode, mlp, vae_init
from experiments.common.timing import (compile_time, describe_machine, interleaved_samples,
                                      median, paired_ratio)

LATENT = 10


@gv.gen
def model(params, x):
    z = gv.mv_normal_diag(jnp.zeros(LATENT), jnp.ones(LATENT)) @ "z"
    gv.observe(gv.bernoulli(mlp(params["dec"], z)), x)


@gv.gen
def guide(params, x):
    mu, log_scale = encode(params, x)
    gv.mv_normal_diag(mu, jnp.exp(log_scale), grad=gv.REPARAM) @ "z"


objective = gv.batch_mean(gv.elbo(model, guide), in_axes=(None, 0))


def handwritten_neg_elbo(params, key, x):
    """−ELBO, reparameterized, written directly in JAX."""
    mu, log_scale = encode(params, x)
    eps = jax.random.normal(key, mu.shape)
    z = mu + jnp.exp(log_scale) * eps
    logits = mlp(params["dec"], z)
    log_lik = jnp.sum(x * jax.nn.log_sigmoid(logits) + (1 - x) * jax.nn.log_sigmoid(-logits), -1)
    log_prior = jnp.sum(-0.5 * z ** 2 - 0.5 * jnp.log(2 * jnp.pi), -1)
    log_q = jnp.sum(-0.5 * eps ** 2 - log_scale - 0.5 * jnp.log(2 * jnp.pi), -1)
    return -jnp.mean(log_lik + log_prior - log_q)


def make_steps(opt):
    @jax.jit
    def genvi_step(params, state, key, x):
        value, grads = objective.value_and_grad_estimate(key, params, x)
        updates, state = opt.update(jax.tree_util.tree_map(jnp.negative, grads), state, params)
        return optax.apply_updates(params, updates), state, value

    @jax.jit
    def hand_step(params, state, key, x):
        loss, grads = jax.value_and_grad(handwritten_neg_elbo)(params, key, x)
        updates, state = opt.update(grads, state, params)
        return optax.apply_updates(params, updates), state, -loss

    return genvi_step, hand_step


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--rounds", type=int, default=100)
    args = ap.parse_args(argv)
    opt = optax.adam(1e-3)
    genvi_step, hand_step = make_steps(opt)
    print(f"# VAE step, {describe_machine()}")
    print("| batch | hand-written JAX (ms) | genvi (ms) | genvi / hand (median of paired ratios) "
          "| compile hand (s) | compile genvi (s) |")
    print("|---|---|---|---|---|---|")
    for b in args.batches:
        key = jax.random.key(b)
        params = vae_init(key)
        state = opt.init(params)
        x = jax.random.bernoulli(jax.random.key(1), 0.3, (b, 784)).astype(jnp.float32)
        c_hand = compile_time(hand_step, params, state, key, x)
        c_genvi = compile_time(genvi_step, params, state, key, x)
        samples = interleaved_samples({
            "hand": lambda: hand_step(params, state, key, x),
            "genvi": lambda: genvi_step(params, state, key, x),
        }, rounds=args.rounds, reps=max(1, 256 // b))
        print(f"| {b} | {median(samples['hand']) * 1e3:.2f} | {median(samples['genvi']) * 1e3:.2f} | "
              f"{paired_ratio(samples, 'genvi', 'hand'):.3f} | {c_hand:.2f} | {c_genvi:.2f} |",
              flush=True)


if __name__ == "__main__":
    main()
