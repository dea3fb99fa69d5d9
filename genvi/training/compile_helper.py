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

import jax
from jax.experimental import serialize_executable


def main() -> None:
    """Compile what comes in; write what it compiled to."""
    # background work: the process that waits trains meanwhile (XLA's threads start
    # with the first compile, below, and take this priority from this thread)
    if hasattr(os, "nice"):
        os.nice(19)
    exported = jax.export.deserialize(bytearray(sys.stdin.buffer.read()))
    args, kwargs = jax.tree_util.tree_unflatten(exported.in_tree, exported.in_avals)
    compiled = jax.jit(exported.call).lower(*args, **kwargs).compile()
    payload, _, _ = serialize_executable.serialize(compiled)
    sys.stdout.buffer.write(payload)


if __name__ == "__main__":
    main()
