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
    >>> from genvi.adev.auto import candidates
    >>> candidates(gv.flip)
    (gv.ENUM, gv.RLOO(2), gv.MVD, gv.DisARM, gv.SD)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax

from genvi.adev.expectation import Expectation
from genvi.adev.strategies import RLOO
from genvi.core import jaxpr as jx
from genvi.core.context import current, using
from genvi.core.primitives import SiteEqn, sample_p
from genvi.core.strategy import Auto, built_in_strategies

# what a refused candidate raises while its estimator is traced
REFUSALS = (ValueError, TypeError, NotImplementedError)


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


@dataclass(frozen=True)
class AutoSite:
    """A `gv.AUTO` site found in an objective's trace: its address and distribution,
    and the strategy it takes untuned (`default`, with the refusals of the candidates
    ranked before it)."""

    addr: tuple
    dist: Any
    default: Any = None
    refused: tuple = ()

    @property
    def name(self) -> str:
        return "/".join(map(str, self.addr)) if self.addr else "(gv.sample)"


def auto_sites(closed: Any) -> list[AutoSite]:
    """The `gv.AUTO` sites still unresolved in a traced objective, in order."""
    found: dict = {}
    for eqn, _ in jx.equations(closed):
        if eqn.primitive is sample_p:
            view = SiteEqn.of(eqn)
            if isinstance(view.strategy, Auto):
                if not view.addr:
                    raise ValueError(
                        f"grad=gv.AUTO at an unnamed gv.sample of gv.{view.dist.name}: its "
                        "choice is recorded by address; name it, gv.sample(..., name=\"b\")")
                found.setdefault(view.addr, AutoSite(view.addr, view.dist))
    return list(found.values())


def placeholder(dist: Any) -> Any:
    """What another AUTO site takes while one site's candidates are tried: REINFORCE
    where supported (it works wherever the distribution is scorable), else the first
    candidate."""
    built_in = built_in_strategies(dist)
    return next((s for s in built_in if s.score_function), built_in[0])


def default_choices(sites: list[AutoSite], allowed: Any) -> tuple[tuple, list[AutoSite]]:
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
                f"grad=gv.AUTO at {site.name!r} (gv.{site.dist.name}): the objective refuses "
                f"every candidate: " + "; ".join(f"{c!r}: {m}" for c, m in refused))
        resolved.append(AutoSite(site.addr, site.dist, chosen[site.addr], tuple(refused)))
    return tuple(chosen.items()), resolved


def refusal(trace: Any) -> str | None:
    """None if `trace()` (a trial trace under `jax.eval_shape`) succeeds, else the
    first line of the refusal it raised."""
    try:
        trace()
    except REFUSALS as err:
        return str(err).split("\n")[0]
    return None


def note_sites(sites: list[AutoSite]) -> None:
    """Hand the sites to a tuning that is collecting them (the run context's list)."""
    log = current().auto_sites
    if log is not None:
        for site in sites:
            if all(s.addr != site.addr for s in log):
                log.append(site)


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
        with using(choices=self.choices):
            return self.objective.dual_estimate(key, args, targs)

    def explain(self, *args: Any, key: jax.Array | None = None, argnums: Any = 0) -> Any:
        explanation = super().explain(*args, key=key, argnums=argnums)
        names = {"/".join(map(str, addr)): s for addr, s in self.choices}
        for site in explanation.sites:
            if site["addr"] in names:
                site["strategy"] = f"gv.AUTO → {site['strategy']}"
        if self.table:
            explanation.notes.append(self.table)
        return explanation

    def __repr__(self) -> str:
        return f"<{self.name} with gv.AUTO at " + ", ".join(
            f"{'/'.join(map(str, a))}: {s!r}" for a, s in self.choices) + ">"
