"""Discrete strategies in a scan: REINFORCE, ENUM, MVD and SD gradient steps against T.

The ELBO of an HMM written with `gv.scan` (model: z_t ~ categorical(A[z_{t-1}]),
y_t ~ normal(μ[z_t], 1); guide: mean-field categorical(l_t)); K = "flip" is the
two-state chain written with `gv.flip` sites (model flip(0.8 or 0.2), guide
flip(sigmoid(l_t))). ENUM and MVD replay the
rest of the objective at each step's other values: Markov-locally
(`genvi.replays.markov_scan`, O(T)) by default, or one replay per step (O(T²), the
general path) when traced under `whole_objective_replays()`. Prints ms per jitted
gradient step (interleaved, warm, median), ratios to REINFORCE, and `explain`'s counts
per step, loops at their trip counts, as ratios to REINFORCE's beside the measured
ratio: operations executed, and kernels run one after another (a scan that XLA:CPU
does not compile into one kernel runs its body kernel by kernel, tens of ns each).

K = "switching" is a switching state-space model (`switching_chain`) whose guide draws
a continuous state inside a `lax.switch` on each step's regime; K = "pairs" a two-state
chain whose emission means, computed in the model's scan from z_{t-1} and z_t, are
observed after it (`paired_emissions_elbo`).

    python -m genvi_experiments.bench.replays.scan [--lengths 100 400] [--states flip 2 3 pairs]
        [--record --table scan_replays]
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp

import genvi as gv
from genvi_experiments.bench.replays.steps import (Step, gradient_step, rows_against_reinforce,
                                                   worst_estimate)
from genvi_experiments.bench.results import command, record
from genvi_experiments.common.timing import describe_machine


def mean_field_flips(strategy: gv.Strategy) -> gv.GenFn:
    """A chain's mean-field guide: flip(sigmoid(l_t)) at each step, with `strategy`;
    takes (logits [T], observations [T])."""

    @gv.gen
    def guide_step(c, logit):
        gv.flip(jax.nn.sigmoid(logit), grad=strategy) @ "z"
        return c, None

    @gv.gen
    def guide(logits, ys):
        gv.scan(guide_step)(0, logits) @ "s"

    return guide


def flip_hmm_elbo(strategy: gv.Strategy) -> gv.Expectation:
    """The ELBO of a two-state HMM with `gv.flip` sites, the guide's with `strategy`."""

    @gv.gen
    def model_step(z_prev, y):
        z = gv.flip(jnp.where(z_prev, 0.8, 0.2)) @ "z"
        gv.observe(gv.normal(jnp.where(z, 1.0, -1.0), 1.0), y)
        return z, None

    @gv.gen
    def model(logits, ys):
        gv.scan(model_step)(False, ys) @ "s"

    return gv.elbo(model, mean_field_flips(strategy))


def paired_emissions_elbo(strategy: gv.Strategy) -> gv.Expectation:
    """The ELBO of a two-state chain whose emission at step t reads z_{t-1} and z_t (a
    switch of state adds a jump), the means computed in the model's scan and observed
    after it in one vectorized site: a step's value reaches two of the scan's outputs.
    The guide is `mean_field_flips`.

    Example:
        >>> elbo = paired_emissions_elbo(gv.ENUM)
        >>> z = jnp.zeros(5)
        >>> "reaches 2 steps" in elbo.explain(z, z).sites[0]["replays"]
        True
    """

    @gv.gen
    def model_step(z_prev, _):
        z = gv.flip(jnp.where(z_prev, 0.8, 0.2)) @ "z"
        return z, jnp.where(z, 1.0, -1.0) + jnp.where(z == z_prev, 0.0, 0.5)

    @gv.gen
    def model(logits, ys):
        _, means = gv.scan(model_step)(False, ys) @ "s"
        gv.observe(gv.normal(means, 1.0), ys)

    return gv.elbo(model, mean_field_flips(strategy))


def categorical_hmm(strategy: gv.Strategy, states: int) -> tuple:
    """A `states`-state HMM with sticky transitions (0.8 to stay) and its mean-field
    guide, the guide's sites with `strategy`: (model, guide, log transition matrix,
    emission means). Both take (guide logits [T, states], observations [T])."""
    stay, move = 0.8, 0.2 / max(states - 1, 1)
    transition = jnp.log(jnp.full((states, states), move) + jnp.eye(states) * (stay - move))
    means = jnp.linspace(-1.5, 1.5, states)

    @gv.gen
    def model_step(z_prev, y):
        z = gv.categorical(transition[z_prev]) @ "z"
        gv.observe(gv.normal(means[z], 1.0), y)
        return z, None

    @gv.gen
    def model(logits, ys):
        gv.scan(model_step)(0, ys) @ "s"

    @gv.gen
    def guide_step(c, logit):
        gv.categorical(logit, grad=strategy) @ "z"
        return c, None

    @gv.gen
    def guide(logits, ys):
        gv.scan(guide_step)(0, logits) @ "s"

    return model, guide, transition, means


def switching_chain(strategy: gv.Strategy, regimes: int = 3) -> tuple:
    """A switching state-space model and its guide, which draws a step's continuous
    state w_t inside a `lax.switch` on the step's regime z_t (the guide's z_t with
    `strategy`, w_t reparameterized): a replay at another z_t takes another branch and
    draws there. (model, guide), both taking ({"logits": [T, regimes], "mu":
    [regimes]}, observations [T]).

    Example:
        >>> model, guide = switching_chain(gv.ENUM)
        >>> args = switching_args(4)
        >>> float(gv.elbo(model, guide).estimate(jax.random.key(0), *args)) < 0
        True
    """
    means = jnp.linspace(-1.0, 1.0, regimes)

    @gv.gen
    def model_step(z_prev, y):
        z = gv.categorical(jnp.where(jnp.arange(regimes) == z_prev, 1.0, 0.0)) @ "z"
        w = gv.normal(means[z], 1.0) @ "w"
        gv.observe(gv.normal(w, 0.5), y)
        return z, None

    @gv.gen
    def model(params, ys):
        gv.scan(model_step)(0, ys) @ "s"

    @gv.gen
    def guide(params, ys):
        @gv.gen
        def guide_step(c, x):
            logits, y = x
            z = gv.categorical(logits, grad=strategy) @ "z"
            branches = [lambda y, r=r: gv.normal(params["mu"][r] + 0.5 * y, 1.0,
                                                 grad=gv.REPARAM) @ "w"
                        for r in range(regimes)]
            jax.lax.switch(z, branches, y)
            return c, None

        gv.scan(guide_step)(0, (params["logits"], ys)) @ "s"

    return model, guide


def switching_args(length: int, regimes: int = 3) -> tuple:
    """`switching_chain`'s parameters and observations for `length` steps."""
    params = {"logits": jnp.cos(jnp.arange(length * regimes * 1.0)).reshape(length, regimes),
              "mu": jnp.linspace(-0.5, 0.5, regimes)}
    return params, jnp.sin(jnp.arange(length) * 0.3) * 1.5


def hmm_elbo(strategy: gv.Strategy, states: int | str) -> gv.Expectation:
    """The ELBO of a `states`-state HMM ("flip": `flip_hmm_elbo`; "switching":
    `switching_chain`; "pairs": `paired_emissions_elbo`), its guide's sites with
    `strategy`."""
    if states == "flip":
        return flip_hmm_elbo(strategy)
    if states == "switching":
        return gv.elbo(*switching_chain(strategy))
    if states == "pairs":
        return paired_emissions_elbo(strategy)
    return gv.elbo(*categorical_hmm(strategy, states)[:2])


def step_args(states: int | str, length: int) -> tuple:
    """(guide logits, observations) of a chain of `length` steps (`switching_args` for
    "switching")."""
    if states == "switching":
        return switching_args(length)
    logits = jnp.zeros(length) if states in ("flip", "pairs") else jnp.zeros((length, states))
    return logits, jnp.sin(jnp.arange(length) * 0.3) * 1.5


def compiled_step(strategy: gv.Strategy, states: int | str, length: int,
                  general: bool = False) -> Step:
    """The jitted gradient step at `length` steps."""
    return gradient_step(lambda: hmm_elbo(strategy, states), jax.random.key(0),
                         step_args(states, length), general)


STRATEGIES = (("REINFORCE", gv.REINFORCE), ("ENUM", gv.ENUM), ("MVD", gv.MVD), ("SD", gv.SD))


def steps(states: int | str, length: int, general: bool) -> dict[str, Step]:
    """Strategy → compiled step, with ENUM's and MVD's replay-per-step paths when
    `general`."""
    out = {}
    for name, strategy in STRATEGIES:
        out[name] = compiled_step(strategy, states, length)
        if general and name in ("ENUM", "MVD"):
            out[f"{name} (a replay per step)"] = compiled_step(strategy, states, length, True)
    return out


COLUMNS = ("K", "T", "strategy", "ms per step", "× REINFORCE", "explain: ops ×",
           "explain: kernels ×", "explain: estimate ×")


def main(argv: list[str] | None = None) -> list:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lengths", type=int, nargs="+", default=[100, 400])
    ap.add_argument("--states", nargs="+", default=["flip", "3"],
                    help='"flip", "switching" (`switching_chain`), "pairs" '
                         '(`paired_emissions_elbo`), or a number of states of a categorical '
                         'chain')
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--general-up-to", type=int, default=100,
                    help="also time one replay per step at lengths up to this")
    ap.add_argument("--record", action="store_true",
                    help="write the table to results/ and docs/benchmarks/replays.md "
                         "(under --table)")
    ap.add_argument("--table", default="scan_replays", help="the result --record writes")
    args = ap.parse_args(argv)
    print(f"# HMM in gv.scan, mean-field guide; {describe_machine()}")
    print("| " + " | ".join(COLUMNS) + " |\n|" + "---|" * len(COLUMNS))
    rows, table = [], []
    for states in args.states:
        states = states if states in ("flip", "switching", "pairs") else int(states)
        for length in args.lengths:
            timed = steps(states, length, length <= args.general_up_to)
            for r in rows_against_reinforce(timed, args.rounds):
                cells = [str(states), str(length), r.name, f"{r.ms:.3f}", f"{r.measured:.2f}",
                         f"{r.ops:.2f}", f"{r.kernels:.2f}", f"{r.estimated:.2f}"]
                print("| " + " | ".join(cells) + " |")
                table.append(cells)
                rows.append(r._replace(name=f"K = {states}, T = {length}, {r.name}"))
    print(worst_estimate(rows))
    if args.record:
        record(args.table, command("replays.scan", argv), COLUMNS, table,
               note=f"ms per jitted gradient step (interleaved, warm, median of {args.rounds} "
                    "rounds); `explain`'s counts per step, loops at their trip counts, as "
                    "ratios to REINFORCE's: operations executed, kernels run one after "
                    "another, and its time estimate. \"(a replay per step)\": the same "
                    "strategy traced under `whole_objective_replays()`.")
    return rows


if __name__ == "__main__":
    main()
