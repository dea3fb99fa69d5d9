"""Atomic checkpoints of a training run with orbax-checkpoint.

A checkpoint is `<dir>/step_<n>/` holding the parameters, optimizer state, step and
PRNG key. orbax writes to a temporary directory and renames it when complete, so a
crash mid-write leaves the previous checkpoint readable.
"""

from __future__ import annotations

import os
import re
from typing import Any

import jax
import numpy as np

_STEP_DIR = re.compile(r"^step_(\d+)$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, or does not match the run."""


def _checkpointer():
    import orbax.checkpoint as ocp  # noqa: PLC0415 - heavy import, only when used
    return ocp.StandardCheckpointer()


def latest_step(directory: str) -> int | None:
    """The step of the newest complete checkpoint in `directory`, if any."""
    if not os.path.isdir(directory):
        return None
    steps = [int(m.group(1)) for name in os.listdir(directory)
             if (m := _STEP_DIR.match(name))]
    return max(steps) if steps else None


def save(directory: str, step: int, payload: dict, keep: int = 2, primary: bool = True) -> str:
    """Write `payload` (a pytree) as the checkpoint for `step`; keep the newest `keep`.

    Under `jax.distributed` every process calls it (orbax writes collectively) and
    only the `primary` one removes old checkpoints."""
    path = os.path.abspath(os.path.join(directory, f"step_{step:09d}"))
    os.makedirs(directory, exist_ok=True)
    ckpt = _checkpointer()
    ckpt.save(path, jax.tree_util.tree_map(np.asarray, payload), force=True)
    ckpt.wait_until_finished()
    if primary:
        old = sorted(int(m.group(1)) for n in os.listdir(directory)
                     if (m := _STEP_DIR.match(n)))
        for s in old[:-keep]:
            _remove(os.path.join(directory, f"step_{s:09d}"))
    if jax.process_count() > 1:  # the others wait until the old ones are gone
        from jax.experimental import multihost_utils  # noqa: PLC0415 - only across processes
        multihost_utils.sync_global_devices(f"genvi checkpoint {step}")
    return path


def restore(directory: str, like: dict) -> tuple[int, dict]:
    """Restore the newest checkpoint; `like` gives the expected structure."""
    step = latest_step(directory)
    if step is None:
        raise CheckpointError(f"no checkpoint found in {os.path.abspath(directory)!r} "
                              "(expected step_<n> folders written by gv.fit)")
    path = os.path.abspath(os.path.join(directory, f"step_{step:09d}"))
    target = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype),
                                    like)
    try:
        restored = _checkpointer().restore(path, target)
    except Exception as err:  # orbax raises several types; name the file and the cause
        raise CheckpointError(
            f"cannot restore checkpoint {path!r}: {type(err).__name__}: {err}. It is corrupt "
            "or was written by a run with different parameters / optimizer state; "
            "delete it or point checkpoint_dir elsewhere.") from err
    _check_same_structure(path, like, restored)
    return step, restored


def _check_same_structure(path: str, like: Any, restored: Any) -> None:
    want = jax.tree_util.tree_structure(like)
    got = jax.tree_util.tree_structure(restored)
    if want != got:
        raise CheckpointError(f"checkpoint {path!r} holds {got}, but this run expects {want}")
    for a, b in zip(jax.tree_util.tree_leaves(like), jax.tree_util.tree_leaves(restored)):
        if np.shape(a) != np.shape(b):
            raise CheckpointError(f"checkpoint {path!r} has an array of shape {np.shape(b)} "
                                  f"where this run has {np.shape(a)}")


def _remove(path: str) -> None:
    import shutil  # noqa: PLC0415
    shutil.rmtree(path, ignore_errors=True)
