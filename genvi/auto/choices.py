"""`gv.AUTO` in the estimator: each AUTO site's candidates, the untuned choice (the
first candidate the rest of the objective allows, in rank order), and `Tuned`, an
objective whose AUTO sites take a tuning's choices.

A site's candidates are the built-in strategies its distribution supports, in rank
order, with REINFORCE as RLOO(2) (leave-one-out baselines for one more evaluation);
where REINFORCE is the only one, RLOO(2), RLOO(4) and RLOO(8), so that the number of
samples is measured too. SWOR(k) and RELAX, which need a k or the user's surrogate,
are not candidates (docs/which_estimator.md: where SWOR(2) was measured, it had
RLOO(2)'s variance at more cost). Whether the rest of the objective allows a candidate is
decided by the checks that refuse misuse: a candidate is tried by tracing the
estimator with it (`jax.eval_shape`, nothing runs), and a refusal (REPARAM before a
discontinuity, RLOO with vector values in a scan, ...) rules it out. Choices are
resolved where a site is bound in an objective's trace (`genvi.core.primitives`), so
the estimator, `explain` and every check see an ordinary strategy.

Example:
    >>> import genvi as gv
    >>> from genvi.auto.choices import candidates
    >>> candidates(gv.flip)
    (gv.ENUM, gv.RLOO(2), gv.MVD, gv.DisARM, gv.SD)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from genvi.adev.expectation import Expectation
from genvi.adev.strategies import RLOO
from genvi.core.context import using
from genvi.core.strategy import PlaceholderSite, Strategy, built_in_strategies
from genvi.core.address import Address


class Auto(Strategy):
    """`gv.AUTO`: the site's strategy is chosen by genvi among those the distribution
    supports and the rest of the objective allows. An objective run under a tuning
    (`gv.tune`, or `gv.fit`, which tunes at its start) takes the measured choice; an
    untuned one takes the first allowed strategy in rank order. It is a placeholder
    (`Strategy.placeholder`): resolved where the site is bound in an objective's
    trace, so the estimator never sees it.

    Example:
        >>> import genvi as gv
        >>> gv.flip(0.3, grad=gv.AUTO).strategy
        gv.AUTO
    """

    kind = "AUTO"
    placeholder = True

    def jvp(self, dist: Any, key: jax.Array, primals: tuple, tangents: tuple,
            k: Any) -> Any:  # pragma: no cover - resolved earlier
        raise RuntimeError(f"gv.AUTO at a gv.{dist.name} site reached the estimator "
                           "unresolved; objectives resolve it when they are traced")

    def check_site(self, dist: Any, where: str) -> None:
        if not built_in_strategies(dist):
            raise ValueError(f"grad=gv.AUTO{where}: gv.{dist.name} supports no built-in "
                             "gradient strategy to choose from; give one of its own with grad=")

    def default_strategies(self, sites: list, allowed: Any) -> tuple[tuple, list]:
        return default_choices(sites, allowed)


AUTO = Auto()


def candidates(dist: Any) -> tuple:
    """The strategies `gv.AUTO` considers at a `dist` site, in rank order.

    Example:
        >>> import genvi as gv
        >>> candidates(gv.normal)
        (gv.REPARAM, gv.RLOO(2), gv.MVD)
    """
    built_in = built_in_strategies(dist)
    if only_reinforce(dist):
        return (RLOO(2), RLOO(4), RLOO(8))
    # DisARM takes its whole-site form by itself where lane-by-lane replays would
    # cost more (a datapoint's latent vector), so one DisARM candidate covers both
    return tuple(RLOO(2) if s.score_function else s for s in built_in)


def only_reinforce(dist: Any) -> bool:
    """Whether the only built-in strategies `dist` supports are score-function ones
    (REINFORCE's family: `Strategy.score_function`)."""
    built_in = built_in_strategies(dist)
    return bool(built_in) and all(s.score_function for s in built_in)


def placeholder(dist: Any) -> Any:
    """What another AUTO site takes while one site's candidates are tried: REINFORCE
    where supported (it works wherever the distribution is scorable), else the first
    candidate."""
    built_in = built_in_strategies(dist)
    return next((s for s in built_in if s.score_function), built_in[0])


def default_choices(sites: list[PlaceholderSite],
                    allowed: Any) -> tuple[tuple, list[PlaceholderSite]]:
    """The untuned choice at each site: its first candidate for which `allowed(choices)`
    (a trial trace of the estimator) returns None rather than a refusal's message,
    with the other sites at their placeholders. Returns (choices, the sites with their
    defaults and refusals)."""
    chosen: dict = {}
    resolved = []
    for site in sites:
        refused = []
        for candidate in candidates(site.dist):
            trial = {s.addr: placeholder(s.dist) for s in sites}
            trial.update(chosen)
            trial[site.addr] = candidate
            message = allowed(tuple(trial.items()))
            if message is None:
                chosen[site.addr] = candidate
                break
            refused.append((candidate, message))
        else:
            raise ValueError(
                f"grad=gv.AUTO at {site.name!r} ({site.dist.label}): the objective refuses "
                f"every candidate: " + "; ".join(f"{c!r}: {m}" for c, m in refused))
        resolved.append(dataclasses.replace(site, default=chosen[site.addr],
                                            refused=tuple(refused)))
    return tuple(chosen.items()), resolved


class Tuned(Expectation):
    """`objective` with its `gv.AUTO` sites at `choices` ((address, strategy) pairs);
    `table` (text) is what `explain` adds below its sites.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.expectation
        ... def e(p):
        ...     return gv.sample(gv.flip(p, grad=gv.AUTO), name="b") * 1.0
        >>> tuned = Tuned(e, ((("b",), gv.MVD),))
        >>> tuned.explain(0.3).sites[0]["strategy"]
        'gv.AUTO → gv.MVD'
    """

    def __init__(self, objective: Expectation, choices: tuple, table: str = ""):
        super().__init__()
        self.objective, self.choices, self.table = objective, tuple(choices), table
        self.name = getattr(objective, "_label", "objective")

    def dual_estimate(self, key, args, targs):
        with using(site_strategies=self.choices):
            return self.objective.dual_estimate(key, args, targs)

    def explain(self, *args: Any, key: jax.Array | None = None, argnums: Any = 0) -> Any:
        explanation = super().explain(*args, key=key, argnums=argnums)
        names = {str(Address(addr)): s for addr, s in self.choices}
        for site in explanation.sites:
            if site["addr"] in names:
                site["strategy"] = f"gv.AUTO → {site['strategy']}"
        if self.table:
            explanation.notes.append(self.table)
        return explanation

    def __repr__(self) -> str:
        return f"<{self.name} with gv.AUTO at " + ", ".join(
            f"{'/'.join(map(str, a))}: {s!r}" for a, s in self.choices) + ">"
