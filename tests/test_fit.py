"""gv.fit: reaches the known optimum, is deterministic, minibatches, evaluates,
skips non-finite updates, checkpoints atomically and resumes bit-for-bit, explains bad
checkpoints, and gives the same result sharded over 4 devices."""

import pathlib
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv
from programs import Crash, crash_after, guide, model, run_on_four_devices

ELBO = gv.elbo(model, guide)
START = {"m": jnp.array(0.0), "s": jnp.array(0.0)}
ADAM = optax.adam(optax.cosine_decay_schedule(0.05, 1500))


def run(**kw):
    kw.setdefault("steps", 1500)
    return gv.fit(ELBO, START, 1.0, optimizer=ADAM, key=jax.random.key(0), progress=False, **kw)


def test_reaches_the_conjugate_optimum_and_records_history():
    # 32 copies of the datapoint: each step averages 32 independent gradient estimates
    averaged = gv.batch_mean(ELBO, in_axes=(None, 0))
    res = gv.fit(averaged, START, jnp.full(32, 1.0), optimizer=ADAM, steps=1500,
                 key=jax.random.key(0), progress=False)
    assert abs(float(res.params["m"]) - 0.5) < 0.03
    assert abs(float(jnp.exp(res.params["s"])) - np.sqrt(0.5)) < 0.03
    assert res.history["objective"].shape == (1500,)
    log_evidence = -0.5 * np.log(2 * np.pi * 2) - 0.25
    assert abs(np.mean(res.history["objective"][-200:]) - log_evidence) < 0.05
    assert not res.history["skipped"].any()


def test_same_key_same_result_whatever_the_chunking():
    a, b = run(chunk_size=1000), run(chunk_size=7)
    for name in ("m", "s"):
        assert np.array_equal(np.asarray(a.params[name]), np.asarray(b.params[name]))
    np.testing.assert_array_equal(a.history["objective"], b.history["objective"])


def test_minibatches_eval_and_callbacks():
    data = jnp.linspace(-1.0, 3.0, 40)        # the mean of the data is 1.0
    seen = []
    obj = gv.batch_mean(ELBO, in_axes=(None, 0))
    res = gv.fit(obj, START, data, optimizer=ADAM, steps=1500, key=jax.random.key(1),
                 batch_size=8, evaluate=gv.Evaluation(obj, data, every=500),
                 callbacks=[lambda step, params, history: seen.append(step)], progress=False)
    # Each datapoint's ELBO is maximized by its own posterior; the average over the data
    # is maximized at m = mean(y) / 2.
    assert abs(float(res.params["m"]) - 0.5) < 0.05
    assert list(res.history["eval_step"]) == [500, 1000, 1500]
    assert np.all(np.isfinite(res.history["eval"]))
    assert seen[-1] == 1500 and 500 in seen


def test_skips_nonfinite_updates():
    @gv.gen
    def flaky_model(p, y):
        z = gv.normal(0.0, 1.0) @ "z"
        gv.observe(gv.normal(z, 1.5 - z), y)   # a negative scale, a NaN density, when z > 1.5

    obj = gv.elbo(flaky_model, guide)
    res = gv.fit(obj, START, 1.0, optimizer=optax.adam(0.01), steps=300, key=jax.random.key(2),
                 skip_nonfinite=True, progress=False)
    assert res.history["skipped"].sum() > 0
    assert all(np.isfinite(np.asarray(v)) for v in res.params.values())


def test_resume_from_checkpoint_is_bit_for_bit(tmp_path):
    full = run(steps=600)
    directory = str(tmp_path / "ckpt")
    with pytest.raises(Crash):
        run(steps=600, checkpoints=gv.Checkpoints(directory, every=200), callbacks=[crash_after(400)])
    assert gv.training.checkpoints.latest_step(directory) == 400
    resumed = run(steps=600, checkpoints=gv.Checkpoints(directory, every=200))
    for name in ("m", "s"):
        assert np.array_equal(np.asarray(full.params[name]), np.asarray(resumed.params[name]))
    np.testing.assert_array_equal(full.history["objective"], resumed.history["objective"])


def test_resume_with_once_shuffled_minibatches_is_bit_for_bit(tmp_path):
    # the one-time shuffle and the windows follow from the key alone
    data = jnp.linspace(-1.0, 3.0, 40)
    obj = gv.batch_mean(ELBO, in_axes=(None, 0))

    def fit(**kw):
        return gv.fit(obj, START, data, optimizer=ADAM, steps=300, key=jax.random.key(2),
                      batch_size=8, shuffle="once", progress=False, **kw)
    full = fit()
    directory = str(tmp_path / "ckpt")
    with pytest.raises(Crash):
        fit(checkpoints=gv.Checkpoints(directory, every=100), callbacks=[crash_after(200)])
    resumed = fit(checkpoints=gv.Checkpoints(directory, every=100))
    for name in ("m", "s"):
        assert np.array_equal(np.asarray(full.params[name]), np.asarray(resumed.params[name]))
    assert abs(float(full.params["m"]) - 0.5) < 0.1


def test_unknown_shuffle_is_refused():
    with pytest.raises(ValueError, match="shuffle='rows' is not one of"):
        gv.fit(gv.batch_mean(ELBO, in_axes=(None, 0)), START, jnp.ones(8), optimizer=ADAM,
               steps=1, key=jax.random.key(0), batch_size=4, shuffle="rows", progress=False)
    with pytest.raises(ValueError, match="pass batch_size=B"):
        gv.fit(gv.batch_mean(ELBO, in_axes=(None, 0)), START, jnp.ones(8), optimizer=ADAM,
               steps=1, key=jax.random.key(0), shuffle="once", progress=False)


def test_bad_checkpoints_give_clear_errors(tmp_path):
    directory = tmp_path / "ckpt"
    run(steps=100, checkpoints=gv.Checkpoints(str(directory), every=100))
    # a different parameter structure
    with pytest.raises(gv.CheckpointError, match="step_000000100"):
        gv.fit(ELBO, {"m": 0.0, "s": 0.0, "extra": jnp.zeros(3)}, 1.0, optimizer=ADAM,
               steps=200, key=jax.random.key(0),
               checkpoints=gv.Checkpoints(str(directory), every=100), progress=False)
    # a different key
    with pytest.raises(gv.CheckpointError, match="different key"):
        gv.fit(ELBO, START, 1.0, optimizer=ADAM, steps=200, key=jax.random.key(9),
               checkpoints=gv.Checkpoints(str(directory), every=100), progress=False)
    # corrupt files
    for f in pathlib.Path(directory).rglob("*"):
        if f.is_file():
            f.write_bytes(b"not a checkpoint")
    with pytest.raises(gv.CheckpointError, match="step_000000100"):
        run(steps=200, checkpoints=gv.Checkpoints(str(directory), every=100))


def test_four_devices_match_one(tmp_path):
    script = textwrap.dedent("""
        import jax, jax.numpy as jnp, numpy as np, optax
        import genvi as gv
        assert len(jax.devices()) == 4
        @gv.gen
        def model(p, y):
            z = gv.normal(0.0, 1.0) @ "z"
            gv.observe(gv.normal(z, 1.0), y)
        @gv.gen
        def guide(p, y):
            gv.normal(p["m"] * y, jnp.exp(p["s"]), grad=gv.REPARAM) @ "z"
        obj = gv.batch_mean(gv.elbo(model, guide), in_axes=(None, 0))
        data = jnp.linspace(-2.0, 2.0, 64)
        kw = dict(optimizer=optax.adam(0.02), steps=200, key=jax.random.key(0), batch_size=16,
                  progress=False)
        one = gv.fit(obj, {"m": 0.0, "s": 0.0}, data, **kw)
        four = gv.fit(obj, {"m": 0.0, "s": 0.0}, data, shard=True, **kw)
        for k in ("m", "s"):
            np.testing.assert_allclose(one.params[k], four.params[k], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(one.history["objective"], four.history["objective"], rtol=1e-4, atol=1e-5)
        print("OK", float(one.params["m"]))
    """)
    run_on_four_devices(script)


def test_missing_checkpoint_and_interrupted_write(tmp_path):
    directory = tmp_path / "ckpt"
    with pytest.raises(gv.CheckpointError, match="no checkpoint"):
        run(steps=100, checkpoints=gv.Checkpoints(str(directory), every=100, resume=True))
    run(steps=200, checkpoints=gv.Checkpoints(str(directory), every=100))
    # A crash in the middle of writing step 300 leaves only orbax's temporary folder:
    # it is not a checkpoint, and the run resumes from step 200.
    partial = directory / "step_000000300.orbax-checkpoint-tmp-1234"
    partial.mkdir()
    (partial / "garbage").write_bytes(b"half written")
    assert gv.training.checkpoints.latest_step(str(directory)) == 200
    # the fit that writes there next removes it, and says so
    with pytest.warns(gv.CheckpointWarning, match=r"removed what a killed or failed checkpoint "
                                                  r"write left .*step_000000300\.orbax"):
        resumed = run(steps=300, checkpoints=gv.Checkpoints(str(directory), every=100,
                                                            resume=True))
    assert not partial.exists()
    full = run(steps=300)
    assert np.array_equal(np.asarray(full.params["m"]), np.asarray(resumed.params["m"]))


def test_chunks_of_every_length_share_one_compiled_program(caplog):
    objective, adam = gv.elbo(model, guide), optax.adam(0.05)

    def fit(steps, **kw):
        return gv.fit(objective, START, 1.0, optimizer=adam, steps=steps, key=jax.random.key(3),
                      progress=False, **kw)

    with jax.log_compiles(True), caplog.at_level("WARNING"):
        fit(20, chunk_size=10)
        # chunks of 10, 10, 3 and, with evaluations every 4 steps, of 4, 4, 2, 4, 4, 2, 3
        odd = fit(23, chunk_size=10)
        fit(23, chunk_size=10, evaluate=gv.Evaluation(objective, 1.0, every=4))
    compiles = [r for r in caplog.records if r.getMessage().startswith("Compiling jit(run_chunk)")]
    assert len(compiles) == 1
    whole = fit(23, chunk_size=23)
    assert odd.history["objective"].shape == (23,)
    np.testing.assert_array_equal(odd.history["objective"], whole.history["objective"])
    np.testing.assert_array_equal(np.asarray(odd.params["m"]), np.asarray(whole.params["m"]))


@pytest.mark.parametrize("asked", [True, False])
def test_fit_turns_the_persistent_compilation_cache_on_only_when_asked(tmp_path, asked):
    """With GENVI_CACHE=FOLDER gv.fit keeps compiled steps there; without it, it leaves
    JAX's process-wide configuration as it was (a library call changes no global state
    the user did not ask for)."""
    import os
    import subprocess
    import sys
    script = ("import genvi as gv, jax, optax\n"
              "@gv.expectation\n"
              "def e(m):\n"
              "    return -(gv.sample(gv.normal(m, 1.0, grad=gv.REPARAM)) - 1.0) ** 2\n"
              "gv.fit(e, 0.0, optimizer=optax.adam(0.1), steps=5, key=jax.random.key(0),"
              " progress=False)\n"
              "print(jax.config.jax_compilation_cache_dir)\n")
    env = {k: v for k, v in os.environ.items()
           if k not in ("GENVI_CACHE", "JAX_COMPILATION_CACHE_DIR")}
    env.update(JAX_PLATFORMS="cpu", **({"GENVI_CACHE": str(tmp_path / "xla")} if asked else {}))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    last = out.stdout.strip().splitlines()[-1]
    assert last == (str(tmp_path / "xla") if asked else "None"), out.stdout
