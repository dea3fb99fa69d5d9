"""Execute the tutorials top to bottom, as the test command does, and optionally save
them with their outputs (how the committed notebooks get their outputs).

    python notebooks/execute.py                 # run every notebook, report seconds
    python notebooks/execute.py --save 01_*.ipynb   # run and write outputs in place

Each notebook runs in a fresh kernel whose working directory is a scratch folder (or
`notebooks/` with --save), with a per-cell limit; an exception in any cell fails the run
and names the cell.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
LIMIT_SECONDS = 180  # the bar: each tutorial in at most 3 minutes on 2 cores


def notebooks() -> list[str]:
    """The tutorials, in reading order."""
    return sorted(glob.glob(os.path.join(HERE, "[0-9][0-9]_*.ipynb")))


def execute(path: str, cwd: str, save: bool = False) -> float:
    """Run the notebook at `path` in a fresh kernel started in `cwd`; return seconds.
    With `save`, write it back with its outputs."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    # figures inline, quiet progress bars, deterministic CPU runs
    os.environ.setdefault("CI", "1")
    client = NotebookClient(nb, timeout=LIMIT_SECONDS, kernel_name="python3",
                            resources={"metadata": {"path": cwd}})
    start = time.perf_counter()
    client.execute()
    seconds = time.perf_counter() - start
    if save:
        nbformat.write(nb, path)
    return seconds


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="notebook files (default: all)")
    ap.add_argument("--save", action="store_true", help="write outputs into the notebooks")
    args = ap.parse_args(argv)
    paths = [os.path.join(HERE, os.path.basename(n)) for n in args.names] or notebooks()
    for path in paths:
        with tempfile.TemporaryDirectory() as scratch:
            seconds = execute(path, HERE if args.save else scratch, save=args.save)
        print(f"{os.path.basename(path)}: {seconds:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
