"""The gradient-strategy protocol that sampling sites carry, and its checks.

A site's `grad=` is a `Strategy`: a static, hashable object with a `kind` (its name
in messages), the capabilities it `needs` of a distribution (declared once, on the
strategy), and a `jvp` rule (defined in `genvi.adev`) that turns the site into a piece
of a forward-mode estimator. The generative language only needs the protocol: to check
a `grad=` where a site gets its address, and to name the strategies a distribution
supports when one is missing. A distribution declares capabilities, never strategy
names: which built-in strategies it supports is derived from `needs`
(`supported_kinds`).

A strategy that chooses among others (`gv.switch`) lists them in `strategies`; each
is checked.

Example:
    >>> import genvi as gv
    >>> from genvi.core.strategy import check_strategy
    >>> check_strategy(gv.normal, gv.REPARAM, ("x",))      # supported: no error
    >>> try:
    ...     check_strategy(gv.normal, gv.ENUM, ("x",))
    ... except ValueError as e:
    ...     print(e)
    gv.normal does not support the ENUM gradient strategy at address 'x' (it needs support of the distribution); it supports: gv.REPARAM, gv.REINFORCE, gv.MVD
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax

from genvi.core.continuation import Continuation, Continued
from genvi.core.address import Address


class Strategy:
    """Base class of gradient strategies.

    Subclasses set `kind` (its name in messages), declare in `needs` what their rule
    uses of a distribution, and define `jvp(dist, key, primals, tangents, k)` (see
    `genvi.adev.strategies`). Strategies are static (hashable); dynamic data such as
    a baseline value travels as operands through `split`/`join`.

    `needs` names the distribution's methods the rule calls (`sample`,
    `lane_log_prob`, `support`, `mvd_terms`, ...) and the capability flags it relies
    on (`reparameterized`: `sample` is differentiable in the parameters; `scorable`:
    the support does not move with the parameters, so a score is an unbiased
    gradient weight). Every distribution that has them all supports it, built-in or
    not, and a masked site (an untaken branch of a batched `cond`) hands the rule a
    distribution whose every density method is masked.

    Example:
        >>> import genvi as gv
        >>> isinstance(gv.REPARAM, gv.Strategy), gv.REPARAM.kind
        (True, 'REPARAM')
        >>> class Mine(gv.Strategy):
        ...     kind, needs = "MINE", ("sample", "lane_log_prob")
        >>> supports(gv.flip, Mine()), supports(gv.flip, gv.REPARAM)
        (True, False)
    """

    kind: str = "?"
    needs: tuple[str, ...] = ()
    #: True if the rule differentiates through the drawn value (`k.dual(x, dx)` with a
    #: tangent, as REPARAM): the value must then reach no discontinuity, which genvi
    #: checks (`gv.DiscontinuityError`), and it moves with the parameters
    pathwise: bool = False
    #: True if the rule weights the objective by the score of its draw and nothing
    #: else (REINFORCE-like, `k.dual(x).plus(score=...)`): `gv.AUTO` tries a
    #: leave-one-out baseline (`gv.RLOO`) in its place and ranks it after the others
    score_function: bool = False
    #: True if the rule puts the gradient of the estimator's variance, not of the
    #: objective, on its operands' tangents (a learned baseline or surrogate): genvi
    #: then refuses a differentiated parameter that reaches both them and the objective
    trains_operands: bool = False
    #: a `RunState` subclass if the strategy keeps state across a run (None: none)
    run_state: type | None = None
    #: True for a marker resolved before a run rather than a rule (`gv.AUTO`): where
    #: a run begins, a site takes the (operand-free) strategy the run's choices give
    #: its address, and the objective asks the marker's `default_strategies` for the
    #: sites left
    placeholder: bool = False

    def default_strategies(self, sites: list, allowed: Any) -> tuple[tuple, list]:
        """Of a placeholder: the strategies its `sites` take where nothing chose one
        (`sites`: records with `addr` and `dist`, in order; `allowed(choices)`: None if
        the objective accepts those (address, strategy) pairs, else the refusal's first
        line). Returns (the (address, strategy) pairs, records of the sites as resolved,
        handed to the run's observer).

        Args:
            sites: the placeholder's sites in the objective's trace.
            allowed: a trial of a choice of strategies.

        Returns:
            (choices, resolved site records).
        """
        raise NotImplementedError(f"{self!r} is not a placeholder")

    def check_site(self, dist: Any, where: str) -> None:
        """Raise a clear error if this strategy cannot be used at a `dist` site (`where`:
        " at address 'x'" or ""): by default, unless `dist` has everything it `needs`.
        A strategy that chooses among others (`gv.switch`) or a placeholder overrides it.

        Args:
            dist: the site's distribution.
            where: the site's address, as messages show it.
        """
        if not supports(dist, self):
            lacks = [n for n in self.needs if not callable(getattr(dist, n, None))]
            needs = f" (it needs {', '.join(lacks)} of the distribution)" if lacks else ""
            raise ValueError(
                f"gv.{dist.name} does not support the {self.kind} gradient strategy{where}"
                f"{needs}; it supports: {offered(dist)}")

    def jvp(self, dist: Any, key: jax.Array, primals: tuple, tangents: tuple,
            k: Continuation) -> Continued | Any:  # pragma: no cover - abstract
        """The rule of the site.

        Args:
            dist: the site's distribution (a `gv.Distribution`).
            key: the site's random key.
            primals: the distribution's parameters.
            tangents: their tangents, None for a symbolic zero.
            k: the rest of the objective (`gv.Continuation`).

        Returns:
            `k.dual(value, value_tangent)` with any `.plus(...)` and
            `.plus_replays(...)` terms (a `gv.Continued`), or the `gv.dual.Dual` of
            `k.dual_map(...)` where the rule evaluated the rest itself.
        """
        raise NotImplementedError

    def split(self) -> tuple["Strategy", tuple]:
        """(the static part, the dynamic operands): the static part is a primitive's
        parameter, the operands are traced."""
        return self, ()

    def operand_event_ndims(self) -> tuple[int, ...]:
        """Of the static part: how many trailing axes of each operand are its own
        rather than lanes (default: none, an operand is lane-shaped like the site's
        value, as a per-lane baseline). Under `vmap` an operand gains the lane axes in
        front of these; missing entries count as 0."""
        return ()

    def lane_operands(self, count: int) -> tuple[bool, ...]:
        """Of the static part: which of the site's `count` operands are lane-shaped
        (default: all). Under `vmap` a lane-shaped operand is padded to broadcast
        against the site's lanes; one that is not (a learned surrogate's parameters)
        gains only the batch axes of the transformations around the site, so its
        leading axes are exactly the plates' (a `gv.vmap`'s, a particle axis)."""
        return (True,) * count

    def join(self, operands: tuple, tangents: tuple | None = None) -> "Strategy":
        """The inverse of `split`, with the operands' tangents (None: none)."""
        return self

    def trained_operands(self, count: int) -> tuple[bool, ...]:
        """Of the static part: which of the site's `count` operands the rule trains for
        the estimator's variance (default: all of them where `trains_operands`)."""
        return (self.trains_operands,) * count

    def __repr__(self) -> str:
        return f"gv.{self.kind}"


class RunState:
    """What a strategy keeps across one run of an objective: the ADEV interpreter makes
    one instance per run for each `Strategy.run_state` class among the objective's
    sites, hands it to their rules (`k.state(strategy)`), and calls its run-level
    hooks, so that the interpreter names no strategy:

    * `enter()` before a scan step's body or a cond branch, returning what `leave`
      restores; `leave(saved)` after it, returning what the body kept (a pytree of
      arrays, or None): a scan stacks it over the steps, a cond keeps each branch's;
    * `after_scan(key, stacked)` and `after_cond(key, which, per_branch)` then fold
      what the bodies kept into the enclosing level (`which`: the taken branch);
    * `finish(replay, final)` once at the end: a term added to the estimate's
      tangent, with `replay(overrides)` the objective's value with some sites
      overridden and `final` its value on this run.

    Every hook defaults to doing nothing (see `genvi.adev.strategies.sd` for
    `gv.SD`'s pruning pool, the built-in one).

    Example:
        >>> class Count(RunState):       # how many scan steps and cond branches a run entered
        ...     def __init__(self):
        ...         self.bodies = 0
        ...     def enter(self):
        ...         self.bodies += 1
        >>> Count().finish(None, 0.0) is None
        True
    """

    def enter(self) -> Any:
        return None

    def leave(self, saved: Any) -> Any:
        return None

    def after_scan(self, key: Any, stacked: Any) -> None:
        return None

    def after_cond(self, key: Any, which: Any, per_branch: list) -> None:
        return None

    def finish(self, replay: Any, final: Any) -> Any:
        return None


def _has(dist: Any, capability: str) -> bool:
    """A method (callable) or a flag set to True."""
    value = getattr(dist, capability, None)
    return value is True or (callable(value) and not isinstance(value, bool))


def supports(dist: Any, strategy: Strategy) -> bool:
    """Whether `dist` has every capability that `strategy` `needs`.

    Example:
        >>> import genvi as gv
        >>> supports(gv.flip, gv.ENUM), supports(gv.uniform, gv.REINFORCE)
        (True, False)
    """
    return all(_has(dist, name) for name in strategy.needs)


# The built-in strategies, kind -> (rank, needs, instance): the names a distribution's
# errors offer and `gv.AUTO`'s candidates, lowest rank first (genvi.adev registers
# each where it is defined)
_BUILT_IN: dict[str, tuple[int, tuple[str, ...], Strategy]] = {}
_WITH_SETTINGS: dict[str, tuple[str, ...]] = {}  # "SWOR(k)" -> needs


def register_built_in(strategy: Strategy, rank: int) -> None:
    """Name `strategy` (an instance) among those a distribution's messages offer, at
    position `rank` (the first supported one is the suggested default)."""
    _BUILT_IN.setdefault(strategy.kind, (rank, tuple(strategy.needs), strategy))


def register_with_settings(written: str, needs: tuple[str, ...]) -> None:
    """Name a strategy that takes settings (`"SWOR(k)"`) among those a distribution's
    messages offer, after the built-in ones: it is not a `gv.AUTO` candidate, which
    needs no settings.

    Example:
        >>> import genvi as gv
        >>> from genvi.core.strategy import offered
        >>> offered(gv.categorical)
        'gv.ENUM, gv.REINFORCE, gv.MVD, gv.SD, gv.SWOR(k), gv.RELAX(surrogate, phi)'
    """
    _WITH_SETTINGS.setdefault(written, tuple(needs))


def offered(dist: Any) -> str:
    """What an error message offers at a `dist` site: its built-in strategies, then
    the ones with settings that it supports."""
    with_settings = [w for w, needs in _WITH_SETTINGS.items()
                     if all(_has(dist, name) for name in needs)]
    return ", ".join("gv." + s for s in (*dist.strategies, *with_settings))


def built_in_strategies(dist: Any) -> tuple[Strategy, ...]:
    """The built-in strategies `dist` supports, in rank order (REPARAM, ENUM,
    REINFORCE, MVD, DisARM, SD): `gv.AUTO`'s candidates before it measures.

    Example:
        >>> import genvi as gv
        >>> built_in_strategies(gv.normal)
        (gv.REPARAM, gv.REINFORCE, gv.MVD)
    """
    ranked = sorted((rank, kind) for kind, (rank, _, s) in _BUILT_IN.items() if supports(dist, s))
    return tuple(_BUILT_IN[kind][2] for _, kind in ranked)


@dataclasses.dataclass(frozen=True)
class PlaceholderSite:
    """A site with a placeholder strategy (`gv.AUTO`) found in an objective's trace:
    its address, distribution and placeholder, and, once resolved by the placeholder's
    `default_strategies`, the strategy it takes untuned (`default`) with the refusals
    of the candidates tried before it.

    Example:
        >>> import genvi as gv
        >>> PlaceholderSite(("enc", "z"), gv.normal, gv.AUTO).name
        'enc/z'
    """

    addr: tuple
    dist: Any
    strategy: Any = None
    default: Any = None
    refused: tuple = ()

    @property
    def name(self) -> str:
        return Address(self.addr).shown()


def supported_kinds(dist: Any) -> tuple[str, ...]:
    """The kinds of the built-in strategies that `dist` supports, derived from what each
    `needs` (what `Distribution.strategies` reports).

    Example:
        >>> import genvi as gv
        >>> supported_kinds(gv.normal), supported_kinds(gv.flip)
        (('REPARAM', 'REINFORCE', 'MVD'), ('ENUM', 'REINFORCE', 'MVD', 'DisARM', 'SD'))
    """
    ranked = sorted((rank, kind) for kind, (rank, needs, _) in _BUILT_IN.items()
                    if all(_has(dist, name) for name in needs))
    return tuple(kind for _, kind in ranked)


def _where(addr: Any) -> str:
    return f" at address {'/'.join(map(str, addr))!r}" if addr else ""


def check_strategy(dist: Any, strategy: Any, addr: Any) -> None:
    """Raise a clear error if `strategy` is not a strategy `dist` supports."""
    where = _where(addr)
    if not isinstance(strategy, Strategy):
        raise TypeError(f"grad={strategy!r}{where} is not a gradient strategy; use one of "
                        f"{offered(dist)}")
    strategy.check_site(dist, where)


def missing_strategy_error(dist: Any, addr: Any) -> ValueError:
    """The error for a site sampled inside an objective without a `grad=`.

    Example:
        >>> import genvi as gv
        >>> print(missing_strategy_error(gv.flip, ("b",)))  # doctest: +ELLIPSIS
        the sampling site 'b' (gv.flip) is sampled inside an objective but has no gradient strategy. ...
    """
    kind = dist.strategies[0]
    # a distribution from another front end says how its sites take a strategy there
    how = getattr(dist, "how_to_set_grad", None)
    example = how(addr, kind) if how else f"gv.{dist.name}(..., grad=gv.{kind})"
    return ValueError(
        f"the sampling site {'/'.join(map(str, addr)) if addr else '(gv.sample)'!r} "
        f"({dist.label}) is sampled inside an objective but has no gradient strategy. "
        f"Pass grad= with one of: {offered(dist)}, e.g. {example}.")
