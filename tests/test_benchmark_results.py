"""BENCHMARKS.md's recorded tables come from the results files the bench scripts write
(`--record`, experiments/genvi_experiments/bench/results.py): each file's table is in BENCHMARKS.md
as rendered, and recording a result writes its file, with its provenance, and rewrites
its block."""

import json

from genvi_experiments.bench import results


def test_benchmarks_md_shows_every_recorded_result():
    recorded = results.load()
    assert {"enumeration", "stochastic_volatility"} <= set(recorded)
    assert results.main(["--check"]) == 0


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
