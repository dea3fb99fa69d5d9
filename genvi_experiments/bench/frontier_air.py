"""The estimator frontier on AIR's z_pres: the ELBO of `genvi_experiments/air` (the
model, guide, networks and canvases of the AIR experiment) with one strategy at the
guide's z_pres site (a flip in each step of a `gv.scan`, followed by a `lax.cond` on
it) per row: REINFORCE, RLOO(2), MVD, ENUM, SD, DisARM (lane by lane and whole site)
and AUTO, measured by `gv.compare_estimators` at the initial parameters (the guide's
gradient variance, seconds per estimate, their product).

SWOR is a categorical estimator, and z_pres is binary. RELAX needs a surrogate of the
relaxed presences that the AIR guide does not have; it is measured on the VAEs and the
mixture instead (`discrete_vae`, `frontier_gmm`).

    python -m genvi_experiments.bench.frontier_air [--batch 8] [--samples 300] [--record]

`--record` writes the table (`air_frontier`) to BENCHMARKS.md.
"""

from __future__ import annotations

import argparse

import jax

import genvi as gv
from genvi_experiments.air.config import AIRConfig
from genvi_experiments.air.data import make_canvases
from genvi_experiments.air.model import AIRNets, air_programs
from genvi_experiments.bench.frontier import record_lab
from genvi_experiments.common.timing import describe_machine

STRATEGIES = {"REINFORCE": gv.REINFORCE, "RLOO(2)": gv.RLOO(2), "MVD": gv.MVD, "ENUM": gv.ENUM,
              "SD": gv.SD, "DisARM": gv.DisARM, "DisARM-whole-site": gv.DisARM.whole_site(),
              "AUTO": gv.AUTO}


def objective(cfg: AIRConfig, nets: AIRNets, strategy) -> gv.Expectation:
    """The batch-mean ELBO with `strategy` at every step's z_pres."""
    model, guide = air_programs(cfg, nets, lambda t, info: strategy)
    return gv.batch_mean(gv.elbo(model, guide))


def measure(batch: int, samples: int, rounds: int,
            strategies: list[str] | None = None) -> gv.EstimatorComparison:
    """The lab on AIR at its initial parameters (seed 0) on `batch` canvases; AUTO's row
    is the objective with the choice `gv.tune` makes there."""
    cfg = AIRConfig()
    nets = AIRNets(cfg)
    params = nets.init(jax.random.key(0))
    x = jax.numpy.asarray(make_canvases(train=batch, test=1).train)
    chosen = STRATEGIES if strategies is None else {a: STRATEGIES[a] for a in strategies}
    objectives = {}
    for label, strategy in chosen.items():
        objectives[label] = objective(cfg, nets, strategy)
        if strategy is gv.AUTO:
            tuning = gv.tune(objectives[label], params, x, key=jax.random.key(5))
            print(tuning)
            objectives[label] = tuning.apply(objectives[label])
    return gv.compare_estimators(objectives, jax.random.key(2), params, x, samples=samples,
                                 rounds=rounds, leaves=["guide"])


def main(argv: list[str] | None = None) -> gv.EstimatorComparison:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--strategies", nargs="+", default=None, choices=list(STRATEGIES))
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args(argv)
    lab = measure(args.batch, args.samples, args.rounds, args.strategies)
    print(f"# AIR z_pres, batch {args.batch}, {describe_machine()}")
    print(lab.table(leaves=["guide"]))
    if args.record:
        note = (f"{args.samples} gradient estimates per strategy at the initial parameters, "
                f"a batch of {args.batch} canvases (50 × 50, up to 2 digits, 3 steps); "
                "variance summed over the guide's entries.")
        record_lab("air_frontier", "frontier_air", lab, None, 0.0, argv, note, "guide", "")
    return lab


if __name__ == "__main__":
    main()
