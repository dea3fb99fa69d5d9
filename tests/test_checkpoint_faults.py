"""Checkpointed fits survive faults: a fit killed with SIGKILL at random moments (also
while a checkpoint is being written) and restarted each time ends bit for bit where an
uninterrupted fit ends; a newest checkpoint truncated or overwritten on disk is
skipped, with a warning, for the previous one, and the resumed run still ends bit
for bit where an uninterrupted one does."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import optax
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


# -- faults inside a write ------------------------------------------------------------

def _stages():
    """The checkpoint library's stages of one write, each a function that a fault can
    be injected into: the temporary folder made, the arrays written, the tree's
    metadata and the commit marker written, the folder renamed into place."""
    from orbax.checkpoint._src.path import async_path
    from orbax.checkpoint._src.serialization.type_handlers import NumpyHandler
    return [(async_path, "mkdir"), (NumpyHandler, "serialize"), (async_path, "write_text"),
            (async_path, "rename")]


class _Injector:
    """Counts the calls of every stage's function; once armed, raises `OSError` at
    call `fail_at` (counted from arming)."""

    def __init__(self, monkeypatch, fail_at=None):
        self.calls, self.armed, self.fail_at = [], False, fail_at
        for owner, name in _stages():
            monkeypatch.setattr(owner, name, self._wrap(name, getattr(owner, name)))

    def _wrap(self, name, original):
        async def stage(*args, **kwargs):
            if self.armed:
                self.calls.append(name)
                if len(self.calls) - 1 == self.fail_at:
                    raise OSError(28, f"No space left on device (injected at {name})")
            return await original(*args, **kwargs)
        return stage

    def arm(self, step, params, history):
        if step == 100:
            self.armed = True


def test_a_write_failing_at_any_stage_keeps_the_previous_checkpoint(tmp_path):
    # one clean write, counted: the stages a write goes through
    with pytest.MonkeyPatch.context() as patch:
        counting = _Injector(patch)
        run(steps=200, checkpoints=gv.Checkpoints(str(tmp_path / "count"), every=100),
            callbacks=[counting.arm])
    stages = counting.calls
    assert {"mkdir", "serialize", "write_text", "rename"} <= set(stages), stages
    full = run(steps=300)
    for k, stage in enumerate(stages):
        directory = tmp_path / f"fail_{k}"
        with pytest.MonkeyPatch.context() as patch, pytest.raises(gv.CheckpointError) as caught:
            injector = _Injector(patch, fail_at=k)
            run(steps=300, checkpoints=gv.Checkpoints(str(directory), every=100),
                callbacks=[injector.arm])
        message = str(caught.value)
        assert f"could not write the checkpoint of step 200 in {str(directory)!r}" in message
        assert f"injected at {stage}" in message and "step 100 is intact" in message
        result = caught.value.result                       # the fit so far, not lost
        assert result.steps == 200 and np.all(np.isfinite(np.asarray(result.params["m"])))
        left = sorted(p.name for p in directory.iterdir() if not p.name.startswith("."))
        assert left == ["step_000000100"], (stage, left)   # nothing half written left
        resumed = run(steps=300, checkpoints=gv.Checkpoints(str(directory), every=100))
        for name in ("m", "s"):
            assert np.array_equal(np.asarray(full.params[name]), np.asarray(resumed.params[name]))
        np.testing.assert_array_equal(full.history["objective"], resumed.history["objective"])


DISK_FULL = textwrap.dedent("""
    import resource, signal, sys
    import jax, jax.numpy as jnp, numpy as np, optax
    import genvi as gv
    from programs import model, guide

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails (EFBIG)
    D = 50_000

    def fill(step, params, history):   # the disk is full from step 100 on
        if step == 100:
            resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))

    @gv.gen
    def wide(p, y):
        gv.normal(p["m"], jnp.exp(p["s"]), grad=gv.REPARAM) @ "z"

    @gv.gen
    def wide_model(p, y):
        z = gv.normal(jnp.zeros(D), 1.0) @ "z"
        gv.observe(gv.normal(z, 1.0), y)

    try:
        gv.fit(gv.elbo(wide_model, wide), {"m": jnp.zeros(D), "s": jnp.zeros(D)},
               jnp.linspace(-1, 1, D), optimizer=optax.adam(0.01), steps=300,
               key=jax.random.key(0), progress=False, callbacks=[fill],
               checkpoints=gv.Checkpoints(sys.argv[1], every=100))
    except gv.CheckpointError as err:
        print("error:", err)
        print("result steps:", err.result.steps)
""")


def test_a_full_disk_is_a_clear_error_and_the_previous_checkpoint_restores(tmp_path):
    script = tmp_path / "full.py"
    script.write_text(DISK_FULL)
    directory = tmp_path / "ckpt"
    env = optimized_env(PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}", GENVI_CACHE="off")
    out = subprocess.run([sys.executable, str(script), str(directory)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"error: could not write the checkpoint of step 200 in {str(directory)!r}" in out.stdout
    assert "File too large" in out.stdout and "step 100 is intact" in out.stdout
    assert "result steps: 200" in out.stdout
    assert sorted(p.name for p in directory.iterdir() if not p.name.startswith(".")) == [
        "step_000000100"]
    params = {"m": np.zeros(50_000, np.float32), "s": np.zeros(50_000, np.float32)}
    state = optax.adam(0.01).init(params)
    step, params, _, history = gv.training.fit_state.resume(str(directory), params, state,
                                                            jax.random.key(0))
    assert step == 100 and history["objective"].shape == (100,)
    assert np.all(np.isfinite(np.asarray(params["m"])))


# a fit whose second checkpoint write (step 200) pauses at one stage, printing "writing
# <stage>", so that a SIGKILL lands inside the write at that stage
PAUSED_WRITE = textwrap.dedent("""
    import asyncio, sys
    import jax, numpy as np, optax
    import genvi as gv
    from orbax.checkpoint._src.path import async_path
    from orbax.checkpoint._src.serialization.type_handlers import NumpyHandler
    from test_fit import run

    directory, out, stage, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    owner = NumpyHandler if stage == "serialize" else async_path
    original = getattr(owner, stage, None)

    armed = []

    async def paused(*args, **kwargs):
        result = await original(*args, **kwargs)
        if armed:
            print("writing", stage, flush=True)
            await asyncio.sleep(60)
        return result
    if stage != "none":
        setattr(owner, stage, paused)
    result = run(steps=steps, checkpoints=gv.Checkpoints(directory, every=100),
                 callbacks=[lambda step, *_: armed.append(step) if step == 100 else None])
    np.savez(out, m=np.asarray(result.params["m"]), objective=result.history["objective"])
""")


@pytest.mark.parametrize("stage", ["mkdir", "serialize", "write_text"])
def test_a_sigkill_inside_a_write_leaves_a_directory_that_resumes(tmp_path, stage):
    script = tmp_path / "paused.py"
    script.write_text(PAUSED_WRITE)
    directory = tmp_path / "ckpt"
    # compiled as this process compiles (tests/conftest.py), to compare with its run
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}", GENVI_CACHE="off")

    def start(stage, out, steps):
        return subprocess.Popen([sys.executable, str(script), str(directory), str(out), stage,
                                 str(steps)], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    proc = start(stage, tmp_path / "killed.npz", 300)
    line = proc.stdout.readline()
    assert line.strip() == f"writing {stage}", proc.stderr.read()[-3000:]
    proc.send_signal(signal.SIGKILL)         # inside the write of step 200
    proc.wait(timeout=60)
    assert [p.name for p in directory.iterdir() if "orbax-checkpoint-tmp" in p.name]
    assert gv.training.checkpoints.latest_step(str(directory)) == 100
    finish = start("none", tmp_path / "resumed.npz", 300)
    stdout, stderr = finish.communicate(timeout=300)
    assert finish.returncode == 0, stderr[-3000:]
    assert "removed what a killed or failed checkpoint write left" in stderr
    assert not [p.name for p in directory.iterdir() if "tmp" in p.name]
    whole = run(steps=300)
    resumed = np.load(tmp_path / "resumed.npz")
    np.testing.assert_array_equal(np.asarray(whole.params["m"]), resumed["m"])
    np.testing.assert_array_equal(whole.history["objective"], resumed["objective"])
