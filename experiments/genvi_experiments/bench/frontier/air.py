"""The estimator frontier on AIR's z_pres: the ELBO of `experiments/genvi_experiments/air` (the
model, guide, networks and canvases of the AIR experiment) with one strategy at the
guide's z_pres site (a flip in each step of a `gv.scan`, followed by a `lax.cond` on
it) per row: REINFORCE, RLOO(2), MVD, ENUM, SD, DisARM (lane by lane and whole site),
RELAX (both forms) and AUTO, measured by `gv.compare_estimators` at the initial
parameters (the guide's gradient variance, seconds per estimate, their product).

SWOR is a categorical estimator, and z_pres is binary. RELAX's surrogate is a small
network of a step's relaxed presence and its logit (per canvas and step; an absent
object's logit is the model's bound, its presence certain), its parameters in
`params["relax"]`, one per form.

    python -m genvi_experiments.bench.frontier.air [--batch 8] [--samples 300] [--record]
    python -m genvi_experiments.bench.frontier.air --time-to-target 320 --seeds 2 [--record]

With `--time-to-target S`, each strategy trains AIR as `genvi run air` does (Adam at
`--lr` 1e-3, minibatches of `--train-batch` 64, here of 2,000 generated canvases) for
S wall-clock seconds from each start (compiling, and AUTO's measurements, counted), and
the table (`air_frontier_auto`) gives the seconds each took to reach a target training
objective: what the best strategy reached at a quarter of its run
(`harness.trajectories`). AIR learns in two phases: the reparameterized z_what,
z_where and decoder first, in which z_pres's strategy hardly matters, then the count,
in which it does; the run must be long enough that its quarter falls after the first
phase (at 60 s and a learning rate of 1e-4 it did not, and every strategy reached the
target within 1.2 times the best's time).

With `--to-level L`, each start trains until the mean training objective of its last
50 steps reaches L (or `--time-to-target` seconds, 320 by default, have passed), and
the table gives the step and the seconds at which each start reached it
(`harness.runs_to_level`): a start stops there, so five starts of every strategy fit
in the time two full runs take, and its steps, unlike its seconds, repeat from run to
run on one machine (not across CPUs: XLA compiles for the host's, and the training
amplifies a rounding difference; `air_frontier_level`, with `--table`). With several levels
(`--to-level 645 650 652.56 654`), each start trains to the highest and the table gives
every strategy's median seconds and steps to each (`harness.runs_to_levels`), how the
distance between strategies changes with the level, measured on the same starts.

With `--trained-steps N`, the estimator table is measured at the parameters N steps
of training with ENUM reach (`--lr`, `--train-batch`), on the first `--batch` training
canvases, where the candidates' variances come apart or do not (`--lab-table` names
it: `air_frontier_trained`).

`--record` writes the table (`air_frontier`, or `air_frontier_auto`, or with `--table`
another name: `air_frontier_auto_pair` is AUTO against ENUM, the best, over more
starts) to docs/benchmarks/frontier.md.
"""

from __future__ import annotations

import argparse
from dataclasses import replace

import jax
import optax

import genvi as gv
from genvi_experiments.air.config import AIRConfig
from genvi_experiments.air.data import make_canvases
from genvi_experiments.air.model import AIRNets, air_programs
from genvi_experiments.bench.frontier.harness import (
    RELAX, RELAX_FORMS, RELAX_WHOLE, add_table_option, measure, record_lab, record_runs_to_level,
    record_runs_to_levels, runs_to_levels, record_time_to_target, relax_init, relax_note,
    runs_to_level, site_strategy, surrogate_value, time_to_target, trajectories)
from genvi_experiments.common.nets import MLP, init_params
from genvi_experiments.common.timing import describe_machine

STRATEGIES = {"REINFORCE": gv.REINFORCE, "RLOO(2)": gv.RLOO(2), "MVD": gv.MVD, "ENUM": gv.ENUM,
              "SD": gv.SD, "DisARM": gv.DisARM, "DisARM-whole-site": gv.DisARM.whole_site(),
              "RELAX": RELAX, "RELAX-whole-site": RELAX_WHOLE, "AUTO": gv.AUTO}


class AIRPresence:
    """AIR with one strategy at z_pres: a `harness.FrontierModel` for the lab (no
    training column, so no `score`).

    Example:
        >>> m = AIRPresence(AIRConfig())
        >>> sorted(m.init(jax.random.key(0)))
        ['decoder', 'guide', 'relax']
    """

    name = "air"
    strategies = STRATEGIES
    leaves = ("guide",)

    def __init__(self, cfg: AIRConfig):
        self.cfg, self.nets, self.lr = cfg, AIRNets(cfg), cfg.lr
        self.surrogate = MLP((16, 1))

    def init(self, key: jax.Array) -> dict:
        """AIR's networks (as `genvi run air` starts them) and untrained surrogates."""
        params = self.nets.init(key)
        params["relax"] = relax_init(
            lambda: init_params(self.surrogate, jax.random.fold_in(key, 1), 2))
        return params

    def objective(self, strategy) -> gv.Expectation:
        """The batch-mean ELBO with `strategy` at every step's z_pres."""
        def pres_grad(t, info):
            return site_strategy(strategy, self._control_variate, info["params"], info["logit"])

        model, guide = air_programs(self.cfg, self.nets, pres_grad)
        return gv.batch_mean(gv.elbo(model, guide))

    def _control_variate(self, phi: dict, z: jax.Array) -> jax.Array:
        return surrogate_value(self.surrogate, phi, z)


def main(argv: list[str] | None = None) -> gv.EstimatorComparison | dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=8, help="canvases for the estimator table")
    ap.add_argument("--samples", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--strategies", nargs="+", default=None, choices=list(STRATEGIES))
    ap.add_argument("--time-to-target", type=float, default=0.0,
                    help="train each strategy this many wall-clock seconds and report the "
                         "time to a target training objective (0: do not)")
    ap.add_argument("--to-level", type=float, nargs="+", default=None,
                    help="train each strategy until the mean training objective of the last "
                         "50 steps reaches this (with several levels: the highest, reporting "
                         "each), for at most --time-to-target seconds, and report the steps "
                         "and seconds to it")
    ap.add_argument("--seeds", type=int, default=2, help="training starts per strategy")
    ap.add_argument("--canvases", type=int, default=2000,
                    help="training canvases for --time-to-target")
    ap.add_argument("--train-batch", type=int, default=64,
                    help="minibatch for --time-to-target (genvi run air's)")
    ap.add_argument("--lr", type=float, default=1e-3,
                    help="Adam's learning rate for --time-to-target (genvi run air's)")
    add_table_option(ap, "air_frontier_auto")
    ap.add_argument("--trained-steps", type=int, default=0,
                    help="measure the estimator table after this many steps of training "
                         "with ENUM (Adam at --lr, minibatches of --train-batch) rather than "
                         "at the initial parameters")
    ap.add_argument("--lab-table", default="air_frontier",
                    help="the estimator table --record writes")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args(argv)
    cfg = AIRConfig()
    chosen = STRATEGIES if args.strategies is None else \
        {a: STRATEGIES[a] for a in args.strategies}
    if args.to_level:
        train = jax.numpy.asarray(make_canvases(train=args.canvases, test=1).train)
        limit, model = args.time_to_target or 320.0, AIRPresence(replace(cfg, lr=args.lr))
        if len(args.to_level) > 1:
            runs = runs_to_levels(model, chosen, args.to_level, limit, train, args.seeds,
                                  args.train_batch)
            print(f"# AIR z_pres: steps and seconds to {args.to_level}: {runs}")
            if args.record:
                record_runs_to_levels(args.table, "frontier.air", runs, args.to_level,
                                      limit, argv, args.train_batch, 50, args.lr)
            return runs
        (level,) = args.to_level
        runs = runs_to_level(model, chosen, level, limit, train, args.seeds, args.train_batch)
        print(f"# AIR z_pres: steps and seconds to {level:g}: {runs}")
        if args.record:
            record_runs_to_level(args.table, "frontier.air", runs, level, limit, argv,
                                 args.train_batch, 50, args.lr)
        return runs
    if args.time_to_target > 0:
        train = jax.numpy.asarray(make_canvases(train=args.canvases, test=1).train)
        runs = trajectories(AIRPresence(replace(cfg, lr=args.lr)), chosen,
                            args.time_to_target, train, args.seeds, args.train_batch, chunk=50)
        target, reach = time_to_target(runs)
        print(f"# AIR z_pres: target {target:.2f}; seconds to it: {reach}")
        if args.record:
            record_time_to_target(args.table, "frontier.air", runs,
                                  args.time_to_target, argv, args.train_batch, chunk=50,
                                  lr=args.lr)
        return runs
    model, params, where = AIRPresence(cfg), None, "the initial parameters"
    if args.trained_steps:
        train = jax.numpy.asarray(make_canvases(train=args.canvases, test=1).train)
        params = gv.fit(model.objective(gv.ENUM), model.init(jax.random.key(0)), train,
                        optimizer=optax.adam(args.lr), steps=args.trained_steps,
                        key=jax.random.key(100), batch_size=args.train_batch,
                        progress=False).params
        x, where = train[:args.batch], (f"the parameters after {args.trained_steps:,} steps "
                                        "of training with ENUM")
    else:
        x = jax.numpy.asarray(make_canvases(train=args.batch, test=1).train)
    lab = measure(model, x, args.samples, args.rounds, args.strategies, params=params)
    print(f"# AIR z_pres, batch {args.batch}, {describe_machine()}")
    print(lab.table(leaves=["guide"]))
    if args.record:
        note = (f"{args.samples} gradient estimates per strategy at {where}, "
                f"a batch of {args.batch} canvases (50 × 50, up to 2 digits, 3 steps); "
                "variance summed over the guide's entries."
                + (f" Trained as --time-to-target trains (Adam {args.lr:g}, minibatches of "
                   f"{args.train_batch} of {args.canvases:,} canvases); the batch is the "
                   "first training canvases." if args.trained_steps else ""))
        if any(form in lab.labels for form in RELAX_FORMS):
            note += relax_note("canvas and step", "a step's relaxed presence and its logit",
                               ("trained" if args.trained_steps else "initial")
                               + " AIR networks, which are held", "the per-lane form (a step's "
                               "presence is one lane, and the guide's RNN carries it to every "
                               "later step, which keeps its replay from being Markov-local: "
                               "it replays the rest of the ELBO after the scan)")
        record_lab(args.lab_table, "frontier.air", lab, None, 0.0, argv, note, "guide", "",
                   at=where)
    return lab


if __name__ == "__main__":
    main()
