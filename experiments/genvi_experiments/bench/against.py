"""A benchmark of this package at a baseline commit beside the current tree, interleaved.

Runs `genvi_experiments.bench.NAME` (`experiments.bench.NAME` at a base that still has
the `experiments/` folder) in a fresh subprocess at the base commit, then in the current
checkout (uncommitted changes included), and so on for `--rounds` rounds. NAME is a
module's dotted name under `bench` (`enumeration.peers`); at a base from before the
benchmarks were grouped by family, where that module does not exist, its flat name
(`enumeration_peers`, from `FLAT_NAMES`) runs there instead, and a flat NAME runs as
its family module in a tree that has it; `--base-name` names the base's module outright. The base runs
in a temporary git worktree (removed at the end unless `--keep`) with the worktree first
on `PYTHONPATH`, which comes before the editable install's import hook; each child
reports the `genvi` it imported and a run from the wrong checkout stops the comparison.
Every markdown table row the benchmark prints is parsed: its key is its non-numeric
cells plus the cells of the `--key-columns` (sizes such as `B` or `batch`), its values
its other numeric cells, named by the table's header. Prints, per row and column, the
median over rounds at the base and in the tree and their ratio, and the least value
on each side (a time's fastest run) and their ratio. `JAX_PLATFORMS=cpu`.

    python -m genvi_experiments.bench.against [--base REV] [--rounds 3] [--keep]
        [--worktree DIR] [--key-columns B batch] [--base-name NAME] NAME
        [-- ARGS OF THE BENCHMARK]

Example:
    python -m genvi_experiments.bench.against --base b94a79c --rounds 3 replays.plate \\
        -- --sizes 1000 4000 --rounds 10
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TREE = Path(__file__).resolve().parents[3]   # the checkout: experiments/genvi_experiments/bench
# The child: note which genvi it imports, then run the benchmark module as `python -m` would.
PROBE = ("import runpy, sys, genvi; print('against: genvi from', genvi.__file__, file=sys.stderr, "
         "flush=True); runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")
SEPARATOR = re.compile(r":?-+:?")
# each family module's name before the benchmarks were grouped by family (one flat
# folder, `bench/enumeration_peers.py` for `bench/enumeration/peers.py`), for a base
# commit from before then
FLAT_NAMES = {
    "frontier.harness": "frontier", "frontier.discrete_vae": "discrete_vae",
    "frontier.gmm": "frontier_gmm", "frontier.air": "frontier_air",
    "frontier.lab": "estimator_lab",
    "enumeration.mixture_hmm": "enumeration", "enumeration.memory": "enumeration_memory",
    "enumeration.peers": "enumeration_peers", "enumeration.plates": "enumeration_plates",
    "enumeration.chain_time": "enumeration_time",
    "vae.step": "vae_step", "vae.roofline": "vae_roofline", "vae.quality": "vae_quality",
    "vae.ssvae_step": "ssvae_step",
    "air.step": "air_step", "air.in_pyro": "air_pyro", "air.compile": "air_compile",
    "replays.steps": "replay_steps", "replays.plate": "plate_replays",
    "replays.scan": "scan_replays", "replays.binary_plate_forms": "binary_plate_forms",
    "replays.sd_plate": "sd_plate", "replays.explain_calibration": "explain_calibration",
    **{f"peers.{name}": name for name in ("coin", "eight_schools", "logreg", "gmm",
                                          "from_numpyro", "stochastic_volatility",
                                          "horseshoe", "guide_starts")},
    "changes.program_fingerprints": "program_fingerprints",
    "changes.fit_overhead": "fit_overhead",
}
# family modules written after the families were made: they have no flat name, and a
# base from before them has no such benchmark
SINCE_FAMILIES = frozenset({"peers.autoguides"})


def git(*args: str, cwd: Path = TREE) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True,
                          text=True).stdout.strip()


def base_worktree(rev: str, where: str | None) -> tuple[Path, bool]:
    """(a checkout of `rev`, whether this call created it)."""
    sha = git("rev-parse", "--verify", f"{rev}^{{commit}}")
    if where and Path(where, ".git").exists():
        if git("rev-parse", "HEAD", cwd=Path(where)) != sha:
            sys.exit(f"against: {where} is not at {rev}")
        return Path(where), False
    path = Path(where) if where else Path(tempfile.mkdtemp(prefix="genvi_base_")) / "checkout"
    git("worktree", "add", "--detach", str(path), sha)
    return path, True


def layout(root: Path) -> tuple[str, str, Path]:
    """(the experiments' package, the import path, the package's folder) of the
    checkout at `root`: its experiments are the project `experiments/` beside genvi
    (`genvi_experiments` inside it), or, at older commits, the package
    `genvi_experiments` or `experiments` at the top."""
    if (root / "experiments" / "genvi_experiments").is_dir():
        return ("genvi_experiments", os.pathsep.join([str(root), str(root / "experiments")]),
                root / "experiments" / "genvi_experiments")
    if (root / "genvi_experiments").is_dir():
        return "genvi_experiments", str(root), root / "genvi_experiments"
    return "experiments", str(root), root / "experiments"


def bench_module(root: Path, name: str, exact: bool = False) -> str:
    """The importable module of the benchmark `name` in the checkout at `root`: `name`
    itself, or where that module is not there (and not `exact`), its flat name before
    the benchmarks were grouped by family, or its family name after."""
    package, _, folder = layout(root)
    family = {flat: dotted for dotted, flat in FLAT_NAMES.items()}
    names = [name] if exact else [name, FLAT_NAMES.get(name), family.get(name)]
    for candidate in filter(None, names):
        path = folder / "bench" / Path(*candidate.split("."))
        if path.with_suffix(".py").is_file():  # a module (a family's package runs nothing)
            return f"{package}.bench.{candidate}"
    raise SystemExit(f"against: no benchmark {' or '.join(filter(None, names))} in {root}")


def run_once(module: str, args: list[str], root: Path) -> tuple[str, float]:
    """The stdout of one run of `module` from the checkout at `root`, and its seconds."""
    env = {**os.environ, "PYTHONPATH": layout(root)[1], "JAX_PLATFORMS": "cpu"}
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", PROBE, module, *args], cwd=root, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit(f"against: {module} in {root} exited with {proc.returncode}")
    found = re.search(r"^against: genvi from (.+)$", proc.stderr, re.M)
    if not found or not Path(found[1]).resolve().is_relative_to(root.resolve()):
        raise SystemExit(f"against: the run from {root} imported genvi from "
                         f"{found[1] if found else '(unknown)'}")
    return proc.stdout, seconds


def is_number(cell: str) -> bool:
    try:
        float(cell)
        return True
    except ValueError:
        return False


def parse_tables(text: str, key_columns: set[str]) -> dict[tuple[str, str], float]:
    """{(row key, column): value} of every markdown table row in `text`."""
    values: dict[tuple[str, str], float] = {}
    header: list[str] | None = None
    previous: list[str] | None = None
    for line in text.splitlines():
        line = line.strip()
        if not (line.startswith("|") and line.endswith("|") and len(line) > 1):
            previous = None
            continue
        cells = [c.strip() for c in line[1:-1].split("|")]
        if previous is not None and all(SEPARATOR.fullmatch(c) for c in cells):
            header, previous = previous, None
            continue
        previous = cells
        if header is None:
            continue
        names = [header[i] if i < len(header) else f"column {i + 1}" for i in range(len(cells))]
        is_key = [not is_number(c) or n.casefold() in key_columns for c, n in zip(cells, names)]
        key = ", ".join(c if not is_number(c) else f"{n}={c}"
                        for c, n, k in zip(cells, names, is_key) if k)
        row = {n: float(c) for c, n, k in zip(cells, names, is_key) if not k}
        base_key, copy = key, 1
        while row and any((key, n) in values for n in row):  # a repeated key: number it
            copy += 1
            key = f"{base_key} #{copy}"
        values.update({(key, n): v for n, v in row.items()})
    return values


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("name", help="a module of genvi_experiments.bench, e.g. replays.plate")
    ap.add_argument("--base", default="HEAD", help="the baseline commit (default HEAD)")
    ap.add_argument("--rounds", type=int, default=3, help="runs on each side, interleaved")
    ap.add_argument("--keep", action="store_true", help="keep the base's worktree")
    ap.add_argument("--worktree", default=None,
                    help="where the base's worktree is (reused if it is there) or goes")
    ap.add_argument("--key-columns", nargs="*", default=["B", "batch"],
                    help="numeric columns that name a row rather than measure it")
    ap.add_argument("--base-name", default=None,
                    help="the benchmark's module at the base, where it has another name "
                         "(default: NAME, or its flat name at a base from before the "
                         "families)")
    args = ap.parse_args(argv[:cut])
    bench_args = argv[cut + 1:]
    os.environ["JAX_PLATFORMS"] = "cpu"
    from genvi_experiments.common.timing import describe_machine  # after JAX_PLATFORMS

    worktree, created = base_worktree(args.base, args.worktree)
    try:
        sides = {"base": (bench_module(worktree, args.base_name or args.name,
                                       exact=args.base_name is not None), worktree),
                 "tree": (bench_module(TREE, args.name), TREE)}
        keys = {k.casefold() for k in args.key_columns}
        samples: dict[str, dict[tuple[str, str], list[float]]] = {"base": {}, "tree": {}}
        seconds: dict[str, list[float]] = {"base": [], "tree": []}
        # the tree as it is measured (a commit made during the run must not be named)
        dirty = git("--no-optional-locks", "status", "--porcelain", "--untracked-files=no")
        tree_rev = git("rev-parse", "--short", "HEAD") + (" + uncommitted changes" if dirty else "")
        for r in range(args.rounds):
            for side, (module, root) in sides.items():
                out, s = run_once(module, bench_args, root)
                seconds[side].append(s)
                for cell, v in parse_tables(out, keys).items():
                    samples[side].setdefault(cell, []).append(v)
                print(f"against: round {r + 1}/{args.rounds}, {side}: {s:.1f} s",
                      file=sys.stderr, flush=True)
        print(f"# {args.name} {' '.join(bench_args)}: base beside tree, median of "
              f"{args.rounds} interleaved runs each")
        print(f"machine: {describe_machine()}")
        print(f"base: {git('rev-parse', '--short', args.base)} ({sides['base'][0]}), "
              f"tree: {tree_rev} ({sides['tree'][0]})")
        print(f"seconds per run: base {statistics.median(seconds['base']):.1f}, "
              f"tree {statistics.median(seconds['tree']):.1f}\n")
        print("| row | column | base | tree | tree / base | base, least | tree, least "
              "| least, tree / base |\n|---|---|---|---|---|---|---|---|")
        for cell in dict.fromkeys([*samples["base"], *samples["tree"]]):
            b, t = samples["base"].get(cell), samples["tree"].get(cell)
            row = []
            for pick in (statistics.median, min):   # a time's least: the quietest run's
                vb, vt = (pick(x) if x else float("nan") for x in (b, t))
                row += [vb, vt, vt / vb if b and t and vb != 0 else float("nan")]
            print(f"| {cell[0]} | {cell[1]} | " + " | ".join(
                f"{v:.4g}" if i % 3 != 2 else f"{v:.3f}" for i, v in enumerate(row)) + " |")
    finally:
        if created and not args.keep:
            git("worktree", "remove", "--force", str(worktree))
            if not args.worktree:
                shutil.rmtree(worktree.parent, ignore_errors=True)
        elif created:
            print(f"against: kept the base's worktree at {worktree}", file=sys.stderr)


if __name__ == "__main__":
    main()
