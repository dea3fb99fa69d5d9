"""Experiments run end to end at a tiny size."""

import math
import os

from experiments import noisy_cone


def test_noisy_cone_tiny(tmp_path):
    out = noisy_cone.main(["--steps", "20", "--estimates-per-step", "4", "--eval", "200",
                           "--out", str(tmp_path)])
    assert abs(out["log_evidence"] - (-5.32)) < 0.01
    for name in noisy_cone.PAPER:
        assert math.isfinite(out[name]) and out[name] < out["log_evidence"]
    assert len([f for f in os.listdir(tmp_path) if f.endswith(".png")]) == 5
    assert "DIWHVI" in (tmp_path / "results.md").read_text()


def test_cli_lists_and_runs_an_experiment(tmp_path, capsys):
    from genvi.cli import main
    assert main(["list"]) == 0
    assert "noisy_cone" in capsys.readouterr().out
    out = tmp_path / "demo"
    assert main(["run", "demo", "--steps", "200", "--out", str(out)]) == 0
    assert (out / "results.md").exists() and (out / "objective.png").exists()
    assert "posterior mean of mu" in capsys.readouterr().out
