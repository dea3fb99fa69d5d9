"""`gv.fit(shard=True)` under `jax.distributed`: two processes on localhost (JAX's gloo
CPU collectives), each passing its own rows, against one process with two devices on
all the rows (SPEC §8)."""

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

WORKER = Path(__file__).with_name("distributed_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def launch(nproc: int, specs: list, tmp: Path, devices: int = 1) -> list:
    """Run the worker as `nproc` processes; each process's results."""
    env = dict(os.environ, JAX_PLATFORMS="cpu",
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    port = _free_port()
    outs = [tmp / f"out_{nproc}_{i}_{port}.json" for i in range(nproc)]
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(i), str(nproc), str(port),
                               json.dumps(specs), str(outs[i])], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(nproc)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    return [json.loads(o.read_text()) for o in outs]


def close(a: dict, b: dict, rtol: float) -> bool:
    return all(np.allclose(a[k], b[k], rtol=rtol, atol=rtol) for k in ("loc", "log_scale"))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("distributed")
    ckpt = str(tmp / "ckpt")
    two = launch(2, [{"steps": 200, "checkpoint_dir": ckpt, "checkpoint_every": 100}], tmp)
    two_more = launch(2, [{"steps": 300, "checkpoint_dir": ckpt, "resume": True},
                          {"steps": 200, "batch_size": 16},
                          {"steps": 200, "objective": "batch_mean"}], tmp)
    one = launch(1, [{"steps": 200}, {"steps": 300}, {"steps": 200, "objective": "batch_mean"}],
                 tmp, devices=2)
    return two, two_more, one


def test_two_processes_match_one_process_with_two_devices(runs):
    two, _, one = runs
    assert two[0][0] == two[1][0]                      # every process: the same parameters
    assert close(two[0][0], one[0][0], rtol=1e-4)      # the concatenated data, two devices
    assert two[0][0]["steps_done"] == 200


def test_checkpoints_are_written_and_resumed_collectively(runs):
    _, two_more, one = runs
    resumed = two_more[0][0]
    assert two_more[1][0] == resumed
    assert close(resumed, one[0][1], rtol=1e-4)        # 200 steps, then 100 more after resuming


def test_a_global_batch_in_equal_shares_agrees_across_processes(runs):
    _, two_more, _ = runs
    a, b = two_more[0][1], two_more[1][1]
    assert a == b
    assert np.allclose(a["loc"], [1.0, -0.5], atol=0.15)   # it fits the regression


def test_batch_mean_over_processes_matches_one_process(runs):
    _, two_more, one = runs
    assert two_more[0][2] == two_more[1][2]
    assert close(two_more[0][2], one[0][2], rtol=1e-4)
    assert np.allclose(two_more[0][2]["loc"], [1.0, -0.5], atol=0.15)


def test_sigterm_to_one_process_stops_all_at_one_step_with_one_checkpoint(tmp_path):
    """Preemption of a multi-process fit: SIGTERM reaches one process; the processes
    agree at their next look (genvi/training/pacing.py), all stop at the same step,
    write that step's checkpoint together and return."""
    from genvi.training.checkpoints import latest_step
    ckpt = str(tmp_path / "ckpt")
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=1")
    port = _free_port()
    spec = json.dumps([{"steps": 10**8, "checkpoint_dir": ckpt, "checkpoint_every": 500,
                        "announce": True}])
    outs = [tmp_path / f"out_{i}.json" for i in range(2)]
    procs = [subprocess.Popen([sys.executable, str(WORKER), str(i), "2", str(port), spec,
                               str(outs[i])], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    try:
        while (line := procs[1].stdout.readline()) and line.strip() != "training":
            pass
        assert line, "process 1 ended before it trained"
        procs[1].send_signal(signal.SIGTERM)
        logs = [p.communicate(timeout=60)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-3000:]
    first, second = (json.loads(o.read_text())[0] for o in outs)
    steps = second["steps_done"]
    assert 0 < steps < 10**8 and first["steps_done"] == steps
    assert first["loc"] == second["loc"] and first["log_scale"] == second["log_scale"]
    assert second["stopped"].startswith(f"terminated (SIGTERM) after step {steps};")
    assert first["stopped"].startswith(
        f"terminated (SIGTERM) on another process of the fit, after step {steps};")
    assert latest_step(ckpt) == steps
