"""Questions asked of a whole jaxpr: every equation with the scans around it, whether a
jaxpr (or an equation's bodies) binds some primitive (cached weakly), which equations
consume some primitive's results (randomness), and which are live."""

from __future__ import annotations

import weakref
from typing import Any, Callable, Iterator

import jax.extend.core as jcore

from genvi.core.jaxpr.views import kind


def sub_jaxprs(eqn: Any) -> list:
    """The jaxprs nested in an equation's parameters (bodies, branches, calls)."""
    return list(jcore.jaxprs_in_params(eqn.params))


def equations(jaxpr: Any, scans: int = 0) -> Iterator[tuple[Any, int]]:
    """Every equation of `jaxpr` and of the jaxprs nested in it, in program order (an
    equation before its bodies' equations), each with the number of `scan` equations
    around it (plus `scans`): the one search over a program's equations.

    Example:
        >>> import jax
        >>> f = lambda c: jax.lax.scan(lambda c, _: (jax.numpy.sin(c), None), c, None, length=2)
        >>> [(e.primitive.name, n) for e, n in equations(jax.make_jaxpr(f)(1.0))]
        [('scan', 0), ('sin', 1)]
    """
    for eqn in getattr(jaxpr, "jaxpr", jaxpr).eqns:
        yield eqn, scans
        inner = scans + (kind(eqn) == "scan")
        for sub in sub_jaxprs(eqn):
            yield from equations(sub, inner)


def contains(jaxpr: Any, prims: frozenset) -> bool:
    """Whether `jaxpr` (or any jaxpr nested in it) binds one of `prims`."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    return _contains(jaxpr, prims)


def nests(eqn: Any, prims: frozenset) -> bool:
    """Whether a jaxpr nested in `eqn` (a body, a branch, a call) binds one of `prims`.

    Example:
        >>> import jax
        >>> f = lambda c: jax.lax.scan(lambda c, _: (jax.numpy.sin(c), None), c, None, length=2)
        >>> (scan,) = jax.make_jaxpr(f)(1.0).eqns
        >>> nests(scan, frozenset({jax.lax.sin_p})), nests(scan, frozenset({jax.lax.cos_p}))
        (True, False)
    """
    return any(_contains(getattr(j, "jaxpr", j), prims) for j in sub_jaxprs(eqn))


#: `cond` itself: a dual `cond` is evaluated branch by branch (see adev.interpreter).
CONDS = frozenset({jcore.primitives.cond_p})

# jaxpr -> {prims: answer}; weak, so a cached answer lives as long as its jaxpr does
_CONTAINS: "weakref.WeakKeyDictionary[Any, dict]" = weakref.WeakKeyDictionary()


def _contains(jaxpr: Any, prims: frozenset) -> bool:
    answers = _CONTAINS.setdefault(jaxpr, {})
    answer = answers.get(prims)
    if answer is None:
        answer = answers[prims] = any(eqn.primitive in prims or nests(eqn, prims)
                                      for eqn in jaxpr.eqns)
    return answer


def consumers(jaxpr: Any, prims: frozenset) -> list[int]:
    """The positions of `jaxpr`'s equations that bind one of `prims` or hold one in
    their bodies (the consumers of randomness, for `prims` the sampling sites and draws).

    Example:
        >>> import jax
        >>> f = lambda x: jax.lax.scan(lambda c, _: (jax.numpy.sin(c), None), jax.numpy.cos(x),
        ...                            None, length=2)
        >>> consumers(jax.make_jaxpr(f)(1.0).jaxpr, frozenset({jax.lax.sin_p}))
        [1]
    """
    return [i for i, eqn in enumerate(jaxpr.eqns) if eqn.primitive in prims or nests(eqn, prims)]


def live_equations(jaxpr: Any, kept: frozenset = frozenset()) -> list[bool]:
    """Whether each equation of `jaxpr` is live: its result is used by the outputs or by
    a live equation, or it has an effect, or it binds a primitive of `kept`.

    Example:
        >>> import jax
        >>> closed = jax.make_jaxpr(lambda x: (jax.numpy.sin(x), jax.numpy.cos(x))[0])(1.0)
        >>> live_equations(closed.jaxpr)
        [True, False]
    """
    needed = {v for v in jaxpr.outvars if not isinstance(v, jcore.Literal)}
    live = [False] * len(jaxpr.eqns)
    for i in range(len(jaxpr.eqns) - 1, -1, -1):
        eqn = jaxpr.eqns[i]
        if eqn.effects or eqn.primitive in kept or any(v in needed for v in eqn.outvars):
            live[i] = True
            needed.update(v for v in eqn.invars if not isinstance(v, jcore.Literal))
    return live


def map_equations(jaxpr: Any, change: Callable[[Any], Any]) -> Any:
    """`jaxpr` (open or closed) with every equation, nested ones first, replaced by
    `change(eqn)`; `change` returns the equation itself to keep it. A jaxpr in which
    nothing changed is returned as it is (so what JAX caches by jaxpr still hits).

    Example:
        >>> import jax
        >>> closed = jax.make_jaxpr(lambda c: jax.lax.scan(
        ...     lambda c, _: (jax.numpy.sin(c), None), c, None, length=2))(1.0)
        >>> cos = lambda e: e.replace(primitive=jax.lax.cos_p) if e.primitive is jax.lax.sin_p else e
        >>> [e.primitive.name for e, _ in equations(map_equations(closed, cos))]
        ['scan', 'cos']
    """
    inner = getattr(jaxpr, "jaxpr", jaxpr)  # JAX 0.12: a jaxpr is its own closed form
    eqns = [change(_with_bodies(eqn, change)) for eqn in inner.eqns]
    if all(new is old for new, old in zip(eqns, inner.eqns)):
        return jaxpr
    rewritten = inner.replace(eqns=eqns)
    return rewritten if inner is jaxpr else jaxpr.replace(jaxpr=rewritten)


def _with_bodies(eqn: Any, change: Callable[[Any], Any]) -> Any:
    """`eqn` with the jaxprs in its parameters (bodies, branches, calls) mapped."""
    def mapped(value: Any) -> Any:
        if isinstance(value, tuple):
            items = tuple(mapped(v) for v in value)
            return value if all(a is b for a, b in zip(items, value)) else items
        if isinstance(value, (jcore.Jaxpr, jcore.ClosedJaxpr)):
            return map_equations(value, change)
        return value

    params = {name: mapped(value) for name, value in eqn.params.items()}
    if all(params[name] is value for name, value in eqn.params.items()):
        return eqn
    return eqn.replace(params=params)
