"""Small programs several test modules share.

The conjugate Gaussian pair: `z ~ normal(0, 1)`, `y ~ normal(z, 1)`, with a guide
`normal(p["m"], exp(p["s"]))`. Its optimum is known: m = y / 2, s = log(sqrt(1/2)).
And `crash_after(step)`, a gv.fit callback that interrupts a run (raising `Crash`), for
the checkpoint tests; `run_on_four_devices(script)`, for the sharding tests; and
`flip_hmm`, a two-state HMM in `gv.scan` for the tests of replays in scans;
`optimized_env()`, the environment for a process that runs a long fit, compiled with
XLA's optimizations (the suite's own processes compile without them: conftest.py).
"""

import itertools
import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp

import genvi as gv


@gv.gen
def model(p, y):
    z = gv.normal(0.0, 1.0) @ "z"
    gv.observe(gv.normal(z, 1.0), y)


@gv.gen
def guide(p, y):
    gv.normal(p["m"], jnp.exp(p["s"]), grad=gv.REPARAM) @ "z"


# how the test processes compile (tests/conftest.py): quickly, the programs unoptimized
UNOPTIMIZED_FLAGS = ("--xla_backend_optimization_level=0",
                     "--xla_llvm_disable_expensive_passes=true")


def optimized_env(**extra: str) -> dict:
    """This process's environment for a subprocess that runs a long fit: XLA_FLAGS
    without the suite's `UNOPTIMIZED_FLAGS` (its thousands of steps would run
    unoptimized code), with `extra` set."""
    env = dict(os.environ, **extra)
    flags = env.get("XLA_FLAGS", "")
    for flag in UNOPTIMIZED_FLAGS:
        flags = re.sub(re.escape(flag.split("=")[0]) + r"=\S+", "", flags)
    flags = " ".join(flags.split())
    if flags:
        env["XLA_FLAGS"] = flags
    else:
        env.pop("XLA_FLAGS", None)
    return env


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


def flip_hmm(strategy, guide_carries_z=False, order=1):
    """Model: a 2-state HMM with `gv.flip` sites in `gv.scan` (order 1 or 2); guide:
    mean-field flips, or autoregressive; its sites with `strategy`. Both take (guide
    logits [T], observations [T])."""

    @gv.gen
    def model_step(c, y):
        p = jnp.where(c[0] ^ c[1], 0.8, 0.3) if order == 2 else jnp.where(c, 0.8, 0.2)
        z = gv.flip(p) @ "z"
        gv.observe(gv.normal(jnp.where(z, 1.0, -1.0), 1.0), y)
        return ((z, c[0]) if order == 2 else z), None

    @gv.gen
    def model(logits, ys):
        gv.scan(model_step)((False, False) if order == 2 else False, ys) @ "s"

    @gv.gen
    def guide_step(z_prev, logit):
        shift = jnp.where(z_prev, 1.0, -1.0) if guide_carries_z else 0.0
        z = gv.flip(jax.nn.sigmoid(logit + shift), grad=strategy) @ "z"
        return (z if guide_carries_z else z_prev), None

    @gv.gen
    def guide(logits, ys):
        gv.scan(guide_step)(False, logits) @ "s"

    return model, guide


def flip_chain_expectation(t, f, length=3):
    """E[f(b)] by enumeration for the chain of flips b_i ~ flip(sigmoid(t_i)),
    t_0 = t, t_{i+1} = t_i + 0.5 if b_i else t_i − 0.5 (`f` of the 0/1 path)."""
    total = 0.0
    for path in itertools.product([0.0, 1.0], repeat=length):
        tt, prob = t, 1.0
        for b in path:
            q = jax.nn.sigmoid(tt)
            prob = prob * (q if b else 1 - q)
            tt = tt + (0.5 if b else -0.5)
        total = total + prob * f(jnp.array(path))
    return total
