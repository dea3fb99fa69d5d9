"""Ctrl-C during `gv.fit` returns the fit so far: a fit in a subprocess sent SIGINT
while it trains returns its `FitResult` (its `stopped` says it was interrupted, its
history and parameters are those of the steps it ran); a checkpointing fit writes a
checkpoint at that step, and running it again resumes there and ends bit for bit
where one uninterrupted run of the same length ends. Arguments that count something
(`steps`, `particles`, ...) are refused by name when they are not counts."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv

ROOT = pathlib.Path(__file__).resolve().parents[1]

# a fit that would run for minutes; a callback sleeps between chunks so that SIGINT
# lands while it trains, and says when the first chunk is done
FIT = textwrap.dedent("""
    import sys, time
    import jax, jax.numpy as jnp, numpy as np, optax
    import genvi as gv

    @gv.gen
    def model(p, y):
        z = gv.normal(jnp.zeros(3), 1.0) @ "z"
        gv.observe(gv.normal(z, 1.0), y)

    @gv.gen
    def guide(p, y):
        gv.normal(p["m"], jnp.exp(p["s"]), grad=gv.REPARAM) @ "z"

    directory, out, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    slow = steps > 100_000

    def pace(step, params, history):
        if step >= 200:
            print("training", flush=True)
        if slow:
            time.sleep(0.02)

    kw = {} if directory == "-" else dict(checkpoints=gv.Checkpoints(directory, every=10**9))
    result = gv.fit(gv.elbo(model, guide), {"m": jnp.zeros(3), "s": jnp.zeros(3)},
                    jnp.array([0.5, -1.0, 2.0]), optimizer=optax.adam(0.01), steps=steps,
                    key=jax.random.key(0), chunk_size=100, progress=False,
                    callbacks=[pace], **kw)
    print("stopped:", result.stopped, flush=True)
    np.savez(out, m=np.asarray(result.params["m"]), s=np.asarray(result.params["s"]),
             objective=result.history["objective"], steps=result.steps)
""")


def _start(script: pathlib.Path, directory: str, out: pathlib.Path, steps: int):
    env = dict(os.environ, PYTHONPATH=str(ROOT), GENVI_CACHE="off", JAX_PLATFORMS="cpu")
    return subprocess.Popen([sys.executable, str(script), directory, str(out), str(steps)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _interrupted(script, directory, out) -> tuple[str, dict]:
    """Start a long fit, SIGINT it once it trains; its last line and saved result."""
    proc = _start(script, directory, out, 10**6)
    while (line := proc.stdout.readline()) and line.strip() != "training":
        pass
    assert line, proc.stderr.read()[-3000:]
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr[-3000:]
    return stdout.strip().splitlines()[-1], dict(np.load(out))


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    path = tmp_path_factory.mktemp("fit") / "fit.py"
    path.write_text(FIT)
    return path


def test_ctrl_c_returns_the_fit_so_far(script, tmp_path):
    last, result = _interrupted(script, "-", tmp_path / "out.npz")
    assert last.startswith("stopped: interrupted (Ctrl-C) after step ")
    ran = int(result["steps"])
    assert 200 <= ran < 10**6 and ran % 100 == 0      # whole chunks, as many as it ran
    assert f"after step {ran};" in last
    assert result["objective"].shape == (ran,) and np.all(np.isfinite(result["objective"]))


def test_a_checkpointed_fit_interrupted_resumes_to_where_one_run_ends(script, tmp_path):
    directory = str(tmp_path / "ckpt")
    _, first = _interrupted(script, directory, tmp_path / "first.npz")
    ran = int(first["steps"])
    # the same fit run again with the interrupted one's length, then one run of it
    total = ran + 300
    proc = _start(script, directory, tmp_path / "resumed.npz", total)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()[-3000:]
    proc = _start(script, "-", tmp_path / "whole.npz", total)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()[-3000:]
    resumed, whole = np.load(tmp_path / "resumed.npz"), np.load(tmp_path / "whole.npz")
    np.testing.assert_array_equal(resumed["objective"][:ran], first["objective"])
    for name in ("m", "s", "objective"):
        np.testing.assert_array_equal(resumed[name], whole[name])


# -- counts refused by name -----------------------------------------------------------

@gv.gen
def _model(p, y):
    z = gv.normal(0.0, 1.0) @ "z"
    gv.observe(gv.normal(z, 1.0), y)


@gv.gen
def _guide(p, y):
    gv.normal(p["m"], 1.0, grad=gv.REPARAM) @ "z"


@pytest.mark.parametrize("make,message", [
    (lambda: gv.iwelbo(_model, _guide, particles=0), r"gv.iwelbo: particles=0 must be a positive"),
    (lambda: gv.iwelbo(_model, _guide, particles=2.5), r"particles=2.5 must be a positive integer"),
    (lambda: gv.renyi(_model, _guide, 0.5, particles=-1), r"gv.renyi: particles=-1"),
    (lambda: gv.vimco(_model, _guide, particles=1), r"gv.vimco: particles=1 must be an integer >= 2"),
    (lambda: gv.dreg(_model, _guide, particles=0), r"gv.dreg: particles=0"),
    (lambda: gv.wake_guide(_model, _guide, particles=0), r"gv.wake_guide: particles=0"),
    (lambda: gv.importance(_guide, 0), r"gv.importance: particles=0"),
])
def test_an_objective_refuses_a_count_that_is_not_one(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("keyword,value,message", [
    ("steps", -5, r"gv.fit: steps=-5 must be a non-negative integer"),
    ("steps", 10.0, r"gv.fit: steps=10.0 must be a non-negative integer"),
    ("chunk_size", 0, r"gv.fit: chunk_size=0 must be a positive integer"),
    ("batch_size", 0, r"gv.fit: batch_size=0 must be a positive integer"),
])
def test_fit_refuses_a_count_that_is_not_one(keyword, value, message):
    kw = dict(steps=10, key=jax.random.key(0), progress=False, optimizer=optax.adam(0.1))
    kw[keyword] = value
    with pytest.raises(ValueError, match=message):
        gv.fit(gv.elbo(_model, _guide), {"m": 0.0}, jnp.ones(3), **kw)


def test_zero_steps_is_a_fit_that_runs_nothing():
    result = gv.fit(gv.elbo(_model, _guide), {"m": 0.5}, 1.0, steps=0, key=jax.random.key(0),
                    progress=False, optimizer=optax.adam(0.1))
    assert result.steps == 0 and float(result.params["m"]) == 0.5
