"""Addresses: the prefix and combinator nesting of the code being traced, and the
binding of `dist(...) @ "x"` as a sampling site.

Inside a `@gv.gen` program every site records its address (the prefixes of the
sub-program calls around it, then its own name) and the `gv.vmap` / `gv.scan`
combinators enclosing it, outermost first (so choices can be laid out in nesting
order, see `genvi.gen.sites.to_user_layout`). Both are `jax.make_user_context`
values: part of the key of JAX's trace caches, so a function JAX traced once (a
`lax.scan` body, a jitted helper) and meets again under another address is traced
again, not reused with the first address's sites.

Example:
    >>> from genvi.core.addressing import current_prefix, prefixed
    >>> with prefixed(("layer",)):
    ...     current_prefix("a site")
    ('layer',)
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import jax

from genvi.core.primitives import bind_site, site_p
from genvi.core.strategy import check_strategy
from genvi.core.tracing import note_site_value

_PREFIX = jax.make_user_context(default_value=None)
_NEST = jax.make_user_context(default_value=())


def nested(kind: str, fn: Callable) -> Callable:
    """`fn` traced inside one more combinator of `kind` ("vmap" or "scan")."""
    def wrapped(*args):
        with _NEST(_NEST.value + (kind,)):
            return fn(*args)
    return wrapped


def nesting() -> tuple:
    """The combinators enclosing the code being traced, outermost first."""
    return _NEST.value


@contextlib.contextmanager
def prefixed(prefix: tuple) -> Iterator[None]:
    """Trace the code inside under the address prefix `prefix` (`()`: a program's root)."""
    with _PREFIX(prefix):
        yield


def current_prefix(what: str) -> tuple:
    """The address prefix here; outside a `@gv.gen` program an error saying that
    `what` belongs inside one."""
    prefix = _PREFIX.value
    if prefix is None:
        raise RuntimeError(
            f"{what} must be used inside a @gv.gen program. Inside an @gv.expectation "
            "objective, draw unnamed values with gv.sample(dist(...)) or call a program's "
            ".sim(...) / .log_density(...).")
    return prefix


def check_address(addr: Any) -> None:
    """Raise a `TypeError` unless `addr` is a string address, and a `ValueError` if it
    contains '/', the separator of nested addresses ("outer/inner")."""
    if not isinstance(addr, str):
        raise TypeError(f"addresses are strings, as in `gv.normal(0, 1) @ \"x\"`; got {addr!r} "
                        f"({type(addr).__name__}). For one site per index use f\"x{{i}}\" in a "
                        "Python loop over a static range, or better gv.vmap / gv.scan, which "
                        "stack the choices at one address.")
    if "/" in addr:
        raise ValueError(f"the address {addr!r} contains '/', which separates the parts of a "
                         "nested address in choice maps and summaries (\"outer/inner\" is the "
                         "site \"inner\" of the sub-program called at \"outer\"). Name the site "
                         f"without it, e.g. {addr.replace('/', '_')!r}, or call a sub-program at "
                         f"{addr.split('/')[0]!r}.")


def sample_site(call: Any, addr: str, batch_axes: int = 0, auxiliary: bool = False) -> Any:
    """`call @ addr` for a distribution call: bind a sampling site at `addr` under the
    current prefix, checking the call's strategy (if any) against its distribution.
    `batch_axes`: how many leading axes of the value are lanes of a plate that is not a
    `vmap` (a NumPyro plate's dimensions); `auxiliary`: scored in the program's density,
    not one of its choices (a NumPyro autoguide's joint latent)."""
    check_address(addr)
    where = current_prefix(f"`... @ {addr!r}`") + (addr,)
    if call.strategy is not None:
        check_strategy(call.dist, call.strategy, where)
    value = bind_site(site_p, call.dist, call.params, call.strategy, where, nest=_NEST.value,
                      batch_axes=batch_axes, auxiliary=auxiliary)
    note_site_value(value, where)  # to name the latent a Python `if` may test
    return value
