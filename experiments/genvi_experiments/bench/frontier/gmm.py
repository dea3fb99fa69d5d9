"""The estimator frontier on a Gaussian mixture whose guide draws the assignments: one
strategy at the guide's categorical site per row (REINFORCE, RLOO(2), SWOR(2), MVD,
ENUM, SD, RELAX in both forms, AUTO), measured by `genvi_experiments.bench.frontier.harness`.

Model: `genvi_experiments.gmm`'s (three components in 2-D, means ~ N(0, 5² I), one
plate over the dataset, minibatches standing for it). Guide: the means reparameterized
(mean-field normal), each point's assignment ~ Categorical(softmax(e^s · (−|x − μₖ|² /
2σ²) + b)) given the sampled means, with a learned sharpness s and biases b: the
assignment's strategy carries part of the means' gradient (through the logits) and
all of s's and b's. RELAX's surrogate is a small network of the relaxed assignment and
the logits, per point.

    python -m genvi_experiments.bench.frontier.gmm [--points 10000] [--batch 256]
        [--samples 2000] [--train-seconds 10 --seeds 5] [--record]
    python -m genvi_experiments.bench.frontier.gmm --time-to-target 30 --seeds 2 [--record]

`--record` writes the tables (`gmm_frontier`, `gmm_frontier_auto`, or with `--table` another
name for a run of some strategies) to docs/benchmarks/frontier.md.
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

import genvi as gv
from genvi_experiments.bench.frontier.harness import (
    RELAX, RELAX_FORMS, RELAX_WHOLE, add_table_option, measure, record_lab, relax_init, relax_note,
    site_strategy, surrogate_value, record_time_to_target, time_to_target, train_in_budget,
    trajectories)
from genvi_experiments.common.nets import MLP, init_params
from genvi_experiments.common.timing import describe_machine
from genvi_experiments.gmm import K, SD, make_points, mixture_guide, mixture_model

STRATEGIES = {"REINFORCE": gv.REINFORCE, "RLOO(2)": gv.RLOO(2), "SWOR(2)": gv.SWOR(2),
              "MVD": gv.MVD, "ENUM": gv.ENUM, "SD": gv.SD, "RELAX": RELAX,
              "RELAX-whole-site": RELAX_WHOLE, "AUTO": gv.AUTO}


class MixtureWithAssignments:
    """The mixture and its guide over `points` (the dataset a minibatch stands for); a
    `harness.FrontierModel`. `score` is the ELBO of `held_out` points.

    Example:
        >>> from genvi_experiments.gmm import make_points
        >>> m = MixtureWithAssignments(make_points(100)[0], make_points(50, seed=1)[0])
        >>> sorted(m.init(jax.random.key(0)))
        ['bias', 'loc', 'log_scale', 'relax', 'sharp']
    """

    name = "gmm"
    strategies = STRATEGIES
    leaves = ("bias", "loc", "log_scale", "sharp")
    lr = 0.05

    def __init__(self, points: jax.Array, held_out: jax.Array):
        self.points = points
        self.surrogate = MLP((16, 1))
        self.score = self._elbo(gv.REINFORCE, len(held_out))  # its value: any strategy's

    def init(self, key: jax.Array) -> dict:
        """Means at K distinct points of the dataset, small scales, the exact
        conditional's logits (s = 0, b = 0), an untrained surrogate."""
        k1, k2 = jax.random.split(key)
        rows = jax.random.choice(k1, len(self.points), (K,), replace=False)
        return {"loc": self.points[rows], "log_scale": jnp.full((K, 2), -1.0),
                "sharp": jnp.zeros(()), "bias": jnp.zeros(K),
                "relax": relax_init(lambda: init_params(self.surrogate, k2, 2 * K))}

    def objective(self, strategy) -> gv.Expectation:
        """The ELBO of the dataset (a minibatch in a plate of its size) with `strategy` at
        the assignments (a new program each call, as a new training script's)."""
        return self._elbo(strategy, len(self.points))

    def _strategy(self, strategy, params: dict, logits: jax.Array):
        return site_strategy(strategy, self._control_variate, params, logits)

    def _control_variate(self, phi: dict, z: jax.Array) -> jax.Array:
        return surrogate_value(self.surrogate, phi, z)

    def _elbo(self, strategy, size: int) -> gv.Expectation:
        @gv.gen
        def assignment(params, means, x):
            fit = -0.5 * jnp.sum((x - means) ** 2, -1) / SD ** 2
            logits = jnp.exp(params["sharp"]) * fit + params["bias"]
            gv.categorical(logits, grad=self._strategy(strategy, params, logits)) @ "z"

        return gv.elbo(mixture_model(size), mixture_guide(size, assignment))


def _note(lab: gv.EstimatorComparison, trained: dict | None, budget: float, samples: int,
          batch: int, points: int) -> str:
    note = (f"{samples} gradient estimates per strategy at the initial parameters, a "
            f"minibatch of {batch} of {points:,} points; variance summed over the guide's "
            "entries (means, sharpness, biases).")
    if any(form in lab.labels for form in RELAX_FORMS):
        note += relax_note("point", "the relaxed assignment and its logits, per point",
                           "initial guide, which is held", "the per-lane form (the points' replays "
                           "are lane-local)")
    if trained:
        seeds = len(next(iter(trained.values()))[1])
        note += (f" Training: Adam(0.05) on minibatches of {batch}, for as many steps as "
                 f"{budget:g} s hold at the strategy's time per estimate, from {seeds} starts "
                 "(mean ± sd); the held-out ELBO is the mean of 20 estimates on 2,000 "
                 "held-out points.")
    return note


def main(argv: list[str] | None = None) -> gv.EstimatorComparison | dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=10_000)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--strategies", nargs="+", default=None, choices=list(STRATEGIES))
    ap.add_argument("--train-seconds", type=float, default=0.0)
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--time-to-target", type=float, default=0.0)
    add_table_option(ap, "gmm_frontier_auto")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args(argv)
    points, held_out = make_points(args.points)[0], make_points(2000, seed=1)[0]
    model = MixtureWithAssignments(points, held_out)
    chosen = STRATEGIES if args.strategies is None else \
        {a: STRATEGIES[a] for a in args.strategies}
    if args.time_to_target > 0:
        runs = trajectories(model, chosen, args.time_to_target, points, args.seeds, args.batch)
        target, reach = time_to_target(runs)
        print(f"# gmm: target {target:.2f}; seconds to it: {reach}")
        if args.record:
            record_time_to_target(args.table, "frontier.gmm", runs,
                                  args.time_to_target, argv, args.batch)
        return runs
    x = points[:args.batch]
    lab = measure(model, x, args.samples, args.rounds, args.strategies)
    print(f"# GMM with guide assignments, batch {args.batch}, {describe_machine()}")
    print(lab.table())
    trained = None
    if args.train_seconds > 0:
        trained = train_in_budget(model, chosen, lab.seconds, args.train_seconds, points,
                                  held_out, args.seeds, args.batch)
        for a, (steps, scores, stops) in trained.items():
            print(f"{a}: held-out ELBO {np.mean(scores):.2f} ± {np.std(scores):.2f} after "
                  f"{steps} steps; non-finite stops at {stops}")
    if args.record:
        record_lab("gmm_frontier", "frontier.gmm", lab, trained, args.train_seconds, argv,
                   _note(lab, trained, args.train_seconds, args.samples, args.batch,
                         args.points), "guide", "held-out ELBO")
    return lab


if __name__ == "__main__":
    main()
