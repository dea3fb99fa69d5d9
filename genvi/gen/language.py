"""`@gv.gen` programs: `GenFn` and sub-program calls.

Inside a program, `dist(...) @ "addr"` binds a sampling site (`genvi.core.addressing`)
and `g(...) @ "addr"` inlines a sub-program under the address prefix `addr`. Programs
are traced to jaxprs (cached per argument shapes) and given meaning by handlers
(`genvi.gen.handlers`) run by the interpreter (`genvi.gen.interpret`); `g.interpret` runs
any handler, the public interpreter API. The combinators are in
`genvi.gen.combinators`; `gv.observe` and `gv.factor` in `genvi.gen.observations`.

Example:
    >>> import genvi as gv, jax
    >>> @gv.gen
    ... def model():
    ...     return gv.normal(0.0, 1.0) @ "x"
    >>> sorted(model.simulate(jax.random.key(0)).choices.flat())
    [('x',)]
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from genvi.core.addressing import check_address, current_prefix, prefixed
from genvi.core.choices import ChoiceMap, choices as to_choices
from genvi.core.address import Address
from genvi.core.keywords import call_with_keywords, split_keywords, takes_keywords
from genvi.core.mistakes import check_key, did_you_mean, not_a_value
from genvi.core.tracing import IN_OBJECTIVE, PLAIN, note_sampled, note_scored, trace_cached
from genvi.core.validation import entry_point
from genvi.gen import handlers as h
from genvi.gen import sites
from genvi.gen.interpret import run as interpret
# gv.observe and gv.factor, re-exported: the language's other two statements
from genvi.gen.observations import (deterministic as deterministic, factor as factor,
                                    observe as observe)


class Trace(NamedTuple):
    """The result of `g.simulate`: choices, log joint density, return value."""

    choices: ChoiceMap
    log_density: jax.Array
    retval: Any


class Interpretation(NamedTuple):
    """The result of `g.interpret(handler, ...)`: the choices the handler recorded (in the
    user's layout), the log density it accumulated, the program's return value, and
    the addresses read from the given choices."""

    choices: ChoiceMap
    log_density: jax.Array
    retval: Any
    visited: frozenset


class GenCall(NamedTuple):
    """A program applied to arguments, waiting for `@ "addr"`."""

    gen: "GenFn"
    args: tuple

    def __matmul__(self, addr: str) -> Any:
        """Inline the program's sites under the address prefix `addr`."""
        check_address(addr)
        prefix = current_prefix(f"`... @ {addr!r}`")
        with prefixed(prefix + (addr,)):
            return self.gen.body(*self.args)

    # Used as a value, a program call is a forgotten `@ "addr"` (as a tuple it would
    # otherwise concatenate or repeat silently).
    def _not_a_value(self, *_: Any, kind: type = TypeError) -> Any:
        name = self.gen.name
        raise not_a_value(f"the program call {name}(...)", f"{name}(...)", f"{name}.sim(...)",
                          kind)

    @property
    def __jax_array__(self) -> Any:  # JAX looks it up first (see DistCall)
        return self._not_a_value(kind=ValueError)

    def __getattr__(self, attr: str) -> Any:  # e.g. g(x).simulate(key): g was called
        name = self.gen.name
        raise AttributeError(
            f"{name}(...) makes a program call, for `{name}(...) @ \"address\"` inside another "
            f"program; it has no attribute {attr!r}. Call methods on the program itself, "
            f"e.g. {name}.simulate(key, ...) or {name}.log_density(choices, ...).")
    # class attributes, not fields, at run time: mypy reads a NamedTuple's body as fields only
    __array__ = __float__ = _not_a_value  # type: ignore[misc]
    __add__ = __radd__ = __sub__ = __rsub__ = _not_a_value  # type: ignore[misc]
    __mul__ = __rmul__ = _not_a_value  # type: ignore[misc]
    __truediv__ = __rtruediv__ = __pow__ = __rpow__ = __neg__ = _not_a_value  # type: ignore[misc]
    __lt__ = __le__ = __gt__ = __ge__ = _not_a_value  # type: ignore[misc]


class GenFn:
    """A generative function. Subclasses define `body(*args)`."""

    name = "program"
    estimated_density = False  # True for gv.marginal / gv.normalize

    def __init__(self) -> None:
        self._traces: dict = {}

    def body(self, *args: Any) -> Any:
        raise NotImplementedError

    def __call__(self, *args: Any) -> GenCall:
        return GenCall(self, args)

    def genvi_unsampled(self) -> tuple[str, str]:
        """(what this is, how to sample it in an objective): for the error raised when a
        program or objective returns it (`genvi.core.mistakes.check_returned`)."""
        return f"{self.name}(...)", f"`{self.name}.sim(...)` in an @gv.expectation objective"

    def _trace(self, args: tuple):
        def at_root(*a):
            with prefixed(()):
                return self.body(*a)
        return trace_cached(self._traces, at_root, args,
                            name=("program", self.name, getattr(self, "fn", None)))

    def _note_scored(self, traced: Any, scored: set) -> None:
        """In an objective, a model's (a program that observes) scored sites with `grad=`:
        unused unless the objective also samples it (`TraceNotes.finish` warns)."""
        if IN_OBJECTIVE and sites.first_observation(traced.closed) is not None:
            note_scored(self, {a: s for a, s in sites.site_strategies(traced.closed).items()
                               if s is not None and a in scored})

    @staticmethod
    def _layouts(traced: Any) -> dict:
        if not hasattr(traced, "layouts"):  # with the addresses `_user` leaves out
            traced.layouts = sites.site_layouts(traced.closed)
            traced.auxiliary = sites.auxiliary_addresses(traced.closed)
        return traced.layouts

    def _user(self, traced: Any, flat: dict) -> ChoiceMap:
        """Interpreter choices → the user's layout (batch axes in nesting order), without
        the auxiliary sites' (scored in the density, not choices)."""
        layouts = self._layouts(traced)
        kept = {a: v for a, v in flat.items() if a not in traced.auxiliary}
        return ChoiceMap(sites.to_user_layout(kept, layouts))

    def _internal(self, traced: Any, cm: ChoiceMap) -> dict:
        return sites.to_interpreter_layout(cm.flat(), self._layouts(traced))

    def _run_traced(self, handler: h.Handler, args: tuple, key: Any = None,
                   reads: ChoiceMap | None = None) -> tuple[Any, list, h.State]:
        """Trace the program on `args` and run one interpreter over it; `reads` are
        the choices the handler reads (user layout). Returns `(traced, outs, state)`."""
        traced, dyn = self._trace(args)
        zero = jnp.zeros((), jnp.result_type(float))
        flat = {} if reads is None else self._internal(traced, reads)
        try:
            outs, state = interpret(traced.closed, dyn, handler,
                                    h.State(key, zero, {}, flat, set()))
        except h.MissingChoice as err:  # suggest a choice the program never reads
            sampled = sites.site_addresses(traced.closed)
            err.args = (err.args[0] + did_you_mean(err.addr, [a for a in flat if a not in sampled]),)
            raise
        return traced, outs, state

    def interpret(self, handler: h.Handler, *args: Any, key: Any = None,
            choices: Any = None) -> Interpretation:
        """Run this program on `args` with `handler` (a `genvi.gen.handlers.Handler`):
        the public interpreter API for guides and tools. `key` is the PRNG key for
        handlers that sample; `choices` (a choice map or nested dict, the user's
        layout) are the values handlers read (`state.reads`).

        Example:
            >>> import genvi as gv, jax
            >>> from genvi.gen.handlers import Simulate
            >>> @gv.gen
            ... def g():
            ...     return gv.normal(0.0, 1.0) @ "x"
            >>> out = g.interpret(Simulate(), key=jax.random.key(0))
            >>> bool(out.choices["x"] == out.retval)
            True
        """
        reads = None if choices is None else to_choices(choices)
        traced, outs, state = self._run_traced(handler, args, key=key, reads=reads)
        return Interpretation(self._user(traced, state.choices), state.log_density,
                              jax.tree_util.tree_unflatten(traced.out_tree, outs),
                              frozenset(state.visited))

    def jaxpr(self, *args: Any) -> Any:
        """The program traced on `args`: a closed jaxpr holding its sites
        (`genvi.core.primitives.site_p`) and observations (`observe_p`), for tools that
        inspect a program (`genvi.gen.sites`). Cached per argument shapes.

        Example:
            >>> import genvi as gv
            >>> @gv.gen
            ... def g(m):
            ...     return gv.normal(m, 1.0) @ "x"
            >>> [e.primitive.name for e in g.jaxpr(0.0).eqns]
            ['genvi_site']
        """
        return self._trace(args)[0].closed

    @entry_point
    @takes_keywords
    def simulate(self, key: jax.Array, *args: Any) -> Trace:
        """Sample all choices; returns a `Trace` (plain JAX, jit/vmap-able).

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def g():
            ...     return gv.normal(0.0, 1.0) @ "x"
            >>> tr = g.simulate(jax.random.key(0))
            >>> bool(tr.choices["x"] == tr.retval)
            True
        """
        check_key(key, f"{self.name}.simulate")
        traced, outs, state = self._run_traced(h.Simulate(), args, key=key)
        return Trace(self._user(traced, state.choices), state.log_density,
                     jax.tree_util.tree_unflatten(traced.out_tree, outs))

    @entry_point
    @takes_keywords
    def log_density(self, choices: Any, *args: Any) -> jax.Array:
        """The log density of `choices` under this program (observations included).

        Example:
            >>> import genvi as gv
            >>> @gv.gen
            ... def g():
            ...     gv.normal(0.0, 1.0) @ "x"
            >>> round(float(g.log_density(gv.choices({"x": 0.0}))), 4)
            -0.9189
        """
        return self.assess(choices, *args)[0]

    @entry_point
    @takes_keywords
    def assess(self, choices: Any, *args: Any) -> tuple[jax.Array, Any]:
        """`(log density of choices, return value)`: `log_density` that also returns
        what the program computes from those choices.

        Example:
            >>> import genvi as gv
            >>> @gv.gen
            ... def g():
            ...     return 2.0 * (gv.normal(0.0, 1.0) @ "x")
            >>> float(g.assess(gv.choices({"x": 1.5}))[1])
            3.0
        """
        cm = to_choices(choices)
        traced, outs, state = self._run_traced(h.Assess(), args, reads=cm)
        self._note_scored(traced, state.visited)
        # gv.deterministic values that simulate returned: accepted, recomputed, not read
        derived = sites.deterministic_addresses(traced.closed)
        unvisited = set(cm.flat()) - state.visited - derived
        if unvisited:
            names = sorted(str(Address(a)) for a in unvisited)
            hint = "".join(did_you_mean(a, state.visited) for a in sorted(unvisited, key=str))
            raise KeyError(f"log_density: the choices hold addresses the program never "
                           f"visits: {names}.{hint} Remove them (or check the address spelling).")
        return state.log_density, jax.tree_util.tree_unflatten(traced.out_tree, outs)

    @takes_keywords
    def sim(self, *args: Any) -> tuple[ChoiceMap, jax.Array]:
        """Inside an objective: `(choices, log density)` sampled with each site's
        gradient strategy.

        Example:
            >>> import genvi as gv
            >>> @gv.gen
            ... def q(m):
            ...     gv.normal(m, 1.0, grad=gv.REPARAM) @ "x"
            >>> @gv.expectation
            ... def neg_entropy(m):
            ...     _, log_q = q.sim(m)
            ...     return log_q
        """
        if not IN_OBJECTIVE:
            raise RuntimeError(
                f"{self.name}.sim(...) draws samples with gradient strategies and belongs "
                "inside an @gv.expectation objective. Outside one, use "
                f"{self.name}.simulate(key, ...).")
        traced, _, state = self._run_traced(h.Sim(repr(self.name)), args)
        note_sampled(self, sites.site_strategies(traced.closed))
        return self._user(traced, state.choices), state.log_density

    @takes_keywords
    def dream(self, *args: Any) -> tuple[ChoiceMap, list, jax.Array]:
        """Inside an objective: sample latents *and observations* from the program
        (observed values passed in are ignored). Returns `(latent choices, sampled
        observations in program order, log joint density)`; used by wake-sleep."""
        with PLAIN.set():
            traced, _, state = self._run_traced(h.Dream(repr(self.name)), args)
        note_sampled(self, sites.site_strategies(traced.closed))
        latents = {a: v for a, v in state.choices.items() if a[0] != "__observation__"}
        latents = self._user(traced, latents).flat()
        observed = [v for _, v in sorted((a[1], v) for a, v in state.choices.items()
                                         if a[0] == "__observation__")]
        return ChoiceMap(latents), observed, state.log_density

    def site_strategies(self, *args: Any) -> dict:
        """`{address: gradient strategy}` of the sites this program may sample on
        `args` (None where a site has no `grad=`); what objectives check.

        Example:
            >>> import genvi as gv
            >>> @gv.gen
            ... def q(m):
            ...     gv.normal(m, 1.0, grad=gv.REPARAM) @ "z"
            >>> q.site_strategies(0.0)
            {'z': gv.REPARAM}
        """
        traced, _ = self._trace(args)
        return {str(Address(a)): s for a, s in sites.site_strategies(traced.closed).items()}

    def require_normalized(self, role: str, *args: Any) -> None:
        """Raise `gv.UnnormalizedError` if this program, run on `args`, calls
        `gv.observe`: `role` says where a normalized density is needed.

        Example:
            >>> import genvi as gv
            >>> @gv.gen
            ... def q(m):
            ...     gv.normal(m, 1.0) @ "z"
            >>> q.require_normalized("the guide of gv.sleep_guide", 0.0)   # no observe: fine
        """
        traced, _ = self._trace(args)
        eqn = sites.first_observation(traced.closed)
        if eqn is not None:
            raise h.unnormalized_error(repr(self.name), eqn, role)

    @takes_keywords
    def generate(self, constraints: Any, *args: Any) -> tuple[ChoiceMap, jax.Array]:
        """Inside an objective: run with `constraints` fixed, sampling the other sites
        with their strategies; returns `(choices, log weight)` where the weight is
        the density of the constrained sites and observations (importance sampling
        with the program's own prior as proposal)."""
        traced, _, state = self._run_traced(h.Generate(), args, reads=to_choices(constraints))
        note_sampled(self, sites.site_strategies(traced.closed))
        return self._user(traced, state.choices), state.log_density

    @takes_keywords
    def partial_log_density(self, choices: Any, scored: Any, *args: Any) -> jax.Array:
        """Log density of the sites at addresses in `scored` plus the observations,
        with every site's value read from `choices`."""
        traced, _, state = self._run_traced(h.Assess(set(scored)), args, reads=to_choices(choices))
        self._note_scored(traced, set(scored) & state.visited)
        return state.log_density

    def __repr__(self) -> str:
        return f"<gv.gen {self.name}>"


class Gen(GenFn):
    """A generative function defined by a Python function (see `gv.gen`)."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn
        self.name = getattr(fn, "__name__", "program")
        functools.update_wrapper(self, fn, updated=())
        try:
            self._signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):  # a callable without one: arguments pass as given
            self._signature = None

    def body(self, *args):
        return call_with_keywords(self.fn, self.arguments(args))

    def arguments(self, args: tuple) -> tuple:
        """`args`, less the first when the function takes exactly one argument fewer:
        a model written without `params` (`def model(y)`) is called as objectives,
        `gv.fit` and `gv.predictive` call every program, `(params, *data)`.

        Example:
            >>> import genvi as gv
            >>> @gv.gen
            ... def model(y):
            ...     gv.normal(0.0, 1.0) @ "z"
            >>> model.arguments(({}, 1.0)), model.arguments((1.0,))
            ((1.0,), (1.0,))
        """
        positional, keywords = split_keywords(args)
        if not positional or self._signature is None or _binds(self._signature, positional, keywords):
            return args
        return args[1:] if _binds(self._signature, positional[1:], keywords) else args


def _binds(signature: inspect.Signature, args: tuple, keywords: dict) -> bool:
    try:
        signature.bind(*args, **keywords)
    except TypeError:
        return False
    return True


def gen(fn: Callable) -> Gen:
    """Make a generative function from a Python function.

    Args:
        fn: a Python function that draws sites with `dist(...) @ "name"` and observes
            with `gv.observe`.

    Returns:
        a `Gen`: simulate, score (`log_density`), call inside other programs, or use as
        a model or guide of an objective.

    Example:
        >>> import genvi as gv, jax
        >>> @gv.gen
        ... def model(y):
        ...     x = gv.normal(0.0, 10.0) @ "x"
        ...     gv.observe(gv.normal(x, 1.0), y)
        ...     return x
        >>> tr = model.simulate(jax.random.key(0), 1.0)
    """
    return Gen(fn)
