"""Clear words for the mistakes of a user's first hour with `@gv.gen` programs.

A distribution call never sampled at an address, a plain Python function passed where
a program belongs, a Python `if` on a traced value, and a `grad=` on a model site
that nothing samples: each raises (or warns) with what went wrong, where, and the
fix. Detection lives with the code that sees the mistake (`genvi.core.tracing` notes
what a traced program did); the words live here.

Example:
    >>> from genvi.core.program_mistakes import require_program
    >>> def model(y):
    ...     pass
    >>> try:
    ...     require_program(model, "model", "gv.elbo(model, guide)")
    ... except TypeError as err:
    ...     print(str(err).split(";")[0])
    gv.elbo(model, guide): the model must be a @gv.gen program
"""

from __future__ import annotations

import inspect
import io
import linecache
import os
import re
import tokenize
from typing import Any, Iterable

import jax

from genvi.core.jaxpr import JAX_DIR
from genvi.core.mistakes import addr_name



# --------------------------------------------------------------------------- programs as arguments

def is_program(obj: Any) -> bool:
    """Whether `obj` is a generative program (`@gv.gen`, a combinator, an automatic
    guide, `gv.marginal`...): it has `simulate`, `log_density` and `interpret`.

    Example:
        >>> import genvi as gv
        >>> is_program(gv.gen(lambda: None)), is_program(lambda: None)
        (True, False)
    """
    return all(callable(getattr(type(obj), m, None))
               for m in ("simulate", "log_density", "interpret"))


def describe_non_program(obj: Any) -> str:
    """What `obj` is and the fix, for an argument that should have been a program.

    Example:
        >>> def guide(p):
        ...     pass
        >>> describe_non_program(guide).split(";")[0]
        "the plain Python function 'guide' (no @gv.gen)"
    """
    if inspect.isfunction(obj) or inspect.ismethod(obj) or isinstance(obj, type(len)):
        name = getattr(obj, "__name__", "f")
        return (f"the plain Python function {name!r} (no @gv.gen); decorate it with @gv.gen "
                f"(write `@gv.gen` on the line above `def {name}(...)`) so that its sampling "
                "sites `dist(...) @ \"address\"` are recorded")
    gen = getattr(obj, "gen", None) if isinstance(obj, tuple) else None
    if gen is not None and is_program(gen):  # `model(...)`: a program call
        return (f"the program call {gen.name}(...); pass the program itself, `{gen.name}`, "
                "not a call of it (the arguments are given when the objective or the draws run)")
    if callable(getattr(type(obj), "grad_estimate", None)):
        return (f"the objective {getattr(obj, 'name', obj)!r}, not a program; pass the model "
                "and guide programs it was built from")
    text = repr(obj)
    return f"{text if len(text) < 60 else text[:57] + '...'} ({type(obj).__name__})"


def require_program(obj: Any, arg: str, call: str, optional: bool = False) -> None:
    """Raise a `TypeError` unless `obj` is a generative program; `arg` names the argument
    of `call` (e.g. `"guide"` of `"gv.elbo(model, guide)"`); `optional`: None is allowed.

    Example:
        >>> import genvi as gv
        >>> require_program(gv.gen(lambda: None), "model", "gv.elbo(model, guide)")
    """
    if is_program(obj) or (optional and obj is None):
        return
    raise TypeError(f"{call}: the {arg} must be a @gv.gen program; got "
                    f"{describe_non_program(obj)}.")


def require_programs(call: str, **programs: Any) -> None:
    """`require_program` for each keyword argument, e.g. `model=model, guide=guide`.

    Example:
        >>> import genvi as gv
        >>> p = gv.gen(lambda: None)
        >>> require_programs("gv.elbo(model, guide)", model=p, guide=p)
    """
    for arg, obj in programs.items():
        require_program(obj, arg, call)


# --------------------------------------------------------------------------- distribution calls never sampled

def unaddressed_error(kind: str, name: str, unused: list) -> TypeError:
    """The error for distribution calls that a program (or objective) made and never
    sampled, scored or read: `unused` holds (what, "file:line") pairs, e.g.
    `("gv.normal(...)", "model.py:3 (model)")`.

    Example:
        >>> err = unaddressed_error("program", "model", [("gv.normal(...)", "m.py:3 (model)")])
        >>> "@ \\"name\\"" in str(err)
        True
    """
    what, line = unused[0]
    code = _source_text(line)
    more = "" if len(unused) == 1 else (
        f" (and {len(unused) - 1} more: " + "; ".join(f"{w} at {w_line}" for w, w_line in unused[1:])
        + ")")
    if kind == "program":
        fix = (f"Sample it at an address: `{what} @ \"name\"` (the value is then a choice at "
               f"\"name\"), or score a value with gv.observe({what}, value)")
        verb = "sampled at an address"
    else:
        fix = f"Draw from it with `x = gv.sample({what})`, or call a program's .sim(...)"
        verb = "drawn from"
    return TypeError(
        f"the {kind} {name!r} makes {what} at {line}{code} but it is never {verb}{more}: a "
        f"distribution call by itself samples nothing, so it would be silently dropped. {fix}.")


def _source_text(line: str) -> str:
    """` (`code`)` for a "file:line (function)" location, or ""."""
    match = re.match(r"(.*):(\d+) \(", line)
    text = _code(match.group(1), int(match.group(2))) if match else ""
    return f" (`{text}`)" if text else ""


def _code(filename: str, line: int) -> str:
    """The source line, stripped of its comment ("" where the source is unknown)."""
    text = linecache.getline(filename, line).strip()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError):  # a line that opens a bracket
        return text
    comments = [t for t in tokens if t.type == tokenize.COMMENT]
    return text[:comments[0].start[1]].rstrip() if comments else text


# --------------------------------------------------------------------------- Python control flow on traced values

class TracedConditionError(TypeError):
    """Python control flow (`if`, `while`, `and`, `bool()`) on a traced value inside a
    program or objective."""


def _innermost_user_frame(err: BaseException) -> tuple[Any, int]:
    """(frame, line) of the innermost frame of `err`'s traceback outside JAX: the code
    that asked for a bool (JAX drops its own frames from the traceback, mostly)."""
    found: tuple[Any, int]
    tb, found = err.__traceback__, (None, 0)
    while tb is not None:
        if not os.path.abspath(tb.tb_frame.f_code.co_filename).startswith(JAX_DIR):
            found = (tb.tb_frame, tb.tb_lineno)
        tb = tb.tb_next
    return found


def _tested_sites(code: str, frame: Any, site_values: dict) -> list[str]:
    """Addresses of the site values that the source line `code` names (by variable)."""
    found = []
    for ident in _names_on(code):
        value = frame.f_locals.get(ident)
        entry = site_values.get(id(value))
        if entry is not None and entry[0] is value:
            found.append(addr_name(entry[1]))
    return found


def _traced_arguments(err: BaseException) -> list[str]:
    """The parameters of the user's function that the line raising `err` names and
    that hold traced values (an argument used where JAX needs a Python value)."""
    frame, line = _innermost_user_frame(err)
    code = _code(frame.f_code.co_filename, line) if frame is not None else ""
    if not code:
        return []
    params = frame.f_code.co_varnames[:frame.f_code.co_argcount + frame.f_code.co_kwonlyargcount]
    return [ident for ident in _names_on(code)
            if ident in params and isinstance(frame.f_locals.get(ident), jax.core.Tracer)]


def _names_on(code: str) -> list[str]:
    """The names a source line mentions, each once, in order."""
    return list(dict.fromkeys(re.findall(r"[A-Za-z_]\w*", code)))


def _where_and_latents(err: BaseException, site_values: dict, otherwise: str
                       ) -> tuple[str, str]:
    """(" at file:line (`code`)", "the latent 'x'") for the user's line that raised `err`,
    the latents named by the variables on it (`otherwise` where none is)."""
    frame, line = _innermost_user_frame(err)
    if frame is None:
        return "", otherwise
    code = _code(frame.f_code.co_filename, line)
    where = f" at {frame.f_code.co_filename}:{line}" + (f" (`{code}`)" if code else "")
    sites = _tested_sites(code, frame, site_values) if code else []
    return where, ("the latent " + " and ".join(repr(s) for s in sites)) if sites else otherwise


def traced_condition_error(err: BaseException, kind: str, name: str,
                           site_values: dict) -> TracedConditionError:
    """The error for JAX's `TracerBoolConversionError` raised in the user's code while
    tracing the {kind} `name`; `site_values` maps `id(value)` to `(value, address)` of
    the sites bound so far (to name the latent that the condition tests)."""
    where, tested = _where_and_latents(err, site_values, "a traced value")
    discrete = ("`b = gv.flip(p, grad=gv.ENUM) @ \"b\"`" if kind == "program"
                else "`b = gv.sample(gv.flip(p, grad=gv.ENUM))`")
    return TracedConditionError(
        f"the {kind} {name!r} uses {tested} as a Python bool{where}. genvi {kind}s are "
        "traced once, like functions under jax.jit: a latent, or anything computed from a "
        "sample or an argument, has no concrete value while the Python code runs, so a "
        "Python `if`, `while`, `and`/`or` or bool() cannot test it. Instead: select a value "
        "with jnp.where(condition, a, b); branch between code that samples with "
        "jax.lax.cond / jax.lax.switch (genvi samples inside their branches); or, for a "
        f"discrete choice, make it a discrete site such as {discrete} (enumerated exactly "
        "with grad=gv.ENUM) and branch on it with jax.lax.cond.")


class BooleanIndexError(IndexError):
    """A traced bool (a `gv.flip` value) used as an index inside a program or
    objective: JAX reads it as a mask of data-dependent size."""


def boolean_index_error(err: BaseException, kind: str, name: str,
                        site_values: dict) -> BooleanIndexError:
    """The error for JAX's `NonConcreteBooleanIndexError` raised in the user's code while
    tracing the {kind} `name` (`p[b]` with `b` a flip's value)."""
    where, used = _where_and_latents(err, site_values, "a traced bool")
    return BooleanIndexError(
        f"the {kind} {name!r} indexes an array with {used}{where}. A gv.flip value is a "
        "bool, and JAX reads an array indexed by a bool as a mask (a result whose size "
        "depends on the value), not as position 0 or 1. To pick an entry, index with an "
        "integer: `p[b.astype(jnp.int32)]`; or select: `jnp.where(b, p[1], p[0])`.")


class StaticUseError(TypeError):
    """A traced value (a latent) used where JAX needs a Python value: a shape, a
    slice's bound, an integer."""


def static_use_error(err: BaseException, kind: str, name: str,
                     site_values: dict) -> StaticUseError:
    """The error for JAX's concretization errors (a traced value as a shape, a slice
    bound, `int()`, `range()`) raised in the user's code while tracing the {kind}
    `name`, naming the latent used where the line names one."""
    # a shape or a bound is a whole number: the line's integer latents are the ones used
    counts = {k: v for k, v in site_values.items()
              if getattr(v[0], "dtype", None) is not None
              and (jax.numpy.issubdtype(v[0].dtype, jax.numpy.integer)
                   or jax.numpy.issubdtype(v[0].dtype, jax.numpy.bool_))}
    where, used = _where_and_latents(err, counts, "a traced value")
    if used == "a traced value":
        where, used = _where_and_latents(err, site_values, used)
    first = (str(err).strip().splitlines() or [type(err).__name__])[0].split(". ")[0]
    arguments = _traced_arguments(err) if used == "a traced value" else []
    if arguments:
        named = " and ".join(repr(a) for a in arguments)
        return StaticUseError(
            f"the {kind} {name!r} uses its argument {named} as a Python value{where} "
            f"({type(err).__name__}: {first}). genvi traces a {kind}'s array and float "
            "arguments, as jax.jit does (Python ints and bools stay constants), so its "
            "Python code cannot read their values: compute what needs the value before "
            f"the call (e.g. n = int(np.max({arguments[0]}))) and pass that as a Python "
            "int argument, or keep the shape fixed and use the value as an array.")
    return StaticUseError(
        f"the {kind} {name!r} uses {used} as a Python value: it sets a shape, bounds a "
        f"slice or counts a loop{where} ({type(err).__name__}: {first}). genvi {kind}s are "
        "traced once, like functions under jax.jit, and a latent is summed or replayed at "
        "all of its values at once (gv.enumeration, gv.ENUM, particles), so it cannot fix "
        "the size of an array. Keep shapes fixed and use the value as an array: mask with "
        "`jnp.arange(N) <= n` instead of slicing `y[: n + 1]`, select with jnp.where, "
        "loop to a fixed length with jax.lax.scan.")


def is_static_use(err: BaseException) -> bool:
    """Whether `err` is JAX refusing a traced value where it needs a Python one."""
    if isinstance(err, (jax.errors.ConcretizationTypeError,
                        jax.errors.TracerIntegerConversionError,
                        jax.errors.TracerArrayConversionError)):
        return True
    # JAX's own words for a traced value in a shape (genvi's errors say "concrete" too)
    if isinstance(err, TypeError) and "Shapes must be 1D sequences of concrete" in str(err):
        return True
    return isinstance(err, IndexError) and "Tracer" in str(err)


# --------------------------------------------------------------------------- grad= where nothing samples

class UnusedStrategyWarning(UserWarning):
    """A `grad=` that an objective never uses: the site is only scored there."""


def unused_strategy_message(objective: str, program: str, strategies: Iterable) -> str:
    """The warning for model sites with `grad=` that the objective `objective` only
    scores (their values come from another program, such as a guide).

    Example:
        >>> unused_strategy_message("elbo", "model", [(("z",), "gv.ENUM")]).split(":")[0]
        "the objective 'elbo' only scores the program 'model' at values another program proposes (a guide)"
    """
    listed = ", ".join(f"{addr_name(a)!r} (grad={s})" for a, s in strategies)
    return (
        f"the objective {objective!r} only scores the program {program!r} at values another "
        f"program proposes (a guide): its sites are never sampled here, so grad= at {listed} "
        "is unused. A model site's value comes from the guide, and the strategy of the guide's "
        "site at that address is what differentiates it: put grad= there (or remove it from "
        "the model). grad= on a model site matters only where the model itself is sampled in "
        "an objective: a site no guide proposes (g.generate), gv.importance(proposal=None), "
        "g.sim or g.dream.")
