"""The one walker: a jaxpr evaluated equation by equation, with hooks.

Every interpreter in genvi (the ADEV interpreter, the lane-tracked evaluator and its
Markov scans, the generative handlers, masked branches, the smoothness analysis,
`explain`'s work count and enumeration) is a set of hooks on `walk`, in the spirit
of JAX's `eval_jaxpr` with a rule table keyed by primitive:

* `walk(jaxpr, env, rule)` reads each equation's operands from `env`, asks
  `rule(i, eqn, ins)` for its outputs and binds them; a rule may return `Stop(x)` to
  end the walk with `x` (the ADEV interpreter does when a strategy evaluated the rest
  of the program itself).
* `Hooks` is such a rule that dispatches: first its `rules` table (keyed by
  primitive: genvi's sites, observations, plate markers), then, for an equation whose
  bodies hold one of the primitives in `holds`, a hook per kind of control flow
  receiving a typed view (`ScanEqn`, `CondEqn`, `CallEqn`), else `other`.

A walk knows no JAX parameter: the typed views of `genvi.core.jaxpr` read them.

Example:
    >>> import jax, jax.numpy as jnp
    >>> from genvi.core.walk import Hooks, env_of, walk
    >>> closed = jax.make_jaxpr(lambda x: jnp.sin(x) * 2.0)(1.0)
    >>> class Count(Hooks):
    ...     seen = 0
    ...     def other(self, i, eqn, ins):
    ...         self.seen += 1
    ...         return super().other(i, eqn, ins)
    >>> hooks = Count()
    >>> [round(float(v), 4) for v in walk(closed.jaxpr, env_of(closed, [0.5]), hooks)]
    [0.9589]
    >>> hooks.seen
    2
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

from genvi.core import jaxpr as jx


class Stop(NamedTuple):
    """What a rule returns to end a walk early: `value` is the walk's result."""

    value: Any


def env_of(closed: Any, args: Sequence, wrap: Callable[[Any], Any] | None = None) -> dict:
    """An environment binding a closed jaxpr's constants and inputs (constants wrapped
    by `wrap`, e.g. as values without a tangent).

    Example:
        >>> import jax
        >>> closed = jax.make_jaxpr(lambda x: x + 1.0)(0.0)
        >>> len(env_of(closed, [2.0]))
        1
    """
    jaxpr = closed.jaxpr
    consts = closed.consts if wrap is None else [wrap(c) for c in closed.consts]
    env = dict(zip(jaxpr.constvars, consts))
    env.update(zip(jaxpr.invars, args))
    return env


def walk(jaxpr: Any, env: dict, rule: Callable[[int, Any, list], Any], start: int = 0,
         literal: Callable[[Any], Any] | None = None) -> Any:
    """Evaluate `jaxpr.eqns[start:]` in `env` (which it extends): each equation's
    outputs are `rule(i, eqn, operands)`; returns the jaxpr's outputs, or the `Stop`
    a rule returned. `literal` wraps the value of a literal operand.

    Example:
        >>> import jax
        >>> closed = jax.make_jaxpr(lambda x: x * 3.0)(1.0)
        >>> [float(v) for v in walk(closed.jaxpr, env_of(closed, [2.0]),
        ...                         lambda i, eqn, ins: jx.eval_eqn(eqn, ins))]
        [6.0]
    """
    def read(var: Any) -> Any:
        if isinstance(var, jx.Literal):
            return var.val if literal is None else literal(var.val)
        return env[var]

    eqns = jaxpr.eqns
    for i in range(start, len(eqns)):
        eqn = eqns[i]
        outs = rule(i, eqn, [read(v) for v in eqn.invars])
        if isinstance(outs, Stop):
            return outs
        env.update(zip(eqn.outvars, outs))
    return [read(v) for v in jaxpr.outvars]


class Hooks:
    """A walk's rule, dispatched: `rules[eqn.primitive]` if there is one; then, for an
    equation whose bodies hold a primitive of `holds`, `scan`, `cond`, `call` (with
    the equation's typed view) or `unsupported`; else `other` (JAX evaluates it).

    Subclasses set `rules` (a class-level table: primitive -> function of
    `(hooks, i, eqn, ins)`) and `holds`, and override the hooks they interpret.

    Example:
        >>> import jax
        >>> closed = jax.make_jaxpr(lambda x: jax.lax.cond(x > 0, jax.numpy.sin, jax.numpy.cos, x))(1.0)
        >>> class Branchy(Hooks):
        ...     holds = frozenset({jax.extend.core.primitives.sin_p})
        ...     def cond(self, i, view, ins):
        ...         return ["looked at %d branches" % len(view.branches)]
        >>> walk(closed.jaxpr, env_of(closed, [1.0]), Branchy())
        ['looked at 2 branches']
    """

    rules: dict = {}
    holds: frozenset = frozenset()

    def __call__(self, i: int, eqn: Any, ins: list) -> Any:
        rule = self.rules.get(eqn.primitive)
        if rule is not None:
            return rule(self, i, eqn, ins)
        if self.interprets(eqn):
            kind = jx.kind(eqn)
            if kind == "scan":
                return self.scan(i, jx.ScanEqn.of(eqn), ins)
            if kind == "cond":
                return self.cond(i, jx.CondEqn.of(eqn), ins)
            if kind == "call":
                return self.call(i, jx.CallEqn.of(eqn), ins)
            return self.unsupported(i, eqn, ins)
        return self.other(i, eqn, ins)

    def interprets(self, eqn: Any) -> bool:
        """Whether `eqn`'s bodies hold a primitive of `holds` (so its control flow is
        interpreted rather than handed to JAX)."""
        return bool(self.holds) and jx.nests(eqn, self.holds)

    def other(self, i: int, eqn: Any, ins: list) -> Any:
        return jx.eval_eqn(eqn, ins)

    def scan(self, i: int, view: jx.ScanEqn, ins: list) -> Any:
        return self.unsupported(i, view.eqn, ins)

    def cond(self, i: int, view: jx.CondEqn, ins: list) -> Any:
        return self.unsupported(i, view.eqn, ins)

    def call(self, i: int, view: jx.CallEqn, ins: list) -> Any:
        return walk(view.body.jaxpr, env_of(view.body, ins), self)

    def unsupported(self, i: int, eqn: Any, ins: list) -> Any:
        raise NotImplementedError(
            f"sampling sites inside `{eqn.primitive.name}` are not supported: use gv.scan or "
            "jax.lax.scan with a fixed length for loops, and keep sampling out of "
            "custom_jvp/custom_vjp functions")
