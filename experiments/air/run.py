"""`genvi run air`: Attend-Infer-Repeat on generated multi-digit canvases, trained
with every estimator the paper compares, each under the same wall-clock budget.

Writes `results.md` (a timing and accuracy table, like the paper's Table 2),
`curves.png` (accuracy and ELBO against steps and seconds, like Fig. 7) and
`reconstructions_<estimator>.png` (inferred boxes and the model's canvas).

Example:
    genvi run air --estimators mvd baseline --minutes 20
    genvi run air --steps 40 --train-size 256 --test-size 64   # a quick look
"""

from __future__ import annotations

import argparse
import dataclasses
import os

import jax
import numpy as np

from experiments.air.config import AIRConfig
from experiments.air.data import make_canvases
from experiments.air.estimators import ESTIMATORS
from experiments.air.figures import save_reconstructions, save_training_curves
from experiments.air.train import train_air
from experiments.common.data import positive_int
from genvi.cli import ShowDefaults

DEFAULT_ESTIMATORS = [e for e in ESTIMATORS if e != "sd"]  # the paper's eight; SD on request


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


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(prog="genvi run air", description=__doc__.splitlines()[0],
                                 formatter_class=ShowDefaults)
    ap.add_argument("--estimators", nargs="+", default=DEFAULT_ESTIMATORS,
                    choices=sorted(ESTIMATORS))
    ap.add_argument("--minutes", type=float, default=None,
                    help="training wall-clock budget per estimator (compile excluded)")
    ap.add_argument("--steps", type=positive_int, default=None, help="step budget per estimator")
    ap.add_argument("--batch-size", type=positive_int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--chunk", type=positive_int, default=200, help="steps between evaluations")
    ap.add_argument("--pres-prior", type=float, default=AIRConfig.pres_prior,
                    help="ratio k of the truncated geometric prior on the count")
    ap.add_argument("--rnn-hidden", type=positive_int, default=AIRConfig.rnn_hidden)
    ap.add_argument("--hidden", type=positive_int, default=AIRConfig.encoder_hidden,
                    help="hidden size of the predict, encoder, decoder and baseline MLPs")
    ap.add_argument("--z-what", type=positive_int, default=AIRConfig.z_what)
    ap.add_argument("--data", default=None, metavar="PATH",
                    help="local MNIST .npz or IDX folder (default: scikit-learn's digits)")
    ap.add_argument("--train-size", type=positive_int, default=20000)
    ap.add_argument("--test-size", type=positive_int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="out/air")
    args = ap.parse_args(argv)
    if args.minutes is None and args.steps is None:
        args.minutes = 20.0
    data = make_canvases(train=args.train_size, test=args.test_size, seed=args.seed, data=args.data)
    h = args.hidden
    cfg = dataclasses.replace(AIRConfig(), pres_prior=args.pres_prior, rnn_hidden=args.rnn_hidden,
                              predict_hidden=h, encoder_hidden=h, decoder_hidden=h,
                              baseline_hidden=h, z_what=args.z_what,
                              window=16 if data.name == "digits" else 28)
    os.makedirs(args.out, exist_ok=True)
    runs, figures = {}, []
    for name in args.estimators:
        print(f"AIR with {name} ({ESTIMATORS[name].about}):", flush=True)
        run = train_air(cfg, data, name, steps=args.steps, minutes=args.minutes,
                        batch_size=args.batch_size, lr=args.lr, chunk=min(args.chunk, args.steps or args.chunk),
                        eval_size=args.test_size, seed=args.seed, verbose=True)
        runs[name] = run
        figures.append(save_reconstructions(
            os.path.join(args.out, f"reconstructions_{name}.png"), run["model"], run["guide"],
            run["params"], data.test[:8], jax.random.key(args.seed + 1)))
    figures.append(save_training_curves(os.path.join(args.out, "curves.png"),
                                        {n: r["log"] for n, r in runs.items()}))
    budget = f"{args.minutes} minutes" if args.minutes else f"{args.steps} steps"
    notes = [f"{len(data.train)} training / {len(data.test)} held-out canvases of {data.canvas}² "
             f"({data.name}, digit sizes {data.digit_sizes[0]}–{data.digit_sizes[1]} px, 0–2 per "
             f"canvas); batch {args.batch_size}, Adam {args.lr} (baseline net "
             f"{cfg.baseline_lr}); budget {budget} of training per estimator; seed {args.seed}.",
             "Count accuracy: the guide's number of present objects (one sample) equals the "
             "true count, on the held-out canvases."]
    table = write_table(os.path.join(args.out, "results.md"), runs, notes)
    for name, run in runs.items():
        print(f"{name:18s} {run['step_ms']:7.1f} ms/step  accuracy {run['log'][-1]['accuracy']:.3f}")
    print(f"wrote {table}, " + ", ".join(os.path.basename(f) for f in figures))
    return {"runs": {n: {k: v for k, v in r.items() if k in ("log", "step_ms", "compile_seconds")}
                     for n, r in runs.items()}, "figures": figures, "table": table,
            "accuracy": {n: float(np.max([x["accuracy"] for x in r["log"]])) for n, r in runs.items()}}


if __name__ == "__main__":
    main()
