"""Everything genvi needs from JAX's internals, in one place.

genvi represents programs as jaxprs holding its own primitives (sampling sites,
observations) and interprets them. This module is the only one that imports
`jax.extend.core` or `jax.interpreters`: defining primitives, tracing a Python
function to a closed jaxpr, evaluating one equation, and recognising the
higher-order primitives (`scan`, `cond`, `jit`, custom derivatives, `while`) whose
bodies may hold sampling sites. A JAX upgrade should touch this file only;
`tests/test_jaxpr_internals.py` pins its behaviour.
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, Sequence

import dataclasses
import itertools
import os
import threading
import weakref

import jax
import jax.extend.core as jcore
import numpy as np
from jax._src import source_info_util
from jax.interpreters import batching

ClosedJaxpr = jcore.ClosedJaxpr
Jaxpr = jcore.Jaxpr
Literal = jcore.Literal


def make_primitive(name: str, abstract_eval: Callable, multiple_results: bool = False) -> jcore.Primitive:
    """A primitive that only genvi's interpreters give meaning to.

    Binding it outside a genvi transformation and then running it raises an
    error: it has no implementation and no lowering of its own.
    """
    prim = jcore.Primitive(name)
    prim.multiple_results = multiple_results

    def impl(*args, **params):
        raise RuntimeError(
            f"genvi primitive '{name}' was executed outside a genvi transformation "
            f"(site {params.get('addr')!r}). Sampling sites only run inside "
            "g.simulate / g.log_density / an @gv.expectation objective.")

    prim.def_impl(impl)
    prim.def_abstract_eval(abstract_eval)
    return prim


def trace(fn: Callable, flat_args: Sequence[Any]) -> ClosedJaxpr:
    """Trace `fn(*flat_args)` (flat arrays in, flat list out) to a closed jaxpr, with
    genvi's batching of conds that hold sampling sites (`genvi_conds`) in force."""
    with genvi_conds:
        return jax.make_jaxpr(fn)(*flat_args)


def read(env: dict, var: Any) -> Any:
    """Value of a jaxpr variable or literal in an environment."""
    if isinstance(var, Literal):
        return var.val
    return env[var]


def is_drop(var: Any) -> bool:
    return isinstance(var, jcore.DropVar)


def eval_eqn(eqn: Any, invals: Sequence[Any]) -> list:
    """Evaluate one equation on concrete or traced values (as `jax.core.eval_jaxpr`).

    The equation keeps its source line and name scopes, so a program re-emitted by
    an interpreter still points at the user's code (and genvi's scopes survive)."""
    params = eqn.primitive.get_bind_params(eqn.params)
    with emitted_as(eqn), eqn.ctx.manager:
        out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def emitted_as(eqn: Any):
    """A context in which new equations take `eqn`'s source line and name scopes
    (for an interpreter that re-emits `eqn` as other equations)."""
    names = source_info_util.current_name_stack() + eqn.source_info.name_stack
    return source_info_util.user_context(eqn.source_info.traceback, name_stack=names)


def name_stack(eqn: Any) -> str:
    """The equation's name scopes (`jax.named_scope`), as one string."""
    return str(eqn.source_info.name_stack)


GENVI_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__))


def source_line(eqn: Any) -> str:
    """'file:line (function)' of the code that emitted `eqn`: the innermost frame
    outside JAX and genvi (the user's line), else the innermost outside JAX."""
    frames = list(source_info_util.user_frames(eqn.source_info.traceback))
    if not frames:
        return "an unknown line"
    outside = [f for f in frames if not f.file_name.startswith(GENVI_DIR)]
    f = (outside or frames)[0]
    return f"{f.file_name}:{f.start_line} ({f.function_name})"


def is_float_aval(aval: Any) -> bool:
    """Whether an abstract value holds floating-point numbers."""
    return jax.dtypes.issubdtype(getattr(aval, "dtype", np.int32), np.inexact)


def quiet_callback_errors(kind: type) -> None:
    """Keep JAX from logging a traceback when a `jax.debug.callback` raises `kind`
    (the error itself still propagates: validation would print it twice)."""
    import logging  # noqa: PLC0415
    from jax._src import debugging  # noqa: PLC0415

    logging.getLogger(debugging.__name__).addFilter(
        lambda record: not (record.exc_info and isinstance(record.exc_info[1], kind)))


def eval_eqn_with(eqn: Any, invals: Sequence[Any], params: dict) -> list:
    """Evaluate an equation's primitive with replaced operands and parameters."""
    out = eqn.primitive.bind(*invals, **params)
    return list(out) if eqn.primitive.multiple_results else [out]


def is_float(x: Any) -> bool:
    return jax.dtypes.issubdtype(jax.numpy.result_type(x), np.inexact)


def jvp_eqn(eqn: Any, primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[list, list]:
    """Forward-mode evaluation of one equation; `None` is a symbolic-zero tangent.

    Only inputs with a tangent are differentiated, so values that do not depend on
    differentiated arguments cost nothing extra (no zero tangents flow through
    matrix products). Integer outputs get a `None` tangent.
    """
    idx = [i for i, t in enumerate(tangents) if t is not None]
    if not idx or eqn.primitive.name == "stop_gradient":  # a symbolic zero, not zeros
        return eval_eqn(eqn, primals), [None] * len(eqn.outvars)

    def f(*diff):
        args = list(primals)
        for i, d in zip(idx, diff):
            args[i] = d
        return eval_eqn(eqn, args)

    outs, touts = jax.jvp(f, [primals[i] for i in idx], [tangents[i] for i in idx])
    touts = [t if is_float(o) else None for o, t in zip(outs, touts)]
    return outs, touts


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
    `WhileEqn`), or None for any other equation (a custom derivative's among them):
    what interpreters dispatch on, by type, instead of by a primitive's name.

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
    if k == "while":
        return WhileEqn.of(eqn)
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
        jaxpr = self.body.jaxpr
        deps: dict = {v: {i} for i, v in enumerate(jaxpr.invars)}

        def of(v: Any) -> set:
            return set() if isinstance(v, Literal) else deps.get(v, set())
        for eqn in jaxpr.eqns:
            found = set().union(set(), *[of(v) for v in eqn.invars])
            for out in eqn.outvars:
                deps[out] = found
        return [of(v) for v in jaxpr.outvars]

    def passes_through(self, carry: int) -> bool:
        """Whether the body returns carry `carry` unchanged."""
        jaxpr = self.body.jaxpr
        return jaxpr.outvars[carry] is jaxpr.invars[self.carry_input(carry)]

    def carries_input(self, carry: int, scanned: int) -> bool:
        """Whether carry `carry`'s new value is the step's scanned input `scanned` itself."""
        jaxpr = self.body.jaxpr
        return jaxpr.outvars[carry] is jaxpr.invars[self.scanned_input(scanned)]

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


def register_batching_by_broadcasting(prim: jcore.Primitive,
                                     event_ndims: Callable[..., Sequence[int]] | None = None,
                                     shared: Callable[..., Sequence[int]] | None = None,
                                     unpadded: Callable[..., Sequence[int]] | None = None,
                                     counted: str | None = None) -> None:
    """Make `jax.vmap` turn `prim` into one site whose parameters gained a leading
    axis (a product of independent components): every batch axis moves to the
    front and unbatched operands are broadcast.

    `event_ndims(**params)` gives each operand's number of trailing event axes
    (default 0): the batch part of each operand is padded with singleton axes so
    operands of different ranks broadcast per lane as they did before batching
    (a vector loc with a scalar scale stays a valid pair).

    The rule is registered as a "fancy" batcher because JAX calls those even when
    no operand is batched: a sampling site under `vmap` must draw one independent
    value per lane even if its parameters are shared (plain batching rules would
    silently draw a single value and broadcast it).

    `shared(**params)` names operands that, when unbatched, get a leading axis of
    size 1 instead of a copy per lane (the primitive's own rule broadcasts them: a
    guide's covariance factor stays one matrix under a particle `vmap`, so its
    products are matrix products rather than one matrix-vector product per lane).

    `unpadded(count, **params)` names, of the `count` operands, those that are not
    lane-shaped (a strategy's learned parameters): they gain the batch axis only, never
    the singleton axes that align the others with the site's lanes, so their leading
    axes are exactly the batch axes.

    `counted` names a parameter that counts the batch axes the rule has added (a
    site's `batch_axes`: how many leading axes of its value are lanes of `vmap` transformations).
    """

    def rule(axis_data, args, dims, **params):
        size = axis_data.size
        keep = set(shared(**params)) if shared else set()
        moved = [jax.numpy.moveaxis(a, d, 0) if d is not None
                 else jax.numpy.expand_dims(a, 0) if i in keep
                 else jax.numpy.broadcast_to(a, (size,) + jax.numpy.shape(a))
                 for i, (a, d) in enumerate(zip(args, dims))]
        events = list(event_ndims(**params)) if event_ndims else []
        events += [0] * (len(moved) - len(events))
        own = set(unpadded(len(moved), **params)) if unpadded else set()
        batch_ranks = [a.ndim - 1 - e for a, e in zip(moved, events)]
        top = max((r for i, r in enumerate(batch_ranks) if i not in own), default=0)
        moved = [a if i in own else a.reshape(a.shape[:1] + (1,) * (top - r) + a.shape[1:])
                 for i, (a, r) in enumerate(zip(moved, batch_ranks))]
        if counted:
            params = {**params, counted: params.get(counted, 0) + 1}
        out = prim.bind(*moved, **params)
        if prim.multiple_results:
            return out, [0] * len(out)
        return out, 0

    batching.fancy_primitive_batchers[prim] = rule


def register_fancy_batching(prim: jcore.Primitive, rule: Callable) -> None:
    """`jax.vmap`'s rule for one of genvi's own primitives, called even where no operand
    is batched: `rule(axis_data, args, dims, **params) -> (out, out_dim)`, with
    `axis_data.size` the batch size."""
    batching.fancy_primitive_batchers[prim] = rule


_COND_TOKENS = itertools.count()


def cond_token() -> int:
    """A fresh integer naming one batched `cond` (its branches' masked sites carry
    it, so records from different branches of the same cond can be told apart).

    Example:
        >>> cond_token() != cond_token()
        True
    """
    return next(_COND_TOKENS)


class _CondBatching:
    """How genvi batches a `cond` whose index is batched, in force only while genvi
    traces a program or objective (`trace`) or runs an interpreter that emits conds
    (`genvi_conds`): JAX's own rule for `cond` is put back on leaving, so a user's
    `jax.vmap` of a `cond` outside genvi runs JAX's code, and importing genvi
    changes no rule of JAX's.

    JAX evaluates every branch and selects; for branches that sample, every site
    would then be sampled *and scored* in every lane. With genvi's rule each branch
    `b` runs as `run_branch(branch, mask, ops, (token, b))` under `vmap` with
    `mask = (index == b)` per lane, so its sites can be masked, and the outputs are
    selected by the index. `token` (from `cond_token`) is shared by the branches of
    this cond: two sites of one address with the same token and different `b` are
    never both executed. Conds where `applies(branches)` is False go to JAX's rule.

    Why a scoped rule and not a primitive of genvi's own: a user's `jax.lax.cond`
    under the user's own `jax.vmap` (in a program or an objective's body) is batched
    by JAX when it is bound, through this table, before genvi sees any jaxpr, so no
    wrapper or rewrite can reach it. While the rule is in force, every cond that
    holds no genvi site and is not traced for an objective goes to JAX's rule
    (`applies`), so other code, on this thread or another, sees JAX's behaviour.
    """

    def __init__(self) -> None:
        self.applies: Callable[[tuple], bool] | None = None
        self.run_branch: Callable | None = None
        self.depth = 0
        self.saved: Any = None
        self.lock = threading.Lock()

    def rule(self, axis_data, args, dims, *, branches, **params):
        jax_rule = self.saved
        if dims[0] is None or not self.applies(branches):
            return jax_rule(axis_data, args, dims, branches=branches, **params)
        size = axis_data.size
        index = jax.numpy.clip(jax.numpy.moveaxis(args[0], dims[0], 0), 0, len(branches) - 1)
        ops = [jax.numpy.moveaxis(a, d, 0) if d is not None else a
               for a, d in zip(args[1:], dims[1:])]
        in_axes = [0 if d is not None else None for d in dims[1:]]
        token = cond_token()
        run_branch = self.run_branch
        outs = [jax.vmap(lambda m, *o, br=br, b=b: run_branch(br, m, list(o), (token, b)),
                         in_axes=[0] + in_axes, axis_size=size)(index == b, *ops)
                for b, br in enumerate(branches)]
        selected = [jax.lax.select_n(jax.numpy.broadcast_to(
                        index.reshape(index.shape + (1,) * (cases[0].ndim - 1)), cases[0].shape),
                        *cases) for cases in zip(*outs)]
        return selected, [0] * len(selected)

    def __enter__(self) -> None:
        if self.applies is None:
            return
        with self.lock:  # traces on several threads share one count
            if self.depth == 0:
                cond_p = jcore.primitives.cond_p
                self.saved = batching.fancy_primitive_batchers[cond_p]
                batching.fancy_primitive_batchers[cond_p] = self.rule
            self.depth += 1

    def __exit__(self, *exc: Any) -> None:
        if self.applies is None:
            return
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                batching.fancy_primitive_batchers[jcore.primitives.cond_p] = self.saved
                self.saved = None


#: enter it (`with genvi_conds:`) where genvi traces or interprets programs
genvi_conds = _CondBatching()


def set_cond_batching(applies: Callable[[tuple], bool],
                      run_branch: Callable[[Any, Any, list, tuple], list]) -> None:
    """Say how `genvi_conds` batches a `cond` with a batched index (see `_CondBatching`):
    for the conds where `applies(branches)` holds, each branch runs as
    `run_branch(branch, mask, ops, (token, b))`. Installs nothing in JAX."""
    genvi_conds.applies, genvi_conds.run_branch = applies, run_branch
