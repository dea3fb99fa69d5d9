"""gv.fit's grouped options (genvi/training/fit_options.py): `gv.Evaluation`,
`gv.Checkpoints` and `gv.SkipNonfinite` run exactly what the flat keywords they
replace ran, the flat keywords still work with a DeprecationWarning that names the
record, and misuse is refused with the fix."""

import warnings

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv
from programs import guide, model

ADAM = optax.adam(0.05)


ELBO = gv.elbo(model, guide)
START = {"m": 0.0, "s": 0.0}


def fit(**kw):
    return gv.fit(ELBO, START, 1.0, optimizer=ADAM, steps=60, key=jax.random.key(0),
                  chunk_size=20, progress=False, **kw)


def same(a, b):
    for x, y in zip(jax.tree_util.tree_leaves(a.params), jax.tree_util.tree_leaves(b.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    np.testing.assert_array_equal(a.history["objective"], b.history["objective"])


def test_records_equal_the_flat_keywords_bit_for_bit(tmp_path):
    records = fit(evaluate=gv.Evaluation(ELBO, 2.0, every=20, estimates=8),
                  checkpoints=gv.Checkpoints(tmp_path / "a", every=30))
    with pytest.warns(DeprecationWarning) as caught:
        flat = fit(eval_objective=ELBO, eval_data=(2.0,), eval_every=20, eval_estimates=8,
                   checkpoint_dir=str(tmp_path / "b"), checkpoint_every=30)
    same(records, flat)
    np.testing.assert_array_equal(records.history["eval"], flat.history["eval"])
    assert list(records.history["eval_step"]) == [20, 40, 60]
    messages = sorted(str(w.message) for w in caught)
    assert "pass checkpoints=gv.Checkpoints(directory, every=..., resume=...)" in messages[0]
    assert "eval_objective, eval_data, eval_every, eval_estimates" in messages[1]
    assert "evaluate=gv.Evaluation(objective, *data, every=..., estimates=...)" in messages[1]
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == \
        sorted(p.name for p in (tmp_path / "b").iterdir())


def test_a_checkpoint_record_resumes_and_requires_when_asked(tmp_path):
    whole = fit()
    fit(checkpoints=gv.Checkpoints(tmp_path, every=20))   # writes steps 20, 40, 60
    resumed = fit(checkpoints=gv.Checkpoints(tmp_path))  # finds step 60: nothing to run
    same(whole, resumed)
    with pytest.raises(gv.CheckpointError, match="resume=True but there is no checkpoint"):
        fit(checkpoints=gv.Checkpoints(tmp_path / "empty", resume=True))


@gv.expectation
def mostly_nan(p):
    # NaN whenever x < 1.28: about 90% of the steps
    x = gv.sample(gv.normal(p["m"], 1.0, grad=gv.REPARAM))
    return jnp.log(x - 1.28)


def test_skip_nonfinite_true_is_the_default_record_and_the_fraction_moves():
    def run(skip):
        return gv.fit(mostly_nan, {"m": 0.0}, optimizer=ADAM, steps=100,
                      key=jax.random.key(2), skip_nonfinite=skip, progress=False)
    with pytest.warns(gv.NonFiniteWarning, match="warn_fraction=...\\), now 0.1"):
        plain = run(True)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gv.NonFiniteWarning)
        quiet = run(gv.SkipNonfinite(warn_fraction=None))
        with pytest.warns(DeprecationWarning, match="skip_warn_fraction"):
            flat = gv.fit(mostly_nan, {"m": 0.0}, optimizer=ADAM, steps=100,
                          key=jax.random.key(2), skip_nonfinite=True, skip_warn_fraction=0.99,
                          progress=False)
    same(plain, quiet)
    same(plain, flat)


def test_misuse_is_refused_with_the_fix(tmp_path):
    with pytest.raises(TypeError, match="pass evaluate= or the keywords eval_every, not both"):
        fit(evaluate=gv.Evaluation(ELBO, 1.0, every=10), eval_every=5)
    with pytest.raises(TypeError, match="eval_objective needs eval_every"):
        with pytest.warns(DeprecationWarning):
            fit(eval_objective=ELBO)
    with pytest.raises(TypeError, match="resume=True needs a checkpoint directory"):
        with pytest.warns(DeprecationWarning):
            fit(resume=True)
    with pytest.raises(TypeError, match="unexpected keyword argument 'eval_evry'"):
        fit(eval_evry=5)
    with pytest.raises(TypeError, match="skip_nonfinite must be True, False or gv.SkipNonfinite"):
        fit(skip_nonfinite=0.5)
    with pytest.raises(ValueError, match="every must be a positive number of steps"):
        gv.Evaluation(ELBO, 1.0, every=0)
    with pytest.raises(ValueError, match="every must be a positive number of steps or None"):
        gv.Checkpoints(tmp_path, every=-1)
    with pytest.raises(TypeError, match="directory must be a path"):
        gv.Checkpoints(3)
    with pytest.raises(TypeError, match="gv.Evaluation's objective.*program 'guide'"):
        gv.Evaluation(guide, 1.0, every=10)
