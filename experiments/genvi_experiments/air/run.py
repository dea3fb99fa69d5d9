"""`genvi run air`: Attend-Infer-Repeat on generated multi-digit canvases, trained
with the estimators the paper compares, each under the same wall-clock budget.

Three ways to run it (each prints its budget and an ETA):

* the default: REINFORCE, MVD and IWELBO(2) with MVD, 2 minutes of training each
  (about 8 minutes on 2 CPU cores): REINFORCE barely learns to count, the others do;
* `--quick`: one estimator (MVD), 600 steps, 200 held-out canvases (under a minute;
  count accuracy about 0.85);
* `--all`: the paper's eight estimators, 20 minutes each (about 2 h 50 min).

Writes `results.md` (a timing and accuracy table, like the paper's Table 2),
`curves.png` (accuracy and ELBO against steps and seconds, like Fig. 7) and
`reconstructions_<estimator>.png` (inferred boxes and the model's canvas).

Example:
    genvi run air --quick
    genvi run air --estimators mvd baseline --minutes 20
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import time

import jax
import numpy as np

from genvi_experiments.air.config import AIRConfig
from genvi_experiments.air.data import make_canvases
from genvi_experiments.air.estimators import ESTIMATORS
from genvi_experiments.air.figures import save_reconstructions, save_training_curves
from genvi_experiments.air.train import train_air
from genvi_experiments.common.data import positive_int
from genvi.cli import ShowDefaults

PAPER_ESTIMATORS = [e for e in ESTIMATORS if e != "sd"]  # the paper's eight; SD on request
DEFAULT_ESTIMATORS = ["reinforce", "mvd", "iwelbo_mvd"]
# what --quick and --all (or neither) fill in where an option was not given
PRESETS = {
    "default": dict(estimators=DEFAULT_ESTIMATORS, minutes=2.0, steps=None, chunk=200,
                    train_size=20000, test_size=1000),
    "quick": dict(estimators=["mvd"], minutes=None, steps=600, chunk=200, train_size=20000,
                  test_size=200),
    "all": dict(estimators=PAPER_ESTIMATORS, minutes=20.0, steps=None, chunk=200,
                train_size=20000, test_size=1000),
}
# what an estimator costs besides its training budget on 2 CPU cores (compiling the step
# and the evaluation, evaluating every chunk); measured 2026-11-23, used for the first ETA
OVERHEAD_SECONDS = 35.0


def write_table(path: str, runs: dict[str, dict], notes: list[str]) -> str:
    lines = ["# AIR: estimators side by side", "",
             "| estimator | what | ms / step | compile s | steps | final count accuracy | "
             "best count accuracy | held-out ELBO |", "|---|---|---|---|---|---|---|---|"]
    for name, run in runs.items():
        last = run["log"][-1]
        best = max(r["accuracy"] for r in run["log"])
        lines.append(f"| {name} | {ESTIMATORS[name].about} | {run['step_ms']:.1f} | "
                     f"{run['compile_seconds']:.1f} | {last['step']} | {last['accuracy']:.3f} | "
                     f"{best:.3f} | {last['elbo']:.1f} |")
    lines += [""] + notes
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def _clock(seconds: float) -> str:
    end = datetime.datetime.now() + datetime.timedelta(seconds=seconds)
    return f"about {seconds / 60:.1f} min, done near {end:%H:%M}"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options, with `--quick`/`--all` filling what was not given explicitly."""
    ap = argparse.ArgumentParser(prog="genvi run air", description=__doc__,
                                 formatter_class=ShowDefaults)
    preset = ap.add_mutually_exclusive_group()
    preset.add_argument("--quick", action="store_true",
                        help="one estimator (mvd), 600 steps, 200 held-out canvases")
    preset.add_argument("--all", action="store_true",
                        help="the paper's eight estimators, 20 minutes of training each")
    ap.add_argument("--estimators", nargs="+", default=None, choices=sorted(ESTIMATORS),
                    help=f"default: {' '.join(DEFAULT_ESTIMATORS)}")
    ap.add_argument("--minutes", type=float, default=None,
                    help="training wall-clock budget per estimator, compile and evaluation "
                         "excluded (default: 2, or 20 with --all)")
    ap.add_argument("--steps", type=positive_int, default=None, help="step budget per estimator")
    ap.add_argument("--batch-size", type=positive_int, default=64, help="canvases per step")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    ap.add_argument("--chunk", type=positive_int, default=None,
                    help="steps between evaluations (default: 200, or 100 with --quick)")
    ap.add_argument("--pres-prior", type=float, default=AIRConfig.pres_prior,
                    help="ratio k of the truncated geometric prior on the count")
    ap.add_argument("--rnn-hidden", type=positive_int, default=AIRConfig.rnn_hidden,
                    help="hidden size of the guide's LSTM, which reads the canvas once per object")
    ap.add_argument("--hidden", type=positive_int, default=AIRConfig.encoder_hidden,
                    help="hidden size of the predict, encoder, decoder and baseline MLPs")
    ap.add_argument("--z-what", type=positive_int, default=AIRConfig.z_what,
                    help="dimensions of each object's appearance code z_what")
    ap.add_argument("--data", default=None, metavar="PATH",
                    help="local MNIST .npz or IDX folder (default: scikit-learn's digits)")
    ap.add_argument("--train-size", type=positive_int, default=None,
                    help="training canvases (default: 20000)")
    ap.add_argument("--test-size", type=positive_int, default=None,
                    help="held-out canvases (default: 1000, or 200 with --quick)")
    ap.add_argument("--seed", type=int, default=0, help="random seed of the canvases and the runs")
    ap.add_argument("--out", default="out/air",
                    help="folder for results.md, curves.png and the reconstruction figures")
    args = ap.parse_args(argv)
    preset = PRESETS["quick" if args.quick else "all" if args.all else "default"]
    if args.minutes is None and args.steps is None:
        args.minutes, args.steps = preset["minutes"], preset["steps"]
    for name in ("estimators", "chunk", "train_size", "test_size"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    started = time.perf_counter()
    data = make_canvases(train=args.train_size, test=args.test_size, seed=args.seed, data=args.data)
    h = args.hidden
    cfg = dataclasses.replace(AIRConfig(), pres_prior=args.pres_prior, rnn_hidden=args.rnn_hidden,
                              predict_hidden=h, encoder_hidden=h, decoder_hidden=h,
                              baseline_hidden=h, z_what=args.z_what,
                              window=16 if data.name == "digits" else 28)
    os.makedirs(args.out, exist_ok=True)
    budget = (f"{args.minutes:g} min of training" if args.minutes else f"{args.steps} steps") + \
        (f" (or {args.steps} steps)" if args.minutes and args.steps else "")
    n = len(args.estimators)
    # a step budget's time is unknown until the first chunk; guess 40 ms a step
    per_estimator = 60.0 * args.minutes if args.minutes else 0.04 * args.steps
    print(f"AIR: {n} estimator(s) ({', '.join(args.estimators)}), {budget} each, "
          f"{len(data.train)} training canvases; {_clock(n * (per_estimator + OVERHEAD_SECONDS))}",
          flush=True)
    runs, figures = {}, []
    for i, name in enumerate(args.estimators):
        print(f"AIR with {name} ({ESTIMATORS[name].about}):", flush=True)
        run = train_air(cfg, data, name, steps=args.steps, minutes=args.minutes,
                        batch_size=args.batch_size, lr=args.lr, chunk=min(args.chunk, args.steps or args.chunk),
                        eval_size=args.test_size, seed=args.seed, verbose=True)
        runs[name] = run
        figures.append(save_reconstructions(
            os.path.join(args.out, f"reconstructions_{name}.png"), run["model"], run["guide"],
            run["params"], data.test[:8], jax.random.key(args.seed + 1)))
        if i + 1 < n:  # the estimators so far say what one costs here
            elapsed = time.perf_counter() - started
            print(f"{i + 1} of {n} done in {elapsed / 60:.1f} min; "
                  f"{_clock(elapsed / (i + 1) * (n - i - 1))}", flush=True)
    figures.append(save_training_curves(os.path.join(args.out, "curves.png"),
                                        {n: r["log"] for n, r in runs.items()}))
    notes = [f"{len(data.train)} training / {len(data.test)} held-out canvases of {data.canvas}² "
             f"({data.name}, digit sizes {data.digit_sizes[0]}–{data.digit_sizes[1]} px, 0–2 per "
             f"canvas); batch {args.batch_size}, Adam {args.lr} (baseline net "
             f"{cfg.baseline_lr}); budget {budget} per estimator; seed {args.seed}.",
             "Count accuracy: the guide's number of present objects (one sample) equals the "
             "true count, on the held-out canvases."]
    table = write_table(os.path.join(args.out, "results.md"), runs, notes)
    for name, run in runs.items():
        print(f"{name:18s} {run['step_ms']:7.1f} ms/step  accuracy {run['log'][-1]['accuracy']:.3f}")
    print(f"wrote {table}, " + ", ".join(os.path.basename(f) for f in figures)
          + f" ({(time.perf_counter() - started) / 60:.1f} min in all)")
    if not args.all:
        print("the paper's full comparison: genvi run air --all (eight estimators, 20 min each); "
              "continue one: genvi run air --estimators iwelbo_mvd --minutes 8")
    return {"runs": {n: {k: v for k, v in r.items() if k in ("log", "step_ms", "compile_seconds")}
                     for n, r in runs.items()}, "figures": figures, "table": table,
            "accuracy": {n: float(np.max([x["accuracy"] for x in r["log"]])) for n, r in runs.items()}}

if __name__ == "__main__":
    main()
