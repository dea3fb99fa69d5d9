"""Signals at any moment are clean stops (SPEC §11, "Faults"): a checkpointing fit in a
subprocess sent SIGINT or SIGTERM at random moments (setting up, compiling, stepping,
and above all writing a checkpoint: it writes one every 100 steps, most of its time)
exits within 30 s with its result, `stopped` naming the signal, its newest checkpoint
the step it reached; the runs resume one another and end bit for bit where one
uninterrupted run ends. A second Ctrl-C drops the steps under way; a second fit on a
directory that a live fit writes is refused, naming it; the previous signal handlers
are back after a fit, and a fit off the main thread installs none."""

import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import genvi as gv
from genvi.training.checkpoints import latest_step
from programs import guide, model

ROOT = pathlib.Path(__file__).resolve().parents[1]

# a tiny fit that would run for hours, a checkpoint every 100 steps (a write takes
# longer than the 100 steps, so most signals land inside one); with `slow`, a step of
# about a second (a chain of matrix products), one step a chunk
FIT = textwrap.dedent("""
    import sys, time
    import jax, jax.numpy as jnp, numpy as np, optax
    import genvi as gv

    directory, out, steps, slow = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "slow"

    @gv.gen
    def model(p, y):
        z = gv.normal(jnp.zeros(3), 1.0) @ "z"
        if slow:   # about a second of work in every step
            m = jax.lax.fori_loop(0, 3000, lambda i, m: jnp.tanh(m @ m), jnp.eye(256) + z[0])
            z = z + 1e-9 * m[0, :3]
        gv.observe(gv.normal(z, 1.0), y)

    @gv.gen
    def guide(p, y):
        gv.normal(p["m"], jnp.exp(p["s"]), grad=gv.REPARAM) @ "z"

    def announce(step, params, history):
        print("step", step, time.perf_counter(), flush=True)

    kw = {} if directory == "-" else dict(checkpoints=gv.Checkpoints(directory, every=100))
    # the arguments first (the first array starts JAX's backend, which can take a
    # while on a busy machine): "fitting" means gv.fit is being entered
    objective, params = gv.elbo(model, guide), {"m": jnp.zeros(3), "s": jnp.zeros(3)}
    data, key = jnp.array([0.5, -1.0, 2.0]), jax.random.key(0)
    print("fitting", flush=True)
    result = gv.fit(objective, params, data, optimizer=optax.adam(0.01), steps=steps,
                    key=key, chunk_size=1 if slow else 50, progress=False,
                    callbacks=[announce] if slow else [], **kw)
    print("stopped:", result.stopped, time.perf_counter(), flush=True)
    np.savez(out, m=np.asarray(result.params["m"]), s=np.asarray(result.params["s"]),
             objective=result.history["objective"], steps=result.steps)
""")
CASES = 20


@pytest.fixture(scope="module")
def script(tmp_path_factory):
    folder = tmp_path_factory.mktemp("signals")
    (folder / "fit.py").write_text(FIT)
    return folder


def _start(script: pathlib.Path, directory: str, out: pathlib.Path, steps: int,
           slow: bool = False) -> subprocess.Popen:
    # the folder's own compilation cache: each run after the first loads its programs
    env = dict(os.environ, PYTHONPATH=f"{ROOT}:{ROOT / 'tests'}", JAX_PLATFORMS="cpu",
               GENVI_CACHE=str(script / "cache"))
    return subprocess.Popen([sys.executable, str(script / "fit.py"), directory, str(out),
                             str(steps), "slow" if slow else "fast"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_signals_at_random_moments_stop_cleanly_and_resume_to_one_run(script, tmp_path):
    directory = str(tmp_path / "ckpt")
    rng = np.random.default_rng(0)
    reached = []
    for case in range(CASES):
        number = (signal.SIGINT, signal.SIGTERM)[case % 2]
        proc = _start(script, directory, tmp_path / "out.npz", 10**9)
        assert proc.stdout.readline().strip() == "fitting", proc.stderr.read()[-3000:]
        time.sleep(rng.uniform(0.2, 2.5))   # setting up, compiling, stepping or writing
        assert proc.poll() is None, proc.stderr.read()[-3000:]
        proc.send_signal(number)
        sent = time.perf_counter()
        stdout, stderr = proc.communicate(timeout=30)
        assert time.perf_counter() - sent < 30
        assert proc.returncode == 0, stderr[-3000:]
        last = stdout.strip().splitlines()[-1]
        named = "interrupted (Ctrl-C)" if number == signal.SIGINT else "terminated (SIGTERM)"
        assert last.startswith(f"stopped: {named} after step "), last
        steps = int(np.load(tmp_path / "out.npz")["steps"])
        assert f"after step {steps};" in last
        assert latest_step(directory) == (steps or None)   # the newest checkpoint: its step
        assert not [n for n in os.listdir(directory) if "tmp" in n or "removing" in n]
        reached.append(steps)
    assert reached == sorted(reached) and reached[-1] > 0   # each resumed the one before
    total = reached[-1] + 250
    finish = _start(script, directory, tmp_path / "resumed.npz", total)
    whole = _start(script, "-", tmp_path / "whole.npz", total)
    for proc in (finish, whole):
        assert proc.wait(timeout=120) == 0, proc.stderr.read()[-3000:]
    resumed, one_run = np.load(tmp_path / "resumed.npz"), np.load(tmp_path / "whole.npz")
    for name in ("m", "s", "objective"):
        np.testing.assert_array_equal(resumed[name], one_run[name])


def test_a_second_ctrl_c_drops_the_steps_under_way(script, tmp_path):
    directory = str(tmp_path / "ckpt")
    proc = _start(script, directory, tmp_path / "out.npz", 1000, slow=True)
    lines = []
    while len(lines) < 2:   # two steps done: the step's length is known
        line = proc.stdout.readline()
        assert line, proc.stderr.read()[-3000:]
        if line.startswith("step"):
            lines.append(float(line.split()[2]))
    step_seconds = lines[1] - lines[0]
    proc.send_signal(signal.SIGINT)
    time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    second = time.perf_counter()
    while not (line := proc.stdout.readline()).startswith("stopped:"):
        assert line, proc.stderr.read()[-3000:]
    returned = time.perf_counter() - second
    assert proc.wait(timeout=60) == 0
    steps = int(np.load(tmp_path / "out.npz")["steps"])
    assert line.startswith(f"stopped: interrupted (Ctrl-C) after step {steps};")
    assert latest_step(directory) == steps
    # it returned without waiting for the step under way (the write of a checkpoint
    # of a tiny fit takes a fraction of it)
    print(f"second Ctrl-C: returned {returned:.2f} s after it; a step takes {step_seconds:.2f} s")
    assert returned < 0.6 * step_seconds, (returned, step_seconds)


def test_a_second_fit_on_a_directory_a_live_fit_writes_is_refused(script, tmp_path):
    directory = str(tmp_path / "ckpt")
    proc = _start(script, directory, tmp_path / "out.npz", 10**9)
    try:
        assert proc.stdout.readline().strip() == "fitting"
        deadline = time.time() + 60
        while latest_step(directory) is None:   # it writes
            assert time.time() < deadline and proc.poll() is None, proc.stderr.read()[-3000:]
            time.sleep(0.05)
        with pytest.raises(gv.CheckpointError,
                           match=rf"another live fit is writing the checkpoints in "
                                 rf".*ckpt.*\(process {proc.pid} on "):
            gv.fit(gv.elbo(model, guide), {"m": 0.0, "s": 0.0}, 1.0, optimizer=optax.adam(0.1),
                   steps=10, key=jax.random.key(0), progress=False,
                   checkpoints=gv.Checkpoints(directory, every=5))
    finally:
        proc.kill()   # SIGKILL: the kernel releases its lock
        proc.wait(timeout=30)
    assert latest_step(directory) is not None
    gv.fit(gv.elbo(model, guide), {"m": 0.0, "s": 0.0}, 1.0, optimizer=optax.adam(0.1),
           steps=10, key=jax.random.key(1), progress=False,
           checkpoints=gv.Checkpoints(str(tmp_path / "other"), every=5))


def _fit(**kw):
    return gv.fit(gv.elbo(model, guide), {"m": 0.0, "s": 0.0}, 1.0, optimizer=optax.adam(0.1),
                  steps=kw.pop("steps", 20), key=jax.random.key(0), progress=False, **kw)


def test_the_previous_handlers_are_back_after_a_fit_that_returns_or_raises():
    mine = lambda number, frame: None  # noqa: E731
    before = signal.signal(signal.SIGTERM, mine)
    try:
        seen = []
        _fit(callbacks=[lambda *a: seen.append(signal.getsignal(signal.SIGTERM))])
        assert seen and seen[0] is not mine           # the fit's own, while it runs
        assert signal.getsignal(signal.SIGTERM) is mine

        def fail(*a):
            raise RuntimeError("a callback's error")
        with pytest.raises(RuntimeError, match="a callback's error"):
            _fit(callbacks=[fail])
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, before)


def test_an_ignored_signal_stays_ignored():
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        seen = []
        _fit(callbacks=[lambda *a: seen.append(signal.getsignal(signal.SIGINT))])
        assert seen == [signal.SIG_IGN]
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_fit_off_the_main_thread_installs_no_handler():
    before = signal.getsignal(signal.SIGINT)
    seen, results = [], []
    worker = threading.Thread(target=lambda: results.append(
        _fit(callbacks=[lambda *a: seen.append(signal.getsignal(signal.SIGINT))])))
    worker.start()
    worker.join(timeout=120)
    assert results and results[0].stopped == "ran all 20 steps"
    assert seen == [before]


def test_a_signal_in_process_returns_the_fit_so_far():
    """`os.kill` of this very process from a callback: the fit stops after that chunk's
    step and returns; the test's own handler is back afterwards."""
    def preempt(step, params, history):
        if step == 10:
            os.kill(os.getpid(), signal.SIGTERM)
    result = _fit(steps=40, chunk_size=5, callbacks=[preempt])
    assert result.stopped.startswith("terminated (SIGTERM) after step ")
    assert 10 <= result.steps < 40 and result.history["objective"].shape == (result.steps,)
    assert np.all(np.isfinite(np.asarray(result.params["m"])))
    assert jnp.isfinite(result.params["s"])


def test_a_signal_as_the_fit_ends_is_reported_not_lost():
    """A signal after the fit's last look (here, from the callback at its last step)
    is too late to stop it: the fit ends and `stopped` says the signal came."""
    def last(step, params, history):
        if step == 20:
            os.kill(os.getpid(), signal.SIGINT)
    result = _fit(steps=20, chunk_size=5, callbacks=[last])
    assert result.stopped == "ran all 20 steps (a SIGINT came as it ended)"


def test_a_signal_to_a_fit_inside_another_fits_callback_stops_both():
    def inner(step, params, history):
        if step == 10:
            def preempt(step, params, history):
                if step == 5:
                    os.kill(os.getpid(), signal.SIGTERM)
            assert _fit(steps=20, chunk_size=5, callbacks=[preempt]).stopped.startswith(
                "terminated (SIGTERM) after step ")
    outer = _fit(steps=40, chunk_size=5, callbacks=[inner])
    assert outer.stopped.startswith("terminated (SIGTERM) after step 10;"), outer.stopped
