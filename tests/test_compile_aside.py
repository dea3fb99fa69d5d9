"""`genvi.auto.compile_aside`: a program compiled by the helper process computes
what the same program compiled here does (pytrees, Python integers, PRNG keys, a
`lax.switch` in a loop, as a measuring program has), the helper runs at the lowest
priority, and where the helper cannot compile (a program that does not export, a
helper that fails) the program compiles here, saying why; a helper stopped by a signal
is an error, not a second compile; a fit that fails kills the helper compiling for it."""

import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv
from genvi.auto import compile_aside
from genvi.auto.compile_aside import AsideFailed, Helpers, HelperStopped, compile_program


def switch_in_a_loop(index, keys, count, args):
    params, data = args

    def one(i, total):
        draw = jax.random.normal(keys[i], data.shape)
        return total + jax.lax.switch(index, [lambda d: jnp.sum(d * params["w"]),
                                              lambda d: jnp.sum(jnp.sin(d) + params["b"])],
                                      draw + data)
    return jax.lax.fori_loop(0, count, one, 0.0)


ARGS = ({"w": jnp.arange(3.0), "b": jnp.float32(0.5)}, jnp.ones(3))
KEYS = jax.random.split(jax.random.key(0), 4)


def test_the_helper_compiles_what_compiles_here():
    program = jax.jit(switch_in_a_loop)
    aside = compile_aside.compile_aside(program, 0, KEYS, 2, ARGS)
    here = program.lower(0, KEYS, 2, ARGS).compile()
    for index, count in [(0, 2), (1, 4), (1, 1)]:
        np.testing.assert_array_equal(aside(index, KEYS, count, ARGS),
                                      here(index, KEYS, count, ARGS))


@pytest.mark.skipif(not hasattr(os, "nice"), reason="a process's priority: POSIX")
def test_the_helper_runs_at_the_lowest_priority(tmp_path):
    # the helper's own code, with its compiling replaced by a report of its priority
    probe = tmp_path / "probe.py"
    report = "    print(os.nice(0), getattr(os, 'sched_getscheduler', lambda p: -1)(0))\n"
    probe.write_text(compile_aside.HELPER.read_text().replace(
        "    exported = ", report + "    return\n    exported = ", 1))
    done = subprocess.run([sys.executable, "-P", str(probe)], input=b"", capture_output=True,
                          check=True)
    niceness, policy = map(int, done.stdout.split())
    assert niceness == 19
    if sys.platform.startswith("linux"):   # and only on a core the training leaves idle
        assert policy == os.SCHED_IDLE


@pytest.mark.skipif(not hasattr(os, "nice"), reason="a process's priority: POSIX")
def test_importing_the_helper_keeps_the_importers_priority():
    # a doctest run imports every module: only the helper run as a script lowers its own
    done = subprocess.run([sys.executable, "-c", "import os, genvi.auto.compile_helper; "
                           "print(os.nice(0))"], capture_output=True, check=True)
    assert int(done.stdout.split()[-1]) == os.nice(0)


def test_a_program_that_does_not_export_compiles_here():
    def with_a_callback(x):
        jax.debug.callback(lambda v: None, x)
        return 2.0 * x
    compiled = compile_program(jax.jit(with_a_callback), jnp.ones(2), aside=Helpers())
    np.testing.assert_array_equal(compiled(jnp.ones(2)), 2.0 * jnp.ones(2))
    assert compile_aside.last_fallback is not None
    compile_program(jax.jit(jnp.sin), jnp.ones(2), aside=Helpers())
    assert compile_aside.last_fallback is None


def test_a_failing_helper_compiles_here(monkeypatch, tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("raise SystemExit('no compiler here')\n")
    monkeypatch.setattr(compile_aside, "HELPER", broken)
    with pytest.raises(AsideFailed, match="no compiler here"):
        compile_aside.compile_aside(jax.jit(jnp.sin), jnp.ones(2))
    compiled = compile_program(jax.jit(jnp.sin), jnp.ones(2), aside=Helpers())
    np.testing.assert_allclose(compiled(jnp.ones(2)), jnp.sin(jnp.ones(2)))
    assert "no compiler here" in compile_aside.last_fallback


@pytest.mark.skipif(not hasattr(os, "kill"), reason="signals: POSIX")
def test_a_helper_stopped_by_a_signal_is_an_error(monkeypatch, tmp_path):
    stopped = tmp_path / "stopped.py"
    stopped.write_text("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n")
    monkeypatch.setattr(compile_aside, "HELPER", stopped)
    with pytest.raises(AsideFailed, match="signal 9"):
        compile_program(jax.jit(jnp.sin), jnp.ones(2), aside=Helpers())


def test_a_background_fit_compiles_its_measurement_aside(monkeypatch):
    calls = []
    aside = compile_aside.compile_aside
    monkeypatch.setattr(compile_aside, "compile_aside",
                        lambda *a, **k: calls.append(a[0]) or aside(*a, **k))

    @gv.expectation
    def e(p):
        b = gv.sample(gv.flip(jax.nn.sigmoid(p), grad=gv.AUTO), name="b")
        return jnp.where(b, 1.0, 3.0) - p ** 2
    result = gv.fit(e, 0.0, optimizer=optax.adam(0.1), steps=100, chunk_size=50,
                    key=jax.random.key(0), progress=False)
    assert len(calls) == 1 and compile_aside.last_fallback is None
    assert result.tunings[0].choice("b") in (gv.ENUM, gv.MVD, gv.DisARM, gv.SD, gv.RLOO(2))


def sleeping_helper(tmp_path):
    """A helper that says it started (its process id in a file), then sleeps, and
    would leave a second file had it not been stopped."""
    script = tmp_path / "sleeper.py"
    script.write_text(
        "import os, pathlib, sys, time\n"
        f"here = pathlib.Path({str(tmp_path)!r})\n"
        # Written aside and renamed, so the test never reads a half-written file.
        "(here / 'pid.part').write_text(str(os.getpid()))\n"
        "os.replace(here / 'pid.part', here / 'pid')\n"
        "time.sleep(300)\n"
        "(here / 'slept').write_text('')\n"
        "sys.exit(1)\n")
    return script


def waited_for(path, seconds):
    """Whether `path` exists, waiting for it up to `seconds`."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def gone(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.skipif(not hasattr(os, "kill"), reason="signals: POSIX")
def test_stopping_the_helpers_kills_the_running_one_and_refuses_new_ones(monkeypatch,
                                                                         tmp_path):
    monkeypatch.setattr(compile_aside, "HELPER", sleeping_helper(tmp_path))
    helpers = Helpers()
    with ThreadPoolExecutor(1) as pool:
        compiling = pool.submit(compile_aside.compile_aside, jax.jit(jnp.sin), jnp.ones(2),
                                helpers=helpers)
        assert waited_for(tmp_path / "pid", seconds=120.0)
        helpers.stop()
        with pytest.raises(HelperStopped, match="signal 9"):
            compiling.result()
    assert gone(int((tmp_path / "pid").read_text()))
    with pytest.raises(HelperStopped, match="stopped"):
        compile_program(jax.jit(jnp.sin), jnp.ones(2), aside=helpers)


@pytest.mark.skipif(not hasattr(os, "kill"), reason="signals: POSIX")
def test_a_fit_that_fails_kills_the_helper_compiling_its_measurement(monkeypatch, tmp_path):
    monkeypatch.setattr(compile_aside, "HELPER", sleeping_helper(tmp_path))

    def fails_once_the_helper_runs(step, params, history):
        # the worker starts at a chunk boundary, so each callback waits only a while
        if waited_for(tmp_path / "pid", seconds=1.0):
            raise RuntimeError("the user's callback failed")

    @gv.expectation
    def e(p):
        b = gv.sample(gv.flip(jax.nn.sigmoid(p), grad=gv.AUTO), name="b")
        return jnp.where(b, 1.0, 3.0) - p ** 2
    with pytest.raises(RuntimeError, match="the user's callback failed"):
        gv.fit(e, 0.0, optimizer=optax.adam(0.1), steps=10_000, chunk_size=50,
               key=jax.random.key(0), progress=False, callbacks=[fails_once_the_helper_runs])
    # the fit did not wait out the helper's sleep: killed, it left no second file
    assert gone(int((tmp_path / "pid").read_text()))
    assert not (tmp_path / "slept").exists()
    assert not [t for t in threading.enumerate() if t.name.startswith("genvi-tune")]
