"""Fingerprints of the programs genvi compiles for the speed benches' steps: the VAE
step, the plate and HMM replay steps, the enumeration bench's steps, and AIR's training
steps.

A change to genvi's interpreters that emits the same StableHLO for every step cannot
change their speed; this prints, per step, a hash of the lowered module's text
(without source locations) and its length, so two commits' outputs can be compared
line by line (`python -m genvi_experiments.bench.against` runs a bench at two
commits side by side; here a `diff` of two runs is enough):

    python -m genvi_experiments.bench.changes.program_fingerprints > /tmp/head.txt
"""

from __future__ import annotations

import argparse
import hashlib
import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
import optax

import genvi as gv

# a lowered module names the jitted function and carries no source lines by default;
# these differ between commits without changing the program
_NAMES = re.compile(r"@[\w.]+|\"[^\"]*\"")


def fingerprint(fn: Callable, *args: Any) -> tuple[str, int]:
    """(hash, length) of `jax.jit(fn)`'s lowered StableHLO at `args`, names dropped."""
    text = jax.jit(fn).lower(*args).as_text()
    text = _NAMES.sub("_", text)
    return hashlib.sha256(text.encode()).hexdigest()[:16], len(text)


def steps(air: bool) -> dict[str, tuple[Callable, tuple]]:
    from genvi_experiments.bench import systems
    from genvi_experiments.bench.replays import plate as plate_replays, scan as scan_replays
    from genvi_experiments.common.nets import VAENets

    out: dict = {}
    nets = VAENets(784, 400, 10)  # the VAE bench's default sizes
    key, params, x = systems.vae_inputs(nets, 64)
    state, step = systems.genvi_vae(nets, params, optax.adam(systems.VAE_LR))
    out["vae step (batch 64)"] = (step, (state, key, x))
    for name, strategy in (("REINFORCE", gv.REINFORCE), ("ENUM", gv.ENUM), ("MVD", gv.MVD)):
        elbo = plate_replays.plate_elbo(strategy)
        out[f"plate {name} (b 1000)"] = (elbo.grad_estimate,
                                         (jax.random.key(0), *plate_replays.step_args(1000)))
    for name, strategy in scan_replays.STRATEGIES:
        elbo = scan_replays.hmm_elbo(strategy, "flip")
        out[f"hmm {name} (T 100)"] = (elbo.grad_estimate,
                                      (jax.random.key(0), *scan_replays.step_args("flip", 100)))
    out.update(enumeration_steps())
    if air:
        from genvi_experiments.air.config import AIRConfig
        from genvi_experiments.air.data import make_canvases
        from genvi_experiments.air.estimators import ESTIMATORS, air_objective
        from genvi_experiments.air.model import AIRNets
        from genvi_experiments.air.train import air_optimizer, make_step
        cfg = AIRConfig()
        batch = jnp.asarray(make_canvases(train=64, test=1).train)
        for name in ("reinforce", "mvd", "enum", "iwelbo_mvd"):
            nets = AIRNets(cfg)
            objective, _, _ = air_objective(cfg, nets, name)
            optimizer = air_optimizer(cfg)
            params = nets.init(jax.random.key(0), baseline=ESTIMATORS[name].baseline)
            air_step = make_step(objective, optimizer, batch, len(batch))
            out[f"air {name} (batch 64)"] = (air_step, ((params, optimizer.init(params)),
                                                        jax.random.key(1)))
    return out


def enumeration_steps() -> dict[str, tuple[Callable, tuple]]:
    """The enumeration bench's gradient steps: the mixture (1,000 points) and the HMM
    (100 steps), each with the sites summed in the model and with ENUM in the guide,
    and the batch of sequences summed in the model."""
    from genvi_experiments.bench.enumeration import mixture_hmm as bench

    out: dict = {}
    key = jax.random.key(0)
    for kind, model, site, keep, means, data in (
            ("mixture", bench.mixture, "data/z", ["w", "mu"], "mu", bench.mixture_data(1000)),
            ("hmm", bench.hmm, "steps/z", ["trans", "means"], "means", bench.hmm_data(100))):
        methods = bench.genvi_methods(model, site, keep, means, data, key)
        for method, (objective, params, _) in methods.items():
            out[f"enum {kind}: {method}"] = (objective.grad_estimate, (key, params, data))
    sequences = gv.marginal(bench.sequences_model(5), keep=["trans", "means"],
                            algorithm=gv.enumeration())
    guide = gv.auto_normal(sequences)
    ys = bench.sequences_data(50, 100, 5)
    objective = gv.elbo(sequences, guide)
    out["enum sequences 50 x 100"] = (objective.grad_estimate,
                                      (key, {"guide": guide.init(key, {}, ys)}, ys))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-air", action="store_true", help="skip AIR's steps (slow to lower)")
    args = ap.parse_args(argv)
    print(f"# JAX {jax.__version__}, numpy {np.__version__}")
    for name, (fn, fn_args) in steps(not args.no_air).items():
        digest, length = fingerprint(fn, *fn_args)
        print(f"{name:28s} {digest} {length:>9,d}")


if __name__ == "__main__":
    main()
