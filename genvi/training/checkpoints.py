"""Atomic checkpoints of a training run with orbax-checkpoint, one writer per directory.

A checkpoint is `<dir>/step_<n>/` holding the parameters, optimizer state, step and
PRNG key. orbax writes it into `step_<n>.orbax-checkpoint-tmp...` and renames that
when complete, so a checkpoint is whole or absent: a crash, a SIGKILL or a failed
write at any moment leaves the previous one readable. The write is synchronous (no
thread of orbax's is left behind, whatever stopped it); one that fails raises a
`CheckpointError` naming the directory, the step and the cause, and its unfinished
folder is removed. Old checkpoints are renamed out of the `step_<n>` namespace before
they are deleted, so a half-deleted one is never taken for a checkpoint.

`Writer` holds a directory for one fit (a lock on `<dir>/.genvi-writer.lock`, released
by the kernel when the process ends, however it ends): a second live fit writing there
is refused, naming the process that holds it; the writer removes what killed writes
left (unfinished folders, half-deleted old checkpoints) and says so.

Example:
    >>> import tempfile, numpy as np
    >>> from genvi.training import checkpoints
    >>> directory = tempfile.mkdtemp()
    >>> with checkpoints.Writer(directory):
    ...     _ = checkpoints.save(directory, 7, {"w": np.zeros(2)})
    >>> checkpoints.latest_step(directory)
    7
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import socket
import warnings
from typing import Any, Callable

import jax
import numpy as np

from genvi.core.mistakes import user_stacklevel

try:
    import fcntl
except ImportError:  # Windows: no advisory locks of this kind
    fcntl = None  # type: ignore[assignment]  # checked for None before each use

_STEP_DIR = re.compile(r"^step_(\d+)$")
# what an interrupted write or deletion leaves: orbax's unfinished folders, and old
# checkpoints renamed out of the way to be deleted
_LEFT_BY_A_KILLED_WRITE = re.compile(r"^step_\d+\.(orbax-checkpoint-tmp.*|genvi-removing)$")
LOCK_FILE = ".genvi-writer.lock"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable, does not match the run, or could not be
    written; or another live fit is writing the directory. Raised by `gv.fit` while
    it writes, `result` holds the `FitResult` of the steps run so far (continue it
    with `gv.fit(objective, error.result, ...)`); otherwise `result` is None.

    Example:
        >>> import genvi as gv
        >>> gv.CheckpointError("disk full").result is None
        True
    """

    def __init__(self, message: str, result: Any = None):
        super().__init__(message)
        self.result = result


def _orbax() -> Any:
    import orbax.checkpoint as ocp  # noqa: PLC0415 - heavy import, only when used
    return ocp


def _checkpointer():
    # synchronous: the write is done (or has failed) when save returns, with no
    # background thread left to wait on at exit
    return _orbax().Checkpointer(_orbax().StandardCheckpointHandler())


def latest_step(directory: str | os.PathLike) -> int | None:
    """The step of the newest complete checkpoint in `directory`, if any."""
    steps = _steps(directory)
    return steps[-1] if steps else None


def _steps(directory: str | os.PathLike) -> list[int]:
    """The steps of the complete checkpoints in `directory`, oldest first."""
    if not os.path.isdir(directory):
        return []
    return sorted(int(m.group(1)) for name in os.listdir(directory)
                  if (m := _STEP_DIR.match(name)))


class CheckpointWarning(UserWarning):
    """Something about a checkpoint directory worth knowing that changes no result: the
    newest checkpoint could not be read and the run resumed from an older one; what a
    killed write left was removed; the file system cannot lock the directory."""


def save(directory: str | os.PathLike, step: int, payload: dict, keep: int = 2,
         primary: bool = True) -> str:
    """Write `payload` (a pytree) as the checkpoint for `step`; keep the newest `keep`.

    Under `jax.distributed` every process calls it (orbax writes collectively) and
    only the `primary` one removes old checkpoints. A write that fails raises a
    `CheckpointError` naming the directory and the cause; the checkpoints before it
    are untouched and its unfinished folder is removed.

    Example:
        >>> import tempfile, numpy as np
        >>> from genvi.training.checkpoints import restore, save
        >>> directory = tempfile.mkdtemp()
        >>> _ = save(directory, 3, {"w": np.ones(2)})
        >>> restore(directory, {"w": np.zeros(2)})
        (3, {'w': array([1., 1.])})
    """
    path = os.path.abspath(os.path.join(directory, _name(step)))
    try:
        os.makedirs(directory, exist_ok=True)
        _checkpointer().save(path, args=_orbax().args.StandardSave(
            jax.tree_util.tree_map(np.asarray, payload)), force=True)
    except Exception as err:  # orbax and the file system raise many types: name the cause
        _remove_leftovers(directory, _name(step) + ".")
        intact = latest_step(directory)
        kept = (f"the checkpoint of step {intact} is intact" if intact is not None
                else "no earlier checkpoint is there")
        raise CheckpointError(
            f"could not write the checkpoint of step {step} in {os.path.abspath(directory)!r}: "
            f"{type(err).__name__}: {err}. {kept.capitalize()}; free space or fix the "
            "directory's permissions, then run the fit again to resume.") from err
    if primary:
        for s in _steps(directory)[:-keep]:
            _remove(os.path.join(directory, _name(s)))
    if jax.process_count() > 1:  # the others wait until the old ones are gone
        from jax.experimental import multihost_utils  # noqa: PLC0415 - only across processes
        multihost_utils.sync_global_devices(f"genvi checkpoint {step}")
    return path


def _name(step: int) -> str:
    return f"step_{step:09d}"


def restore(directory: str | os.PathLike,
            like: dict | Callable[[int], dict]) -> tuple[int, dict]:
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
        path = os.path.abspath(os.path.join(directory, _name(step)))
        expected = like(step) if callable(like) else like
        target = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), expected)
        try:
            restored = _checkpointer().restore(path, args=_orbax().args.StandardRestore(target))
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
    if want != got:  # type: ignore[operator]  # jaxlib's PyTreeDef comes without a type stub
        raise CheckpointError(f"checkpoint {path!r} holds {got}, but this run expects {want}")
    for a, b in zip(jax.tree_util.tree_leaves(like), jax.tree_util.tree_leaves(restored)):
        if np.shape(a) != np.shape(b):
            raise CheckpointError(f"checkpoint {path!r} has an array of shape {np.shape(b)} "
                                  f"where this run has {np.shape(a)}")


def _remove(path: str) -> None:
    """Delete a checkpoint: first renamed out of the `step_<n>` names (atomic), so that
    a deletion cut short never leaves a partial folder that reads as a checkpoint."""
    doomed = path + ".genvi-removing"
    try:
        os.replace(path, doomed)
    except OSError:
        return
    shutil.rmtree(doomed, ignore_errors=True)


def _remove_leftovers(directory: str | os.PathLike, prefix: str = "") -> list[str]:
    """Remove what killed or failed writes left in `directory` (orbax's unfinished
    folders, old checkpoints half deleted) whose names start with `prefix`; their
    names."""
    if not os.path.isdir(directory):
        return []
    left = sorted(name for name in os.listdir(directory)
                  if name.startswith(prefix) and _LEFT_BY_A_KILLED_WRITE.match(name))
    for name in left:
        shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
    return left


class Writer:
    """The one writer of a checkpoint directory for the length of a `with` block.

    Entering locks `<directory>/.genvi-writer.lock` (an advisory `flock`, which the
    kernel releases when the holding process ends, even by SIGKILL, so a lock is
    never stale) and records the holder in it; a directory that another live fit
    holds raises `CheckpointError` naming that process. Holding it, the writer removes
    the leftovers of killed writes, with a `CheckpointWarning` listing them.
    `directory=None` holds nothing. A file system that cannot lock (some cluster file
    systems without their lock option) is written without the lock, with a warning.
    Under several processes only the `primary` one holds the directory, and `agree`
    (genvi/training/distributed.py's `agreement`) tells the others if it could not.

    Example:
        >>> import tempfile
        >>> from genvi.training.checkpoints import CheckpointError, Writer
        >>> directory = tempfile.mkdtemp()
        >>> with Writer(directory):
        ...     try:
        ...         Writer(directory).__enter__()
        ...     except CheckpointError as err:
        ...         print(str(err)[:43])
        another live fit is writing the checkpoints
    """

    def __init__(self, directory: str | os.PathLike | None, primary: bool = True,
                 agree: Callable[[int, int], tuple[int, int]] | None = None):
        self.directory = None if directory is None else os.path.abspath(directory)
        self.primary, self.agree = primary, agree
        self._fd: int | None = None

    def __enter__(self) -> "Writer":
        refused = None
        if self.directory is not None and self.primary:
            try:
                self._hold()
            except CheckpointError as err:
                refused = err
        # several processes write one directory collectively and the primary holds it:
        # the others learn whether it could (else they would wait for it forever)
        # (every process takes part in the collective, the refused one too)
        if self.agree is not None:
            anyone_refused = self.agree(int(refused is not None), 0)[0]
            if anyone_refused and refused is None:
                raise CheckpointError(f"the primary process could not hold the checkpoint "
                                      f"directory {self.directory!r}; see its error")
        if refused is not None:
            raise refused
        return self

    def _hold(self) -> None:
        assert self.directory is not None  # held only where there is a directory
        os.makedirs(self.directory, exist_ok=True)
        lock = os.path.join(self.directory, LOCK_FILE)
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 4096).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise CheckpointError(
                f"another live fit is writing the checkpoints in {self.directory!r} "
                f"({holder}); two fits writing one directory would overwrite each "
                "other's checkpoints. Wait for it to end or stop it, or give this fit "
                "another directory.") from None
        except OSError as err:   # no locks on this file system
            warnings.warn(CheckpointWarning(
                f"cannot lock {lock!r} ({err}); nothing stops another fit from writing "
                f"{self.directory!r} at the same time"), stacklevel=user_stacklevel())
        self._fd = fd
        since = datetime.datetime.now().isoformat(timespec="seconds")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"process {os.getpid()} on {socket.gethostname()}, writing since "
                      f"{since}\n".encode(), 0)
        left = _remove_leftovers(self.directory)
        if left:
            warnings.warn(CheckpointWarning(
                f"removed what a killed or failed checkpoint write left in "
                f"{self.directory!r}: {', '.join(left)} (the complete checkpoints are "
                "untouched)"), stacklevel=user_stacklevel())

    def __exit__(self, *exc_info: Any) -> None:
        if self._fd is not None:
            os.close(self._fd)   # closing releases the lock
            self._fd = None
