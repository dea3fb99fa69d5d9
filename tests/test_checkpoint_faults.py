"""Checkpointed fits survive faults: a fit killed with SIGKILL at random moments (also
while a checkpoint is being written) and restarted each time ends bit for bit where an
uninterrupted fit ends; a newest checkpoint truncated or overwritten on disk is
skipped, with a warning, for the previous one, and the resumed run still ends bit
for bit where an uninterrupted one does."""

import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

import genvi as gv
from programs import Crash, crash_after, optimized_env
from test_fit import run

ROOT = pathlib.Path(__file__).resolve().parents[1]

# a fit of about 10 s (a 40,000-dimensional latent: about 0.5 ms a step) with a
# checkpoint every 1,000 steps: each kill lands at a random moment of it (compiling,
# stepping, or writing a checkpoint) long before it could end
FIT = textwrap.dedent("""
    import sys
    import jax, jax.numpy as jnp, numpy as np, optax
    import genvi as gv

    D = 40_000

    @gv.gen
    def model(p, y):
        z = gv.normal(jnp.zeros(D), 1.0) @ "z"
        gv.observe(gv.normal(z, 1.0), y)

    @gv.gen
    def guide(p, y):
        gv.normal(p["m"], jnp.exp(p["s"]), grad=gv.REPARAM) @ "z"

    directory, out = sys.argv[1], sys.argv[2]
    steps = 20_000
    print("fitting", flush=True)
    kw = {} if directory == "-" else dict(checkpoints=gv.Checkpoints(directory, every=1_000))
    result = gv.fit(gv.elbo(model, guide), {"m": jnp.zeros(D), "s": jnp.zeros(D)},
                    jnp.linspace(-1.0, 1.0, D),
                    optimizer=optax.adam(optax.cosine_decay_schedule(0.01, steps)),
                    steps=steps, key=jax.random.key(0), chunk_size=250, progress=False, **kw)
    np.savez(out, m=np.asarray(result.params["m"]), s=np.asarray(result.params["s"]),
             objective=result.history["objective"])
""")
KILLS = 10


def _start(script: pathlib.Path, directory: str, out: pathlib.Path) -> subprocess.Popen:
    env = optimized_env(PYTHONPATH=str(ROOT), GENVI_CACHE="off")
    return subprocess.Popen([sys.executable, str(script), directory, str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_fit_killed_at_random_moments_ends_where_an_uninterrupted_one_does(tmp_path):
    script = tmp_path / "fit.py"
    script.write_text(FIT)
    whole = _start(script, "-", tmp_path / "whole.npz")
    assert whole.wait(timeout=300) == 0, whole.stderr.read()[-3000:]
    directory = str(tmp_path / "ckpt")
    rng = np.random.default_rng(0)
    kills = 0
    while kills < KILLS:          # kill each restart at a random moment
        proc = _start(script, directory, tmp_path / "killed.npz")
        assert proc.stdout.readline().strip() == "fitting"
        time.sleep(rng.uniform(0.3, 1.2))
        assert proc.poll() is None, "the fit ended before it was killed: make it longer"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
        kills += 1
    finish = _start(script, directory, tmp_path / "killed.npz")
    assert finish.wait(timeout=300) == 0, finish.stderr.read()[-3000:]
    assert gv.training.checkpoints.latest_step(directory) == 20_000
    a, b = np.load(tmp_path / "whole.npz"), np.load(tmp_path / "killed.npz")
    for name in ("m", "s", "objective"):
        np.testing.assert_array_equal(a[name], b[name])


def _newest_files(directory: pathlib.Path) -> list[pathlib.Path]:
    newest = max(p for p in directory.iterdir() if p.name.startswith("step_"))
    return [f for f in newest.rglob("*") if f.is_file() and f.stat().st_size > 0]


@pytest.mark.parametrize("damage", ["truncated", "overwritten"])
def test_a_damaged_newest_checkpoint_is_skipped_for_the_previous_one(tmp_path, damage):
    directory = tmp_path / "ckpt"
    with pytest.raises(Crash):
        run(steps=600, checkpoints=gv.Checkpoints(str(directory), every=100),
            callbacks=[crash_after(400)])
    assert gv.training.checkpoints.latest_step(str(directory)) == 400
    for f in _newest_files(directory):
        data = f.read_bytes()
        f.write_bytes(data[:len(data) // 2] if damage == "truncated" else b"\\0" * len(data))
    with pytest.warns(gv.CheckpointWarning, match=r"step_000000400.*resuming from .*step_000000300"):
        resumed = run(steps=600, checkpoints=gv.Checkpoints(str(directory), every=100))
    full = run(steps=600)
    for name in ("m", "s"):
        assert np.array_equal(np.asarray(full.params[name]), np.asarray(resumed.params[name]))
    np.testing.assert_array_equal(full.history["objective"], resumed.history["objective"])


def test_when_no_checkpoint_can_be_read_the_error_names_each(tmp_path):
    directory = tmp_path / "ckpt"
    run(steps=200, checkpoints=gv.Checkpoints(str(directory), every=100))
    for f in directory.rglob("*"):
        if f.is_file():
            f.write_bytes(b"")
    with pytest.raises(gv.CheckpointError, match="step_000000200.*step_000000100"):
        run(steps=300, checkpoints=gv.Checkpoints(str(directory), every=100))
    assert jax.devices()  # the process is still usable
