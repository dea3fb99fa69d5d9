"""The `genvi` command line: `genvi list`, `genvi run NAME [options]`.

Each experiment writes its table (`results.md`) and figures (PNG) to `--out`
(default `out/NAME`); options after NAME go to the experiment (`--steps N`, ...).
"""

from __future__ import annotations

import argparse
import copy
import importlib
import os
import sys

class ShowDefaults(argparse.HelpFormatter):
    """Help that shows every option's default (also options without help text), for
    `genvi run NAME --help`.

    Example:
        >>> import argparse
        >>> from genvi.cli import ShowDefaults
        >>> ap = argparse.ArgumentParser(formatter_class=ShowDefaults)
        >>> _ = ap.add_argument("--steps", type=int, default=5)
        >>> "(default: 5)" in ap.format_help()
        True
    """

    def _format_action(self, action: argparse.Action) -> str:
        shown = action.option_strings and action.default not in (None, argparse.SUPPRESS) \
            and not isinstance(action, argparse._StoreConstAction)
        if shown and "%(default)" not in (action.help or ""):
            action = copy.copy(action)  # argparse prints no help line for help=None
            action.help = ((action.help or "") + " (default: %(default)s)").strip()
        return super()._format_action(action)


# name -> (module, what it does, wall time at its defaults on 2 CPU cores, measured
# 2026-11-23 with `genvi run NAME`, compile included)
EXPERIMENTS = {
    "demo": ("genvi.demo", "a short VI run checked against the exact posterior", "10 s"),
    "noisy_cone": ("experiments.noisy_cone",
                   "the paper's noisy cone: ELBO, IWELBO, HVI, IWHVI, DIWHVI (Table 4)", "20 s"),
    "vae": ("experiments.vae", "VAE on digits (ELBO or IWELBO training; test ELBO and log-likelihood)",
            "2.5 min"),
    "ssvae": ("experiments.ssvae", "semi-supervised VAE (M2), enumerated labels, 10% labelled", "35 s"),
    "cvae": ("experiments.cvae", "conditional VAE completing digits from one quadrant, with a baseline",
             "45 s"),
    "eight_schools": ("experiments.eight_schools",
                      "eight schools with automatic guides (auto_normal; auto_mvn on the ELBO, "
                      "Rényi, IWELBO, inclusive KL, and its exact ELBO optimum) beside NUTS",
                      "55 s"),
    "logreg": ("experiments.logreg", "Bayesian logistic regression on 100,000 points: gv.plate, "
               "gv.auto_normal, gv.predictive", "10 s"),
    "gmm": ("experiments.gmm", "a Gaussian mixture on 100,000 points: global means, gv.plate "
            "minibatches, assignments enumerated in the plate", "5 s"),
    "air": ("experiments.air.run",
            "Attend-Infer-Repeat on multi-digit canvases: REINFORCE, MVD, IWELBO+MVD "
            "(--quick: one estimator, under a minute; --all: the paper's eight, 2 h 50 min)", "8 min"),
}


def use_compilation_cache() -> str | None:
    """Keep compiled steps on disk between runs, so a second `genvi run` of an
    experiment skips XLA's compile (AIR's steps take seconds each to compile on a CPU).
    The folder is `$GENVI_CACHE`, default `~/.cache/genvi/xla`; `GENVI_CACHE=off`
    turns it off, and a JAX cache configured already (JAX_COMPILATION_CACHE_DIR) wins.

    Example:
        >>> import os
        >>> from unittest import mock
        >>> from genvi.cli import use_compilation_cache
        >>> with mock.patch.dict(os.environ, GENVI_CACHE="off"):
        ...     print(use_compilation_cache())
        None
    """
    import jax  # noqa: PLC0415 - `genvi list` stays instant

    folder = os.environ.get("GENVI_CACHE", os.path.join("~", ".cache", "genvi", "xla"))
    if folder.lower() in ("off", "0", "") or jax.config.jax_compilation_cache_dir:
        return None
    folder = os.path.expanduser(folder)
    jax.config.update("jax_compilation_cache_dir", folder)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
    return folder


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `genvi` console script.

    Example:
        >>> from genvi.cli import main
        >>> main(["list"])  # doctest: +ELLIPSIS
        name ...
        demo ...10 s  a short VI run ...
        0
    """
    ap = argparse.ArgumentParser(prog="genvi", description="genvi experiments")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="show the experiments")
    # `genvi run NAME --help` is the experiment's own help (its options and defaults),
    # so the run command leaves -h/--help to the experiment once a name is given
    run = sub.add_parser("run", help="run an experiment", add_help=False,
                         usage="genvi run NAME [options]  (genvi run NAME --help: NAME's options)")
    run.add_argument("name", nargs="?", choices=sorted(EXPERIMENTS))
    args, rest = ap.parse_known_args(argv)
    if args.command == "run" and args.name is None:
        run.print_usage()
        print("experiments: " + ", ".join(EXPERIMENTS))
        return 0 if any(a in ("-h", "--help") for a in rest) else 2
    if args.command == "list":
        width = max(map(len, EXPERIMENTS))
        print(f"{'name':<{width}}  {'time':>7}  what (time: at the defaults, 2 CPU cores)")
        for name, (_, about, seconds) in EXPERIMENTS.items():
            print(f"{name:<{width}}  {seconds:>7}  {about}")
        print("genvi run NAME --help shows NAME's options and their defaults")
        return 0
    use_compilation_cache()
    module = importlib.import_module(EXPERIMENTS[args.name][0])
    if not any(a == "--out" or a.startswith("--out=") for a in rest):
        rest = rest + ["--out", f"out/{args.name}"]
    module.main(rest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
