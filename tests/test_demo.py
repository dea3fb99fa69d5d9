"""The README's demo runs end to end and reaches the exact posterior."""

from genvi import demo


def test_demo_reaches_exact_posterior(capsys):
    out = demo.main(["--steps", "1500"])
    (m, s, p), (m0, s0, p0) = out["learned"], out["exact"][:3]
    assert abs(m - m0) < 0.05 and abs(s - s0) < 0.03 and abs(p - p0) < 0.02
    assert abs(out["elbo"] - out["log_evidence"]) < 0.05
    assert "posterior mean of mu" in capsys.readouterr().out
