"""`gv.switch`: a site's gradient strategy chosen by a traced index.

Example:
    >>> import genvi as gv, jax.numpy as jnp
    >>> gv.switch(jnp.int32(0), [gv.MVD, gv.ENUM]).kind
    'MVD'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from genvi.adev.continuation import Deferred, Replays
from genvi.core.strategy import Strategy


@dataclass(frozen=True, eq=False)
class SwitchStrategy(Strategy):
    """The strategy `strategies[index]`, chosen by a traced index (see `gv.switch`)."""

    strategies: tuple = ()
    index: Any = None
    operands: tuple = ()

    # kind, pathwise, score_function: read-only properties over Strategy's class attributes
    # (a switch's are its strategies'), which mypy takes for writeable ones
    @property
    def kind(self) -> str:  # type: ignore[override]  # the kinds must agree for `check_strategy`
        return self.strategies[0].kind if self.strategies else "?"

    def check_site(self, dist: Any, where: str) -> None:
        for s in self.strategies:  # a choice among strategies: each must be supported
            s.check_site(dist, where)

    @property
    def pathwise(self) -> bool:  # type: ignore[override]  # checked as if any choice were taken
        return any(s.pathwise for s in self.strategies)

    @property
    def score_function(self) -> bool:  # type: ignore[override]
        return bool(self.strategies) and all(s.score_function for s in self.strategies)

    def split(self):
        parts = [s.split() for s in self.strategies]
        static = SwitchStrategy(tuple(p[0] for p in parts), None, tuple(len(p[1]) for p in parts))
        return static, (self.index,) + tuple(x for _, ops in parts for x in ops)

    def operand_event_ndims(self):
        events = [0]  # the index
        for s, n in zip(self.strategies, self.operands):
            own = tuple(s.operand_event_ndims())
            events += list(own) + [0] * (n - len(own))
        return tuple(events)

    def lane_operands(self, count):
        return (True,) + tuple(t for s, n in zip(self.strategies, self.operands)
                               for t in s.lane_operands(n))

    def trained_operands(self, count):
        return (False,) + tuple(t for s, n in zip(self.strategies, self.operands)
                                for t in s.trained_operands(n))

    def join(self, operands, tangents=None):
        index, rest = operands[0], list(operands[1:])
        rest_t = None if tangents is None else list(tangents[1:])
        joined = []
        for s, n in zip(self.strategies, self.operands):
            ops, rest = tuple(rest[:n]), rest[n:]
            ts = None
            if rest_t is not None:
                ts, rest_t = tuple(rest_t[:n]), rest_t[n:]
            joined.append(s.join(ops, ts))
        return SwitchStrategy(tuple(joined), index, self.operands)

    def __hash__(self):
        return hash((SwitchStrategy, self.strategies))

    def __eq__(self, other):
        return isinstance(other, SwitchStrategy) and self.strategies == other.strategies

    def __repr__(self):
        return f"gv.switch(index, {list(self.strategies)})"

    def jvp(self, dist: Any, key: jax.Array, primals: tuple, tangents: tuple, k: Any) -> Any:
        out_dtype = jnp.result_type(float)

        def outcome(strategy):
            res = strategy.jvp(dist, key, primals, tangents, k)
            if not isinstance(res, Deferred):
                raise TypeError("gv.switch: a strategy that enumerates the whole rest "
                                "of the program cannot be switched; use it directly")
            return res

        # Replays leave the switch (to be deferred like any rule's) when every rule
        # asking for them asks for the same shapes; a rule without replays pads with
        # dead terms. Otherwise each branch evaluates its own replays.
        shapes = [jax.eval_shape(lambda s=s: _replay_arrays(outcome(s))) for s in self.strategies]
        asked = [[(a.shape, a.dtype) for a in sh] for sh in shapes if sh is not None]
        shared = asked[0] if asked and all(sh == asked[0] for sh in asked) else None

        def branch(strategy):
            def run():
                res = outcome(strategy)
                if shared is None:
                    res, replays = k.resolved(res), ()
                else:
                    replays = _replay_arrays(res) or tuple(jnp.zeros(*a) for a in shared)
                zero = jnp.zeros((), out_dtype)
                tangent = res.tangent
                if tangent is None and jnp.issubdtype(jnp.result_type(res.value), jnp.floating):
                    tangent = jnp.zeros_like(res.value)
                return (res.value, tangent, zero if res.score is None else res.score,
                        zero if res.offset is None else res.offset, replays)
            return run

        index = jnp.clip(jnp.asarray(self.index, jnp.int32), 0, len(self.strategies) - 1)
        value, tangent, score, offset, replays = jax.lax.switch(
            index, [branch(s) for s in self.strategies])
        return Deferred(value, tangent, score, offset, Replays(*replays) if replays else None)


def _replay_arrays(res: Deferred) -> tuple | None:
    r = res.replays
    return None if r is None else (r.alternatives, r.weights, r.live)


def switch(index: Any, strategies: Any) -> Strategy:
    """The gradient strategy `strategies[index]` for a site whose strategy depends on
    a traced index, e.g. the step of a `gv.scan` (AIR's "hybrid" estimator: MVD for
    the first steps, ENUM for the last). Only the chosen rule runs, as `lax.switch`.
    All strategies must be of one kind of site (each must be supported by the
    distribution). Strategies that enumerate the whole rest of a top-level program
    (ENUM on a scalar site outside scan/cond) cannot be switched.

    Args:
        index: an integer, traced or not, choosing the strategy.
        strategies: a sequence of strategies, each supported by the site's distribution.

    Returns:
        a `Strategy` to pass as a site's `grad=`.

    Example:
        >>> import genvi as gv, jax.numpy as jnp
        >>> s = gv.switch(jnp.int32(2), [gv.MVD, gv.MVD, gv.ENUM])
        >>> s.kind
        'MVD'
    """
    strategies = tuple(strategies)
    if not strategies or not all(isinstance(s, Strategy) for s in strategies):
        raise TypeError(f"gv.switch needs a non-empty list of gradient strategies, got {strategies!r}")
    kept = [s for s in strategies if s.run_state is not None]  # a state spanning the run
    if kept:
        raise TypeError(f"gv.switch cannot hold {kept[0]!r}: it keeps state across the whole "
                        f"objective (as gv.SD's pruning pool does); give the site {kept[0]!r} "
                        "directly, or switch between other strategies")
    return SwitchStrategy(strategies, index, tuple(len(s.split()[1]) for s in strategies))
