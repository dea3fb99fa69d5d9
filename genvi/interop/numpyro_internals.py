"""NumPyro's private names, read here and nowhere else: the one module of genvi that
depends on what NumPyro does not promise to keep, as `genvi.core.jaxpr` is for JAX.

`gv.from_numpyro` answers NumPyro's effects from the bottom of its handler stack
(`numpyro_effects`). Its public protocol (`Messenger`, the message's `name`, `fn`,
`value`, `infer`, `scale`) is read there; three things beyond it are read here:

* the handler stack itself, `numpyro.primitives._PYRO_STACK`: which handlers sit above
  genvi's messenger (a mask or scale around a scan would not reach its steps);
* a sample message's `kwargs` hold its `sample_shape`; a plate's `args` are
  `(size, subsample_size)`;
* a `contrib.control_flow.scan` message: its `fn` is `scan_wrapper`, its `args` are
  `(f, init, xs, length, reverse)` and its `kwargs` hold the `substitute_stack`;
* the value such a message answers, `((length, rng_key, carry), (PytreeTrace(trace),
  ys))`, which NumPyro's `scan` unpacks.

A NumPyro release that renames one of these names fails when this module is imported,
naming the release and what genvi reads it for; `check_scan_layout()` runs a NumPyro
scan through `read_scan` and `answer_scan` and fails if the message's layout moved.
`tests/test_numpyro_fence.py` runs both on the two NumPyro releases CI installs
(`TESTED`, the ends of the range in `pyproject.toml`) and checks that no other module
reads a private NumPyro name.

Example:
    >>> import numpyro
    >>> handler = numpyro.handlers.seed(rng_seed=0)
    >>> with handler:
    ...     handlers_above(handler)
    []
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpyro
from numpyro import handlers as nh
from numpyro import primitives as numpyro_primitives

# the module, not the function `numpyro.contrib.control_flow.scan` that shadows its name
numpyro_scan = importlib.import_module("numpyro.contrib.control_flow.scan")

#: the oldest and the newest NumPyro release CI runs genvi against (constraints/)
TESTED = ("0.21.0", "0.22.0")


class NumPyroInternalsChanged(ImportError):
    """The installed NumPyro no longer has a private name, or a message layout, that
    `gv.from_numpyro` reads (see the module docstring)."""


def _read(module: Any, name: str, why: str) -> Any:
    """`module.name`, or an error naming the NumPyro release and what genvi needs."""
    try:
        return getattr(module, name)
    except AttributeError:
        raise NumPyroInternalsChanged(
            f"NumPyro {numpyro.__version__} has no {module.__name__}.{name}, which "
            f"gv.from_numpyro reads ({why}); genvi is tested with NumPyro {TESTED[0]} to "
            f"{TESTED[1]}: install one of those (pip install 'numpyro>={TESTED[0]},"
            f"<={TESTED[1]}') or a genvi release that supports {numpyro.__version__}"
        ) from None


_HANDLER_STACK: list = _read(numpyro_primitives, "_PYRO_STACK",
                             "the handlers above genvi's messenger")
_SCAN_FN: Callable = _read(numpyro_scan, "scan_wrapper",
                           "what a contrib.control_flow.scan message carries")
_PYTREE_TRACE: type = _read(numpyro_scan, "PytreeTrace",
                            "the value a scan message answers")


def handlers_above(messenger: Any) -> list:
    """The handlers NumPyro applies to a message before `messenger` sees it (those
    entered after it, innermost first).

    Example:
        >>> outer, inner = nh.seed(rng_seed=0), nh.block()
        >>> with outer, inner:
        ...     [type(h).__name__ for h in handlers_above(outer)]
        ['block']
    """
    return list(_HANDLER_STACK[_HANDLER_STACK.index(messenger) + 1:])


def sample_shape(msg: dict) -> tuple:
    """A sample message's `sample_shape` (`numpyro.sample(..., sample_shape=)`).

    Example:
        >>> sample_shape({"type": "sample", "kwargs": {"sample_shape": (2,)}})
        (2,)
    """
    return tuple(msg["kwargs"].get("sample_shape", ()))


def plate_sizes(msg: dict) -> tuple[int, int]:
    """A plate message's `(size, subsample_size)`.

    Example:
        >>> plate_sizes({"type": "plate", "args": (10, 3)})
        (10, 3)
    """
    size, count = msg["args"]
    return size, count


class ScanMessage(NamedTuple):
    """A `contrib.control_flow.scan` message's request: the scanned function, its
    initial carry and inputs, the length (None: the inputs' leading length), the
    direction, and the `(kind, values)` pairs of the `condition` and `substitute`
    handlers (and others) that met it on its way down."""

    body: Callable
    init: Any
    xs: Any
    length: int | None
    reverse: bool
    substitutions: tuple


def is_scan(msg: dict) -> bool:
    """Whether a control-flow message is `contrib.control_flow.scan`'s.

    Example:
        >>> is_scan({"type": "control_flow", "fn": print})
        False
    """
    return msg["fn"] is _SCAN_FN


def read_scan(msg: dict) -> ScanMessage:
    """The request a scan message carries (see `ScanMessage`).

    Example:
        >>> read_scan({"fn": _SCAN_FN, "args": (abs, 0.0, None, 3, False),
        ...            "kwargs": {"substitute_stack": []}}).length
        3
    """
    body, init, xs, length, reverse = msg["args"]
    subs = tuple(msg["kwargs"].get("substitute_stack", ()))
    return ScanMessage(body, init, xs, length, reverse, subs)


def answer_scan(msg: dict, length: int | None, carry: Any, ys: Any) -> None:
    """Answer a scan message with its final carry and stacked outputs, and no sites for
    NumPyro's scan to send again (genvi has run them).

    Example:
        >>> msg = {"fn": _SCAN_FN, "value": None}
        >>> answer_scan(msg, 3, 0.0, None)
        >>> msg["value"][0]
        (3, None, 0.0)
    """
    msg["value"] = ((length, None, carry), (_PYTREE_TRACE({}), ys))


class _AnswerScans(numpyro_primitives.Messenger):
    """Answers every scan message by running its body with `jax.lax.scan`."""

    def process_message(self, msg: dict) -> None:
        if msg["type"] == "control_flow" and is_scan(msg):
            request = read_scan(msg)
            carry, ys = jax.lax.scan(request.body, request.init, request.xs,
                                     length=request.length, reverse=request.reverse)
            answer_scan(msg, request.length, carry, ys)


def check_scan_layout() -> None:
    """Run a NumPyro scan whose message is read and answered by this module; raise
    `NumPyroInternalsChanged` if NumPyro's scan reads the answer differently (its
    message's layout moved).

    Example:
        >>> check_scan_layout()
    """
    def body(carry: Any, x: Any) -> tuple:
        return carry + x, 2.0 * x

    cause: Exception | None
    try:
        with nh.seed(rng_seed=0), _AnswerScans():
            carry, ys = numpyro_scan.scan(body, 1.0, jnp.arange(3.0))
        ok = float(carry) == 4.0 and [float(y) for y in ys] == [0.0, 2.0, 4.0]
    except (TypeError, ValueError, KeyError, AttributeError) as err:
        ok, cause = False, err
    else:
        cause = None
    if not ok:
        raise NumPyroInternalsChanged(
            f"NumPyro {numpyro.__version__}'s contrib.control_flow.scan message no longer "
            "has the layout gv.from_numpyro reads ((f, init, xs, length, reverse) in, "
            f"((length, rng_key, carry), (PytreeTrace, ys)) out); genvi is tested with "
            f"NumPyro {TESTED[0]} to {TESTED[1]}") from cause
