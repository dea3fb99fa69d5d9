"""Opt-in validation: site parameters and observed values checked at run time, reported
by address (or by the observation's source line) even under `jit`, `vmap` and `scan`.

How an error reaches the user. A check is a host callback that raises
`InvalidParameters`; inside a compiled computation JAX turns that into a
`JaxRuntimeError` whose text holds the message. genvi's entry points (`simulate`,
`log_density`, `estimate`, `grad_estimate`, `gv.fit`, ...) and the `gv.validation()`
block itself catch that error and raise the original `InvalidParameters` instead,
with one traceback. A computation the user compiles *and runs* inside the block with
their own `jax.jit` / `jax.lax.scan` raises the JAX error inside the block and
`InvalidParameters` where it leaves the block; under a global `gv.set_validation(True)`
it stays a `JaxRuntimeError`, whose message ends with genvi's.

The validation state (this module: the switch, the entry points that turn a failed
check back into `InvalidParameters`) is a `jax.make_user_context`, so it is part of the cache key of
every `jax.jit` (genvi's and the user's) and of genvi's trace caches: an objective
compiled before the block is recompiled, checked, inside it.

Example:
    >>> import genvi as gv, jax
    >>> @gv.gen
    ... def g(s):
    ...     return gv.normal(0.0, s) @ "x"
    >>> try:
    ...     with gv.validation():
    ...         g.simulate(jax.random.key(0), -1.0)
    ... except gv.InvalidParameters as e:
    ...     print(str(e).split(":")[0])
    invalid parameters for gv.normal at address 'x' in program 'g'
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Literal, TypeVar

import jax

from genvi.core import jaxpr as jx
from genvi.core.context import current, using

F = TypeVar("F", bound=Callable)

# Part of every jit cache key (jax.make_user_context) and of genvi's trace caches.
_STATE = jax.make_user_context(default_value=False)


class InvalidParameters(ValueError):
    """A sampling site or observation received invalid parameters, or an observed (or
    scored) value outside its distribution's support; raised under `gv.validation()`."""


jx.quiet_callback_errors(InvalidParameters)  # the error propagates; no second traceback


def set_validation(enabled: bool) -> None:
    """Turn validation on or off globally (a `gv.validation()` block overrides it).

    Args:
        enabled: True to check every distribution's parameters and values as programs
            run.

    Returns:
        None.

    Example:
        >>> import genvi as gv
        >>> gv.set_validation(True); gv.set_validation(False)
    """
    _STATE.set_global(bool(enabled))


def enabled() -> bool:
    """Whether validation is on here (the innermost `gv.validation` block, else the
    global setting)."""
    return bool(_STATE.value)


class validation:
    """Context manager: validate parameters and observed values inside it.

    Each site's parameters are checked (a negative scale, a probability outside
    [0, 1], ...), and so are observed values and the values scored by
    `log_density` (NaN, outside the support: a negative value under gamma, 0.5 under
    flip, a non-integer count). The first failure raises `gv.InvalidParameters`
    naming the distribution, the address (or the observation's source line) and the
    program; also inside `jax.jit`, `vmap`, `scan` and `gv.fit`. Objectives compiled
    outside the block are recompiled with the checks inside it (and without them
    after it). `validation(False)` turns checks off inside.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.gen
        ... def coin(p):
        ...     gv.observe(gv.flip(p), 0.5)       # 0.5 is not a coin outcome
        >>> try:
        ...     with gv.validation():
        ...         coin.log_density(gv.choices({}), 0.3)
        ... except gv.InvalidParameters as e:
        ...     print(str(e).split(" at ")[0])
        invalid observation for gv.flip
    """

    def __init__(self, enabled: bool = True):
        self._enabled = bool(enabled)
        self._contexts: list = []

    def __enter__(self) -> None:
        context = _STATE(self._enabled)
        context.__enter__()
        self._contexts.append(context)

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> Literal[False]:
        self._contexts.pop().__exit__(kind, error, traceback)
        found = _recorded(error)
        if found is not None and found is not error:
            # JAX's error's traceback holds the user's failing line (JAX frames filtered)
            raise InvalidParameters(*found.args).with_traceback(error.__traceback__) from None
        return False


def entry_point(fn: F) -> F:
    """Decorate a genvi entry point: under validation, wait for its result and raise a
    failed check as `InvalidParameters` (not JAX's wrapped runtime error), with one
    traceback. Free when validation is off.

    Example:
        >>> from genvi.core.validation import entry_point
        >>> @entry_point
        ... def double(x):
        ...     return 2 * x
        >>> double(2)
        4
    """
    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if not enabled():
            return fn(*args, **kwargs)
        with using(program=_describe(args[0]) if args else None):
            return _checked(fn, args, kwargs)
    return wrapped  # type: ignore[return-value]


def _checked(fn: Callable, args: tuple, kwargs: dict) -> Any:
    """`fn(*args, **kwargs)` with its outputs waited for, a failed check raised as
    `InvalidParameters` (see `entry_point`)."""
    try:
        out = fn(*args, **kwargs)
        ready = [x for x in jax.tree_util.tree_leaves(out)
                 if isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)]
        jax.block_until_ready(ready)  # a failed check surfaces here, not later
        return out
    except Exception as e:  # noqa: BLE001 - only our own error is replaced
        found = _recorded(e)
        if found is None:
            raise
    # a fresh error (without the notes JAX adds on its way): outside `except`, no context
    raise InvalidParameters(*found.args)


def _describe(obj: Any) -> str | None:
    """"program 'model'" / "objective 'elbo'": where a failed check was, for messages."""
    name = getattr(obj, "name", None)
    if not isinstance(name, str):
        return None
    return f"{'program' if hasattr(obj, 'simulate') else 'objective'} {name!r}"


# -- the raised errors, found again in JAX's runtime error --------------------------

_RAISED: dict = {}  # message -> InvalidParameters, the most recent few
_LOCK = threading.Lock()


def raise_invalid(error: InvalidParameters) -> None:
    """Raise `error` from a check's host callback, remembering it so that the
    `JaxRuntimeError` JAX wraps it in is turned back into it (`entry_point`)."""
    with _LOCK:
        _RAISED[str(error)] = error
        while len(_RAISED) > 16:
            _RAISED.pop(next(iter(_RAISED)))
    raise error


def _recorded(error: Any) -> InvalidParameters | None:
    """The `InvalidParameters` that `error` is, or that JAX wrapped into it."""
    if isinstance(error, InvalidParameters):
        return error
    if not isinstance(error, jax.errors.JaxRuntimeError):
        return None
    text = str(error)
    with _LOCK:
        for message in reversed(list(_RAISED)):
            if message in text:
                return _RAISED.pop(message)
    return None


def within() -> str:
    """" in program 'g'" for the entry point being validated, or ""."""
    program = current().program
    return f" in {program}" if program else ""
