"""The same VAE training step in four systems, for side-by-side timing and quality
comparisons: genvi, hand-written JAX, NumPyro (`SVI`, `Trace_ELBO`, `flax_module`)
and Pyro (torch on the GPU where torch sees one, else on the CPU; `pip install -e ".[pyro]"`).

Every JAX side uses the Flax networks of `genvi_experiments.common.nets`, the same
initial parameters and `optax.adam`; each step maps `(state, key, x) -> (state,
ELBO estimate)` where `x` is a batch of binary images, and the objective is the
batch mean of single-sample ELBOs (NumPyro's and Pyro's sums are scaled by 1/B).
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

import genvi as gv
from genvi_experiments.common.nets import VAENets, gaussian_head
from genvi_experiments.vae import vae_programs

Step = Callable[[Any, jax.Array, jax.Array], tuple[Any, jax.Array]]
VAE_LR = 1e-3  # Adam's learning rate in every system's VAE step


def vae_inputs(nets: VAENets, batch: int) -> tuple[jax.Array, dict, np.ndarray]:
    """The fixed inputs every system's VAE step is timed on at this batch size: a key,
    the initial parameters, and a float32 batch of binary images (pixels on w.p. 0.3)."""
    key = jax.random.key(batch)
    x = np.asarray(jax.random.bernoulli(jax.random.key(1), 0.3, (batch, nets.pixels)), np.float32)
    return key, nets.init(key), x


def genvi_vae(nets: VAENets, params: dict, opt: optax.GradientTransformation) -> tuple[Any, Step]:
    model, guide = vae_programs(nets)
    objective = gv.batch_mean(gv.elbo(model, guide))

    @jax.jit
    def step(state, key, x):
        params, opt_state = state
        value, grads = objective.value_and_grad_estimate(key, params, x)
        updates, opt_state = opt.update(jax.tree_util.tree_map(jnp.negative, grads), opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    return (params, opt.init(params)), step


def hand_vae_neg_elbo(nets: VAENets, params: dict, key: jax.Array, x: jax.Array) -> jax.Array:
    """−ELBO, reparameterized, written directly in JAX (log q at the sample)."""
    mean, scale = nets.encode(params, x)
    eps = jax.random.normal(key, mean.shape)
    z = mean + scale * eps
    logits = nets.decode(params, z)
    log_lik = jnp.sum(x * logits - jax.nn.softplus(logits), -1)
    log_prior = jnp.sum(-0.5 * z ** 2 - 0.5 * jnp.log(2 * jnp.pi), -1)
    log_q = jnp.sum(-0.5 * eps ** 2 - jnp.log(scale) - 0.5 * jnp.log(2 * jnp.pi), -1)
    return -jnp.mean(log_lik + log_prior - log_q)


def hand_vae(nets: VAENets, params: dict, opt: optax.GradientTransformation) -> tuple[Any, Step]:
    @jax.jit
    def step(state, key, x):
        params, opt_state = state
        loss, grads = jax.value_and_grad(lambda p: hand_vae_neg_elbo(nets, p, key, x))(params)
        updates, opt_state = opt.update(grads, opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), -loss

    return (params, opt.init(params)), step


def numpyro_vae(nets: VAENets, params: dict, opt: optax.GradientTransformation,
                batch: int) -> tuple[Any, Step]:
    """NumPyro's SVI on the same model; the SVI state carries its own key, so the
    step's key argument is unused (NumPyro splits its key inside `update`)."""
    import numpyro
    import numpyro.distributions as dist
    from numpyro.contrib.module import flax_module
    from numpyro.infer import SVI, Trace_ELBO

    def model(x):
        decoder = flax_module("decoder", nets.decoder, input_shape=(nets.latent,))
        with numpyro.plate("batch", x.shape[0]), numpyro.handlers.scale(scale=1.0 / x.shape[0]):
            z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([nets.latent]).to_event(1))
            numpyro.sample("x", dist.Bernoulli(logits=decoder(z)).to_event(1), obs=x)

    def guide(x):
        encoder = flax_module("encoder", nets.encoder, input_shape=(nets.pixels,))
        with numpyro.plate("batch", x.shape[0]), numpyro.handlers.scale(scale=1.0 / x.shape[0]):
            mean, scale = gaussian_head(encoder(x))
            numpyro.sample("z", dist.Normal(mean, scale).to_event(1))

    svi = SVI(model, guide, opt, Trace_ELBO())
    init = {"encoder$params": params["enc"], "decoder$params": params["dec"]}
    state = svi.init(jax.random.key(0), jnp.zeros((batch, nets.pixels)), init_params=init)

    @jax.jit
    def step(state, key, x):
        state, loss = svi.update(state, x)
        return state, -loss

    step.get_params = lambda state: {"enc": svi.get_params(state)["encoder$params"],
                                     "dec": svi.get_params(state)["decoder$params"]}
    return state, step


def torch_mlp(sizes: list[int]):
    import torch.nn as tnn
    layers = []
    for i, (m, n) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(tnn.Linear(m, n))
        if i < len(sizes) - 2:
            layers.append(tnn.ReLU())
    return tnn.Sequential(*layers)


def torch_device() -> str:
    """Where the torch side of a comparison runs: "cuda" where torch sees a GPU, else
    "cpu" (the JAX side runs on JAX's default device)."""
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def pyro_vae(nets: VAENets, lr: float, device: str = "cpu") -> Callable[[Any], float]:
    """Pyro's SVI step on the same model (torch networks of the same shapes, on
    `device`), as `step(x) -> ELBO estimate` for a float32 torch tensor `x` there."""
    import pyro
    import pyro.distributions as pdist
    import torch
    from pyro.infer import SVI, Trace_ELBO
    from pyro.optim import Adam

    encoder = torch_mlp([nets.pixels, nets.hidden, 2 * nets.latent]).to(device)
    decoder = torch_mlp([nets.latent, nets.hidden, nets.pixels]).to(device)
    prior_loc = torch.zeros(nets.latent, device=device)

    def model(x):
        pyro.module("decoder", decoder)
        with pyro.plate("batch", x.shape[0]), pyro.poutine.scale(scale=1.0 / x.shape[0]):
            z = pyro.sample("z", pdist.Normal(prior_loc, 1.0).to_event(1))
            pyro.sample("x", pdist.Bernoulli(logits=decoder(z)).to_event(1), obs=x)

    def guide(x):
        pyro.module("encoder", encoder)
        with pyro.plate("batch", x.shape[0]), pyro.poutine.scale(scale=1.0 / x.shape[0]):
            out = encoder(x)
            mean, log_scale = out.chunk(2, -1)
            pyro.sample("z", pdist.Normal(mean, log_scale.exp()).to_event(1))

    pyro.clear_param_store()
    svi = SVI(model, guide, Adam({"lr": lr}), Trace_ELBO())
    return lambda x: -svi.step(x)
