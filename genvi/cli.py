"""The `genvi` command line: `genvi list`, `genvi run NAME [options]`.

Each experiment writes its table (`results.md`) and figures (PNG) to `--out`
(default `out/NAME`); options after NAME go to the experiment (`--steps N`, ...).

Where experiments come from: `demo` (`genvi.demo`) is built in; every other one is
an entry point in the `genvi.experiments` group of an installed package. genvi's own
experiments are the package `genvi_experiments`, a project of its own in the
repository's `experiments/` folder, not in genvi's wheel: installed
(`GENVI_EXPERIMENTS=1 scripts/install.sh`), they register like any other package's,
and in a checkout `genvi run` finds them there without installing. `genvi list`
reads the entry points' records without importing the experiments; `genvi run NAME`
imports NAME's module only then. A third-party package registers an experiment in
its pyproject.toml:

    [project.entry-points."genvi.experiments"]
    my_model = "my_package.registry:MY_MODEL"

where `my_package.registry.MY_MODEL` is any light object (import nothing heavy in
that module, since `genvi list` loads it) with three string attributes: `module`,
the module whose `main(argv)` runs the experiment (argv: the options after NAME,
with `--out` added when not given), `about`, one line on what it does, and `time`,
its wall time at the defaults (`"30 s"`). A NamedTuple does; so does
`genvi_experiments.registry.Experiment`. Two helpers for the experiment itself:
`genvi.cli.ShowDefaults`, the formatter for its argument parser (pass the module
docstring as the description: `genvi run NAME --help` then shows all of it, paragraph
by paragraph, and every option's help and default), and `genvi.cli.announce`, which
says what a long phase (a compile, a training loop) is doing before it starts. After `pip install` of that package, `genvi list` shows `my_model` and
`genvi run my_model` runs it. Experiments are listed demo first, then by the module
holding their records and, within one, in the order the records are defined there.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import importlib.metadata
import itertools
import pathlib
import re
import sys
import textwrap
import tomllib
from typing import Any, NamedTuple

from genvi.core.compile_cache import use_compilation_cache


class ShowDefaults(argparse.HelpFormatter):
    """Help for `genvi run NAME --help` that shows every option's default (also for
    options without help text) and the whole description, paragraph by paragraph: a
    module docstring passed as the description keeps its paragraphs, its bullet items
    (lines starting with `* ` or `- `) and its command lines (indented by four spaces
    or more, as in Markdown), instead of being
    run together or cut. The helper for experiments, genvi's own and other packages'
    (see the module docstring): pass it as the `formatter_class` of the experiment's
    `argparse.ArgumentParser`.

    Example:
        >>> import argparse
        >>> from genvi.cli import ShowDefaults
        >>> ap = argparse.ArgumentParser(prog="x", formatter_class=ShowDefaults,
        ...                              description="One paragraph.\\n\\n    x --steps 5\\n")
        >>> _ = ap.add_argument("--steps", type=int, default=5, help="steps to take")
        >>> text = ap.format_help()
        >>> "steps to take (default: 5)" in text, "One paragraph.\\n\\n    x --steps 5" in text
        (True, True)
    """

    def _format_action(self, action: argparse.Action) -> str:
        shown = action.option_strings and action.default not in (None, argparse.SUPPRESS) \
            and not isinstance(action, argparse._StoreConstAction)
        if shown and "%(default)" not in (action.help or ""):
            action = copy.copy(action)  # argparse prints no help line for help=None
            action.help = ((action.help or "") + " (default: %(default)s)").strip()
        return super()._format_action(action)

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        # argparse's own filling joins the whole description into one paragraph
        blocks = []
        for paragraph in re.split(r"\n\s*\n", textwrap.dedent(text).strip("\n")):
            lines = []
            # lines indented by four spaces or more (a command line, an example) are kept
            # as written; a bullet item's continuation lines are indented less
            for verbatim, run in itertools.groupby(paragraph.splitlines(), key=_verbatim):
                group = list(run)
                if verbatim:
                    lines += [indent + line.rstrip() for line in group]
                    continue
                for item in re.split(r"\n(?=[*-] )", "\n".join(group)):
                    hang = "  " if item.startswith(("* ", "- ")) else ""
                    lines.append(textwrap.fill(" ".join(item.split()), width,
                                               initial_indent=indent,
                                               subsequent_indent=indent + hang))
            blocks.append("\n".join(lines))
        return "\n\n".join(blocks)


def _verbatim(line: str) -> bool:
    return line.startswith(("    ", "\t"))


def announce(message: str) -> None:
    """Say what an experiment is about to do, before a phase that runs for a while
    without output (compiling a training loop, then running it; an evaluation): one
    line on stderr, flushed at once, so it shows even when stdout is a pipe and stays
    out of the results that an experiment prints on stdout.

    Example:
        >>> import contextlib, io
        >>> from genvi.cli import announce
        >>> err = io.StringIO()
        >>> with contextlib.redirect_stderr(err):
        ...     announce("ELBO: compiling, then 20000 SGD steps")
        >>> err.getvalue()
        'ELBO: compiling, then 20000 SGD steps …\\n'
    """
    print(f"{message} …", file=sys.stderr, flush=True)


GROUP = "genvi.experiments"  # the entry-point group experiments register in
#: genvi's own experiments in a checkout of the repository: a project beside `genvi/`
CHECKOUT = pathlib.Path(__file__).resolve().parents[1] / "experiments"


def _checkout_entry_points() -> list[importlib.metadata.EntryPoint]:
    """The experiments of a checkout's `experiments/` project (its pyproject.toml's
    entry points), its folder appended to `sys.path` so that they import where the
    project is not installed (an installed copy comes first on the path). None outside
    a checkout (genvi installed from its wheel)."""
    project = CHECKOUT / "pyproject.toml"
    if not project.is_file():
        return []
    declared = tomllib.loads(project.read_text())["project"].get("entry-points", {})
    if str(CHECKOUT) not in sys.path:
        sys.path.append(str(CHECKOUT))
    return [importlib.metadata.EntryPoint(name, value, GROUP)
            for name, value in declared.get(GROUP, {}).items()]


class _Record(NamedTuple):
    """A built-in experiment's record (the same three attributes as a plugin's)."""

    module: str
    about: str
    time: str


# wall time at the defaults on 2 CPU cores, measured 2026-11-23 with `genvi run demo`,
# compile included
BUILTIN = {"demo": _Record("genvi.demo", "a short VI run checked against the exact posterior",
                          "10 s")}


def experiments() -> dict[str, Any]:
    """The experiments `genvi run` knows, name -> record (`module`, `about`, `time`):
    the built-in demo, then every `genvi.experiments` entry point of the installed
    packages, and those of the checkout's `experiments/` project where genvi runs from
    a checkout of its repository. Loading an entry point imports only the module holding its record, not
    the experiment; one that fails to load or lacks the attributes is skipped with a
    warning on stderr, and a name taken already (by the demo or another package) keeps
    its first record.

    Example:
        >>> from genvi.cli import experiments
        >>> found = experiments()
        >>> found["demo"].module
        'genvi.demo'
        >>> found["noisy_cone"].module, found["noisy_cone"].time
        ('genvi_experiments.noisy_cone', '20 s')
    """
    found: list[tuple[tuple, str, Any]] = []
    installed = list(importlib.metadata.entry_points(group=GROUP))
    seen = {(ep.name, ep.value) for ep in installed}
    for ep in installed + [ep for ep in _checkout_entry_points()
                           if (ep.name, ep.value) not in seen]:
        try:
            record = ep.load()
            if not all(isinstance(getattr(record, a, None), str)
                       for a in ("module", "about", "time")):
                raise TypeError("its record needs str attributes module, about and time")
        except Exception as e:  # noqa: BLE001 - one broken plugin leaves the others usable
            print(f"genvi: skipping experiment {ep.name!r} ({ep.value}): {e}", file=sys.stderr)
            continue
        # order: by the module holding the records, then where the record is defined there
        names = list(vars(sys.modules[ep.module]))
        attr = (ep.attr or "").split(".")[0]
        found.append(((ep.module, names.index(attr) if attr in names else len(names), ep.name),
                      ep.name, record))
    result: dict[str, Any] = dict(BUILTIN)
    for _, name, record in sorted(found, key=lambda f: f[0]):
        if name in result:
            print(f"genvi: experiment {name!r} is registered twice; keeping "
                  f"{result[name].module}, not {record.module}", file=sys.stderr)
            continue
        result[name] = record
    return result


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `genvi` console script.

    Example:
        >>> from genvi.cli import main
        >>> main(["list"])  # doctest: +ELLIPSIS
        name ...
        demo ...10 s  a short VI run ...
        0
    """
    known = experiments()
    ap = argparse.ArgumentParser(prog="genvi", description="genvi experiments")
    sub = ap.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="show the experiments")
    # `genvi run NAME --help` is the experiment's own help (its options and defaults),
    # so the run command leaves -h/--help to the experiment once a name is given
    run = sub.add_parser("run", help="run an experiment", add_help=False,
                         usage="genvi run NAME [options]  (genvi run NAME --help: NAME's options)")
    run.add_argument("name", nargs="?", choices=sorted(known),
                     help="the experiment to run (genvi list shows them)")
    args, rest = ap.parse_known_args(argv)
    if args.command == "run" and args.name is None:
        run.print_usage()
        print("experiments: " + ", ".join(known))
        return 0 if any(a in ("-h", "--help") for a in rest) else 2
    if args.command == "list":
        width = max(map(len, known))
        print(f"{'name':<{width}}  {'time':>7}  what (time: at the defaults, 2 CPU cores)")
        for name, record in known.items():
            print(f"{name:<{width}}  {record.time:>7}  {record.about}")
        print("genvi run NAME --help shows NAME's options and their defaults")
        return 0
    use_compilation_cache(by_default=True)   # `genvi run` owns its process
    module = importlib.import_module(known[args.name].module)
    if not any(a == "--out" or a.startswith("--out=") for a in rest):
        rest = rest + ["--out", f"out/{args.name}"]
    module.main(rest)
    return 0

if __name__ == "__main__":
    sys.exit(main())
