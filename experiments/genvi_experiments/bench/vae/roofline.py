"""How fast can a VAE step be on this machine? A matrix-product floor for the step.

A VAE training step with one-hidden-layer MLPs is, at MNIST size, almost all matrix
products: four forward products, four weight gradients and three input gradients
(the encoder's first layer needs no input gradient). No system can take a step
faster than those eleven products take on the same cores, so

    Pyro time / floor time

bounds the speed-up over Pyro that *any* implementation could show here. This
script measures that floor twice (the eleven products alone, in XLA and in torch),
the machine's peak GEMM rate, the step's FLOPs (counted, and as XLA's cost analysis
reports them for genvi's compiled step), and genvi's and Pyro's step times, all
interleaved in one process.

    python -m genvi_experiments.bench.vae.roofline [--pixels 784 --hidden 400]
        [--batches 64 256 1024]
"""

from __future__ import annotations

import argparse
import importlib.util
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from genvi_experiments.bench import systems
from genvi_experiments.common.nets import VAENets
from genvi_experiments.common.timing import (describe_machine, interleaved_samples, median,
                                             paired_ratio)

def product_shapes(nets: VAENets, batch: int) -> list[tuple[int, int, int]]:
    """(m, k, n) of each matrix product of one VAE training step: forward, weight
    gradients, input gradients (none for the encoder's first layer: x is data)."""
    p, h, two_l, l = nets.pixels, nets.hidden, 2 * nets.latent, nets.latent
    layers = [(p, h), (h, two_l), (l, h), (h, p)]            # encoder, decoder dense layers
    forward = [(batch, k, n) for k, n in layers]
    weight_grads = [(k, batch, n) for k, n in layers]
    input_grads = [(batch, n, k) for k, n in layers[1:]]
    return forward + weight_grads + input_grads


def step_flops(nets: VAENets, batch: int) -> float:
    return float(sum(2 * m * k * n for m, k, n in product_shapes(nets, batch)))


def xla_products(shapes):
    """The step's products alone, as one jitted XLA computation."""
    rng = np.random.default_rng(0)
    operands = [(jnp.asarray(rng.standard_normal((m, k)), jnp.float32),
                 jnp.asarray(rng.standard_normal((k, n)), jnp.float32)) for m, k, n in shapes]
    run = jax.jit(lambda ops: [a @ b for a, b in ops])
    jax.block_until_ready(run(operands))
    return lambda: run(operands)


def torch_products(shapes):
    import torch
    gen = torch.Generator().manual_seed(0)
    operands = [(torch.randn(m, k, generator=gen), torch.randn(k, n, generator=gen))
                for m, k, n in shapes]

    def run():
        with torch.no_grad():
            return [a @ b for a, b in operands]
    run()
    return run


def peak_gflops(size: int = 2048, rounds: int = 7) -> dict[str, float]:
    """Best-case float32 GEMM rate of XLA (and torch, when installed) on this machine."""
    fns = {"xla": xla_products([(size, size, size)])}
    if importlib.util.find_spec("torch"):
        fns["torch"] = torch_products([(size, size, size)])
    samples = interleaved_samples(fns, rounds=rounds, reps=2, warmup=1)
    return {name: 2 * size ** 3 / min(s) / 1e9 for name, s in samples.items()}


def genvi_step(nets: VAENets, batch: int):
    key, params, x = systems.vae_inputs(nets, batch)
    state, step = systems.genvi_vae(nets, params, optax.adam(systems.VAE_LR))
    compiled = step.lower(state, key, x).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    jax.block_until_ready(step(state, key, x))
    return (lambda: step(state, key, x)), float((cost or {}).get("flops", float("nan"))), x


def measure(nets: VAENets, batch: int, rounds: int, with_pyro: bool) -> dict:
    shapes = product_shapes(nets, batch)
    genvi_fn, xla_flops, x = genvi_step(nets, batch)
    fns = {"genvi": genvi_fn, "floor_xla": xla_products(shapes)}
    if with_pyro:
        import torch
        pyro_step = systems.pyro_vae(nets, systems.VAE_LR)
        tx = torch.from_numpy(x)
        pyro_step(tx)
        fns["floor_torch"] = torch_products(shapes)
        fns["pyro"] = lambda: pyro_step(tx)
    reps = max(1, 512 // batch)
    samples = interleaved_samples(fns, rounds=rounds, reps=reps, warmup=2)
    row = {name: median(s) for name, s in samples.items()}
    row.update(batch=batch, flops=step_flops(nets, batch), xla_flops=xla_flops)
    if with_pyro:
        row["floor"] = min(row["floor_xla"], row["floor_torch"])
        row["pyro_over_genvi"] = paired_ratio(samples, "pyro", "genvi")
        # the floor of each round is the faster library's products in that round
        row["pyro_over_floor"] = median([p / min(a, b) for p, a, b in zip(
            samples["pyro"], samples["floor_xla"], samples["floor_torch"])])
    else:
        row["floor"] = row["floor_xla"]
    return row


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--pixels", type=int, default=784)
    ap.add_argument("--hidden", type=int, default=400)
    ap.add_argument("--latent", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--peak-size", type=int, default=2048, help="square GEMM for the peak rate")
    ap.add_argument("--no-pyro", action="store_true", help="skip torch and Pyro")
    args = ap.parse_args(argv)
    with_pyro = not args.no_pyro and importlib.util.find_spec("pyro") is not None
    nets = VAENets(args.pixels, args.hidden, args.latent)
    t0 = time.perf_counter()
    peak = peak_gflops(args.peak_size)
    print(f"# VAE step roofline, {args.pixels}-{args.hidden}-{args.latent}, {describe_machine()}")
    print(f"# peak float32 GEMM ({args.peak_size}³): " +
          ", ".join(f"{name} {rate:.0f} GFLOP/s" for name, rate in peak.items()))
    cols = ["batch", "step GFLOP (counted)", "XLA cost analysis GFLOP", "floor XLA (ms)"]
    if with_pyro:
        cols += ["floor torch (ms)", "genvi step (ms)", "Pyro step (ms)", "Pyro / genvi",
                 "Pyro / floor (best any system can do)"]
    else:
        cols += ["genvi step (ms)", "genvi / floor"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    rows = []
    for b in args.batches:
        r = measure(nets, b, args.rounds, with_pyro)
        r["peak_gflops"] = peak
        rows.append(r)
        cells = [f"{b}", f"{r['flops'] / 1e9:.3f}", f"{r['xla_flops'] / 1e9:.3f}",
                 f"{r['floor_xla'] * 1e3:.2f}"]
        if with_pyro:
            cells += [f"{r['floor_torch'] * 1e3:.2f}", f"{r['genvi'] * 1e3:.2f}",
                      f"{r['pyro'] * 1e3:.2f}", f"{r['pyro_over_genvi']:.2f}",
                      f"{r['pyro_over_floor']:.2f}"]
        else:
            cells += [f"{r['genvi'] * 1e3:.2f}", f"{r['genvi'] / r['floor']:.2f}"]
        print("| " + " | ".join(cells) + " |", flush=True)
    print(f"# {time.perf_counter() - t0:.0f} s")
    return rows


if __name__ == "__main__":
    main()
