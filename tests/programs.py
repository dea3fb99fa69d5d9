"""Small programs several test modules share.

The conjugate Gaussian pair: `z ~ normal(0, 1)`, `y ~ normal(z, 1)`, with a guide
`normal(p["m"], exp(p["s"]))`. Its optimum is known: m = y / 2, s = log(sqrt(1/2)).
And `crash_after(step)`, a gv.fit callback that interrupts a run (raising `Crash`), for
the checkpoint tests; `run_on_four_devices(script)`, for the sharding tests.
"""

import os
import subprocess
import sys

import jax.numpy as jnp

import genvi as gv


@gv.gen
def model(p, y):
    z = gv.normal(0.0, 1.0) @ "z"
    gv.observe(gv.normal(z, 1.0), y)


@gv.gen
def guide(p, y):
    gv.normal(p["m"], jnp.exp(p["s"]), grad=gv.REPARAM) @ "z"


class Crash(Exception):
    """An interrupted run."""


def crash_after(step_limit):
    """A gv.fit callback raising `Crash` at the first chunk end at or after `step_limit`."""
    def callback(step, params, history):
        if step >= step_limit:
            raise Crash
    return callback


def run_on_four_devices(script: str) -> str:
    """Run a Python `script` in a fresh process that sees four CPU devices (XLA's host
    platform split in four); assert it exits cleanly and prints "OK"; its stdout."""
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
               JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "OK" in out.stdout
    return out.stdout
