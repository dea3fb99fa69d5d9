"""Atomic checkpoints of a training run with orbax-checkpoint.

A checkpoint is `<dir>/step_<n>/` holding the parameters, optimizer state, step and
PRNG key. orbax writes to a temporary directory and renames it when complete, so a
crash mid-write leaves the previous checkpoint readable.
"""

from __future__ import annotations

import os
import re
import warnings
from typing import Any, Callable

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
    steps = _steps(directory)
    return steps[-1] if steps else None


def _steps(directory: str) -> list[int]:
    """The steps of the complete checkpoints in `directory`, oldest first."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for name in os.listdir(directory)
                  if (m := _STEP_DIR.match(name)))


class CheckpointWarning(UserWarning):
    """The newest checkpoint could not be read; the run resumed from an older one."""


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
        for s in _steps(directory)[:-keep]:
            _remove(os.path.join(directory, f"step_{s:09d}"))
    if jax.process_count() > 1:  # the others wait until the old ones are gone
        from jax.experimental import multihost_utils  # noqa: PLC0415 - only across processes
        multihost_utils.sync_global_devices(f"genvi checkpoint {step}")
    return path


def restore(directory: str, like: dict | Callable[[int], dict]) -> tuple[int, dict]:
    """Restore the newest readable checkpoint; `like` (or `like(step)`, where the
    structure depends on the step) gives the structure expected of it.

    A checkpoint that cannot be read (truncated or overwritten by something else after
    orbax finished it) is skipped with a `CheckpointWarning` for the next older one,
    so a run resumes where its last good checkpoint left it; if none can be read, a
    `CheckpointError` names each and why. A readable checkpoint of another run (other
    parameters) is an error, never skipped."""
    steps = _steps(directory)
    if not steps:
        raise CheckpointError(f"no checkpoint found in {os.path.abspath(directory)!r} "
                              "(expected step_<n> folders written by gv.fit)")
    unreadable = []
    for step in reversed(steps):
        path = os.path.abspath(os.path.join(directory, f"step_{step:09d}"))
        expected = like(step) if callable(like) else like
        target = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), expected)
        try:
            restored = _checkpointer().restore(path, target)
        except Exception as err:  # orbax raises several types; name the file and the cause
            unreadable.append((path, err))
            continue
        _check_same_structure(path, expected, restored)
        if unreadable:
            warnings.warn(CheckpointWarning(
                "could not read the newest checkpoint" + ("s " if len(unreadable) > 1 else " ")
                + ", ".join(repr(p) for p, _ in unreadable)
                + f" ({type(unreadable[0][1]).__name__}); resuming from {path!r}, step {step}"),
                stacklevel=3)
        return step, restored
    causes = "; ".join(f"{p!r}: {type(e).__name__}: {e}" for p, e in unreadable)
    raise CheckpointError(
        f"cannot restore any checkpoint in {os.path.abspath(directory)!r} ({causes}). They "
        "are corrupt or were written by a run with different parameters / optimizer state; "
        "delete them or point checkpoint_dir elsewhere.") from unreadable[0][1]


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
