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

The validation state is a `jax.make_user_context`, so it is part of the cache key of
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

import contextlib
import contextvars
import functools
import threading
from typing import Any, Callable, Iterator, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from jax.custom_batching import custom_vmap

from genvi.core import jaxpr as jx

F = TypeVar("F", bound=Callable)

# Part of every jit cache key (jax.make_user_context) and of genvi's trace caches.
_STATE = jax.make_user_context(default_value=False)
# The program whose entry point is running (named in messages about observations).
_PROGRAM: contextvars.ContextVar = contextvars.ContextVar("genvi_program", default=None)
# Inside the control flow being interpreted, per level: {id(jaxpr): the lanes where that
# body runs (a boolean), or None for all}; see `control`.
_GATES: contextvars.ContextVar = contextvars.ContextVar("genvi_gates", default=())


class InvalidParameters(ValueError):
    """A sampling site or observation received invalid parameters, or an observed (or
    scored) value outside its distribution's support; raised under `gv.validation()`."""


jx.quiet_callback_errors(InvalidParameters)  # the error propagates; no second traceback


def set_validation(enabled: bool) -> None:
    """Turn validation on or off globally (a `gv.validation()` block overrides it).

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

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> bool:
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
        >>> from genvi.validation import entry_point
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
        token = _PROGRAM.set(_describe(args[0]) if args else None)
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
        finally:
            _PROGRAM.reset(token)
        # a fresh error (without the notes JAX adds on its way): outside `except`, no context
        raise InvalidParameters(*found.args)
    return wrapped  # type: ignore[return-value]


def _describe(obj: Any) -> str | None:
    """"program 'model'" / "objective 'elbo'": where a failed check was, for messages."""
    name = getattr(obj, "name", None)
    if not isinstance(name, str):
        return None
    return f"{'program' if hasattr(obj, 'simulate') else 'objective'} {name!r}"


# -- the raised errors, found again in JAX's runtime error --------------------------

_RAISED: dict = {}  # message -> InvalidParameters, the most recent few
_LOCK = threading.Lock()


def _raise(error: InvalidParameters) -> None:
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


# -- the checks -----------------------------------------------------------------------

_FIX_PARAMS = ("Fix the values computed for this site (e.g. pass a scale through jnp.exp "
               "or jax.nn.softplus, a probability through jax.nn.sigmoid).")
_FIX_VALUE = ("Check the data passed as this observation (NaNs, missing values, units, "
              "the encoding of categories and counts).")
_FIX_READ = "Fix the value at this address in the choice map."


@contextlib.contextmanager
def control(eqn: Any, ins: list, jaxpr: Any) -> Iterator[None]:
    """While the interpreter runs the bodies of the control-flow equation `eqn` (found
    in `jaxpr`, operands `ins`): checks in a cond's branch `b` hold only where the
    index is `b`. `jax.vmap` of a `cond` runs every branch in every lane (a select),
    where an untaken branch's parameters may well be invalid.

    Example:
        >>> from genvi.validation import control   # used by the interpreters
    """
    if not enabled():
        yield
        return
    outer = _gate(jaxpr)
    entry: dict = {}
    for b, body in enumerate(jx.sub_jaxprs(eqn)):
        body = getattr(body, "jaxpr", body)
        gate = outer
        if jx.kind(eqn) == "cond":
            here = jnp.asarray(ins[0]) == b
            gate = here if outer is None else outer & here
            if id(body) in entry:  # one jaxpr for several branches
                gate = entry[id(body)] | gate
        entry[id(body)] = gate
    token = _GATES.set(_GATES.get() + (entry,))
    try:
        yield
    finally:
        _GATES.reset(token)


def _gate(jaxpr: Any) -> Any:
    """The lanes where the body `jaxpr` runs (None: all), per `control`."""
    for entry in reversed(_GATES.get()):
        if id(jaxpr) in entry:
            return entry[id(jaxpr)]
    return None


def check_site(eqn: Any, ins: list, offset: int = 0, value: bool = True,
               jaxpr: Any = None) -> None:
    """Emit the run-time check of a site's parameters (`offset=1`: an observation,
    whose observed value `ins[0]` is checked too unless `value` is False: the sleep
    phase ignores it). `jaxpr`: the body holding `eqn` (see `control`). A no-op when
    validation is off.

    Example:
        >>> from genvi.validation import check_site   # called by the interpreters
    """
    if not enabled() or eqn.params.get("masked"):
        # masked sites (untaken lanes of a batched cond) may hold any parameters
        return
    p = eqn.params
    dist = p["dist"]
    params = tuple(ins[offset:offset + p["n_params"]])
    observed = offset == 1
    line = jx.source_line(eqn) if observed else None
    where = f"the observation {line}" if observed else _address(eqn)
    within = _within()
    gate = _gate(jaxpr)
    with _support_scope():
        checks = [(ok, m, None) for ok, m in dist.check_params(*params)]
        head = f"invalid parameters for gv.{dist.name} at {where}{within}"
        _emit(checks, gate, lambda bad: f"{head}: {'; '.join(bad)}. {_FIX_PARAMS}")
        if observed and value:
            _check_value(dist, ins[0], params, gate, f"invalid observation for gv.{dist.name} "
                         f"at {line}{within}", _FIX_VALUE)


def check_read_value(eqn: Any, ins: list, value: Any, jaxpr: Any = None) -> None:
    """Emit the run-time check of a value read from a choice map at a site (scored by
    `log_density`): inside the distribution's support.

    Example:
        >>> from genvi.validation import check_read_value   # called by the interpreters
    """
    if not enabled() or eqn.params.get("masked"):
        return
    p = eqn.params
    dist = p["dist"]
    within = _within()
    with _support_scope():
        _check_value(dist, value, tuple(ins[:p["n_params"]]), _gate(jaxpr),
                     f"invalid value for gv.{dist.name} at {_address(eqn)}{within}", _FIX_READ)


def _within() -> str:
    """" in program 'g'" for the entry point being validated, or ""."""
    return f" in {_PROGRAM.get()}" if _PROGRAM.get() else ""


def _address(eqn: Any) -> str:
    return f"address {'/'.join(map(str, eqn.params['addr']))!r}"


def _support_scope() -> Any:
    """Checks are support tests, not uses of a value (for the smoothness check)."""
    from genvi.adev.smoothness import density_scope  # noqa: PLC0415 - imports tracing
    return density_scope()


def _check_value(dist: Any, value: Any, params: tuple, gate: Any, head: str, fix: str) -> None:
    value = jax.lax.stop_gradient(jnp.asarray(value))
    params = tuple(jax.lax.stop_gradient(q) for q in params)
    checks = [(ok, f"the value {m}", value) for ok, m in dist.check_value(value, *params)]
    _emit(checks, gate, lambda bad: f"{head}: {'; '.join(bad)}. {fix}")


def _emit(checks: list, gate: Any, message: Callable[[list], str]) -> None:
    """One host callback for a list of `(condition, meaning, value or None)`; the
    callback raises `InvalidParameters(message(failed meanings))`. Each condition is
    reduced on the device to (holds, number of failing entries, a failing value);
    where `gate` (a boolean, None: everywhere) is False, the site does not run."""
    if not checks:
        return
    if gate is not None:
        checks = [(jnp.asarray(ok) | ~gate, m, value) for ok, m, value in checks]
    parts = [_summary(ok, value) for ok, _, value in checks]
    oks, counts, examples = (jnp.stack(col) for col in zip(*parts))
    meanings = [m for _, m, _ in checks]
    counted = [value is not None for _, _, value in checks]

    def report(oks, counts, examples):
        oks, counts, examples = np.asarray(oks), np.asarray(counts), np.asarray(examples)
        if oks.all():
            return
        bad = []
        for i in np.flatnonzero(~oks):
            if not counted[i]:
                bad.append(meanings[i])
            elif counts[i] > 1:
                bad.append(f"{meanings[i]} ({counts[i]} entries fail, e.g. {examples[i]:g})")
            else:
                bad.append(f"{meanings[i]} (got {examples[i]:g})")
        _raise(InvalidParameters(message(bad)))

    _callback(report)(oks, counts, examples)


def _summary(ok: Any, value: Any) -> tuple:
    ok = jnp.asarray(ok, bool)
    bad = jnp.ravel(~ok)
    example = jnp.zeros((), jnp.float32)
    if value is not None and jnp.shape(value) == ok.shape and ok.size:
        example = jnp.ravel(value)[jnp.argmax(bad)].astype(jnp.float32)
    return ~jnp.any(bad), jnp.sum(bad, dtype=jnp.int32), example


def _callback(report: Callable) -> Callable:
    """`report(oks, counts, examples)` as a debug callback that runs once per
    execution under `vmap` too (JAX would unroll one callback per lane): the batch is
    reduced first, keeping the first failing lane's example."""
    @custom_vmap
    def check(oks, counts, examples):
        jax.debug.callback(report, oks, counts, examples)
        return oks

    @check.def_vmap
    def batched(size, in_batched, oks, counts, examples):
        oks, counts, examples = (x if b else jnp.broadcast_to(x, (size,) + x.shape)
                                 for x, b in zip((oks, counts, examples), in_batched))
        first = jnp.argmax(~oks, axis=0)
        example = jnp.take_along_axis(examples, first[None], axis=0)[0]
        return check(oks.all(0), counts.sum(0), example), False

    return check
