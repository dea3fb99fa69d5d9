"""gv.diagnose on a conjugate normal–normal model, whose posterior and evidence are exact:
khat separates the exact posterior (and a wider guide) from a too-narrow one, the log
evidence is within 4 standard errors of the exact log marginal likelihood, and
resampling corrects a mildly off guide."""

import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import genvi as gv
from programs import model

Y = jnp.array([0.8, 1.9, -0.3, 1.2, 0.4])
N = Y.shape[0]
POST_MEAN = float(Y.sum()) / (N + 1)      # z ~ N(0, 1), y_i ~ N(z, 1)
POST_SD = (1.0 / (N + 1)) ** 0.5


def exact_log_evidence() -> float:
    """log N(y; 0, I + 1 1ᵀ)."""
    cov = np.eye(N) + np.ones((N, N))
    y = np.asarray(Y, np.float64)
    _, logdet = np.linalg.slogdet(cov)
    return float(-0.5 * (N * math.log(2 * math.pi) + logdet + y @ np.linalg.solve(cov, y)))


@gv.gen
def guide(params, y):
    gv.normal(params["m"], params["s"], grad=gv.REPARAM) @ "z"


def run(mean_shift: float, sd_ratio: float, num_samples: int = 20_000, seed: int = 0):
    params = {"m": POST_MEAN + mean_shift * POST_SD, "s": sd_ratio * POST_SD}
    return gv.diagnose(model, guide, params, Y, key=jax.random.key(seed), num_samples=num_samples)


def test_exact_posterior_guide_is_good():
    report = run(0.0, 1.0)
    # the weights are the evidence itself, equal up to rounding: no tail at all
    assert report.khat < 0.5 and report.verdict == "good"
    assert report.ess == pytest.approx(20_000)
    assert report.log_evidence == pytest.approx(exact_log_evidence(), abs=1e-4)
    assert "the guide is the posterior" in str(report)


def test_wider_guide_is_good_and_its_log_evidence_is_exact_within_4_se():
    report = run(0.3, 1.5)
    assert report.khat < 0.5 and report.verdict == "good"
    assert 0.5 * 20_000 < report.ess < 20_000
    assert abs(report.log_evidence - exact_log_evidence()) < 4 * report.log_evidence_se
    assert report.elbo < report.log_evidence      # log Z − ELBO estimates KL(q ‖ p) > 0


def test_too_narrow_guide_is_unreliable_and_says_what_to_do():
    report = run(0.0, 0.2)
    assert report.khat > 0.7 and report.verdict == "unreliable"
    text = str(report)
    assert "unreliable" in text.lower() and "gv.auto_mvn" in text and "resample" not in text
    assert "khat=" in repr(report) and f"{report.khat:.3f}" in repr(report)


def test_resample_corrects_a_mildly_off_guide():
    report = run(0.6, 1.2)
    draws = report.resample(jax.random.key(1), 20_000)
    assert draws["z"].shape == (20_000,) and sorted(draws.flat()) == [("z",)]
    # the resampled mean's error: multinomial resampling plus the importance weights
    se = POST_SD * math.sqrt(1.0 / 20_000 + 1.0 / report.ess)
    assert abs(float(draws["z"].mean()) - POST_MEAN) < 5 * se
    guide_mean = float(report.draws["z"].mean())
    assert abs(guide_mean - POST_MEAN) > 20 * se          # the guide alone is off


def test_a_marginal_model_is_weighted_by_its_density_estimate():
    @gv.gen
    def joint(params, y):
        z = gv.normal(0.0, 1.0) @ "z"
        u = gv.normal(z, 1.0) @ "u"
        gv.observe(gv.normal(u, 1.0), y)

    marginal = gv.marginal(joint, keep=["z"], algorithm=gv.importance(particles=10))
    report = gv.diagnose(marginal, guide, {"m": 0.3, "s": 0.9}, 1.0, key=jax.random.key(0),
                         num_samples=4000)
    exact = -0.5 * math.log(2 * math.pi * 3.0) - 1.0 / 6.0      # y ~ N(0, 3)
    assert report.khat < 0.5
    assert abs(report.log_evidence - exact) < 4 * report.log_evidence_se


def test_batch_size_changes_memory_not_the_answer():
    whole = run(0.3, 1.5, num_samples=1000)
    chunked = gv.diagnose(model, guide, {"m": POST_MEAN + 0.3 * POST_SD, "s": 1.5 * POST_SD}, Y,
                          key=jax.random.key(0), num_samples=1000, batch_size=128)
    np.testing.assert_allclose(chunked.log_weights, whole.log_weights, rtol=1e-6, atol=1e-6)


def test_automatic_guide_reads_its_params_entry():
    auto = gv.auto_normal(model)
    params = {"guide": auto.init(jax.random.key(0), {}, Y)}
    report = gv.diagnose(model, auto, params, Y, key=jax.random.key(1), num_samples=500)
    assert report.draws["z"].shape == (500,) and np.isfinite(report.khat)


def test_guide_outside_the_model_support_is_a_clear_error():
    @gv.gen
    def positive_model(params, y):
        z = gv.gamma(2.0, 1.0) @ "z"
        gv.observe(gv.normal(z, 1.0), y)

    with pytest.raises(ValueError, match="outside its support"):
        gv.diagnose(positive_model, guide, {"m": 0.0, "s": 1.0}, Y, key=jax.random.key(0),
                    num_samples=200)


def test_bad_arguments_name_the_fix():
    with pytest.raises(TypeError, match="@gv.gen"):
        gv.diagnose(lambda params, y: None, guide, {}, Y, key=jax.random.key(0))
    with pytest.raises(ValueError, match="num_samples"):
        gv.diagnose(model, guide, {"m": 0.0, "s": 1.0}, Y, key=jax.random.key(0), num_samples=1)
    with pytest.raises(TypeError, match="PRNG key"):
        gv.diagnose(model, guide, {"m": 0.0, "s": 1.0}, Y, key=0)
    with pytest.raises(ValueError, match="positive int"):
        run(0.0, 1.0, num_samples=100).resample(jax.random.key(0), 0)


def test_without_arviz_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "arviz", None)  # `import arviz` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'genvi\[arviz\]'"):
        gv.diagnose(model, guide, {"m": 0.0, "s": 1.0}, Y, key=jax.random.key(0))
    with pytest.raises(ImportError, match=r"pip install 'genvi\[arviz\]'"):
        gv.to_arviz({"z": jnp.zeros(10)})
