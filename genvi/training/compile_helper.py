"""The helper process of `genvi.training.compile_aside`: reads a serialized
`jax.export.Exported` on its standard input, compiles it at the lowest priority, and
writes the executable (`jax.experimental.serialize_executable`) on its standard output.
It is run as a script (`python -P compile_helper.py`), so it imports JAX and nothing of
genvi's:

    python -P genvi/training/compile_helper.py < exported.bin > executable.bin
"""

from __future__ import annotations

import os
import sys

# background work: the process that waits trains meanwhile. The priority is lowered
# before JAX is imported, as the import is a good part of the helper's work (1-3
# CPU-seconds), and XLA's threads, started by the first compile, take it from this
# thread. Only as a script: a process importing this module (a doctest run) keeps its
# priority.
if __name__ == "__main__" and hasattr(os, "nice"):
    os.nice(19)

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
