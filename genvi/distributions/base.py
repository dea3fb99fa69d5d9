"""The `Distribution` base class and `DistCall`, a distribution applied to parameters.

A distribution is a stateless, hashable object (it is a static parameter of genvi's
primitives). Subclasses define `sample` and `lane_log_prob`; parameters of any
shape make a product of independent components ("lanes"), whose log densities are
summed. A distribution declares capabilities, never strategy names: each strategy
declares what it needs (`Strategy.needs`), and the strategies a distribution supports
follow (`strategies`, for messages):

* `scorable = True` (the default): the support does not move with the parameters, so
  a score is an unbiased gradient weight (REINFORCE and its baselines).
* `reparameterized = True`: `sample` is differentiable in the parameters (REPARAM).
* `support(*params)`: the finite support of one lane (ENUM).
* `mvd_terms(key, value, params, tangents)`: measure-valued derivative terms (MVD).
* `sd_terms(value, params, tangents)`: stochastic derivative terms (SD).
* `binary = True`: each lane takes the values 0 and 1 (or False and True), with
  `lane_log_prob` defined at both (DisARM).
* `lanewise = True`: `sample` draws each lane from that lane's parameters alone
  (the lane-local replays of ENUM, MVD, RLOO, DisARM, SWOR and RELAX stay O(lanes)
  through such a draw).
* `pushforward(*params)`: `(base, base_params, forward)` where a value is a map of
  a draw `u` of a base distribution (`forward(u)` = (value, log |det ∂value/∂u| per
  lane), continuous): the handlers that sample the site score it at `u`, never at an
  inverse of a rounded value (automatic guides' sites; `genvi.gen.handlers`).
* `domain`: where a continuous value lies ("real", "positive", "unit_interval",
  "interval", "simplex", "own"): automatic guides transform onto it
  (`genvi.guides.supports`). None: unknown (automatic guides refuse the site).

Example: a new distribution in one small class (see docs/extending.md)::

    class Exponential(gv.Distribution):
        name = "exponential"
        reparameterized = True
        def sample(self, key, rate):
            return jax.random.exponential(key, jnp.shape(rate)) / rate
        def lane_log_prob(self, x, rate):
            return jnp.log(rate) - rate * x
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from genvi.core.addressing import sample_site
from genvi.core.mistakes import not_a_value
from genvi.core.scopes import density_scope
from genvi.core.strategy import supported_kinds
from genvi.core.tracing import note_dist_call


def static_max(value: Any) -> int | None:
    """The largest entry of `value` where it is known when the program is traced (a
    Python number, a numpy array, a constant), else None: what bounds a finite support
    such as a binomial's 0..n.

    Example:
        >>> import numpy as np
        >>> static_max(np.array([3, 5])), static_max(4)
        (5, 4)
    """
    try:
        return int(np.max(np.asarray(value)))
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError,
            jax.errors.UnexpectedTracerError):
        return None


class Distribution:
    """Base class of genvi distributions. Call it to get a `DistCall`."""

    name: str = "distribution"
    scorable: bool = True
    reparameterized: bool = False
    param_names: tuple[str, ...] = ()
    # Trailing event axes of each parameter and of a value (0 = elementwise); used
    # to keep parameters aligned when `vmap` adds batch axes.
    param_event_ndims: tuple[int, ...] = ()
    value_event_ndim: int = 0
    # The support of a continuous value, for automatic guides (see the module docstring)
    domain: str | None = None
    # `sample` maps each lane's parameters to that lane's value with the same random
    # numbers, so a draw whose parameters depend lane by lane on a batched site still
    # does: lane-local replays (`genvi.replays.lanes`) may then follow it in O(lanes)
    lanewise: bool = False
    # each lane takes the values 0 and 1 only (gv.DisARM)
    binary: bool = False
    # Parameters (by position) that `sample` and `lane_log_prob` accept with a leading
    # axis of size 1 where the others have one per lane: under `jax.vmap` these stay
    # one copy when unbatched (see `genvi.core.jaxpr.register_batching_by_broadcasting`)
    lane_shared_params: tuple[int, ...] = ()

    @property
    def label(self) -> str:
        """How messages name this distribution ("gv.normal"; a wrapped one says whose)."""
        return f"gv.{self.name}"

    def sample(self, key: jax.Array, *params: Any) -> jax.Array:
        raise NotImplementedError

    def lane_log_prob(self, value: jax.Array, *params: Any) -> jax.Array:
        """Log density of each independent component (broadcast shape)."""
        raise NotImplementedError

    def lane_prob(self, value: jax.Array, *params: Any) -> jax.Array:
        """Probability of each component (discrete distributions; ENUM uses it).
        Override where exp(log p) has an unsafe derivative (p = 0)."""
        return jnp.exp(self.lane_log_prob(value, *params))

    def log_prob(self, value: jax.Array, *params: Any) -> jax.Array:
        """Log density of `value`: the sum over independent components."""
        # A density of a value is not a use of it for the smoothness check (its support
        # tests are not discontinuities of the objective), also when called directly.
        with density_scope():
            return jnp.sum(self.lane_log_prob(value, *params))

    def check_params(self, *params: Any) -> list[tuple[jax.Array, str]]:
        """(condition that must hold, what it means) pairs for validation mode."""
        return []

    def check_value(self, value: jax.Array, *params: Any) -> list[tuple[jax.Array, str]]:
        """(condition per component of `value`, what it means) pairs for validation
        mode: is an observed or scored value inside the support? Default: not NaN.
        A condition may be elementwise; "the value " + meaning must read as a sentence.

        Example:
            >>> import genvi as gv
            >>> [(bool(ok), m) for ok, m in gv.gamma.check_value(-1.0, 2.0, 1.0)]
            [(False, 'must be >= 0 and finite')]
        """
        return [(~jnp.isnan(value), "must not be NaN")]

    def value_shape(self, *params: Any) -> tuple:
        return jax.eval_shape(lambda *p: self.sample(jax.random.key(0), *p), *params).shape

    @property
    def strategies(self) -> tuple[str, ...]:
        """The built-in strategies this distribution supports, derived from its
        capabilities and what each strategy needs.

        Example:
            >>> import genvi as gv
            >>> gv.normal.strategies, gv.uniform.strategies
            (('REPARAM', 'REINFORCE', 'MVD'), ('REPARAM',))
        """
        return supported_kinds(self)

    def supports(self, kind: str) -> bool:
        """Whether this distribution supports the built-in strategy named `kind`.

        Example:
            >>> import genvi as gv
            >>> gv.flip.supports("ENUM"), gv.normal.supports("ENUM")
            (True, False)
        """
        return kind in self.strategies

    def __call__(self, *params: Any, grad: Any = None) -> "DistCall":
        """This distribution applied to `params`: a `DistCall`, to sample at an address
        (`dist(...) @ "x"`), observe (`gv.observe`) or draw (`gv.sample`).

        `grad=` is the gradient strategy (`gv.REPARAM`, `gv.REINFORCE`, `gv.MVD`,
        `gv.ENUM`, `gv.SD`, ...) used where the site is *sampled inside an objective*:
        a guide's sites (`guide.sim`), a proposal, `gv.sample`. A model's site whose
        value a guide proposes is only *scored* (`model.log_density`), so its `grad=` is
        unused there: the strategy of the guide's site at that address differentiates
        the value, and an objective that only scores the model warns
        (`gv.UnusedStrategyWarning`). A model's `grad=` is used where the model itself is
        sampled in an objective: a site no guide proposes (`g.generate`),
        `gv.importance(proposal=None)`, `g.sim`, `g.dream`.

        Example:
            >>> import genvi as gv
            >>> gv.flip(0.3, grad=gv.ENUM).strategy
            gv.ENUM
        """
        return DistCall(self, tuple(jnp.asarray(p) if not isinstance(p, jax.Array) else p
                                    for p in params), grad)

    def __repr__(self) -> str:
        return f"gv.{self.name}"


class DistCall:
    """A distribution applied to parameters, with an optional gradient strategy.

    `dist_call @ "addr"` samples it at an address inside a `@gv.gen` program;
    `gv.observe(dist_call, value)` scores a value; `gv.sample(dist_call)` draws an
    unnamed value inside an `@gv.expectation`.

    Example:
        >>> import genvi as gv
        >>> call = gv.normal(0.0, 1.0, grad=gv.REPARAM)
        >>> call.dist.name, len(call.params)
        ('normal', 2)
    """

    __slots__ = ("_dist", "_params", "_strategy", "genvi_used")

    def __init__(self, dist: Distribution, params: Sequence[Any], strategy: Any):
        self._dist = dist
        self._params = tuple(params)
        self._strategy = strategy  # checked where the site gets its address
        # Whether anything read this call (sampled, observed, drawn, scored): one made
        # inside a program and never read is a forgotten `@ "addr"`, an error raised when
        # the program's trace ends (`genvi.core.tracing.TraceNotes`)
        self.genvi_used = False
        note_dist_call(self)

    @property
    def dist(self) -> Distribution:
        self.genvi_used = True
        return self._dist

    @property
    def params(self) -> tuple:
        self.genvi_used = True
        return self._params

    @property
    def strategy(self) -> Any:
        """The gradient strategy (`grad=`), or None."""
        self.genvi_used = True
        return self._strategy

    def __matmul__(self, addr: str) -> Any:
        return sample_site(self, addr)

    def sample(self, key: jax.Array) -> jax.Array:
        """Draw a value (plain JAX; no address, no gradient strategy)."""
        return self.dist.sample(key, *self.params)

    def log_prob(self, value: Any) -> jax.Array:
        return self.dist.log_prob(value, *self.params)

    def __repr__(self) -> str:
        return f"{self.dist!r}(...{', grad=' + repr(self.strategy) if self.strategy else ''})"

    # Used as a value (arithmetic, jnp, a program's return value) a distribution call
    # is a forgotten `@ "addr"`: say so, instead of JAX's "not a valid JAX type".
    def genvi_unsampled(self) -> tuple[str, str]:
        """(what this is, how to sample it in an objective): for the error raised when a
        program or objective returns it (`genvi.core.mistakes.check_returned`)."""
        what = f"gv.{self.dist.name}(...)"
        return what, f"`gv.sample({what})` in an @gv.expectation objective"

    def _not_a_value(self, *_: Any, kind: type = TypeError) -> Any:
        name = f"gv.{self.dist.name}(...)"
        raise not_a_value(name, name, f"gv.sample({name})", kind)

    # JAX looks `__jax_array__` up before anything else (jnp functions, jnp.asarray):
    # a property raising here keeps JAX's own message from replacing ours.
    __jax_array__ = property(lambda self: self._not_a_value(kind=ValueError))
    __array__ = __float__ = __bool__ = _not_a_value
    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _not_a_value
    __truediv__ = __rtruediv__ = __pow__ = __rpow__ = __rmatmul__ = _not_a_value
    __neg__ = __abs__ = __lt__ = __le__ = __gt__ = __ge__ = __getitem__ = _not_a_value
