"""Placeholder strategies (`gv.AUTO`) resolved before a run, by address.

An objective is traced with its placeholder sites (`Strategy.placeholder`) as they
are, so one trace serves every choice. Where a run begins, its estimator rewrites the
traced jaxpr (`resolved`): each placeholder site takes the strategy its address is
given (a tuning's choices, read once from the run context), and nothing reads the
choices again, at a site or elsewhere. Placeholder sites left over take their
placeholder's defaults (`Strategy.default_strategies`), each choice tried with a trial
trace of the estimator (`refusal`: nothing runs), and are reported to the run's
observer. Nothing here names a placeholder: `gv.AUTO`'s rules live in `genvi.auto`.

Example:
    >>> import genvi as gv, jax
    >>> @gv.expectation
    ... def e(p):
    ...     return gv.sample(gv.flip(p, grad=gv.AUTO), name="b") * 1.0
    >>> closed, _ = e.trace(0.3)
    >>> [(s.name, s.strategy) for s in placeholder_sites(closed)]
    [('b', gv.AUTO)]
"""

from __future__ import annotations

from typing import Any, Callable

from genvi.core import jaxpr as jx
from genvi.core.mistakes import addr_name
from genvi.core.primitives import SiteEqn, sample_p
from genvi.core.strategy import PlaceholderSite

# what a refused choice raises while its estimator is traced
REFUSALS = (ValueError, TypeError, NotImplementedError)


def placeholder_sites(closed: Any) -> list[PlaceholderSite]:
    """The sites of a traced objective whose strategy is still a placeholder, in order
    (one record per address).

    Args:
        closed: the objective's closed jaxpr.

    Returns:
        A `PlaceholderSite` per address.
    """
    found: dict = {}
    for eqn, _ in jx.equations(closed):
        if eqn.primitive is sample_p:
            view = SiteEqn.of(eqn)
            strategy = view.strategy
            if strategy is not None and strategy.placeholder:
                if not view.addr:
                    raise ValueError(
                        f"grad={strategy!r} at an unnamed gv.sample of gv.{view.dist.name}: "
                        "its choice is recorded by address; name it, "
                        "gv.sample(..., name=\"b\")")
                found.setdefault(view.addr, PlaceholderSite(view.addr, view.dist, strategy))
    return list(found.values())


def resolved(closed: Any, choices: tuple) -> Any:
    """`closed` with its placeholder sites at the strategies `choices` give their
    addresses (the first pair for an address counts; a site no pair names keeps its
    placeholder). A choice is static: a strategy with operands (a baseline's value)
    is refused, since the trace has no operand for it.

    Args:
        closed: an objective's closed jaxpr.
        choices: (address, strategy) pairs.

    Example:
        >>> import genvi as gv
        >>> @gv.expectation
        ... def e(p):
        ...     return gv.sample(gv.flip(p, grad=gv.AUTO), name="b") * 1.0
        >>> closed, _ = e.trace(0.3)
        >>> [s.strategy for s in placeholder_sites(resolved(closed, ((("b",), gv.MVD),)))]
        []
    """
    chosen: dict = {}
    for addr, strategy in choices:
        chosen.setdefault(addr, strategy)
    if not chosen:
        return closed

    def choose(eqn: Any) -> Any:
        if eqn.primitive is not sample_p:
            return eqn
        view = SiteEqn.of(eqn)
        if view.strategy is None or not view.strategy.placeholder or view.addr not in chosen:
            return eqn
        static, operands = chosen[view.addr].split()
        if operands:
            raise ValueError(
                f"{view.strategy!r} at {addr_name(view.addr)!r} (gv.{view.dist.name}): the choice "
                f"{chosen[view.addr]!r} carries operands (a value it learns or is given), "
                "but a placeholder's choice must be static; choose a strategy without "
                "operands, or write that strategy at the site with grad=")
        return view.with_strategy(static)

    return jx.map_equations(closed, choose)


def default_strategies(sites: list[PlaceholderSite],
                       allowed: Callable[[tuple], str | None]) -> tuple[tuple, list]:
    """The strategies placeholder `sites` take where nothing chose one, as their
    placeholder's `default_strategies` rules (one kind of placeholder per objective).

    Args:
        sites: `placeholder_sites`' records.
        allowed: None if the objective accepts a tuple of (address, strategy) pairs,
            else the refusal's first line.

    Returns:
        (the (address, strategy) pairs, the sites with their defaults).
    """
    kinds = {type(s.strategy) for s in sites}
    if len(kinds) > 1:
        raise NotImplementedError(
            "an objective with placeholder strategies of several kinds ("
            + ", ".join(sorted(repr(s.strategy) for s in sites)) + "): give each site "
            "one of them")
    return sites[0].strategy.default_strategies(sites, allowed)


def refusal(trace: Callable[[], Any]) -> str | None:
    """None if `trace()` (a trial trace, under `jax.eval_shape`) succeeds, else the
    first line of the refusal it raised.

    Example:
        >>> refusal(lambda: None) is None, refusal(lambda: int("x"))
        (True, "invalid literal for int() with base 10: 'x'")
    """
    try:
        trace()
    except REFUSALS as err:
        return str(err).split("\n")[0]
    return None
