"""The gradient-strategy protocol that sampling sites carry, and its checks.

A site's `grad=` is a `Strategy`: a static, hashable object whose `kind` names what it
needs of a distribution ("REPARAM", "REINFORCE", "MVD", "ENUM", "SD"), and whose `jvp`
rule (defined in `genvi.adev.strategies`) turns the site into a piece of a
forward-mode estimator. The generative language only needs the protocol: to check a
`grad=` where a site gets its address, and to name the strategies a distribution
supports when one is missing. The rules themselves live in `genvi.adev`.

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
    gv.normal does not support the ENUM gradient strategy at address 'x'; it supports: gv.REPARAM, gv.REINFORCE, gv.MVD
"""

from __future__ import annotations

from typing import Any


class Strategy:
    """Base class of gradient strategies.

    Subclasses set `kind` (its name in messages, and for the built-in strategies the
    name distributions list as supported) and define
    `jvp(dist, key, primals, tangents, k)` (see `genvi.adev.strategies`). Strategies
    are static (hashable); dynamic data such as a baseline value travels as operands
    through `split`/`join`.

    A strategy written outside genvi declares what it needs of a distribution once,
    in `needs`: the names of the distribution's methods its rule calls (`sample`,
    `lane_log_prob`, `support`, `mvd_terms`, ...). Every distribution that has them
    supports it, and a masked site (an untaken branch of a batched `cond`) hands the
    rule a distribution whose every such method is masked.

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
    #: a `RunState` subclass if the strategy keeps state across a run (None: none)
    run_state: type | None = None

    def jvp(self, dist, key, primals, tangents, k):  # pragma: no cover - abstract
        raise NotImplementedError

    def split(self) -> tuple["Strategy", tuple]:
        """(the static part, the dynamic operands): the static part is a primitive's
        parameter, the operands are traced."""
        return self, ()

    def join(self, operands: tuple, tangents: tuple | None = None) -> "Strategy":
        """The inverse of `split`, with the operands' tangents (None: none)."""
        return self

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

    Every hook defaults to doing nothing (see `genvi.adev.stochastic_derivatives` for
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


def supports(dist: Any, strategy: Strategy) -> bool:
    """Whether `dist` supports `strategy`: it has every method the strategy `needs`,
    or (a built-in strategy, which declares no needs) it lists the strategy's kind."""
    if strategy.needs:
        return all(callable(getattr(dist, name, None)) for name in strategy.needs)
    return dist.supports(strategy.kind)


def _where(addr: Any) -> str:
    return f" at address {'/'.join(map(str, addr))!r}" if addr else ""


def check_strategy(dist: Any, strategy: Any, addr: Any) -> None:
    """Raise a clear error if `strategy` is not a strategy `dist` supports."""
    where = _where(addr)
    if not isinstance(strategy, Strategy):
        raise TypeError(f"grad={strategy!r}{where} is not a gradient strategy; use one of "
                        f"{', '.join('gv.' + s for s in dist.strategies)}")
    inner = getattr(strategy, "strategies", None)
    if inner is not None:  # a choice among strategies: each must be supported
        for s in inner:
            check_strategy(dist, s, addr)
        return
    if not supports(dist, strategy):
        lacks = [n for n in strategy.needs if not callable(getattr(dist, n, None))]
        needs = f" (it needs {', '.join(lacks)} of the distribution)" if lacks else ""
        raise ValueError(
            f"gv.{dist.name} does not support the {strategy.kind} gradient strategy{where}"
            f"{needs}; it supports: {', '.join('gv.' + s for s in dist.strategies)}")


def missing_strategy_error(dist: Any, addr: Any) -> ValueError:
    """The error for a site sampled inside an objective without a `grad=`.

    Example:
        >>> import genvi as gv
        >>> print(missing_strategy_error(gv.flip, ("b",)))  # doctest: +ELLIPSIS
        the sampling site 'b' (gv.flip) is sampled inside an objective but has no gradient strategy. ...
    """
    return ValueError(
        f"the sampling site {'/'.join(map(str, addr)) if addr else '(gv.sample)'!r} "
        f"(gv.{dist.name}) is sampled inside an objective but has no gradient strategy. "
        f"Pass grad= with one of: {', '.join('gv.' + s for s in dist.strategies)}, "
        f"e.g. gv.{dist.name}(..., grad=gv.{dist.strategies[0]}).")
