"""`@gv.gen` programs, addressing, observation, and the combinators.

Inside a program, `dist(...) @ "addr"` binds a sampling site and `g(...) @ "addr"`
inlines a sub-program under the address prefix `addr`. Programs are traced to
jaxprs (cached per argument shapes) and given meaning by the interpreters in
`genvi.gen.interpreters`. The combinators are trace-time sugar: `gv.vmap` is
`jax.vmap` of the body, `gv.scan` is `jax.lax.scan` of it, so nothing is unrolled.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from genvi.adev.strategies import check_strategy
from genvi.core.choices import ChoiceMap, choices as to_choices
from genvi.core.mistakes import check_key, did_you_mean, not_a_value
from genvi.core.primitives import bind_observe, bind_site, site_p
from genvi.core.tracing import IN_OBJECTIVE, PLAIN, trace_cached
from genvi.distributions.base import DistCall
from genvi.gen import interpreters as interp
from genvi.validation import entry_point

# The address prefix of the code being traced, and the gv.vmap / gv.scan combinators
# enclosing it, outermost first (sites record it so choices can be laid out in nesting
# order, see interpreters.layout). Both are stamped on the sites a trace binds, so both
# are jax.make_user_context values: part of the key of JAX's trace caches, so a
# function JAX traced once (a lax.scan body, a jitted helper) and meets again under
# another address is traced again, not reused with the first address's sites.
_PREFIX = jax.make_user_context(default_value=None)
_NEST = jax.make_user_context(default_value=())


def _nested(kind: str, fn: Callable) -> Callable:
    """`fn` traced inside one more combinator of `kind` ("vmap" or "scan")."""
    def wrapped(*args):
        with _NEST(_NEST.value + (kind,)):
            return fn(*args)
    return wrapped


@contextlib.contextmanager
def _prefix(prefix: tuple):
    with _PREFIX(prefix):
        yield


def _current_prefix(what: str) -> tuple:
    prefix = _PREFIX.value
    if prefix is None:
        raise RuntimeError(
            f"{what} must be used inside a @gv.gen program. Inside an @gv.expectation "
            "objective, draw unnamed values with gv.sample(dist(...)) or call a program's "
            ".sim(...) / .log_density(...).")
    return prefix


def sample_at(call: Any, addr: str) -> Any:
    """`call @ addr`: sample a distribution or inline a sub-program at `addr`."""
    if not isinstance(addr, str):
        raise TypeError(f"addresses are strings, as in `gv.normal(0, 1) @ \"x\"`; got {addr!r} "
                        f"({type(addr).__name__}). For one site per index use f\"x{{i}}\" in a "
                        "Python loop over a static range, or better gv.vmap / gv.scan, which "
                        "stack the choices at one address.")
    prefix = _current_prefix(f"`... @ {addr!r}`")
    if isinstance(call, DistCall):
        if call.strategy is not None:
            check_strategy(call.dist, call.strategy, prefix + (addr,))
        return bind_site(site_p, call.dist, call.params, call.strategy, prefix + (addr,),
                         nest=_NEST.value)
    if isinstance(call, GenCall):
        with _prefix(prefix + (addr,)):
            return call.gen.body(*call.args)
    raise TypeError(f"`x @ {addr!r}` needs a distribution call or a program call; got {call!r}")


def observe(call: DistCall, value: Any, *, name: str | None = None) -> None:
    """Multiply the program's density by `call`'s density at `value`.

    `name` labels the observation with an address (under the enclosing sub-program
    prefixes, stacked by `gv.vmap` / `gv.plate` / `gv.scan` like a choice) so that
    `gv.predictive` can return draws of it. It changes nothing else: the observation
    is scored, not recorded among `simulate`'s choices, and `log_density` does not
    read it. Unnamed observations are never returned by `gv.predictive`. A named
    observation's `value` may be None (new inputs without data): `gv.predictive`
    draws it; scoring it (`simulate`, `log_density`, objectives) is an error.

    Example:
        >>> import genvi as gv
        >>> @gv.gen
        ... def model(y):
        ...     mu = gv.normal(0.0, 1.0) @ "mu"
        ...     gv.observe(gv.normal(mu, 1.0), y, name="y")
    """
    prefix = _current_prefix("gv.observe")
    if not isinstance(call, DistCall):
        raise TypeError(f"gv.observe needs a distribution call such as gv.normal(0, 1); got {call!r}")
    if name is not None and not isinstance(name, str):
        raise TypeError(f"gv.observe(gv.{call.dist.name}(...), value, name=...): a name is a "
                        f"string address such as name=\"y\"; got {name!r} "
                        f"({type(name).__name__})")
    missing = value is None
    if missing and name is None:
        raise TypeError(f"gv.observe(gv.{call.dist.name}(...), None): an observation needs a "
                        "value to score. Only a named observation may be None, for gv.predictive "
                        "to draw it: gv.observe(dist, None, name=\"y\").")
    if missing:  # a placeholder of the distribution's shape (never scored)
        out = jax.eval_shape(lambda *p: call.dist.sample(jax.random.key(0), *p), *call.params)
        value = jnp.zeros(out.shape, out.dtype)
    value = jnp.asarray(value)
    addr = None if name is None else prefix + (name,)
    bind_observe(call.dist, value, call.params, addr=addr, nest=_NEST.value, missing=missing)


class Trace(NamedTuple):
    """The result of `g.simulate`: choices, log joint density, return value."""

    choices: ChoiceMap
    log_density: jax.Array
    retval: Any


class GenCall(NamedTuple):
    """A program applied to arguments, waiting for `@ "addr"`."""

    gen: "GenFn"
    args: tuple

    def __matmul__(self, addr: str) -> Any:
        return sample_at(self, addr)

    # Used as a value, a program call is a forgotten `@ "addr"` (as a tuple it would
    # otherwise concatenate or repeat silently).
    def _not_a_value(self, *_: Any, kind: type = TypeError) -> Any:
        name = self.gen.name
        raise not_a_value(f"the program call {name}(...)", f"{name}(...)", f"{name}.sim(...)",
                          kind)

    # JAX looks it up first (see DistCall)
    __jax_array__ = property(lambda self: self._not_a_value(kind=ValueError))

    def __getattr__(self, attr: str) -> Any:  # e.g. g(x).simulate(key): g was called
        name = self.gen.name
        raise AttributeError(
            f"{name}(...) makes a program call, for `{name}(...) @ \"address\"` inside another "
            f"program; it has no attribute {attr!r}. Call methods on the program itself, "
            f"e.g. {name}.simulate(key, ...) or {name}.log_density(choices, ...).")
    __array__ = __float__ = _not_a_value
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _not_a_value
    __truediv__ = __rtruediv__ = __pow__ = __rpow__ = __neg__ = _not_a_value
    __lt__ = __le__ = __gt__ = __ge__ = _not_a_value


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

    def _trace(self, args: tuple):
        def at_root(*a):
            with _prefix(()):
                return self.body(*a)
        return trace_cached(self._traces, at_root, args,
                            name=("program", self.name, getattr(self, "fn", None)))

    @staticmethod
    def _layouts(traced: Any) -> dict:
        if not hasattr(traced, "layouts"):
            traced.layouts = interp.site_layouts(traced.closed)
        return traced.layouts

    def _user(self, traced: Any, flat: dict) -> ChoiceMap:
        """Interpreter choices → the user's layout (batch axes in nesting order)."""
        return ChoiceMap(interp.to_user_layout(flat, self._layouts(traced)))

    def _internal(self, traced: Any, cm: ChoiceMap) -> dict:
        return interp.to_interpreter_layout(cm.flat(), self._layouts(traced))

    def _interpret(self, handler: interp.Handler, args: tuple, key: Any = None,
                   reads: ChoiceMap | None = None) -> tuple[Any, list, interp.State]:
        """Trace the program on `args` and run one interpreter over it; `reads` are
        the choices the handler reads (user layout). Returns `(traced, outs, state)`."""
        traced, dyn = self._trace(args)
        zero = jnp.zeros((), jnp.result_type(float))
        flat = {} if reads is None else self._internal(traced, reads)
        try:
            outs, state = interp.run(traced.closed, dyn, handler,
                                     interp.State(key, zero, {}, flat, set()))
        except interp.MissingChoice as err:  # suggest a choice the program never reads
            sites = interp.site_addresses(traced.closed)
            err.args = (err.args[0] + did_you_mean(err.addr, [a for a in flat if a not in sites]),)
            raise
        return traced, outs, state

    @entry_point
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
        traced, outs, state = self._interpret(interp.Simulate(), args, key=key)
        return Trace(self._user(traced, state.choices), state.log_density,
                     jax.tree_util.tree_unflatten(traced.out_tree, outs))

    @entry_point
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
        traced, outs, state = self._interpret(interp.Assess(), args, reads=cm)
        unvisited = set(cm.flat()) - state.visited
        if unvisited:
            names = sorted("/".join(map(str, a)) for a in unvisited)
            hint = "".join(did_you_mean(a, state.visited) for a in sorted(unvisited, key=str))
            raise KeyError(f"log_density: the choices hold addresses the program never "
                           f"visits: {names}.{hint} Remove them (or check the address spelling).")
        return state.log_density, jax.tree_util.tree_unflatten(traced.out_tree, outs)

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
        traced, _, state = self._interpret(interp.Sim(repr(self.name)), args)
        return self._user(traced, state.choices), state.log_density

    def dream(self, *args: Any) -> tuple[ChoiceMap, list, jax.Array]:
        """Inside an objective: sample latents *and observations* from the program
        (observed values passed in are ignored). Returns `(latent choices, sampled
        observations in program order, log joint density)`; used by wake-sleep."""
        with PLAIN.set():
            traced, _, state = self._interpret(interp.Dream(repr(self.name)), args)
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
        return {"/".join(map(str, a)): s for a, s in interp.site_strategies(traced.closed).items()}

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
        eqn = interp.first_observation(traced.closed)
        if eqn is not None:
            raise interp.unnormalized_error(repr(self.name), eqn, role)

    def generate(self, constraints: Any, *args: Any) -> tuple[ChoiceMap, jax.Array]:
        """Inside an objective: run with `constraints` fixed, sampling the other sites
        with their strategies; returns `(choices, log weight)` where the weight is
        the density of the constrained sites and observations (importance sampling
        with the program's own prior as proposal)."""
        traced, _, state = self._interpret(interp.Generate(), args, reads=to_choices(constraints))
        return self._user(traced, state.choices), state.log_density

    def partial_log_density(self, choices: Any, scored: Any, *args: Any) -> jax.Array:
        """Log density of the sites at addresses in `scored` plus the observations,
        with every site's value read from `choices`."""
        _, _, state = self._interpret(interp.Assess(set(scored)), args, reads=to_choices(choices))
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

    def body(self, *args):
        return self.fn(*args)


def gen(fn: Callable) -> Gen:
    """Make a generative function from a Python function.

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


class Vmap(GenFn):
    def __init__(self, inner: GenFn, in_axes: Any):
        super().__init__()
        self.inner, self.in_axes = inner, in_axes
        self.name = f"vmap({inner.name})"

    def body(self, *args):
        return jax.vmap(_nested("vmap", self.inner.body), in_axes=self.in_axes)(*args)


class Repeat(GenFn):
    def __init__(self, inner: GenFn, n: int):
        super().__init__()
        self.inner, self.n = inner, int(n)
        self.name = f"repeat({inner.name}, {n})"

    def body(self, *args):
        return jax.vmap(_nested("vmap", lambda _: self.inner.body(*args)))(jnp.arange(self.n))


class Scan(GenFn):
    def __init__(self, inner: GenFn, length: int | None):
        super().__init__()
        self.inner, self.length = inner, length
        self.name = f"scan({inner.name})"

    def body(self, carry, xs=None):
        return jax.lax.scan(_nested("scan", self.inner.body), carry, xs, length=self.length)


def vmap(g: GenFn, in_axes: Any = 0) -> GenFn:
    """`g` mapped over a batch of arguments; choices stacked on a leading axis.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp
        >>> @gv.gen
        ... def point(mu):
        ...     return gv.normal(mu, 1.0) @ "x"
        >>> tr = gv.vmap(point).simulate(jax.random.key(0), jnp.zeros(5))
        >>> tr.choices["x"].shape
        (5,)
    """
    return Vmap(g, in_axes)


def repeat(g: GenFn, n: int) -> GenFn:
    """`n` independent runs of `g` on the same arguments (particles).

    Example:
        >>> import genvi as gv, jax
        >>> @gv.gen
        ... def point():
        ...     return gv.normal(0.0, 1.0) @ "x"
        >>> gv.repeat(point, 4).simulate(jax.random.key(0)).choices["x"].shape
        (4,)
    """
    return Repeat(g, n)


def scan(g: GenFn, length: int | None = None) -> GenFn:
    """`g(carry, x) -> (carry, y)` iterated as `jax.lax.scan`; choices stacked.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp
        >>> @gv.gen
        ... def step(z, _):
        ...     z = gv.normal(z, 1.0) @ "z"
        ...     return z, z
        >>> tr = gv.scan(step, length=3).simulate(jax.random.key(0), 0.0)
        >>> tr.choices["z"].shape
        (3,)
    """
    return Scan(g, length)
