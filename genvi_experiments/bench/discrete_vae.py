"""Gradient estimators of discrete-latent VAEs at their initial parameters: the DisARM
and RELAX papers' binary-latent VAE and a categorical-latent one, at digits size.

* binary: 20 binary latents with a Bernoulli(½) prior;
* categorical: 10 latents of 10 categories each with a uniform prior, one-hot into
  the decoder.

8×8 digits (binarized once), one-hidden-layer MLPs (hidden 200), batch-mean ELBO over
a batch; one strategy at the guide's latent site per row. `gv.compare_estimators`
measures each strategy's gradient variance on the encoder (the only parameters the
site's strategy changes), seconds per gradient estimate and their product, and
checks that the means agree.

    python -m genvi_experiments.bench.discrete_vae [--latents binary categorical]
        [--batch 64] [--samples 2000] [--train-seconds 10 --seeds 5] [--record]
    python -m genvi_experiments.bench.discrete_vae --time-to-target 30 --seeds 3 [--record]

With `--train-seconds S`, each strategy also trains for S seconds from each of
`--seeds` starts (as many steps as S holds at its measured time per estimate), and
the table gains the test ELBO reached. RELAX's surrogate is a small network of the
relaxed latents and the image, trained in the same step; AUTO's row is what `gv.tune`
chooses at the initial parameters (and `gv.fit` when it trains).

With `--time-to-target S`, each strategy trains for S wall-clock seconds from each
start (compiling, and AUTO's measurements, counted), and the table (as
`binary_vae_auto`, `categorical_vae_auto`) gives the seconds each took to reach a
target training objective: what the best strategy reached at half its run.

`--record` writes each table (as `binary_vae` and `categorical_vae`, `_gpu` appended
on a GPU) to BENCHMARKS.md through `genvi_experiments.bench.results`.
"""

from __future__ import annotations

import argparse
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import genvi as gv
from genvi_experiments.bench.results import command, on_platform, record
from genvi_experiments.common.data import binarize, load_images
from genvi_experiments.common.nets import MLP, apply, init_params
from genvi_experiments.common.timing import describe_machine

RELAX = "RELAX"  # gv.RELAX with the VAE's learned surrogate (DiscreteVAE.strategy)
STRATEGIES = {
    "binary": {"REINFORCE": gv.REINFORCE, "RLOO(2)": gv.RLOO(2), "DisARM": gv.DisARM,
               "DisARM-whole-site": gv.DisARM.whole_site(), "MVD": gv.MVD, "ENUM": gv.ENUM,
               "SD": gv.SD, "RELAX": RELAX, "AUTO": gv.AUTO},
    "categorical": {"REINFORCE": gv.REINFORCE, "RLOO(2)": gv.RLOO(2), "SWOR(2)": gv.SWOR(2),
                    "SWOR(4)": gv.SWOR(4), "MVD": gv.MVD, "ENUM": gv.ENUM, "SD": gv.SD,
                    "RELAX": RELAX, "AUTO": gv.AUTO},
}


class DiscreteVAE:
    """Encoder pixels→hidden→latent logits and decoder latent→hidden→pixel logits;
    `categories` None: binary latents, else that many categories per latent."""

    def __init__(self, pixels: int = 64, hidden: int = 200, latent: int = 20,
                 categories: int | None = None):
        self.pixels, self.latent, self.categories = pixels, latent, categories
        self.width = latent * (categories or 1)   # logits out of the encoder, into the decoder
        self.encoder, self.decoder = MLP((hidden, self.width)), MLP((hidden, pixels))
        # RELAX's control variate: a small network of the relaxed latents and the
        # encoder's logits (what it knows of the image)
        self.surrogate = MLP((32, 1))

    def init(self, key: jax.Array) -> dict:
        k1, k2, k3 = jax.random.split(key, 3)
        return {"enc": init_params(self.encoder, k1, self.pixels),
                "dec": init_params(self.decoder, k2, self.width),
                "relax": init_params(self.surrogate, k3, 2 * self.width)}

    def strategy(self, strategy, params: dict, logits: jax.Array):
        """The site's strategy; `RELAX`: gv.RELAX with the surrogate network, its
        parameters `params["relax"]` trained in the same step, and the encoder's
        `logits` as data (behind stop_gradient: the variance does not train them)."""
        if isinstance(strategy, str) and strategy == RELAX:
            return gv.RELAX(self._control_variate,
                            {"net": params["relax"], "logits": jax.lax.stop_gradient(logits)})
        return strategy

    def _control_variate(self, phi: dict, z: jax.Array) -> jax.Array:
        inputs = jnp.concatenate([z.reshape(-1), phi["logits"].reshape(-1)])
        return apply(self.surrogate, phi["net"], inputs)[0]

    def _latent(self, logits: jax.Array, strategy=None) -> gv.DistCall:
        if self.categories is None:
            return gv.bernoulli(logits, grad=strategy)
        return gv.categorical(logits.reshape(self.latent, self.categories), grad=strategy)

    def _code(self, z: jax.Array) -> jax.Array:
        if self.categories is None:
            return z * 1.0
        return jax.nn.one_hot(z, self.categories).reshape(-1)

    def objective(self, strategy) -> gv.Expectation:
        """The batch-mean ELBO with `strategy` at the guide's latent site."""
        @gv.gen
        def model(params, x):
            z = self._latent(jnp.zeros(self.width)) @ "z"
            gv.observe(gv.bernoulli(apply(self.decoder, params["dec"], self._code(z))), x)

        @gv.gen
        def guide(params, x):
            logits = apply(self.encoder, params["enc"], x)
            self._latent(logits, self.strategy(strategy, params, logits)) @ "z"

        return gv.batch_mean(gv.elbo(model, guide))


def make_vae(latents: str, pixels: int) -> DiscreteVAE:
    """The binary (20 latents) or categorical (10 × 10) VAE of the tables."""
    return (DiscreteVAE(pixels) if latents == "binary"
            else DiscreteVAE(pixels, latent=10, categories=10))


def measure(latents: str, x: jax.Array, samples: int, rounds: int,
            strategies: list[str] | None = None) -> gv.EstimatorComparison:
    """The estimator lab on one VAE at its initial parameters (seed 0); AUTO's row is
    the objective with the choice `gv.tune` makes there."""
    vae = make_vae(latents, x.shape[-1])
    chosen = STRATEGIES[latents] if strategies is None else \
        {name: STRATEGIES[latents][name] for name in strategies}
    params = vae.init(jax.random.key(0))
    if RELAX in chosen.values():
        params = fit_surrogate(vae, params, x)
    objectives = {}
    for label, strategy in chosen.items():
        objective = vae.objective(strategy)
        if strategy is gv.AUTO:
            tuning = gv.tune(objective, params, x, key=jax.random.key(5))
            print(tuning)
            objective = tuning.apply(objective)
        objectives[label] = objective
    return gv.compare_estimators(objectives, jax.random.key(2), params, x, samples=samples,
                                 rounds=rounds, leaves=["enc"])


def fit_surrogate(vae: DiscreteVAE, params: dict, x: jax.Array, steps: int = 5000) -> dict:
    """`params` with RELAX's surrogate trained at the encoder and decoder as they are
    (they are held): its variance at fixed parameters is then the estimator's, not an
    untrained control variate's."""
    labels = {k: ("relax" if k == "relax" else "held") for k in params}
    optimizer = optax.multi_transform({"relax": optax.adam(3e-3), "held": optax.set_to_zero()},
                                      labels)
    return gv.fit(vae.objective(RELAX), params, x, optimizer=optimizer, steps=steps,
                  key=jax.random.key(6), progress=False).params


def train_in_budget(latents: str, strategies: dict, seconds: dict[str, float], budget: float,
                    train: jax.Array, test: jax.Array, seeds: int, batch: int) -> dict:
    """The test ELBO (per image, mean of 20 estimates over the test set) that each
    strategy reaches in `budget` seconds of training from each of `seeds` starts:
    Adam(1e-3) on minibatches of `batch`, for as many steps as `budget` holds at the
    strategy's measured seconds per gradient estimate (`seconds`). A start that stops
    at a non-finite gradient (`gv.NonFiniteError`) is scored at the parameters from
    before that step and counted. Returns {label: (steps, [ELBO per seed], [step of
    each non-finite stop])}."""
    vae = make_vae(latents, train.shape[-1])
    score = vae.objective(gv.REINFORCE)  # the value does not depend on the strategy
    optimizer = optax.adam(1e-3)
    out = {}
    for label, strategy in strategies.items():
        objective, steps = vae.objective(strategy), max(1, int(budget / seconds[label]))
        elbos, stops = [], []
        for seed in range(seeds):
            try:
                result = gv.fit(objective, vae.init(jax.random.key(10 + seed)), train,
                                optimizer=optimizer, steps=steps,
                                key=jax.random.key(100 + seed), batch_size=batch,
                                progress=False)
            except gv.NonFiniteError as stopped:
                result = stopped.result
                stops.append(stopped.step)
            keys = jax.random.split(jax.random.key(1000 + seed), 20)
            elbos.append(float(jnp.mean(jax.vmap(
                lambda k, p=result.params: score.estimate(k, p, test))(keys))))
        out[label] = (steps, elbos, stops)
    return out


class _OutOfTime(Exception):
    pass


def trajectories(latents: str, strategies: dict, budget: float, train: jax.Array, seeds: int,
                 batch: int, chunk: int = 200) -> dict:
    """For each strategy and start: [(seconds since `gv.fit` was called, mean training
    objective of the last `chunk` steps)], training for `budget` wall-clock seconds
    (compiling, and AUTO's measurements, included). Adam(1e-3), minibatches of `batch`."""
    vae = make_vae(latents, train.shape[-1])
    optimizer = optax.adam(1e-3)
    out = {}
    for label, strategy in strategies.items():
        out[label] = []
        for seed in range(seeds):
            points: list = []
            begin = time.perf_counter()

            def note(step, params, history, points=points, begin=begin):
                elapsed = time.perf_counter() - begin
                points.append((elapsed, float(np.mean(history["objective"][-chunk:]))))
                if elapsed > budget:
                    raise _OutOfTime
            try:
                gv.fit(vae.objective(strategy), vae.init(jax.random.key(10 + seed)), train,
                       optimizer=optimizer, steps=10 ** 7, key=jax.random.key(100 + seed),
                       batch_size=batch, chunk_size=chunk, callbacks=[note], progress=False)
            except (_OutOfTime, gv.NonFiniteError):
                pass
            out[label].append(points)
    return out


def time_to_target(runs: dict, fraction: float = 0.5) -> tuple[float, dict]:
    """The target: the training objective the best strategy (highest mean final value)
    reached at `fraction` of its run; and per strategy the seconds each start took to
    reach it (inf: never)."""
    final = {a: np.mean([p[-1][1] for p in runs[a]]) for a in runs}
    best = max(final, key=final.get)
    target = float(np.median([_value_at(p, fraction * p[-1][0]) for p in runs[best]]))
    reach = {a: [next((t for t, v in p if v >= target), math.inf) for p in runs[a]] for a in runs}
    return target, reach


def _value_at(points: list, seconds: float) -> float:
    return next(v for t, v in points if t >= seconds)


def _record_time_to_target(name: str, runs: dict, budget: float, argv, batch: int) -> None:
    target, reach = time_to_target(runs)
    median = {a: float(np.median(reach[a])) for a in reach}
    best = min((a for a in median if a != "AUTO"), key=median.get)
    columns = ["strategy", "seconds to the target (median)", "÷ best single strategy's",
               "each start"]
    rows = [[a, _seconds(median[a]), f"{median[a] / median[best]:.2f}"
             if math.isfinite(median[a]) else "–", ", ".join(_seconds(t) for t in reach[a])]
            for a in runs]
    note = (f"Training objective (mean of the last 200 steps' estimates, minibatches of "
            f"{batch}) from {len(next(iter(runs.values())))} starts, each for {budget:g} s "
            f"of wall-clock time, compiling and AUTO's measurements included. Target: "
            f"{target:.2f}, what the strategy with the best final value ({best} is the "
            "fastest to it) reached at half its run; – : not reached.")
    record(on_platform(name), command("discrete_vae", argv), columns, rows, note=note)


def _seconds(t: float) -> str:
    return f"{t:.1f}" if math.isfinite(t) else "–"


def _record(name: str, lab: gv.EstimatorComparison, trained: dict | None, budget: float,
            argv, samples: int, batch: int) -> None:
    names = [f for f in lab.leaves if f.startswith("enc")]
    variance = {a: sum(lab.variance[a][f] for f in names) for a in lab.labels}
    columns = ["strategy", "encoder gradient variance", "ms / estimate", "÷ REINFORCE's time",
               "variance × seconds", "mean flagged?"]
    rows = [[a, f"{variance[a]:.3g}", f"{lab.seconds[a] * 1e3:.2f}",
             f"{lab.seconds[a] / lab.seconds['REINFORCE']:.2f}" if "REINFORCE" in lab.labels
             else "–", f"{variance[a] * lab.seconds[a]:.3g}",
             "yes" if any(lab.biased[a][f] for f in names) else "no"] for a in lab.labels]
    note = (f"{samples} gradient estimates per strategy at the initial parameters, batch "
            f"{batch}; variance summed over the encoder's entries.")
    if RELAX in lab.labels:
        note += (" RELAX's surrogate (a network of the relaxed latents and the encoder's "
                 "logits) is trained for its variance 5,000 steps at the initial encoder and "
                 "decoder, which are held; in training it starts untrained and learns in the "
                 "same step.")
    if "AUTO" in lab.labels:
        note += " AUTO: the strategy `gv.tune` chose at the initial parameters."
    if trained:
        columns += [f"test ELBO after {budget:g} s (steps)"]
        for row, a in zip(rows, lab.labels):
            steps, elbos, stops = trained[a]
            row.append(f"{np.mean(elbos):.2f} ± {np.std(elbos):.2f} ({steps:,})"
                       + (f"; {len(stops)} stopped at a non-finite gradient (steps "
                          f"{', '.join(map(str, stops))})" if stops else ""))
        seeds = len(next(iter(trained.values()))[1])  # (steps, elbos, stops)
        note += (f" Training: Adam(1e-3) on minibatches of {batch} of the binarized training "
                 f"digits, for as many steps as {budget:g} s hold at the strategy's time per "
                 f"estimate, from {seeds} starts (mean ± sd); the test ELBO per image is the "
                 "mean of 20 estimates over the test digits.")
    record(on_platform(name), command("discrete_vae", argv), columns, rows, note=note)


def main(argv: list[str] | None = None) -> dict[str, gv.EstimatorComparison]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--latents", nargs="+", default=list(STRATEGIES), choices=list(STRATEGIES))
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--strategies", nargs="+", default=None,
                    help="a subset of the strategies (the same names for every VAE)")
    ap.add_argument("--train-seconds", type=float, default=0.0,
                    help="also train each strategy for this many seconds (0: do not)")
    ap.add_argument("--seeds", type=int, default=5, help="training starts per strategy")
    ap.add_argument("--time-to-target", type=float, default=0.0,
                    help="train each strategy this many wall-clock seconds and report the "
                         "time to a target training objective (0: do not)")
    ap.add_argument("--record", action="store_true", help="write the tables to BENCHMARKS.md")
    args = ap.parse_args(argv)
    images = load_images()
    x = jnp.asarray(binarize(jax.random.key(1), images.train[:args.batch]))
    labs = {}
    for latents in args.latents:
        if args.time_to_target > 0:
            chosen = STRATEGIES[latents] if args.strategies is None else \
                {a: STRATEGIES[latents][a] for a in args.strategies}
            runs = trajectories(latents, chosen, args.time_to_target,
                                jnp.asarray(binarize(jax.random.key(3), images.train)),
                                args.seeds, args.batch)
            target, reach = time_to_target(runs)
            print(f"# {latents}: target {target:.2f}; seconds to it: {reach}")
            if args.record:
                _record_time_to_target(f"{latents}_vae_auto", runs, args.time_to_target, argv,
                                       args.batch)
            continue
        labs[latents] = lab = measure(latents, x, args.samples, args.rounds, args.strategies)
        print(f"# {latents}-latent VAE, batch {args.batch}, {describe_machine()}")
        print(lab.table(leaves=["enc"]))
        trained = None
        if args.train_seconds > 0:
            chosen = {a: STRATEGIES[latents][a] for a in lab.labels}
            trained = train_in_budget(
                latents, chosen, lab.seconds, args.train_seconds,
                jnp.asarray(binarize(jax.random.key(3), images.train)),
                jnp.asarray(binarize(jax.random.key(4), images.test)), args.seeds, args.batch)
            for a, (steps, elbos, stops) in trained.items():
                print(f"{a}: test ELBO {np.mean(elbos):.2f} ± {np.std(elbos):.2f} after "
                      f"{steps} steps; non-finite stops at {stops}")
        if args.record:
            _record(f"{latents}_vae", lab, trained, args.train_seconds, argv, args.samples,
                    args.batch)
    return labs


if __name__ == "__main__":
    main()
