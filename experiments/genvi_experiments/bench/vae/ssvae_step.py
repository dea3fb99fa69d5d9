"""Semi-supervised VAE (M2) training step: genvi beside Pyro's `TraceEnum_ELBO`.

One step: the gradient of ELBO(x_u) (label enumerated in the guide) + ELBO(x_l, y_l)
+ alpha · log q(y_l | x_l), averaged over a batch of (unlabelled, labelled) pairs,
then one Adam update. genvi enumerates with `grad=gv.ENUM`; Pyro with
`config_enumerate(..., "parallel")` and `TraceEnum_ELBO(max_plate_nesting=1)`, the
same networks' shapes in torch, the same objective (its sums scaled by 1/B).
Timed interleaved in one process; needs `pip install -e ".[pyro]"`.

    python -m genvi_experiments.bench.vae.ssvae_step [--batches 64 256] [--pixels 784 --hidden 400]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np
import optax

from genvi_experiments.bench.systems import torch_mlp
from genvi_experiments.common.timing import (compile_time, describe_machine, interleaved_samples,
                                            median, paired_ratio)
from genvi_experiments.ssvae import CLASSES, M2Nets, m2_objective, m2_programs

ALPHA, LR = 10.0, 1e-3


def genvi_m2_step(nets: M2Nets, params: dict):
    objective = m2_objective(nets, m2_programs(nets), ALPHA, binarize=False)
    opt = optax.adam(LR)

    @jax.jit
    def step(state, key, x_u, x_l, y_l):
        params, opt_state = state
        value, grads = objective.value_and_grad_estimate(key, params, x_u, x_l, y_l)
        updates, opt_state = opt.update(jax.tree_util.tree_map(jnp.negative, grads), opt_state, params)
        return (optax.apply_updates(params, updates), opt_state), value

    return (params, opt.init(params)), step


def pyro_m2_step(pixels: int, hidden: int, latent: int):
    """Pyro's M2 step (the SSVAE tutorial's model and guide) on torch tensors."""
    import pyro
    import pyro.distributions as pdist
    import torch
    from pyro.infer import TraceEnum_ELBO, config_enumerate

    classifier = torch_mlp([pixels, hidden, CLASSES])
    encoder = torch_mlp([pixels + CLASSES, hidden, 2 * latent])
    decoder = torch_mlp([latent + CLASSES, hidden, pixels])
    prior = torch.full((CLASSES,), 1.0 / CLASSES)

    def model(xs, ys=None):
        pyro.module("decoder", decoder)
        with pyro.plate("data", xs.shape[0]), pyro.poutine.scale(scale=1.0 / xs.shape[0]):
            z = pyro.sample("z", pdist.Normal(torch.zeros(latent), 1.0).to_event(1))
            ys = pyro.sample("y", pdist.OneHotCategorical(prior), obs=ys)
            pyro.sample("x", pdist.Bernoulli(logits=decoder(torch.cat([z, ys], -1))).to_event(1), obs=xs)

    @config_enumerate(default="parallel", expand=True)
    def guide(xs, ys=None):
        pyro.module("encoder", encoder)
        pyro.module("classifier", classifier)
        with pyro.plate("data", xs.shape[0]), pyro.poutine.scale(scale=1.0 / xs.shape[0]):
            if ys is None:
                ys = pyro.sample("y", pdist.OneHotCategorical(logits=classifier(xs)))
            mean, log_scale = encoder(torch.cat([xs.expand(ys.shape[:-1] + xs.shape[-1:]), ys], -1)).chunk(2, -1)
            pyro.sample("z", pdist.Normal(mean, log_scale.exp()).to_event(1))

    elbo = TraceEnum_ELBO(max_plate_nesting=1)
    params = [*classifier.parameters(), *encoder.parameters(), *decoder.parameters()]
    optimizer = torch.optim.Adam(params, lr=LR)

    def step(x_u, x_l, y_l):
        optimizer.zero_grad()
        y_onehot = torch.nn.functional.one_hot(y_l, CLASSES).float()
        log_q_y = torch.log_softmax(classifier(x_l), -1).gather(-1, y_l[:, None]).mean()
        loss = (elbo.differentiable_loss(model, guide, x_u) +
                elbo.differentiable_loss(model, guide, x_l, y_onehot) - ALPHA * log_q_y)
        loss.backward()
        optimizer.step()
        return -float(loss)

    return step


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--pixels", type=int, default=784)
    ap.add_argument("--hidden", type=int, default=400)
    ap.add_argument("--latent", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args(argv)
    import torch
    nets = M2Nets(args.pixels, args.hidden, args.latent)
    print(f"# M2 step {args.pixels}-{args.hidden}-{args.latent}, {describe_machine()}, "
          f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    print("| batch | Pyro TraceEnum_ELBO (ms) | genvi ENUM (ms) | Pyro / genvi (median paired) "
          "| compile genvi (s) |")
    print("|---|---|---|---|---|")
    rows = []
    for b in args.batches:
        rng = np.random.default_rng(b)
        x_u, x_l = (rng.random((2, b, args.pixels)) < 0.3).astype(np.float32)
        y_l = rng.integers(0, CLASSES, b).astype(np.int32)
        key = jax.random.key(0)
        state, step = genvi_m2_step(nets, nets.init(key))
        c = compile_time(step, state, key, x_u, x_l, y_l)
        pyro_step = pyro_m2_step(args.pixels, args.hidden, args.latent)
        tx_u, tx_l, ty = torch.from_numpy(x_u), torch.from_numpy(x_l), torch.from_numpy(y_l).long()
        pyro_step(tx_u, tx_l, ty)
        samples = interleaved_samples({"genvi": lambda: step(state, key, x_u, x_l, y_l),
                                       "pyro": lambda: pyro_step(tx_u, tx_l, ty)},
                                      rounds=args.rounds, reps=3, warmup=1)
        ratio = 1 / paired_ratio(samples, "genvi", "pyro")
        rows.append({"batch": b, "pyro": median(samples["pyro"]), "genvi": median(samples["genvi"]),
                     "speedup": ratio})
        print(f"| {b} | {median(samples['pyro']) * 1e3:.2f} | {median(samples['genvi']) * 1e3:.2f} | "
              f"{ratio:.1f} | {c:.2f} |", flush=True)
    return rows


if __name__ == "__main__":
    main()
