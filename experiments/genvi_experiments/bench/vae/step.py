"""VAE training step: genvi beside hand-written JAX, NumPyro and Pyro.

Bernoulli pixels, 10-dimensional Gaussian latent, one-hidden-layer MLPs (784-400 by
default, `--pixels 64 --hidden 200` for the digits size), Adam, batch mean of
single-sample ELBOs. Each pair (genvi, other) is timed in this one process,
interleaved round by round, warm; the ratio is the median over rounds of the paired
per-round ratio (robust to the machine's drift). Pyro runs on torch's GPU where
torch sees one, else on the CPU, and is skipped with a note when it is not installed
(`pip install -e ".[pyro]"`).

    python -m genvi_experiments.bench.vae.step [--batches 64 256 1024] [--systems hand numpyro pyro]
        [--pixels 784] [--hidden 400] [--rounds 60] [--record]

`--record` writes the table (as `vae_step_<pixels>`, with `_gpu` appended on a GPU)
to docs/benchmarks/vae.md through `genvi_experiments.bench.results`.
"""

from __future__ import annotations

import argparse
import importlib.util

import optax

from genvi_experiments.bench import systems
from genvi_experiments.bench.results import command, on_platform, record
from genvi_experiments.common.nets import VAENets
from genvi_experiments.common.timing import (compile_time, describe_machine, interleaved_samples,
                                            median, paired_ratio)

def jax_side(make, key, x):
    state, step = make()
    compile_s = compile_time(step, state, key, x)
    return (lambda: step(state, key, x)), compile_s


def time_pair(other: str, nets: VAENets, batch: int, rounds: int) -> dict:
    """Seconds per step of genvi and of `other` at this batch size, interleaved."""
    key, params, x = systems.vae_inputs(nets, batch)
    opt = optax.adam(systems.VAE_LR)
    genvi_fn, genvi_compile = jax_side(lambda: systems.genvi_vae(nets, params, opt), key, x)
    if other == "hand":
        other_fn, other_compile = jax_side(lambda: systems.hand_vae(nets, params, opt), key, x)
    elif other == "numpyro":
        other_fn, other_compile = jax_side(lambda: systems.numpyro_vae(nets, params, opt, batch),
                                           key, x)
    else:
        import torch
        device = systems.torch_device()
        step = systems.pyro_vae(nets, systems.VAE_LR, device)
        tx = torch.from_numpy(x).to(device)
        other_fn, other_compile = (lambda: step(tx)), compile_time(lambda: step(tx))
    # Beside Pyro, untimed warm-up calls let torch's and XLA's thread pools hand the
    # cores over before each timed block (see `interleaved_samples`).
    reps = max(1, 256 // batch)
    samples = interleaved_samples({"genvi": genvi_fn, other: other_fn}, rounds=rounds, reps=reps,
                                  warmup=2 if other == "pyro" else 0)
    return {"other": median(samples[other]), "genvi": median(samples["genvi"]),
            "ratio": paired_ratio(samples, "genvi", other),
            "compile_other": other_compile, "compile_genvi": genvi_compile}


def available(system: str) -> bool:
    needs = {"hand": None, "numpyro": "numpyro", "pyro": "pyro"}[system]
    return needs is None or importlib.util.find_spec(needs) is not None


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256, 1024])
    ap.add_argument("--systems", nargs="+", default=["hand", "numpyro", "pyro"],
                    choices=["hand", "numpyro", "pyro"])
    ap.add_argument("--pixels", type=int, default=784)
    ap.add_argument("--hidden", type=int, default=400)
    ap.add_argument("--latent", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--record", action="store_true",
                    help="write the table to docs/benchmarks/vae.md")
    args = ap.parse_args(argv)
    nets = VAENets(args.pixels, args.hidden, args.latent)
    print(f"# VAE step {args.pixels}-{args.hidden}-{args.latent}, {describe_machine()}")
    print("| other system | batch | other (ms) | genvi (ms) | genvi / other (median paired ratio) "
          "| other / genvi | compile other (s) | compile genvi (s) |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for other in args.systems:
        if not available(other):
            print(f"| {other} | (not installed: pip install -e \".[{'bench' if other == 'numpyro' else 'pyro'}]\") |")
            continue
        for b in args.batches:
            r = time_pair(other, nets, b, args.rounds)
            rows.append({"system": other, "batch": b, **r})
            print(f"| {other} | {b} | {r['other'] * 1e3:.3f} | {r['genvi'] * 1e3:.3f} | "
                  f"{r['ratio']:.3f} | {1 / r['ratio']:.2f} | {r['compile_other']:.2f} | "
                  f"{r['compile_genvi']:.2f} |", flush=True)
    if args.record:
        names = {"hand": "hand-written JAX", "numpyro": "NumPyro"}
        if any(r["system"] == "pyro" for r in rows):
            names["pyro"] = f"Pyro (torch on {systems.torch_device()})"
        record(on_platform(f"vae_step_{args.pixels}"), command("vae.step", argv),
               ["other system", "batch", "other (ms)", "genvi (ms)", "genvi / other"],
               [[names[r["system"]], r["batch"], f"{r['other'] * 1e3:.3f}",
                 f"{r['genvi'] * 1e3:.3f}", f"{r['ratio']:.3f}"] for r in rows])
    return rows


if __name__ == "__main__":
    main()
