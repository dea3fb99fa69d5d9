"""Benchmark results as files: a bench script run with `--record` writes its summary
table to `experiments/genvi_experiments/bench/results/<name>.json`, with the command that made it
and where, when and at which commit it ran, and rewrites that table in the page that
marks it (between the markers `<!-- results: name -->` and `<!-- /results: name -->`):
BENCHMARKS.md or its family's page in docs/benchmarks/ (`PAGES`), so a rerun updates
the numbers there and nobody copies them by hand.

    python -m genvi_experiments.bench.results           # rewrite every marked table
    python -m genvi_experiments.bench.results --check   # exit 1 if one is out of date

A table measured on an accelerator is its own result (`vae_step_784_gpu` beside
`vae_step_784`: see `on_platform`). Where the checkout is a copy without git (a bench
sent to a GPU machine), `GENVI_BENCH_COMMIT` names the commit it was copied from, and
`GENVI_RESULTS_DIR` where the files go (the pages are then left alone: render them
with this module where the files land).

Example:
    >>> from genvi_experiments.bench.results import render
    >>> print(render({"command": "python -m x", "columns": ["a", "b"], "rows": [[1, 2.5]],
    ...               "note": "", "provenance": {"date": "2026-11-26", "commit": "abc1234",
    ...                                         "machine": "x86_64, 2 cores"}}))
    | a | b |
    |---|---|
    | 1 | 2.5 |
    <BLANKLINE>
    `python -m x` (2026-11-26, commit abc1234; x86_64, 2 cores)
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import re
import subprocess
import sys
from typing import Any, Sequence

ROOT = pathlib.Path(__file__).resolve().parents[3]   # the checkout: experiments/genvi_experiments/bench
RESULTS = pathlib.Path(__file__).resolve().parent / "results"
BENCHMARKS = ROOT / "BENCHMARKS.md"
# the pages whose markers the results fill: the index and a page per family
PAGES = (BENCHMARKS, *sorted((ROOT / "docs" / "benchmarks").glob("*.md")))
# a copy of the checkout sent to another machine: where its results go instead
_RESULTS_ELSEWHERE = os.environ.get("GENVI_RESULTS_DIR")
VERSIONED = ("jax", "numpyro", "funsor", "pyro", "torch", "flax")


def _commit() -> str:
    """The checkout's short commit, marked where the code that runs (the library, the
    experiments) differs from it; `GENVI_BENCH_COMMIT` where the checkout is a copy."""
    if os.environ.get("GENVI_BENCH_COMMIT"):
        return os.environ["GENVI_BENCH_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--",
                                "genvi", "experiments", "pyproject.toml"],
                               cwd=ROOT, text=True, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" with uncommitted changes" if dirty.strip() else "")


_COMMIT = _commit()  # when the bench started: the code it runs is what was checked out then


def provenance() -> dict:
    """Where, when and at which commit a result is recorded: the UTC date, the commit,
    the machine and the versions of the libraries the bench imported.

    Example:
        >>> from genvi_experiments.bench.results import provenance
        >>> sorted(provenance())
        ['commit', 'date', 'machine']
    """
    from genvi_experiments.common.timing import describe_machine  # noqa: PLC0415 - imports JAX

    versions = [f"{name} {sys.modules[name].__version__}" for name in VERSIONED[1:]
                if name in sys.modules and hasattr(sys.modules[name], "__version__")]
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
            "commit": _COMMIT,
            "machine": ", ".join([describe_machine()] + versions)}


def command(bench: str, argv: Sequence[str] | None) -> str:
    """The command line that ran a bench: its module and its arguments (`argv`, or the
    process's own when None), as the results record it.

    Example:
        >>> from genvi_experiments.bench.results import command
        >>> command("peers.horseshoe", ["--seeds", "8", "--record"])
        'python -m genvi_experiments.bench.peers.horseshoe --seeds 8 --record'
    """
    args = list(sys.argv[1:] if argv is None else argv)
    return " ".join([f"python -m genvi_experiments.bench.{bench}", *args])


def on_platform(name: str) -> str:
    """A result's name on the machine JAX computes on: `name` on a CPU, with the
    platform appended on an accelerator, so a GPU table never overwrites a CPU one.

    Example:
        >>> from genvi_experiments.bench.results import on_platform
        >>> on_platform("vae_step_784")  # on a CPU
        'vae_step_784'
    """
    import jax  # noqa: PLC0415 - the results files and their pages need no JAX

    platform = jax.default_backend()
    return name if platform == "cpu" else f"{name}_{platform}"


def render(result: dict) -> str:
    """The markdown of a recorded result: its table, its note, and one line with the
    command and its provenance."""
    lines = ["| " + " | ".join(result["columns"]) + " |",
             "|" + "---|" * len(result["columns"])]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in result["rows"]]
    p = result["provenance"]
    lines += [""] + ([result["note"], ""] if result["note"] else [])
    lines.append(f"`{result['command']}` ({p['date']}, commit {p['commit']}; {p['machine']})")
    return "\n".join(lines)


def _block(name: str) -> re.Pattern:
    return re.compile(rf"(<!-- results: {re.escape(name)} -->\n).*?(\n<!-- /results: "
                      rf"{re.escape(name)} -->)", re.S)


def update(markdown: str, results: dict) -> str:
    """`markdown` with each marked block replaced by its result's rendering."""
    for name, result in results.items():
        markdown = _block(name).sub(lambda m, r=result: m.group(1) + render(r) + m.group(2),
                                    markdown)
    return markdown


def load(directory: pathlib.Path = RESULTS) -> dict:
    """{name: result} of every recorded result."""
    return {path.stem: json.loads(path.read_text())
            for path in sorted(directory.glob("*.json"))}


def record(name: str, command: str, columns: Sequence[str], rows: Sequence[Sequence[Any]],
           note: str = "", directory: pathlib.Path | None = None,
           benchmarks: pathlib.Path | Sequence[pathlib.Path] | None = PAGES) -> dict:
    """Write a bench's summary table to `directory/<name>.json` and rewrite its block in
    `benchmarks` (a page or pages; those that mark it), by default in `PAGES`; cells are
    written as given (format numbers before). `directory` defaults to `results/` beside
    this module, or to `GENVI_RESULTS_DIR` when set (and then no page is touched).
    Returns the result.

    Example:
        >>> # record("stochastic_volatility", "python -m ...", ["guide", "ms"], [["x", "0.3"]])
    """
    result = {"command": command, "columns": list(columns),
              "rows": [[str(cell) for cell in row] for row in rows], "note": note,
              "provenance": provenance()}
    if directory is None:
        directory = pathlib.Path(_RESULTS_ELSEWHERE) if _RESULTS_ELSEWHERE else RESULTS
        if _RESULTS_ELSEWHERE and benchmarks is PAGES:
            benchmarks = None
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"{name}.json").write_text(json.dumps(result, indent=1, ensure_ascii=False)
                                            + "\n")
    pages = [benchmarks] if isinstance(benchmarks, pathlib.Path) else list(benchmarks or ())
    for page in pages:
        if page.exists():
            text = page.read_text()
            new = update(text, {name: result})
            if new != text:
                page.write_text(new)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a page differs from the recorded results")
    a = p.parse_args(argv)
    texts = {page: page.read_text() for page in PAGES}
    results = load()
    missing = [name for name in results
               if not any(_block(name).search(text) for text in texts.values())]
    if missing:
        print(f"no page ({', '.join(str(p.relative_to(ROOT)) for p in PAGES)}) has a block "
              f"for {missing}", file=sys.stderr)
        return 1
    stale = {page: new for page, text in texts.items()
             if (new := update(text, results)) != text}
    if a.check:
        if stale:
            print(f"{', '.join(str(p.relative_to(ROOT)) for p in stale)} out of date: "
                  "python -m genvi_experiments.bench.results", file=sys.stderr)
            return 1
        return 0
    for page, new in stale.items():
        page.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
