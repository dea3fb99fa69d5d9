"""The helper process of `genvi.auto.compile_aside`: reads a serialized
`jax.export.Exported` on its standard input, compiles it at the lowest priority, and
writes the executable (`jax.experimental.serialize_executable`) on its standard output.
It is run as a script (`python -P compile_helper.py`), so it imports JAX and nothing of
genvi's:

    python -P genvi/auto/compile_helper.py < exported.bin > executable.bin
"""

from __future__ import annotations

import os
import sys

# background work: the process that waits trains meanwhile. The priority is lowered
# before JAX is imported, as the import is a good part of the helper's work (1-3
# CPU-seconds), and XLA's threads, started by the first compile, take it from this
# thread. On Linux the helper also takes the idle scheduling class, which runs only on
# a core the training leaves idle (at niceness 19 alone, the compile still took turns:
# an AIR fit's chunks took 1.25 times as long while it ran, 1.05 times under
# SCHED_IDLE). Only as a script: a process importing this module (a doctest run) keeps
# its priority. genvi.auto.fit_tuning lowers its own threads the same way; this
# script imports nothing of genvi's, so it says it again.
if __name__ == "__main__" and hasattr(os, "nice"):
    os.nice(19)
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):   # not Linux, or the system refuses: niceness 19
        pass

import jax  # noqa: E402
from jax.experimental import serialize_executable  # noqa: E402


def main() -> None:
    """Compile what comes in; write what it compiled to."""
    exported = jax.export.deserialize(bytearray(sys.stdin.buffer.read()))
    args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree, exported.in_avals)
    compiled = jax.jit(exported.call).lower(*args, **kwargs).compile()
    payload, _, _ = serialize_executable.serialize(compiled)
    sys.stdout.buffer.write(payload)


if __name__ == "__main__":
    main()
