"""`gv.fit`'s grouped options: a held-out evaluation, checkpoints, and skipping
non-finite steps, each a small frozen record that says in one place what belongs
together.

    gv.fit(objective, params, *data, optimizer=..., steps=..., key=...,
           evaluate=gv.Evaluation(objective, *held_out, every=500),
           checkpoints=gv.Checkpoints("runs/1", every=1000),
           skip_nonfinite=gv.SkipNonfinite(warn_fraction=0.2))

The flat keywords these replace (`eval_objective`, `eval_data`, `eval_every`,
`eval_estimates`, `checkpoint_dir`, `checkpoint_every`, `resume`,
`skip_warn_fraction`) still work for now, with a `DeprecationWarning` that shows the
record to write (`from_flat_keywords`).

Example:
    >>> import genvi as gv
    >>> gv.Checkpoints("runs/1", every=1000)
    Checkpoints(directory='runs/1', every=1000, resume=None)
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp

from genvi.adev.expectation import Expectation
from genvi.core.mistakes import user_stacklevel
from genvi.training.fit_checks import check_objective
from genvi.training.schedule import at_step, check_schedules, split_scheduled


@dataclasses.dataclass(frozen=True, init=False)
class Evaluation:
    """A held-out objective that `gv.fit` estimates every `every` steps: the mean of
    `estimates` independent estimates of `objective(params, *data)`, recorded in
    `history["eval"]` at the steps in `history["eval_step"]`. Data given as
    `gv.schedule(fn)` get `fn(step)` at the evaluation's step.

    Example:
        >>> import genvi as gv
        >>> @gv.expectation
        ... def held_out(m, y):
        ...     return -(m - y) ** 2
        >>> gv.Evaluation(held_out, 1.0, every=100).every
        100
    """

    objective: Expectation
    data: tuple
    every: int
    estimates: int

    def __init__(self, objective: Expectation, *data: Any, every: int, estimates: int = 64):
        check_objective(objective, "gv.Evaluation's objective")
        if not isinstance(every, int) or every < 1:
            raise ValueError(f"gv.Evaluation: every must be a positive number of steps; got {every!r}")
        if not isinstance(estimates, int) or estimates < 1:
            raise ValueError(f"gv.Evaluation: estimates must be a positive count; got {estimates!r}")
        for name, value in (("objective", objective), ("data", tuple(data)), ("every", every),
                            ("estimates", estimates)):
            object.__setattr__(self, name, value)


@dataclasses.dataclass(frozen=True)
class Checkpoints:
    """Atomic orbax checkpoints of a `gv.fit` in `directory`, written every `every`
    steps, at the end and when a stopping rule fires (`every=None`: none written,
    only resumed from). A fit that finds one there resumes from the newest good one
    and ends bit for bit where an uninterrupted run ends; a damaged newest checkpoint
    is reported and the one before it is used. `resume=True` requires a checkpoint (a
    clear error if there is none), `resume=False` ignores existing ones. A fit that
    writes holds the directory: a second live fit writing there is refused, and what
    a killed write left is removed (genvi/training/checkpoints.py).

    Example:
        >>> import genvi as gv
        >>> gv.Checkpoints("runs/1", every=1000, resume=True).resume
        True
    """

    directory: str | os.PathLike
    every: int | None = None
    resume: bool | None = None

    def __post_init__(self):
        if not isinstance(self.directory, (str, os.PathLike)):
            raise TypeError(f"gv.Checkpoints: directory must be a path; got {self.directory!r}")
        if self.every is not None and (not isinstance(self.every, int) or self.every < 1):
            raise ValueError(f"gv.Checkpoints: every must be a positive number of steps or "
                             f"None; got {self.every!r}")
        if self.resume not in (None, True, False):
            raise TypeError(f"gv.Checkpoints: resume must be True, False or None; got {self.resume!r}")


@dataclasses.dataclass(frozen=True)
class SkipNonfinite:
    """Skip the steps of a `gv.fit` whose objective estimate or gradient is not finite
    (the parameters and optimizer state stay as they were), flagged in
    `history["skipped"]` and counted in `history["num_skipped"]`; a
    `gv.NonFiniteWarning` is issued when more than `warn_fraction` of the steps were
    skipped (`None`: never). `skip_nonfinite=True` is `SkipNonfinite()`.

    Example:
        >>> import genvi as gv
        >>> gv.SkipNonfinite(warn_fraction=None)
        SkipNonfinite(warn_fraction=None)
    """

    warn_fraction: float | None = 0.1


#: the flat keywords the records replace, and the record field each fills
_FLAT = {"eval_objective": ("evaluate", "objective"), "eval_data": ("evaluate", "data"),
         "eval_every": ("evaluate", "every"), "eval_estimates": ("evaluate", "estimates"),
         "checkpoint_dir": ("checkpoints", "directory"),
         "checkpoint_every": ("checkpoints", "every"), "resume": ("checkpoints", "resume"),
         "skip_warn_fraction": ("skip_nonfinite", "warn_fraction")}
#: the names of those keywords
FLAT_NAMES = frozenset(_FLAT)


def from_flat_keywords(flat: dict[str, Any], evaluate: Evaluation | None,
                       checkpoints: Checkpoints | None, skip_nonfinite: bool | SkipNonfinite,
                       ) -> tuple[Evaluation | None, Checkpoints | None, SkipNonfinite | None]:
    """The records `gv.fit` runs with, from its record arguments and the deprecated
    flat keywords `flat` (warned about, with the record to write; a keyword given as
    None counts as not given); an unknown keyword raises `TypeError` as Python would.

    Example:
        >>> from genvi.training.fit_options import from_flat_keywords
        >>> from_flat_keywords({}, None, None, True)
        (None, None, SkipNonfinite(warn_fraction=0.1))
    """
    unknown = [k for k in flat if k not in _FLAT]
    if unknown:
        raise TypeError(f"gv.fit() got an unexpected keyword argument {unknown[0]!r}")
    if skip_nonfinite is True:
        skip_nonfinite = SkipNonfinite()
    if skip_nonfinite is not False and not isinstance(skip_nonfinite, SkipNonfinite):
        raise TypeError(f"gv.fit: skip_nonfinite must be True, False or gv.SkipNonfinite(...); "
                        f"got {skip_nonfinite!r}")
    groups: dict[str, dict[str, Any]] = {}
    for key, value in flat.items():
        record, field = _FLAT[key]
        groups.setdefault(record, {})[field] = value
    records = {"evaluate": evaluate, "checkpoints": checkpoints}
    for record, fields in groups.items():
        keywords = ", ".join(k for k in flat if _FLAT[k][0] == record)
        if records.get(record) is not None:
            raise TypeError(f"gv.fit: pass {record}= or the keywords {keywords}, not both")
        warnings.warn(f"gv.fit's keywords {keywords} are now one record: pass "
                      f"{_WRITE[record]}", DeprecationWarning, stacklevel=user_stacklevel())
        fields = {k: v for k, v in fields.items() if v is not None}
        if record == "evaluate" and "objective" in fields:
            if "every" not in fields:
                raise TypeError("gv.fit: eval_objective needs eval_every, the steps between "
                                "evaluations (now: evaluate=gv.Evaluation(objective, *data, "
                                "every=...))")
            evaluate = Evaluation(fields["objective"], *tuple(fields.get("data", ())),
                                  every=fields["every"], estimates=fields.get("estimates", 64))
        elif record == "checkpoints" and "directory" in fields:
            checkpoints = Checkpoints(fields["directory"], fields.get("every"), fields.get("resume"))
        elif record == "checkpoints" and fields.get("resume"):
            raise TypeError("gv.fit: resume=True needs a checkpoint directory (now: "
                            "checkpoints=gv.Checkpoints(directory, resume=True))")
        elif record == "skip_nonfinite" and isinstance(skip_nonfinite, SkipNonfinite):
            skip_nonfinite = SkipNonfinite(fields.get("warn_fraction"))
    return evaluate, checkpoints, skip_nonfinite or None


_WRITE = {"evaluate": "evaluate=gv.Evaluation(objective, *data, every=..., estimates=...)",
          "checkpoints": "checkpoints=gv.Checkpoints(directory, every=..., resume=...)",
          "skip_nonfinite": "skip_nonfinite=gv.SkipNonfinite(warn_fraction=...)"}


def held_out_estimator(evaluation: Evaluation | None, key: jax.Array) -> Callable | None:
    """`estimate(params, step)`: the mean of the evaluation's held-out estimates, with
    scheduled arguments at `step`."""
    if evaluation is None:
        return None
    objective, data, n = evaluation.objective, evaluation.data, evaluation.estimates
    fixed, scheduled = split_scheduled(tuple(data or ()))
    check_schedules(scheduled, "gv.Evaluation's data")
    eval_key = jax.random.fold_in(key, 2 ** 31 - 1)

    @jax.jit
    def evaluate(params, step):
        args = at_step(fixed, scheduled, step)
        keys = jax.random.split(eval_key, n)
        return jnp.mean(jax.vmap(lambda k: objective.estimate(k, params, *args))(keys))

    return evaluate
