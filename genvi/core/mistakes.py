"""Clear words for the mistakes a new user makes most often.

Each helper turns a raw error (a missing-argument `TypeError`, a broadcasting error
without an address, a bare `KeyError`) into one that names what went wrong, where,
and the fix; the original error stays chained (`raise ... from err`).

Example:
    >>> from genvi.core.mistakes import did_you_mean
    >>> did_you_mean(("z",), [("Z",), ("w",)])
    " Did you mean 'Z'?"
"""

from __future__ import annotations

import difflib
import inspect
import operator
import os
import sys
from types import FrameType
from typing import Any, Iterable, Mapping

import jax
import numpy as np

from genvi.core.jaxpr import GENVI_DIR
from genvi.core.address import Address



def addr_name(addr: Any) -> str:
    """An address path as the user writes it.

    Example:
        >>> addr_name(("layer", "z"))
        'layer/z'
    """
    return str(Address(addr)) if isinstance(addr, tuple) else str(addr)


def did_you_mean(missing: Any, candidates: Iterable[Any]) -> str:
    """`" Did you mean 'X'?"` for the closest candidate (case-insensitive), or `""`."""
    lowered = {addr_name(c).lower(): addr_name(c) for c in candidates}
    want = addr_name(missing).lower()
    close = difflib.get_close_matches(want, list(lowered), n=1, cutoff=0.6)
    if not close:  # the same site under another prefix ('z' for 'layer/z')
        last = want.rsplit("/", 1)[-1]
        close = [n for n in sorted(lowered) if n.rsplit("/", 1)[-1] == last][:1]
    return f" Did you mean {lowered[close[0]]!r}?" if close else ""


# --------------------------------------------------------------------------- PRNG keys

def is_key(x: Any) -> bool:
    """A single PRNG key: new-style (`jax.random.key`) or legacy uint32[2], traced or not.

    Example:
        >>> is_key(jax.random.key(0)), is_key(jax.random.PRNGKey(0)), is_key(1.0)
        (True, True, False)
    """
    dtype = getattr(x, "dtype", None)
    if dtype is None:
        return False
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return np.shape(x) == ()
    return dtype == np.uint32 and np.shape(x) == (2,)


def is_count(value: Any, minimum: int = 1) -> bool:
    """Whether `value` is an int (not a bool) of at least `minimum`: a number of
    samples, a chunk size.

    Example:
        >>> is_count(3), is_count(0), is_count(True), is_count(2.0), is_count(1, minimum=2)
        (True, False, False, False, False)
    """
    return (not isinstance(value, bool) and hasattr(value, "__index__")
            and operator.index(value) >= minimum)


def checked_count(value: Any, name: str, where: str, minimum: int = 1, what: str = "") -> int:
    """`value` as an int, or a `ValueError` naming the argument unless it is an int (not
    a bool) of at least `minimum`.

    Args:
        value: the argument given.
        name: its name (`particles`).
        where: the call it was given to (`gv.iwelbo`).
        minimum: the least value allowed.
        what: what the number counts, for the message.

    Returns:
        `value` as an int.

    Example:
        >>> try:
        ...     checked_count(0, "particles", "gv.iwelbo", what="guide particles")
        ... except ValueError as e:
        ...     print(e)
        gv.iwelbo: particles=0 must be a positive integer (the number of guide particles)
    """
    if is_count(value, minimum):
        return operator.index(value)
    need = ("a positive integer" if minimum == 1 else "a non-negative integer" if minimum == 0
            else f"an integer >= {minimum}")
    counts = f" (the number of {what})" if what else ""
    raise ValueError(f"{where}: {name}={value!r} must be {need}{counts}")


def user_stacklevel(skip: tuple[str, ...] = (GENVI_DIR + os.sep,)) -> int:
    """`warnings.warn`'s stacklevel, for its caller, of the first frame whose file is
    not under `skip` (genvi's folder by default): a warning raised deep inside genvi
    points at the user's line that called it, whatever wraps that call.

    Example:
        >>> import warnings
        >>> def warn_from_library():
        ...     warnings.warn("a warning", stacklevel=user_stacklevel(skip=()))
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_from_library()
        >>> caught[0].lineno == warn_from_library.__code__.co_firstlineno + 1
        True
    """
    frame: FrameType | None
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame, level = frame.f_back, level + 1
    return level


def _describe(x: Any) -> str:
    if hasattr(x, "dtype") and hasattr(x, "shape"):
        return f"an array of shape {tuple(x.shape)} and dtype {x.dtype}"
    text = repr(x)
    return f"{text if len(text) < 40 else text[:37] + '...'} ({type(x).__name__})"


def check_key(key: Any, call: str) -> None:
    """Raise a `TypeError` unless `key` is one PRNG key; `call` is e.g. `"g.simulate"`."""
    if is_key(key):
        return
    dtype = getattr(key, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key) or (
            dtype == np.uint32 and np.shape(key)[-1:] == (2,)):
        raise TypeError(
            f"{call}(key, *args) takes one PRNG key; got a batch of keys ({_describe(key)}). "
            f"Map over keys with jax.vmap(lambda k: {call}(k, ...))(keys).")
    raise TypeError(
        f"{call}(key, *args) needs a PRNG key as its first argument, e.g. "
        f"{call}(jax.random.key(0), ...); got {_describe(key)} as the key. "
        "Did you forget the key?")


# --------------------------------------------------------------------------- shapes at sites

def is_shape_error(err: BaseException) -> bool:
    """Whether a JAX error is about incompatible shapes (what broadcasting raises)."""
    text = str(err).lower()
    return isinstance(err, (ValueError, TypeError)) and ("shape" in text or "broadcast" in text)


def _param_shapes(dist: Any, shapes: list) -> str:
    names = list(getattr(dist, "param_names", ()) or ())
    names += [f"parameter {i}" for i in range(len(names), len(shapes))]
    return ", ".join(f"{n} {tuple(s)}" for n, s in zip(names, shapes))


def site_shape_error(dist: Any, addr: Any, param_shapes: list, value_shape: Any = None,
                     observation: bool = False) -> ValueError:
    """The error for parameters (or an observed value) whose shapes do not broadcast."""
    if observation:
        where = f"an observation of gv.{dist.name}"
    elif not addr:
        where = f"an unnamed gv.sample of gv.{dist.name}"
    else:
        where = f"gv.{dist.name} at address {addr_name(addr)!r}"
    params = _param_shapes(dist, param_shapes)
    if value_shape is not None:
        return ValueError(
            f"shape mismatch in {where}: the observed value has shape {tuple(value_shape)} but "
            f"the parameters have shapes {params}, and they do not broadcast together. Pass a "
            "value with the parameters' shape (one entry per independent component), or give "
            "the parameters the value's shape (e.g. jnp.broadcast_to, x[:, None]).")
    return ValueError(
        f"shape mismatch in {where}: the parameters have shapes {params}, which do not "
        "broadcast together (NumPy rules). Give them one shape, or add axes so they "
        "broadcast (e.g. x[:, None], jnp.broadcast_to); under gv.vmap each parameter is "
        "per datapoint.")


# --------------------------------------------------------------------------- values that are not values

def not_a_value(what: str, example: str, in_objective: str, kind: type = TypeError) -> Exception:
    """The error for a distribution call or a program call used as a value.

    `kind` is ValueError where JAX looks the object up as an array (`__jax_array__`):
    jitted `jnp` functions catch a TypeError there and raise their own message."""
    return kind(
        f"{what} is not a value: it must be sampled first. Inside a @gv.gen program write "
        f"`{example} @ \"address\"`; inside an @gv.expectation objective use "
        f"{in_objective}.")


# --------------------------------------------------------------------------- missing dict keys

def arg_names(fn: Any) -> list | None:
    """The positional parameter names of `fn`, or None when they are unknown (`fn` None
    or not a function included)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return None
    names = [p.name for p in params
             if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return names or None


def _raised_in_genvi(err: BaseException) -> bool:
    tb = err.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    return last is not None and os.path.abspath(last.tb_frame.f_code.co_filename).startswith(GENVI_DIR)


def _dicts(x: Any, path: str) -> Iterable[tuple[str, Mapping]]:
    if isinstance(x, Mapping):
        yield path, x
        for k, v in x.items():
            yield from _dicts(v, f"{path}[{k!r}]")
    elif isinstance(x, (tuple, list)):
        for i, v in enumerate(x):
            yield from _dicts(v, f"{path}[{i}]")


class MissingKey(KeyError):
    """A dict argument of a program or objective lacks a key its body reads."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


def missing_key_error(err: KeyError, what: str, fn_name: str, args: tuple,
                      names: list | None = None) -> MissingKey | None:
    """A `MissingKey` naming `what` (e.g. "program 'model'"), the argument of
    `fn_name(...)` and the keys present, when `err` is a lookup of a key absent from a
    dict argument (None otherwise: the caller re-raises `err`)."""
    if type(err) is not KeyError or len(err.args) != 1 or _raised_in_genvi(err):
        return None
    key = err.args[0]
    found = []  # (no close match, -depth, argument, path, dict, hint) per dict lacking key
    for i, a in enumerate(args):
        label = names[i] if names and i < len(names) else f"argument {i}"
        for path, d in _dicts(a, label):
            try:
                absent = key not in d
            except TypeError:
                continue
            if absent and any(type(k) is type(key) for k in d):
                hint = did_you_mean(key, [k for k in d if isinstance(k, str)]) \
                    if isinstance(key, str) else ""
                found.append((not hint, -path.count("["), i, path, d, hint))
    if not found:
        return None
    # the dict with a close match, else the innermost one (params["enc"]["w"])
    _, _, i, path, d, hint = min(found, key=lambda f: f[:3])
    return MissingKey(
        f"{what} reads key {key!r} of {path} (argument {i} of {fn_name}(...)), which has "
        f"no such key; the keys present are {sorted(map(str, d))}.{hint} Add {key!r} to the "
        "dict (e.g. in the initial parameters) or fix the key's spelling.")


def check_returned(leaves: list, kind: str, name: str) -> None:
    """Raise a `TypeError` when a program or objective returns a distribution call or a
    program (call) that was never sampled at an address.

    Such objects say so themselves: their `genvi_unsampled()` method returns (what
    they are, how to sample them inside an objective).

    Example:
        >>> import genvi as gv
        >>> try:
        ...     check_returned([gv.normal(0.0, 1.0)], "program", "g")
        ... except TypeError as e:
        ...     print(str(e).split(",")[0])
        the program 'g' returns gv.normal(...)
    """
    for leaf in leaves:
        unsampled = getattr(type(leaf), "genvi_unsampled", None)
        if unsampled is None:
            continue
        what, fix = unsampled(leaf)
        raise TypeError(f"the {kind} {name!r} returns {what}, a distribution or program call, "
                        f"not a value. Sample it: `return {what} @ \"address\"` in a @gv.gen "
                        f"program, or {fix}.")
