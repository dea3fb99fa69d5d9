"""Opt-in validation of distribution parameters, reported by address even under jit.

Example:
    >>> import genvi as gv
    >>> with gv.validation():
    ...     pass   # g.simulate(...) here raises on the first invalid site
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import jax
import jax.numpy as jnp

_ENABLED = [False]


def set_validation(enabled: bool) -> None:
    """Turn validation on or off globally (affects programs traced afterwards)."""
    _ENABLED[0] = bool(enabled)


@contextlib.contextmanager
def validation(enabled: bool = True) -> Iterator[None]:
    """Context manager: validate site parameters in programs traced inside it.

    Each site's parameters are checked (a negative scale, a probability outside
    [0, 1], ...); an invalid one raises an error naming its address, its
    distribution and the condition, also inside `jax.jit`, `vmap` and `scan`.
    """
    old = _ENABLED[0]
    _ENABLED[0] = enabled
    try:
        yield
    finally:
        _ENABLED[0] = old


def enabled() -> bool:
    return _ENABLED[0]


class InvalidParameters(ValueError):
    """A sampling site or observation received invalid parameters."""


def check_site(eqn: Any, ins: list, offset: int = 0) -> None:
    """Emit a runtime check of a site's parameters (no-op when disabled)."""
    if not _ENABLED[0] or eqn.params.get("masked"):
        # masked sites (untaken lanes of a batched cond) may hold any parameters
        return
    p = eqn.params
    dist, addr = p["dist"], p["addr"]
    params = ins[offset:offset + p["n_params"]]
    checks = dist.check_params(*params)
    if not checks:
        return
    oks = jnp.stack([jnp.asarray(ok) for ok, _ in checks])
    messages = [m for _, m in checks]
    where = "/".join(map(str, addr)) if addr else "an observation"

    def report(oks):
        import numpy as np
        oks = np.asarray(oks)
        bad = [m for m, ok in zip(messages, oks.reshape(-1, len(messages)).T) if not ok.all()]
        if bad:
            raise InvalidParameters(
                f"invalid parameters for gv.{dist.name} at address {where!r}: {'; '.join(bad)}. "
                "Fix the values computed for this site (e.g. pass a scale through "
                "jnp.exp or jax.nn.softplus, a probability through jax.nn.sigmoid).")

    jax.debug.callback(report, oks)
