"""`gv.sample`: an unnamed random choice inside an `@gv.expectation` objective."""

from __future__ import annotations

from typing import Any

from genvi.core.primitives import bind_site, sample_p
from genvi.core.strategy import check_strategy, missing_strategy_error
from genvi.core.tracing import IN_OBJECTIVE
from genvi.distributions.base import DistCall


def sample(call: DistCall, name: str | None = None) -> Any:
    """Draw a value from `call` with its gradient strategy, inside an objective.

    Args:
        call: a distribution call, e.g. `gv.normal(mu, 1.0, grad=gv.REPARAM)`; its
            `grad` is the site's strategy.
        name: the site's name in `explain`'s report and in error messages (optional).

    Returns:
        the drawn value (an array of the distribution's event shape).

    Example:
        >>> import genvi as gv, jax
        >>> @gv.expectation
        ... def e(p):
        ...     return jax.numpy.where(gv.sample(gv.flip(p, grad=gv.ENUM)), 1.0, 0.0)
        >>> float(e.grad_estimate(jax.random.key(0), 0.3))
        1.0
    """
    if not IN_OBJECTIVE:
        raise RuntimeError("gv.sample(...) belongs inside an @gv.expectation objective; in a "
                           "@gv.gen program use `dist(...) @ \"address\"`.")
    if not isinstance(call, DistCall):
        raise TypeError(f"gv.sample needs a distribution call such as gv.flip(p, grad=gv.ENUM); got {call!r}")
    addr = (name,) if name else ()
    if call.strategy is None:
        raise missing_strategy_error(call.dist, addr)
    check_strategy(call.dist, call.strategy, addr)
    return bind_site(sample_p, call.dist, call.params, call.strategy, addr)
