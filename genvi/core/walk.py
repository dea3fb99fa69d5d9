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
  primitive: genvi's sites, observations, plate markers), then, for an equation it
  `interprets` (by default: whose bodies hold one of the primitives in `holds`), a
  hook per kind of control flow receiving a typed view (`ScanEqn`, `CondEqn`,
  `CallEqn`, `CustomEqn`, `WhileEqn`; `unsupported` for the rest), else `other`. No interpreter
  outside `genvi.core` reads a primitive's name or a JAX parameter.

* `scan_fixed_point` and `while_fixed_point` run a loop's body in a walk over
  abstract values (the smoothness and variance-training checks) until its carry
  stops changing.

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
        if self.interprets(eqn, ins):
            return self.control(i, eqn, ins)
        return self.other(i, eqn, ins)

    def control(self, i: int, eqn: Any, ins: list) -> Any:
        """An interpreted control-flow equation, handed to its hook as a typed view."""
        view = jx.view(eqn)
        if isinstance(view, jx.CustomEqn):  # before CallEqn, which it is too
            return self.custom(i, view, ins)
        if isinstance(view, jx.ScanEqn):
            return self.scan(i, view, ins)
        if isinstance(view, jx.CondEqn):
            return self.cond(i, view, ins)
        if isinstance(view, jx.CallEqn):
            return self.call(i, view, ins)
        if isinstance(view, jx.WhileEqn):
            return self.while_(i, view, ins)
        return self.unsupported(i, eqn, ins)

    def interprets(self, eqn: Any, ins: list) -> bool:
        """Whether `eqn`'s bodies hold a primitive of `holds` (so its control flow is
        interpreted rather than handed to JAX); `ins` are its operands' values."""
        return bool(self.holds) and jx.nests(eqn, self.holds)

    def other(self, i: int, eqn: Any, ins: list) -> Any:
        return jx.eval_eqn(eqn, ins)

    def scan(self, i: int, view: jx.ScanEqn, ins: list) -> Any:
        return self.unsupported(i, view.eqn, ins)

    def cond(self, i: int, view: jx.CondEqn, ins: list) -> Any:
        return self.unsupported(i, view.eqn, ins)

    def call(self, i: int, view: jx.CallEqn, ins: list) -> Any:
        return walk(view.body.jaxpr, env_of(view.body, ins), self)

    def while_(self, i: int, view: jx.WhileEqn, ins: list) -> Any:
        return self.unsupported(i, view.eqn, ins)

    def custom(self, i: int, view: jx.CustomEqn, ins: list) -> Any:
        return self.unsupported(i, view.eqn, ins)

    def unsupported(self, i: int, eqn: Any, ins: list) -> Any:
        raise NotImplementedError(
            f"sampling sites inside `{jx.name_of(eqn)}` are not supported: use gv.scan or "
            "jax.lax.scan with a fixed length for loops, and keep sampling out of "
            "custom_jvp/custom_vjp functions")


# -- loops in an abstract walk ------------------------------------------------------
#
# An analysis that walks a jaxpr with abstract values (the smoothness and
# variance-training checks) runs a loop's body until its carry stops changing. Each
# pass joins what the body returns into what it was given; the joins only go up, in a
# lattice of finite height, so the loop ends.


def scan_fixed_point(view: jx.ScanEqn, ins: list, run: Callable[[Any, list], list],
                     join: Callable[[Any, Any], Any]) -> list:
    """The outputs of a scan in an abstract walk: `run(jaxpr, values)` walks a body,
    `join` joins two abstract values. The body is run with its carry joined to a fixed
    point; returns that last run's outputs (carry out, then stacked).

    Example:
        >>> import jax, operator
        >>> closed = jax.make_jaxpr(lambda c, xs: jax.lax.scan(
        ...     lambda c, x: (x, c), c, xs))(0.0, jax.numpy.zeros(3))
        >>> (eqn,) = closed.jaxpr.eqns
        >>> run = lambda jaxpr, ins: walk(jaxpr, dict(zip(jaxpr.invars, ins)),
        ...                               lambda i, e, a: [0] * len(e.outvars))
        >>> scan_fixed_point(jx.ScanEqn.of(eqn), [1, 2], run, operator.or_)  # ys: c or an x
        [2, 3]
    """
    consts, carry, xs = view.split(ins)

    def step(carry: list) -> tuple[list, list]:
        outs = run(view.body.jaxpr, consts + carry + xs)
        return view.split_outs(outs)[0], outs

    return _fixed_point(step, carry, join)[1]


def while_fixed_point(view: jx.WhileEqn, ins: list, run: Callable[[Any, list], list],
                      join: Callable[[Any, Any], Any]) -> tuple[list, Any]:
    """A while loop in an abstract walk (as `scan_fixed_point`): returns its carry at
    the fixed point and its predicate's abstract value there.

    Example:
        >>> import jax, operator
        >>> closed = jax.make_jaxpr(lambda x: jax.lax.while_loop(
        ...     lambda c: c < 3.0, lambda c: c + x, 0.0))(1.0)
        >>> eqn = closed.jaxpr.eqns[-1]
        >>> run = lambda jaxpr, ins: walk(jaxpr, dict(zip(jaxpr.invars, ins)),
        ...                               lambda i, e, a: [max(a)] * len(e.outvars),
        ...                               literal=lambda _: 0)
        >>> while_fixed_point(jx.WhileEqn.of(eqn), [1, 0], run, operator.or_)
        ([1], 1)
    """
    cond_consts, body_consts, carry = view.split(ins)
    carry, _ = _fixed_point(lambda c: (run(view.body.jaxpr, body_consts + c), None), carry, join)
    (pred,) = run(view.cond.jaxpr, cond_consts + carry)
    return carry, pred


def _fixed_point(step: Callable[[list], tuple[list, Any]], carry: list,
                 join: Callable[[Any, Any], Any]) -> tuple[list, Any]:
    while True:
        out, result = step(carry)
        joined = [join(c, o) for c, o in zip(carry, out)]
        if joined == carry:
            return carry, result
        carry = joined
