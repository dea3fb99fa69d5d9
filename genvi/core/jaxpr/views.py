"""Typed views of the control-flow equations genvi interprets (`ScanEqn`, `CondEqn`,
`CallEqn`, `WhileEqn`), `view` to get one, and the few parameter readers
interpreters need (a sort's keys, a reduction's axes): the only readers of those
equations' JAX parameters."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

import jax

from genvi.core.jaxpr.basics import ClosedJaxpr, Literal, output_dependence


# Recognisers for the higher-order primitives genvi interprets structurally.

def kind(eqn: Any) -> str:
    """'scan', 'cond', 'call' (jit/closed_call), 'custom' (custom_jvp/vjp),
    'while', or 'other'."""
    name = eqn.primitive.name
    if name == "scan":
        return "scan"
    if name == "cond":
        return "cond"
    if name in ("jit", "pjit", "closed_call", "core_call", "remat", "remat2", "checkpoint"):
        return "call"
    if name.startswith("custom_jvp") or name.startswith("custom_vjp"):
        return "custom"
    if name == "while":
        return "while"
    return "other"


def view(eqn: Any) -> "ScanEqn | CondEqn | CallEqn | WhileEqn | None":
    """The typed view of a control-flow equation (`ScanEqn`, `CondEqn`, `CallEqn`,
    `CustomEqn`, a `CallEqn` with a custom derivative, `WhileEqn`), or None for any
    other equation: what interpreters dispatch on, by type, instead of by a
    primitive's name.

    Example:
        >>> import jax
        >>> f = lambda x: jax.lax.cond(x > 0, jax.numpy.sin, jax.numpy.cos, x)
        >>> [type(view(e)).__name__ for e in jax.make_jaxpr(f)(1.0).eqns]
        ['NoneType', 'NoneType', 'CondEqn']
    """
    k = kind(eqn)
    if k == "scan":
        return ScanEqn.of(eqn)
    if k == "cond":
        return CondEqn.of(eqn)
    if k == "call":
        return CallEqn.of(eqn)
    if k == "custom":
        return CustomEqn.of(eqn)
    if k == "while":
        return WhileEqn.of(eqn)
    return None


def has_custom_rule(eqn: Any) -> bool:
    """Whether `eqn` is a call with a custom derivative (`custom_jvp`, `custom_vjp`),
    whose rule, not its body, is what JAX differentiates.

    Example:
        >>> import jax
        >>> f = jax.custom_jvp(lambda x: x * 2.0)
        >>> f.defjvp(lambda p, t: (p[0] * 2.0, t[0] * 2.0))
        <function <lambda> at ...>
        >>> [has_custom_rule(e) for e in jax.make_jaxpr(lambda x: f(x) + 1.0)(1.0).eqns]
        [True, False]
    """
    return kind(eqn) == "custom"


def nesting(eqn: Any) -> tuple[str, int] | None:
    """How an equation nests what runs inside it, in words and as a count of runs: a
    scan's `("scan(N)", N)`, a cond's `("cond", 1)`; None for any other equation.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> f = lambda xs: jax.lax.scan(lambda c, x: (c + x, c), 0.0, xs)
        >>> [nesting(e) for e in jax.make_jaxpr(f)(jnp.zeros(4)).eqns]
        [('scan(4)', 4)]
    """
    k = kind(eqn)
    if k == "scan":
        length = ScanEqn.of(eqn).length
        return f"scan({length})", length
    if k == "cond":
        return "cond", 1
    return None


def name_of(eqn: Any) -> str:
    """The name of an equation's primitive, for messages only (never for dispatch:
    compare `eqn.primitive` with a primitive object, or use `view`).

    Example:
        >>> import jax
        >>> name_of(jax.make_jaxpr(jax.numpy.sin)(1.0).eqns[0])
        'sin'
    """
    return eqn.primitive.name


def _closed(j: Any) -> ClosedJaxpr:
    """`j` as a closed jaxpr (JAX 0.10 keeps open and closed jaxprs apart; from 0.12 a
    jaxpr carries its own constants)."""
    if hasattr(j, "consts"):
        return j
    return ClosedJaxpr(j, ())


@dataclasses.dataclass(frozen=True)
class CallEqn:
    """A typed view of a call-like equation (`jit`, `closed_call`, `remat`, a custom
    derivative): the closed jaxpr it evaluates on its operands.

    Example:
        >>> import jax
        >>> eqn = jax.make_jaxpr(lambda x: jax.jit(lambda y: y + 1.0)(x))(1.0).jaxpr.eqns[0]
        >>> view = CallEqn.of(eqn)
        >>> [float(v) for v in jax.core.eval_jaxpr(view.body.jaxpr, view.body.consts, 2.0)]
        [3.0]
    """
    eqn: Any
    body: ClosedJaxpr

    @staticmethod
    def of(eqn: Any) -> "CallEqn":
        p = eqn.params
        j = p.get("jaxpr", p.get("call_jaxpr", p.get("fun_jaxpr")))
        return CallEqn(eqn, _closed(j))


class CustomEqn(CallEqn):
    """A call with a custom derivative (`custom_jvp`, `custom_vjp`): its body is what
    it evaluates; genvi interprets sites there only where it can ignore the custom rule
    (a walk over values), and refuses them where it differentiates.

    Example:
        >>> import jax
        >>> f = jax.custom_jvp(lambda x: x * 2.0)
        >>> f.defjvp(lambda p, t: (p[0] * 2.0, t[0] * 2.0))
        <function <lambda> at ...>
        >>> type(view(jax.make_jaxpr(f)(1.0).eqns[0])).__name__
        'CustomEqn'
    """

    @staticmethod
    def of(eqn: Any) -> "CustomEqn":
        return CustomEqn(eqn, CallEqn.of(eqn).body)


@dataclasses.dataclass(frozen=True)
class CondEqn:
    """A typed view of a `cond` equation: its branches (closed jaxprs) and
    operands (the branch index first, then the branches' arguments).

    Example:
        >>> import jax
        >>> f = lambda i, x: jax.lax.switch(i, [lambda v: v, lambda v: -v], x)
        >>> (eqn,) = [e for e in jax.make_jaxpr(f)(0, 1.0).jaxpr.eqns if kind(e) == "cond"]
        >>> len(CondEqn.of(eqn).branches)
        2
    """
    eqn: Any
    branches: tuple

    @staticmethod
    def of(eqn: Any) -> "CondEqn":
        return CondEqn(eqn, tuple(_closed(b) for b in eqn.params["branches"]))

    def split(self, ins: Sequence) -> tuple:
        """(index, branch operands) of the equation's operands `ins`."""
        return ins[0], list(ins[1:])


@dataclasses.dataclass(frozen=True)
class ScanEqn:
    """A typed view of a `scan` equation: its body (a closed jaxpr taking consts,
    carries and one step of the scanned inputs; returning carries, then per-step
    outputs), how its operands split, and how to emit a scan like it.

    The one reader of a scan's parameters: JAX 0.10 names the operand groups by
    count, later releases by a flat tree (`ft_in`). The view says it in genvi's words
    (`const_count`, `carry_count`) and owns the operand layout (consts, then carries,
    then scanned inputs; the body reads its inputs in the same order), so a walker
    asks for a carry's or a scanned input's position rather than computing it.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> f = lambda c, xs: jax.lax.scan(lambda c, x: (c + x, c * x), c, xs)
        >>> (eqn,) = jax.make_jaxpr(f)(0.0, jnp.arange(3.0)).jaxpr.eqns
        >>> s = ScanEqn.of(eqn)
        >>> (s.const_count, s.carry_count, s.length, s.reverse)
        (0, 1, 3, False)
        >>> (s.carry_input(0), s.scanned_input(0), s.scanned_index(1), s.scanned_index(0))
        (0, 1, 0, None)
    """
    eqn: Any
    body: ClosedJaxpr
    const_count: int
    carry_count: int
    length: int
    reverse: bool
    unroll: Any

    @staticmethod
    def of(eqn: Any) -> "ScanEqn":
        p = eqn.params
        if "num_consts" in p:
            nc, ncar = p["num_consts"], p["num_carry"]
        else:
            consts, carry, _ = p["ft_in"].unpack()
            nc, ncar = len(consts), len(carry)
        return ScanEqn(eqn, _closed(p["jaxpr"]), nc, ncar, p["length"], bool(p["reverse"]),
                       p["unroll"])

    def split(self, ins: Sequence) -> tuple[list, list, list]:
        """(consts, initial carries, scanned inputs) of the equation's operands (or of
        the body's inputs: the same layout)."""
        nc, ncar = self.const_count, self.carry_count
        return list(ins[:nc]), list(ins[nc:nc + ncar]), list(ins[nc + ncar:])

    def split_outs(self, outs: Sequence) -> tuple[list, list]:
        """(carries, per-step outputs) of the body's or the equation's outputs."""
        return list(outs[:self.carry_count]), list(outs[self.carry_count:])

    def carry_input(self, carry: int) -> int:
        """The position of carry `carry` among the operands and the body's inputs."""
        return self.const_count + carry

    def scanned_input(self, scanned: int) -> int:
        """The position of scanned input `scanned` among the operands and the body's
        inputs."""
        return self.const_count + self.carry_count + scanned

    def scanned_index(self, position: int) -> int | None:
        """Which scanned input the operand at `position` is (None: a const or a carry)."""
        k = position - self.scanned_input(0)
        return k if k >= 0 else None

    def scan(self, step: Callable, init: Any, xs: Any, length: int | None = None) -> Any:
        """`jax.lax.scan(step, init, xs)` with this scan's length, direction and
        unrolling (what an interpreter re-emitting the equation calls)."""
        return jax.lax.scan(step, init, xs, length=self.length if length is None else length,
                            reverse=self.reverse, unroll=self.unroll)

    # the body's structure, for the analyses of enumeration and Markov-local replays

    def body_in_aval(self, position: int) -> Any:
        """The abstract value (shape, dtype) of the body's input at `position`."""
        return self.body.jaxpr.invars[position].aval

    @property
    def body_out_count(self) -> int:
        """How many outputs the body has (carries, then per-step outputs)."""
        return len(self.body.jaxpr.outvars)

    def dependence(self) -> list[set]:
        """For each body output, the positions of the body inputs it depends on
        (conservatively: an equation's outputs depend on all of its inputs).

        Example:
            >>> import jax, jax.numpy as jnp
            >>> f = lambda c, xs: jax.lax.scan(lambda c, x: (c + 1.0, x * 2.0), c, xs)
            >>> (eqn,) = jax.make_jaxpr(f)(0.0, jnp.arange(3.0)).jaxpr.eqns
            >>> ScanEqn.of(eqn).dependence()
            [{0}, {1}]
        """
        return output_dependence(self.body.jaxpr)

    def passes_through(self, carry: int) -> bool:
        """Whether the body returns carry `carry` unchanged."""
        jaxpr = self.body.jaxpr
        return jaxpr.outvars[carry] is jaxpr.invars[self.carry_input(carry)]

    def carries_input(self, carry: int, scanned: int) -> bool:
        """Whether carry `carry`'s new value is the step's scanned input `scanned` itself."""
        jaxpr = self.body.jaxpr
        return jaxpr.outvars[carry] is jaxpr.invars[self.scanned_input(scanned)]

    def shifts(self, carry: int, other: int) -> bool:
        """Whether carry `carry`'s new value is carry `other`'s value at the step's start
        (a register of a chain's earlier values).

        Example:
            >>> import jax, jax.numpy as jnp
            >>> f = lambda c, xs: jax.lax.scan(lambda c, x: ((x, c[0]), None), c, xs)
            >>> (eqn,) = jax.make_jaxpr(f)((0.0, 0.0), jnp.arange(3.0)).jaxpr.eqns
            >>> ScanEqn.of(eqn).shifts(1, 0), ScanEqn.of(eqn).shifts(0, 1)
            (True, False)
        """
        jaxpr = self.body.jaxpr
        return jaxpr.outvars[carry] is jaxpr.invars[self.carry_input(other)]

    def accumulators(self, subtract: bool = True, sole_use: bool = True) -> frozenset:
        """The carries `j` whose new value is `c_j + term` (or, with `subtract`,
        `c_j - term`), `c_j` used nowhere else in the body, and (with `sole_use`) the
        sum used only as the new carry: a change in an earlier step shifts them by a
        constant.

        Example:
            >>> import jax, jax.numpy as jnp
            >>> f = lambda c, xs: jax.lax.scan(lambda c, x: ((c[0] * x, c[1] + x), None), c, xs)
            >>> init = (jnp.float32(1.0), jnp.float32(0.0))
            >>> (eqn,) = jax.make_jaxpr(f)(init, jnp.arange(3.0)).jaxpr.eqns
            >>> ScanEqn.of(eqn).accumulators()
            frozenset({1})
        """
        jaxpr = self.body.jaxpr
        uses: dict = {}
        for eqn in jaxpr.eqns:
            for v in eqn.invars:
                if not isinstance(v, Literal):
                    uses.setdefault(v, []).append(eqn)
        for v in jaxpr.outvars:
            if not isinstance(v, Literal):
                uses.setdefault(v, []).append(None)
        found = set()
        for j in range(self.carry_count):
            c, out = jaxpr.invars[self.carry_input(j)], jaxpr.outvars[j]
            (eqn, *more) = uses.get(c, [None, None])
            if more or eqn is None or eqn.outvars[0] is not out or (
                    sole_use and len(uses.get(out, [])) != 1):
                continue
            name = eqn.primitive.name
            if name == "add" or (subtract and name == "sub" and eqn.invars[0] is c
                                 and eqn.invars[1] is not c):
                found.add(j)
        return frozenset(found)


@dataclasses.dataclass(frozen=True)
class WhileEqn:
    """A typed view of a `while` equation: its predicate and body (closed jaxprs) and
    how its operands split (predicate consts, body consts, carries).

    Example:
        >>> import jax
        >>> f = lambda x: jax.lax.while_loop(lambda c: c < 3.0, lambda c: c + 1.0, x)
        >>> w = WhileEqn.of(jax.make_jaxpr(f)(0.0).jaxpr.eqns[0])
        >>> [len(part) for part in w.split([0.0])]
        [0, 0, 1]
    """
    eqn: Any
    cond: ClosedJaxpr
    body: ClosedJaxpr
    cond_const_count: int
    body_const_count: int

    @staticmethod
    def of(eqn: Any) -> "WhileEqn":
        p = eqn.params
        return WhileEqn(eqn, _closed(p["cond_jaxpr"]), _closed(p["body_jaxpr"]),
                        p["cond_nconsts"], p["body_nconsts"])

    def split(self, ins: Sequence) -> tuple[list, list, list]:
        """(predicate consts, body consts, carries) of the equation's operands."""
        cn, bn = self.cond_const_count, self.body_const_count
        return list(ins[:cn]), list(ins[cn:cn + bn]), list(ins[cn + bn:])


def sort_keys(eqn: Any) -> int:
    """How many of a `sort` equation's operands are keys (the rest ride along)."""
    return eqn.params.get("num_keys", 1)


def reduced_axes(eqn: Any) -> tuple:
    """The axes a reduction equation (`reduce_sum`, `reduce_max`, ...) reduces.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> (eqn,) = jax.make_jaxpr(lambda x: x.sum(axis=(0, 2)))(jnp.ones((2, 3, 4))).jaxpr.eqns
        >>> reduced_axes(eqn)
        (0, 2)
    """
    return tuple(eqn.params["axes"])


def call_body(eqn: Any) -> ClosedJaxpr:
    """The closed jaxpr a call-like equation ('call' or 'custom' kind) evaluates."""
    return CallEqn.of(eqn).body


def cond_branches(eqn: Any) -> tuple:
    """The branches (closed jaxprs) of a `cond` equation."""
    return CondEqn.of(eqn).branches


def shaped(shape: tuple, dtype: Any) -> Any:
    """An abstract value (what an abstract-evaluation rule returns)."""
    return jax.core.ShapedArray(tuple(shape), dtype)
