"""The estimator frontier's measurements, shared by its models (the discrete-latent
VAEs of `frontier.discrete_vae`, the mixture of `frontier.gmm`, AIR's z_pres in
`frontier.air`): for one model, one strategy at its discrete site per row,

* `measure`: `gv.compare_estimators` at the initial parameters (gradient variance on
  the leaves the site's strategy changes, seconds per estimate, their product, and
  the lab's bias check); AUTO's row is the objective with what `gv.tune` chooses;
* `train_in_budget`: the evaluation objective each strategy reaches in a fixed
  budget of training seconds (as many steps as the budget holds at its measured
  time per estimate), from several starts;
* `trajectories` and `time_to_target`: wall-clock training runs (compiling, and
  AUTO's measurements, counted) and the seconds each took to reach a target;
* `runs_to_level` and `runs_to_levels`: runs that stop at a fixed level of the
  training objective (or the highest of several), with the step and the seconds at
  which each reached it (each level).

A model is an object with `name`, `strategies` ({label: strategy}, `RELAX`,
`RELAX_WHOLE` and `RELAX_PER_LANE` for `gv.RELAX` and its `.whole_site()` and
`.per_lane()` forms with the model's own surrogate, one per form in `params["relax"]`), `leaves` (the parameter prefixes measured),
`init(key)`, `objective(strategy)`, `score` (the evaluation objective) and `lr`.

Example:
    >>> from genvi_experiments.bench.frontier.harness import time_to_target
    >>> runs = {"A": [[(1.0, -5.0), (2.0, -1.0)]], "B": [[(1.0, -4.0), (2.0, -3.0)]]}
    >>> time_to_target(runs)          # A is best; -5.0 at a quarter of its run
    (-5.0, {'A': [1.0], 'B': [1.0]})
"""

from __future__ import annotations

import argparse
import gc
import math
import time
from collections.abc import Sequence
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np
import optax

import genvi as gv
from genvi_experiments.bench.results import command, on_platform, record
from genvi_experiments.common.nets import apply

RELAX = "RELAX"  # gv.RELAX with the model's learned surrogate (its `strategy`)
RELAX_WHOLE = "RELAX-whole-site"  # the same without the lane-local replay baseline
RELAX_PER_LANE = "RELAX-per-lane"  # the same with it, even where the lanes couple
RELAX_FORMS = (RELAX, RELAX_WHOLE, RELAX_PER_LANE)


def site_strategy(strategy: Any, surrogate: Any, params: dict, logits: jax.Array) -> Any:
    """What a model's site takes for a row: a RELAX form becomes `gv.RELAX` with the
    model's `surrogate`, that form's parameters `params["relax"][form]` (trained in the
    same step) and the site's `logits` as data (behind stop_gradient: the variance does
    not train them); any other strategy is itself.

    Example:
        >>> site_strategy(RELAX_WHOLE, lambda phi, z: z.sum(), {"relax": relax_init(dict)},
        ...               jnp.zeros(3))
        gv.RELAX(<lambda>, phi).whole_site()
    """
    if not (isinstance(strategy, str) and strategy in RELAX_FORMS):
        return strategy
    relax = gv.RELAX(surrogate, {"net": params["relax"][strategy],
                                 "logits": jax.lax.stop_gradient(logits)})
    return {RELAX_WHOLE: relax.whole_site(), RELAX_PER_LANE: relax.per_lane()}.get(strategy, relax)


def surrogate_value(net: Any, phi: dict, z: jax.Array) -> jax.Array:
    """RELAX's control variate on the frontier models (`site_strategy`'s surrogates):
    the network `net` (an `MLP` with one output, parameters `phi["net"]`) of the
    relaxed draw `z` and the site's logits `phi["logits"]`, both flattened.

    Example:
        >>> from genvi_experiments.common.nets import MLP, init_params
        >>> net = MLP((4, 1))
        >>> phi = {"net": init_params(net, jax.random.key(0), 4), "logits": jnp.zeros(2)}
        >>> surrogate_value(net, phi, jnp.full(2, 0.5)).shape
        ()
    """
    return apply(net, phi["net"], jnp.concatenate([jnp.ravel(z), jnp.ravel(phi["logits"])]))[0]


def relax_init(init: Any) -> dict:
    """A model's `params["relax"]`: one surrogate per RELAX form, from `init()`."""
    return {form: init() for form in RELAX_FORMS}


def relax_note(lane: str, inputs: str, held: str, default: str) -> str:
    """The tables' sentence on the RELAX rows: what a `lane` is, what the surrogate
    network reads (`inputs`), which parameters are `held` while it is fitted, and which
    form `gv.RELAX` takes on this model (`default`)."""
    return (f" RELAX takes {default} here; RELAX-per-lane is each {lane}'s score term with "
            "a lane-local replay baseline, RELAX-whole-site the papers' form (one "
            f"evaluation). Each row has a surrogate (a network of {inputs}), trained for "
            f"its variance 5,000 steps at the {held}; in training it starts "
            "untrained and learns in the same step.")


class FrontierModel(Protocol):
    name: str
    strategies: dict
    leaves: tuple
    lr: float

    def init(self, key: jax.Array) -> dict: ...
    def objective(self, strategy: Any) -> gv.Expectation: ...
    @property
    def score(self) -> gv.Expectation: ...


def measure(model: FrontierModel, x: jax.Array, samples: int, rounds: int,
            strategies: list[str] | None = None, seed: int = 0,
            params: dict | None = None) -> gv.EstimatorComparison:
    """The estimator lab on `model` at `params` (by default its initial parameters,
    `seed`) on the batch `x`; AUTO's row is the objective with the choice `gv.tune`
    makes there."""
    chosen = model.strategies if strategies is None else \
        {name: model.strategies[name] for name in strategies}
    if params is None:
        params = model.init(jax.random.key(seed))
    for form in RELAX_FORMS:
        if form in chosen.values():
            params = fit_surrogate(model, params, x, form)
    objectives = {}
    for label, strategy in chosen.items():
        objective = model.objective(strategy)
        if strategy is gv.AUTO:
            tuning = gv.tune(objective, params, x, key=jax.random.key(5))
            print(tuning)
            objective = tuning.apply(objective)
        objectives[label] = objective
    return gv.compare_estimators(objectives, jax.random.key(2), params, x, samples=samples,
                                 rounds=rounds, leaves=list(model.leaves))


def fit_surrogate(model: FrontierModel, params: dict, x: jax.Array, form: str = RELAX,
                  steps: int = 5000) -> dict:
    """`params` with the surrogate of RELAX's `form` (`params["relax"][form]`) trained
    at the other parameters as they are (they are held): its variance at fixed
    parameters is then the estimator's, not an untrained control variate's."""
    labels = {k: "held" for k in params}
    labels["relax"] = {f: ("relax" if f == form else "held") for f in params["relax"]}
    optimizer = optax.multi_transform({"relax": optax.adam(3e-3), "held": optax.set_to_zero()},
                                      labels)
    return gv.fit(model.objective(form), params, x, optimizer=optimizer, steps=steps,
                  key=jax.random.key(6), progress=False).params


def train_in_budget(model: FrontierModel, strategies: dict, seconds: dict[str, float],
                    budget: float, train: jax.Array, test: jax.Array, seeds: int,
                    batch: int) -> dict:
    """The evaluation objective (`model.score` on `test`, mean of 20 estimates) that each
    strategy reaches in `budget` seconds of training from each of `seeds` starts: Adam
    (`model.lr`) on minibatches of `batch`, for as many steps as `budget` holds at the
    strategy's measured seconds per gradient estimate (`seconds`). A start that stops at
    a non-finite gradient (`gv.NonFiniteError`) is scored at the parameters from before
    that step and counted. Returns {label: (steps, [score per seed], [step of each
    non-finite stop])}."""
    optimizer = optax.adam(model.lr)
    out = {}
    for label, strategy in strategies.items():
        objective, steps = model.objective(strategy), max(1, int(budget / seconds[label]))
        scores, stops = [], []
        for seed in range(seeds):
            try:
                result = gv.fit(objective, model.init(jax.random.key(10 + seed)), train,
                                optimizer=optimizer, steps=steps,
                                key=jax.random.key(100 + seed), batch_size=batch,
                                progress=False)
            except gv.NonFiniteError as stopped:
                result = stopped.result
                stops.append(stopped.step)
            keys = jax.random.split(jax.random.key(1000 + seed), 20)
            scores.append(float(jnp.mean(jax.vmap(
                lambda k, p=result.params: model.score.estimate(k, p, test))(keys))))
        out[label] = (steps, scores, stops)
    return out


class _Stop(Exception):
    """Raised by a start's watcher to end its fit: it has measured what it needs."""


def _interleaved(model: FrontierModel, strategies: dict, train: jax.Array, seeds: int,
                 batch: int, chunk: int, watcher: Any) -> dict:
    """{label: [what `watcher()` measured of each start]}: a start trains `strategies[label]`
    from `model.init(key(10 + seed))` (Adam, `model.lr`; minibatches of `batch`) and
    calls its watcher's `note(step, history, seconds since gv.fit was called)` between
    chunks of `chunk` steps, until the watcher raises `_Stop` (or a gradient is not
    finite); its `result` is the start's entry. Every start compiles its own objective:
    the persistent compilation cache is turned off (it keeps only compiles over a
    second, so it would load a fixed strategy's training step from an earlier run while
    AUTO's shorter candidate compiles ran again). The starts are interleaved, each
    seed's strategies in an order rotated by one from the last seed's, so that a machine
    whose speed drifts over the minutes (a shared one's does, by a third) slows every
    strategy alike; an untimed chunk of training first sets up what every run shares
    (JAX's own programs, the data's first batches)."""
    jax.config.update("jax_enable_compilation_cache", False)
    optimizer = optax.adam(model.lr)
    labels = list(strategies)

    def run(label: str, seed: int, steps: int) -> Any:
        watch = watcher()
        gc.collect()   # each start from a clean heap: the earlier starts' traces freed
        begin = time.perf_counter()
        try:
            gv.fit(model.objective(strategies[label]), model.init(jax.random.key(10 + seed)),
                   train, optimizer=optimizer, steps=steps, key=jax.random.key(100 + seed),
                   batch_size=batch, chunk_size=chunk, progress=False,
                   callbacks=[lambda step, params, history: watch.note(
                       step, history, time.perf_counter() - begin)])
        except (_Stop, gv.NonFiniteError):
            pass
        return watch.result

    run(labels[0], seeds, chunk)
    out: dict = {label: [] for label in labels}
    for seed in range(seeds):
        for label in labels[seed % len(labels):] + labels[:seed % len(labels)]:
            out[label].append(run(label, seed, 10 ** 7))
    return out


class _Trajectory:
    """A start's [(seconds, mean training objective of the last `chunk` steps)] at each
    chunk's end, for `budget` seconds."""

    def __init__(self, budget: float, chunk: int):
        self.budget, self.chunk, self.result = budget, chunk, []

    def note(self, step: int, history: dict, seconds: float) -> None:
        self.result.append((seconds, float(np.mean(history["objective"][-self.chunk:]))))
        if seconds > self.budget:
            raise _Stop


def trajectories(model: FrontierModel, strategies: dict, budget: float, train: jax.Array,
                 seeds: int, batch: int, chunk: int = 200) -> dict:
    """For each strategy and start: [(seconds since `gv.fit` was called, mean training
    objective of the last `chunk` steps)], training for `budget` wall-clock seconds
    (compiling, and AUTO's measurements, included). Adam (`model.lr`), minibatches of
    `batch`; every start compiled afresh, the starts interleaved after an untimed
    chunk (`_interleaved`)."""
    return _interleaved(model, strategies, train, seeds, batch, chunk,
                        lambda: _Trajectory(budget, chunk))


class _ToLevels:
    """A start's [(first step at which the mean training objective of the last `window`
    steps reached the level, the seconds at that step, interpolated within its chunk)
    for each of `levels`], (None, inf) for a level that `limit` seconds passed before;
    the run stops at the last level it lacks or at the limit."""

    def __init__(self, levels: Sequence[float], limit: float, window: int):
        self.levels, self.limit, self.window = tuple(levels), limit, window
        self.last, self.reached = (0, 0.0), {}

    @property
    def result(self) -> list:
        return [self.reached.get(level, (None, math.inf)) for level in self.levels]

    def note(self, step: int, history: dict, seconds: float) -> None:
        values = np.asarray(history["objective"])
        if len(values) >= self.window:
            mean = np.convolve(values, np.ones(self.window) / self.window, "valid")
            before, then = self.last
            for level in self.levels:
                done = mean >= level
                if level not in self.reached and done.any():
                    at = int(np.argmax(done)) + self.window
                    reached = then + (at - before) / max(1, step - before) * (seconds - then)
                    if reached <= self.limit:
                        self.reached[level] = (at, reached)
        if all(level in self.reached for level in self.levels) or seconds > self.limit:
            raise _Stop
        self.last = (step, seconds)


# what a start's step count is worth: the same AIR start, rerun on another machine with
# the same library versions, reached the levels at other steps
INTERLEAVED_NOTE = ("The starts interleaved, each start's strategies in an order rotated by "
                    "one from the last start's, after an untimed chunk of training.")
STEPS_NOTE = ("A start's steps repeat from run to run on one machine, but not across CPUs "
              "(XLA compiles for the host's, and a long training run amplifies a rounding "
              "difference); its seconds are this machine's.")


def runs_to_levels(model: FrontierModel, strategies: dict, levels: Sequence[float],
                   limit: float, train: jax.Array, seeds: int, batch: int, window: int = 50,
                   chunk: int = 50) -> dict:
    """For each strategy and start: [(the first step at which the mean training
    objective of the last `window` steps reached the level, the seconds since `gv.fit`
    was called at that step) for each of `levels`], (None, inf) for a level not reached
    in `limit` seconds. A run stops at its last level, so a start costs its time to the
    level rather than a fixed budget, and the step does not depend on the machine's
    speed (a start draws the same estimates on every run on one machine; a different
    CPU can round differently, and a long run amplifies that), which separates how
    many steps a strategy needs from what each costs; one run gives every level, so how the
    strategies' distance changes with the level is measured on the same starts. Starts
    interleaved, compiled afresh and warmed up as in `trajectories` (`_interleaved`);
    the seconds within a chunk of `chunk` steps are interpolated by step."""
    return _interleaved(model, strategies, train, seeds, batch, chunk,
                        lambda: _ToLevels(levels, limit, window))


def runs_to_level(model: FrontierModel, strategies: dict, level: float, limit: float,
                  train: jax.Array, seeds: int, batch: int, window: int = 50,
                  chunk: int = 50) -> dict:
    """`runs_to_levels` at the one `level`: for each strategy and start, (step, seconds)
    at which it reached the level, or (None, inf)."""
    runs = runs_to_levels(model, strategies, [level], limit, train, seeds, batch, window,
                          chunk)
    return {label: [start[0] for start in starts] for label, starts in runs.items()}


def record_runs_to_level(name: str, bench: str, runs: dict, level: float, limit: float,
                         argv, batch: int, window: int, lr: float) -> None:
    """Record `runs_to_level`'s steps and seconds to the level as table `name`."""
    seconds = {a: float(np.median([t for _, t in runs[a]])) for a in runs}
    best = min((a for a in seconds if a != "AUTO"), key=seconds.get)
    auto = seconds.get("AUTO", math.nan)
    columns = ["strategy", "seconds to the level (median)", "÷ best single strategy's",
               "÷ AUTO's", "each start: steps (seconds)"]
    rows = [[a, _seconds(seconds[a]), _ratio(seconds[a], seconds[best], limit),
             _ratio(seconds[a], auto, limit),
             ", ".join("–" if n is None else f"{n:,} ({t:.1f})" for n, t in runs[a])]
            for a in runs]
    note = (f"Training (minibatches of {batch}, Adam {lr:g}) from "
            f"{_starts(len(next(iter(runs.values()))))} per strategy, each until the mean "
            f"training objective of the last {window} steps reached {level:g} or "
            f"{limit:g} s had passed (–); seconds from the fit's call, compiling (no "
            f"persistent compilation cache) and AUTO's measurements included. {INTERLEAVED_NOTE} "
            f"{STEPS_NOTE} The fastest single strategy: {best}.")
    record(on_platform(name), command(bench, argv), columns, rows, note=note)


def record_runs_to_levels(name: str, bench: str, runs: dict, levels: Sequence[float],
                          limit: float, argv, batch: int, window: int, lr: float) -> None:
    """Record `runs_to_levels` as two tables: `name`, a row per level (each strategy's
    median seconds and steps to it, the best single strategy, and the worst single
    strategy's time and the best's over AUTO's), and `name`_starts, each start's steps
    and seconds per strategy and level."""
    labels, single = list(runs), [a for a in runs if a != "AUTO"]
    starts = len(runs[labels[0]])
    rows, detail = [], []
    for i, level in enumerate(levels):
        at = {a: [start[i] for start in runs[a]] for a in labels}
        seconds = {a: float(np.median([t for _, t in at[a]])) for a in labels}
        steps = {a: float(np.median([math.inf if n is None else n for n, _ in at[a]]))
                 for a in labels}
        best, worst = min(single, key=seconds.get), max(single, key=seconds.get)
        auto = seconds.get("AUTO", math.nan)
        cells = []
        for a in labels:
            reached = sum(n is not None for n, _ in at[a])
            cell = "–" if not math.isfinite(seconds[a]) else \
                f"{seconds[a]:.1f} ({steps[a]:,.0f})"
            cells.append(cell + ("" if reached == starts else f"; {reached} of {starts}"))
        rows.append([f"{level:g}", *cells, best, _ratio(seconds[worst], auto, limit),
                     _ratio(auto, seconds[best], limit)])
        detail += [[a, f"{level:g}", ", ".join("–" if n is None else f"{n:,} ({t:.1f})"
                                               for n, t in at[a])] for a in labels]
    columns = ["level", *(f"{a}: seconds (steps), median" for a in labels),
               "best single strategy", "worst single strategy's time ÷ AUTO's",
               "AUTO's ÷ best's"]
    note = (f"Training (minibatches of {batch}, Adam {lr:g}) from {_starts(starts)} per "
            f"strategy, each until the mean training objective of the last {window} steps "
            f"reached {max(levels):g} or {limit:g} s had passed; for each level, the "
            "median over the starts of the seconds from the fit's call (compiling, with no "
            "persistent compilation cache, and AUTO's measurements included) and of the "
            "step at which a start first reached it (–: the median start did not reach "
            f"it; \"k of n\": the starts that did). {INTERLEAVED_NOTE} {STEPS_NOTE}")
    record(on_platform(name), command(bench, argv), columns, rows, note=note)
    record(on_platform(f"{name}_starts"), command(bench, argv),
           ["strategy", "level", "each start: steps (seconds)"], detail,
           note=f"Each start's step and seconds at each level of table {name}; –: not "
                f"reached in {limit:g} s.")


# a quarter: a strategy three times slower than the best still has the run's time to
# reach the target, so "never" means at least about 3x slower than the best
TARGET_FRACTION = 0.25


def time_to_target(runs: dict, fraction: float = TARGET_FRACTION) -> tuple[float, dict]:
    """The target: the training objective the best strategy (highest mean final value)
    reached at `fraction` of its run; and per strategy the seconds each start took to
    reach it (inf: never)."""
    final = {a: np.mean([p[-1][1] for p in runs[a]]) for a in runs}
    best = max(final, key=final.get)
    target = float(np.median([_value_at(p, fraction * p[-1][0]) for p in runs[best]]))
    reach = {a: [next((t for t, v in p if v >= target), math.inf) for p in runs[a]] for a in runs}
    return target, reach


def _value_at(points: list, seconds: float) -> float:
    """The training objective at `seconds` (at the first chunk's end past it), or where
    the run stopped before (a non-finite gradient) its last."""
    return next((v for t, v in points if t >= seconds), points[-1][1])


def add_table_option(ap: argparse.ArgumentParser, default: str) -> None:
    """A bench's `--table`: the name its time-to-target table is recorded under (another
    than `default` for a run of some strategies beside the full table)."""
    ap.add_argument("--table", default=default,
                    help="the time-to-target table --record writes (another name: a run of "
                         "some strategies beside the full table)")


def record_time_to_target(name: str, bench: str, runs: dict, budget: float, argv,
                          batch: int, chunk: int = 200, lr: float | None = None) -> None:
    """Record the seconds to the target of `runs` (from `trajectories`) as table `name`;
    `lr`, where given, is named in the note."""
    target, reach = time_to_target(runs)
    median = {a: float(np.median(reach[a])) for a in reach}
    best = min((a for a in median if a != "AUTO"), key=median.get)
    auto = median.get("AUTO", math.nan)
    columns = ["strategy", "seconds to the target (median)", "÷ best single strategy's",
               "÷ AUTO's", "each start", f"training objective after {budget:g} s"]
    rows = [[a, _seconds(median[a]), _ratio(median[a], median[best], budget),
             _ratio(median[a], auto, budget), ", ".join(_seconds(t) for t in reach[a]),
             _mean_sd([_value_at(p, budget) for p in runs[a]])]
            for a in runs]
    optimizer = "" if lr is None else f", Adam {lr:g}"
    note = (f"Training objective (mean of the last {chunk} steps' estimates, minibatches of "
            f"{batch}{optimizer}) from {_starts(len(next(iter(runs.values()))))}, each for "
            f"{budget:g} s of wall-clock time, compiling (no persistent compilation cache) "
            f"and AUTO's measurements included; the starts interleaved (each start runs every "
            f"strategy, in an order rotated by one from the last start's), after an untimed "
            f"chunk of training; the last column is the training objective at "
            f"{budget:g} s, mean ± sd over the starts. Target: "
            f"{target:.2f}, what the strategy with the best final value reached at a quarter "
            f"of its run ({best} is the fastest to it); – : not reached, and a ratio "
            "\"> r\" for a strategy that did not reach it: the run's length over the other's "
            "time. AUTO trains with its starting choice (the untuned one, or where that "
            "step is costly by the cost model the first cheap candidate in rank order) "
            "while its candidates compile and are measured (a batch of estimates each, "
            "more for those within twice the best's variance × time, the race within "
            "a twentieth of the fit's time so far), then with its choice (the "
            f"starting one kept where it measured within {gv.AutoTuning.keep_margin:g} "
            "times the best).")
    record(on_platform(name), command(bench, argv), columns, rows, note=note)


def _mean_sd(values: list) -> str:
    return f"{np.mean(values):.2f} ± {np.std(values):.2f}"


def _ratio(t: float, other: float, budget: float) -> str:
    """t / other, or "> budget / other" where t is inf (the target never reached)."""
    if not math.isfinite(other):
        return "–"
    return f"{t / other:.2f}" if math.isfinite(t) else f"> {budget / other:.1f}"


def _starts(n: int) -> str:
    return f"{n} start" + ("" if n == 1 else "s")


def _seconds(t: float) -> str:
    return f"{t:.1f}" if math.isfinite(t) else "–"


def record_lab(name: str, bench: str, lab: gv.EstimatorComparison, trained: dict | None,
               budget: float, argv, note: str, variance_of: str, score: str,
               at: str = "the initial parameters") -> None:
    """Record the lab's table (and the budgeted training's `score` column) as `name`;
    `note` says what was measured, `variance_of` whose gradient's variance it is, `at`
    the parameters it was measured at."""
    variance = {a: sum(lab.variance[a].values()) for a in lab.labels}
    columns = ["strategy", f"{variance_of} gradient variance", "ms / estimate", "÷ REINFORCE's time",
               "variance × seconds", "mean flagged?"]
    rows = [[a, f"{variance[a]:.3g}", f"{lab.seconds[a] * 1e3:.2f}",
             f"{lab.seconds[a] / lab.seconds['REINFORCE']:.2f}" if "REINFORCE" in lab.labels
             else "–", f"{variance[a] * lab.seconds[a]:.3g}",
             "yes" if any(lab.biased[a].values()) else "no"] for a in lab.labels]
    if "AUTO" in lab.labels:
        note += f" AUTO: the strategy `gv.tune` chose at {at}."
    if trained:
        columns += [f"{score} after {budget:g} s (steps)"]
        for row, a in zip(rows, lab.labels):
            steps, scores, stops = trained[a]
            row.append(f"{_mean_sd(scores)} ({steps:,})"
                       + (f"; {len(stops)} stopped at a non-finite gradient (steps "
                          f"{', '.join(map(str, stops))})" if stops else ""))
    record(on_platform(name), command(bench, argv), columns, rows, note=note)
