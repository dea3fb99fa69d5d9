"""The benchmark pages' recorded tables come from the results files the bench scripts
write (`--record`, experiments/genvi_experiments/bench/results.py): each file's table is
in its page (BENCHMARKS.md or docs/benchmarks/*.md) as rendered, and recording a result
writes its file, with its provenance, and rewrites its block; `against` finds a
benchmark by its name in a family or by its flat name at an older commit."""

import json

from genvi_experiments.bench import results


def test_benchmarks_md_shows_every_recorded_result():
    recorded = results.load()
    assert {"enumeration", "stochastic_volatility"} <= set(recorded)
    assert results.main(["--check"]) == 0
    # the tables live on the families' pages, each in the toctree of the docs' index page
    pages = {page.stem for page in results.PAGES[1:]}
    assert {"frontier", "enumeration", "vae", "air", "replays", "peers", "changes"} <= pages
    toctree = (results.ROOT / "docs" / "BENCHMARKS.md").read_text()
    assert all(f"benchmarks/{page}\n" in toctree for page in pages)


def test_recording_writes_the_file_and_rewrites_its_block(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# B\n\n<!-- results: toy -->\nold table\n<!-- /results: toy -->\n\nafter\n")
    out = results.record("toy", "python -m toy", ["method", "ms"], [["a", "0.125"]],
                         directory=tmp_path / "results", benchmarks=doc)
    saved = json.loads((tmp_path / "results" / "toy.json").read_text())
    assert saved == out and saved["rows"] == [["a", "0.125"]]
    assert {"date", "commit", "machine"} <= set(saved["provenance"])
    text = doc.read_text()
    assert "old table" not in text and "| a | 0.125 |" in text and text.endswith("after\n")
    results.record("toy", "python -m toy", ["method", "ms"], [["a", "0.250"]],
                   directory=tmp_path / "results", benchmarks=doc)
    assert "| a | 0.250 |" in doc.read_text() and "0.125" not in doc.read_text()


def test_against_finds_a_benchmark_by_its_family_name_or_its_flat_name(tmp_path):
    """Every benchmark module of a family has its flat name from before the families
    (`against.FLAT_NAMES`), so `against` runs it at a base commit from then, or is
    named as written since (`against.SINCE_FAMILIES`)."""
    import pathlib

    from genvi_experiments.bench import against
    bench = pathlib.Path(against.__file__).parent
    modules = {".".join(p.relative_to(bench).with_suffix("").parts)
               for p in bench.glob("*/*.py") if p.name != "__init__.py"}
    assert modules == set(against.FLAT_NAMES) | against.SINCE_FAMILIES
    assert not set(against.FLAT_NAMES) & against.SINCE_FAMILIES
    old = tmp_path / "experiments" / "genvi_experiments" / "bench"
    old.mkdir(parents=True)
    (old / "enumeration_peers.py").write_text("")
    (old / "frontier.py").write_text("")
    assert against.bench_module(tmp_path, "enumeration.peers") == \
        "genvi_experiments.bench.enumeration_peers"
    assert against.bench_module(tmp_path, "frontier.harness") == "genvi_experiments.bench.frontier"
    assert against.bench_module(against.TREE, "enumeration_peers") == \
        "genvi_experiments.bench.enumeration.peers"
    assert against.bench_module(against.TREE, "frontier") == \
        "genvi_experiments.bench.frontier.harness"


# genvi's internals a benchmark still reaches, for want of a public route: the chain
# product's memory budget (to time the blocked product against the whole one)
INTERNAL = {("enumeration/memory.py", "genvi.inference.enumeration")}


def test_benchmarks_are_written_against_gv():
    """A benchmark imports genvi as `gv` (and the experiments' own code), not genvi's
    modules, but for the few in `INTERNAL`."""
    import ast
    import pathlib

    from genvi_experiments import bench
    folder = pathlib.Path(bench.__file__).parent
    found = set()
    for path in folder.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {(path.relative_to(folder).as_posix(), a.name) for a in node.names
                          if a.name.startswith("genvi") and not a.name.startswith("genvi_")
                          and (a.name, a.asname) != ("genvi", "gv")}
            elif isinstance(node, ast.ImportFrom) and node.module \
                    and node.module.split(".")[0] == "genvi":
                found.add((path.relative_to(folder).as_posix(), node.module))
    assert found == INTERNAL
