"""The fence's ground: genvi's primitives defined, a function traced to a closed jaxpr,
one equation evaluated or differentiated, and where an equation came from in the
user's source."""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import jax
import jax.extend.core as jcore
import numpy as np
from jax._src import source_info_util


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


GENVI_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JAX_DIR = os.path.dirname(os.path.abspath(jax.__file__))


#: folders whose frames are not the user's line: genvi's, and a front end's library (the
#: NumPyro that `gv.from_numpyro` runs: its handlers emit the sites a user's line wrote)
LIBRARY_DIRS: list[str] = [GENVI_DIR]


def not_the_users(folder: str) -> None:
    """Name a library folder whose frames `source_line` passes over to the user's line."""
    folder = os.path.dirname(os.path.abspath(folder)) if folder.endswith(".py") else folder
    if folder not in LIBRARY_DIRS:
        LIBRARY_DIRS.append(folder)


def source_line(eqn: Any) -> str:
    """'file:line (function)' of the code that emitted `eqn`: the innermost frame
    outside JAX, genvi and the libraries of `LIBRARY_DIRS` (the user's line), else the
    innermost outside JAX."""
    frames = list(source_info_util.user_frames(eqn.source_info.traceback))
    if not frames:
        return "an unknown line"
    outside = [f for f in frames if not f.file_name.startswith(tuple(LIBRARY_DIRS))]
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


def output_dependence(jaxpr: Any) -> list[set]:
    """For each output of `jaxpr`, the positions of the inputs it depends on
    (conservatively: an equation's outputs depend on all of its inputs).

    Example:
        >>> import jax
        >>> closed = jax.make_jaxpr(lambda x, y: (x * 2.0, x + y, 1.0))(1.0, 2.0)
        >>> output_dependence(closed)
        [{0}, {0, 1}, set()]
    """
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    deps: dict = {v: {i} for i, v in enumerate(jaxpr.invars)}

    def of(v: Any) -> set:
        return set() if isinstance(v, Literal) else deps.get(v, set())
    for eqn in jaxpr.eqns:
        found = set().union(set(), *[of(v) for v in eqn.invars])
        for out in eqn.outvars:
            deps[out] = found
    return [of(v) for v in jaxpr.outvars]
