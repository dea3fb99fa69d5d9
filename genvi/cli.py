"""The `genvi` command line: `genvi list`, `genvi run NAME [options]`.

Each experiment writes its table (`results.md`) and figures (PNG) to `--out`
(default `out/NAME`); options after NAME go to the experiment (`--steps N`, ...).
"""

from __future__ import annotations

import argparse
import importlib
import sys

EXPERIMENTS = {
    "demo": ("genvi.demo", "a short VI run checked against the exact posterior"),
    "noisy_cone": ("experiments.noisy_cone",
                   "the paper's noisy cone: ELBO, IWELBO, HVI, IWHVI, DIWHVI (Table 4)"),
    "vae": ("experiments.vae", "VAE on digits (ELBO or IWELBO training; test ELBO and log-likelihood)"),
    "ssvae": ("experiments.ssvae", "semi-supervised VAE (M2), enumerated labels, 10% labelled"),
    "cvae": ("experiments.cvae", "conditional VAE completing digits from one quadrant, with a baseline"),
    "air": ("experiments.air.run", "Attend-Infer-Repeat on multi-digit canvases, every estimator side by side"),
}


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `genvi` console script.

    Example:
        >>> from genvi.cli import main
        >>> main(["list"])  # doctest: +ELLIPSIS
        demo ...
        0
    """
    ap = argparse.ArgumentParser(prog="genvi", description="genvi experiments")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="show the experiments")
    run = sub.add_parser("run", help="run an experiment")
    run.add_argument("name", choices=sorted(EXPERIMENTS))
    args, rest = ap.parse_known_args(argv)
    if args.command == "list":
        width = max(map(len, EXPERIMENTS))
        for name, (_, about) in EXPERIMENTS.items():
            print(f"{name:<{width}}  {about}")
        return 0
    module = importlib.import_module(EXPERIMENTS[args.name][0])
    if not any(a == "--out" or a.startswith("--out=") for a in rest):
        rest = rest + ["--out", f"out/{args.name}"]
    module.main(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
