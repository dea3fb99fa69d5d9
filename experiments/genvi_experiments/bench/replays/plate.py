"""Discrete strategies in a plate: REINFORCE, ENUM and MVD gradient steps against B.

The ELBO of a plate of B datapoints: model z_i ~ flip(0.5), y_i ~ normal(±1, 1); guide
flip(sigmoid(l_i)); both `gv.vmap`'d. ENUM and MVD replay the rest of the objective at
each lane's other value: lane-locally (`genvi.replays.lanes`, O(B)) by default, or by
whole-objective replays (O(B²), the general path) when traced under
`whole_objective_replays()`. Prints ms per jitted gradient step (interleaved, warm,
median), ratios to REINFORCE, XLA's FLOP count of each compiled step, and `explain`'s
counts of operations executed and kernels run one after another (loops at their trip
counts) as ratios to REINFORCE's.

    python -m genvi_experiments.bench.replays.plate [--sizes 1000 4000] [--rounds 20]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import genvi as gv
from genvi_experiments.bench.replays.steps import (Step, gradient_step, rows_against_reinforce,
                                                   worst_estimate)
from genvi_experiments.common.timing import describe_machine


def plate_elbo(strategy: gv.Strategy) -> gv.Expectation:
    @gv.gen
    def model_i(l, y):
        z = gv.flip(0.5) @ "z"
        gv.observe(gv.normal(jnp.where(z, 1.0, -1.0), 1.0), y)

    @gv.gen
    def guide_i(l, y):
        gv.flip(jax.nn.sigmoid(l), grad=strategy) @ "z"

    @gv.gen
    def model(ls, ys):
        gv.vmap(model_i)(ls, ys) @ "p"

    @gv.gen
    def guide(ls, ys):
        gv.vmap(guide_i)(ls, ys) @ "p"

    return gv.elbo(model, guide)


def step_args(b: int) -> tuple:
    """(guide logits, observations) of a plate of size b."""
    return jnp.zeros(b), jnp.linspace(-2.0, 2.0, b)


def compiled_step(strategy: gv.Strategy, b: int, general: bool = False) -> Step:
    """The jitted gradient step at plate size b."""
    return gradient_step(lambda: plate_elbo(strategy), jax.random.key(0), step_args(b),
                         general)


def steps(b: int, general: bool) -> dict[str, Step]:
    """Strategy → compiled step at plate size b, with ENUM's and MVD's whole-objective
    replays when `general`."""
    out = {}
    for name, strategy in (("REINFORCE", gv.REINFORCE), ("ENUM", gv.ENUM), ("MVD", gv.MVD)):
        out[name] = compiled_step(strategy, b)
        if general and name != "REINFORCE":
            out[f"{name} (whole-objective replays)"] = compiled_step(strategy, b, True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--general-up-to", type=int, default=1000,
                    help="also time whole-objective replays at sizes up to this")
    args = ap.parse_args()
    print(f"# plate of flips, {describe_machine()}")
    print("| B | strategy | ms per step | × REINFORCE | MFLOP per step | explain: ops × | "
          "explain: kernels × | explain: estimate × |")
    print("|---|---|---|---|---|---|---|---|")
    rows = []
    for b in args.sizes:
        timed = steps(b, b <= args.general_up_to)
        for r in rows_against_reinforce(timed, args.rounds):
            print(f"| {b} | {r.name} | {r.ms:.3f} | {r.measured:.2f} | "
                  f"{timed[r.name].flops / 1e6:.3f} | {r.ops:.2f} | {r.kernels:.2f} | "
                  f"{r.estimated:.2f} |")
            rows.append(r._replace(name=f"B = {b}, {r.name}"))
    print(worst_estimate(rows))


if __name__ == "__main__":
    main()
