"""Compiling aside: a jitted program compiled by a helper process at the lowest
priority, for a fit's background measurement on a CPU.

A fit measures its `gv.AUTO` candidates while it trains (`genvi.auto.fit_tuning`),
and on a CPU their compile shares the cores with the training. A thread of its own at
the lowest priority does not keep the compile out of the training's way: XLA:CPU
generates code on a process-wide pool of threads, made at the priority of the thread
that first compiled in the process (the user's), and that half of the compile's work
competes with the training as an equal (on AIR: 20 of the measuring program's 28
CPU-seconds, which took 14 s from a 60-s run on two cores). A helper process at the
lowest priority (niceness 19 and, on Linux, the idle scheduling class, which runs only
on a core the training leaves idle), all of whose threads are its own, does yield: the
program is traced and lowered here, exported (`jax.export`), compiled there, and its
executable is sent back (`jax.experimental.serialize_executable`) and loaded, so the
measurement compiles from the cores the training leaves idle. The helper imports only JAX
(`genvi/auto/compile_helper.py`), with this process's environment (so `XLA_FLAGS`)
and its 64-bit setting.

`compile_program` compiles aside where that can work (a CPU backend, a program that
exports) and here otherwise, or where the helper failed (its reason: `last_fallback`);
a helper stopped by a signal (an interrupt, the system out of memory, its owner's
`Helpers.stop`) is an error. A fit that fails stops its helpers (`Helpers`), so that
its error is not held back by a compile nobody will use.

Example:
    >>> import jax, jax.numpy as jnp
    >>> compiled = compile_program(jax.jit(lambda x: 2.0 * x), jnp.ones(3), aside=Helpers())
    >>> compiled(jnp.ones(3)).tolist()
    [2.0, 2.0, 2.0]
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import jax
from jax.experimental import serialize_executable

HELPER = Path(__file__).with_name("compile_helper.py")
log = logging.getLogger(__name__)
# why the last aside compile fell back to compiling here (None: it did not)
last_fallback: str | None = None


class AsideFailed(RuntimeError):
    """The helper process could not compile the program (its message: the helper's
    error output's last lines)."""


class HelperStopped(AsideFailed):
    """The helper process was stopped by a signal (an interrupt, or the system out of
    memory): an error, where compiling again here would repeat what stopped it."""


class Helpers:
    """The helper processes one owner (a fit's measurement) runs, so that it can stop
    them: `stop` kills those running and refuses new ones (each compile then raises
    `HelperStopped`).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> helpers = Helpers()
        >>> compile_aside(jax.jit(jnp.cos), jnp.zeros(1), helpers=helpers)(jnp.zeros(1)).tolist()
        [1.0]
        >>> helpers.stop()
        >>> compile_aside(jax.jit(jnp.cos), jnp.zeros(1), helpers=helpers)
        Traceback (most recent call last):
        ...
        genvi.auto.compile_aside.HelperStopped: the compile helpers were stopped (their owner ended)
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen] = set()
        self._stopped = False

    def run(self, payload: bytes | bytearray, env: dict) -> tuple[int, bytes, bytes]:
        """The helper run on `payload`: its exit status, output and error output."""
        with self._lock:
            if self._stopped:
                raise HelperStopped("the compile helpers were stopped (their owner ended)")
            # -P: the helper's folder is not put on the import path (its neighbours are
            # genvi's modules, not JAX's)
            process = subprocess.Popen([sys.executable, "-P", str(HELPER)],
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, env=env)
            self._running.add(process)
        try:
            # typeshed wants bytes; Popen writes any bytes-like input (jax.export's bytearray)
            out, err = process.communicate(payload)  # type: ignore[arg-type]
        finally:
            with self._lock:
                self._running.discard(process)
        return process.returncode, out, err

    def stop(self) -> None:
        """Kill the helpers running and refuse new ones."""
        with self._lock:
            self._stopped = True
            for process in self._running:
                process.kill()


def compile_aside(jitted: Any, *args: Any, helpers: Helpers | None = None
                  ) -> jax.stages.Compiled:
    """`jitted.lower(*args).compile()`, compiled by a helper process at the lowest
    priority on the CPU backend (see the module docstring), run by `helpers` (by
    default its own). Raises `AsideFailed` where the helper fails, and what
    `jax.export` raises where the program does not export.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> compile_aside(jax.jit(jnp.sin), jnp.zeros(2))(jnp.zeros(2)).tolist()
        [0.0, 0.0]
    """
    exported = jax.export.export(jitted, platforms=("cpu",))(*args)
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "JAX_ENABLE_X64": "1" if jax.config.jax_enable_x64 else "0"}
    status, out, err = (helpers or Helpers()).run(exported.serialize(), env)
    if status < 0:
        raise HelperStopped(f"the compile helper was stopped by signal {-status}")
    if status != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-5:]
        raise AsideFailed(f"the compile helper exited with status {status}: "
                          + " | ".join(tail))
    return serialize_executable.deserialize_and_load(out, exported.in_tree,
                                                     exported.out_tree)


def compile_program(jitted: Any, *args: Any, aside: Helpers | None
                    ) -> jax.stages.Compiled:
    """`jitted` compiled for `args`: aside (`compile_aside`, run by the helpers `aside`)
    where they are given and the default backend is a CPU, else, or where that fails
    (recorded in `last_fallback` and logged), in this process. A helper stopped by a
    signal, or by `aside.stop`, raises `HelperStopped`.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> compile_program(jax.jit(jnp.cos), jnp.zeros(1), aside=None)(jnp.zeros(1)).tolist()
        [1.0]
    """
    global last_fallback
    if aside is not None and jax.default_backend() == "cpu":
        try:
            compiled = compile_aside(jitted, *args, helpers=aside)
        except HelperStopped:
            raise
        except Exception as error:   # it does not export, or the helper failed: compile here
            last_fallback = f"{type(error).__name__}: {error}"
            log.info("genvi: compiling in process, as the helper could not: %s",
                     last_fallback)
        else:
            last_fallback = None
            return compiled
    return jitted.lower(*args).compile()
