"""The README's demo runs end to end and reaches the exact posterior."""

import sys

from genvi import demo


def test_demo_reaches_exact_posterior(capsys, tmp_path):
    out = demo.main(["--steps", "1500", "--out", str(tmp_path)])
    (m, s, p), (m0, s0, p0) = out["learned"], out["exact"][:3]
    assert abs(m - m0) < 0.05 and abs(s - s0) < 0.03 and abs(p - p0) < 0.02
    assert abs(out["elbo"] - out["log_evidence"]) < 0.05
    printed = capsys.readouterr().out
    assert "posterior mean of mu" in printed
    # the model is named before the fit: its first line, before the results table
    assert printed.startswith("genvi demo: variational inference on a model")
    assert printed.index("mu ~ Normal(0, 1)") < printed.index("posterior mean of mu")
    # results.md is a well-formed table: every row has the header's three cells
    rows = (tmp_path / "results.md").read_text().splitlines()
    cells = [len(r.replace("\\|", "").strip("|").split("|")) for r in rows]
    assert cells == [3] * len(rows), rows


def test_demo_runs_without_matplotlib(capsys, tmp_path, monkeypatch):
    # the README's first command installs genvi alone (matplotlib is the experiments
    # extra) and runs the demo, which `genvi run` gives an --out folder
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # its import now fails
    demo.main(["--steps", "200", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert "no objective.png (saving figures needs matplotlib: pip install matplotlib)" in printed
    assert (tmp_path / "results.md").exists() and not (tmp_path / "objective.png").exists()
