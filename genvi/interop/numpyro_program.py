"""`gv.from_numpyro`: a NumPyro model or guide function as a genvi program.

The program runs the function unchanged under `GenviEffects`
(`genvi.interop.numpyro_effects`), so every genvi objective, strategy, automatic guide,
diagnostic and `gv.fit` applies to it. Like every genvi program it takes the parameters
first, `(params, *args)`: `params` holds the values `numpyro.param` reads (`{}` for a
model without any), and `program.init(key, *args)` returns the function's own initial
values, each with its NumPyro constraint as a genvi constrained parameter.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import jax
import jax.numpy as jnp
from numpyro import handlers as nh
from numpyro.distributions import constraints as nc

from genvi.core.strategy import Strategy
from genvi.interop.numpyro_distributions import base_constraint
from genvi.gen.language import GenFn
from genvi.guides import params as gp
from genvi.interop.numpyro_effects import GenviEffects, NumPyroError


def _name_of(fn: Any) -> str:
    """The name of the function a chain of NumPyro handlers wraps."""
    while not hasattr(fn, "__name__") and hasattr(fn, "fn"):
        fn = fn.fn
    return getattr(fn, "__name__", type(fn).__name__)


def to_genvi_param(name: str, value: Any, constraint: Any) -> Any:
    """A `numpyro.param`'s initial value as a genvi parameter: a plain array on the
    real line, a genvi constrained parameter for NumPyro's positive, unit-interval,
    interval, simplex and lower-Cholesky constraints (stored unconstrained, as NumPyro
    stores them).

    Example:
        >>> from numpyro.distributions import constraints
        >>> p = to_genvi_param("s", 2.0, constraints.positive)
        >>> type(p).__name__, round(float(p.value), 4)
        ('Constrained', 2.0)
    """
    base = None if constraint is None else base_constraint(constraint)
    if base is None or base is nc.real:
        return jax.tree_util.tree_map(jnp.asarray, value)
    if base in (nc.positive, nc.softplus_positive):
        return gp.positive(value)
    if base is nc.unit_interval:
        return gp.unit_interval(value)
    if base is nc.simplex:
        return gp.simplex(value)
    if base is nc.lower_cholesky:
        return gp.lower_cholesky(value)
    if isinstance(base, nc.interval):
        low: float | None
        high: float | None
        try:
            low, high = float(base.lower_bound), float(base.upper_bound)
        except TypeError:
            low = high = None
        if low is not None:
            assert high is not None  # both bounds are floats, or both None
            return gp.interval(value, low, high)
    raise NumPyroError(
        f"numpyro.param({name!r}, ..., constraint={constraint}): genvi stores constrained "
        "parameters for the positive, unit_interval, interval (with fixed bounds), simplex "
        "and lower_cholesky constraints; reparameterize this one onto one of those (e.g. "
        "greater_than(a) as a + a positive parameter)")


class NumPyroProgram(GenFn):
    """A NumPyro function run as a genvi program (see `from_numpyro`)."""

    def __init__(self, fn: Callable, strategies: Any):
        super().__init__()
        self.fn, self.strategies = fn, strategies
        self.name = _name_of(fn)

    def body(self, *args: Any) -> Any:
        if not args or not isinstance(args[0], Mapping):
            got = "no arguments" if not args else f"{type(args[0]).__name__} first"
            raise TypeError(
                f"{self.name} (gv.from_numpyro) takes the parameters first, as every genvi "
                f"program: program.simulate(key, params, *args), with params = {{}} where "
                f"{self.name} has no numpyro.param (got {got})")
        effects = GenviEffects(args[0], self.strategies, self.name)
        with effects:
            out = self.fn(*args[1:])
        effects.check_strategies()
        return out

    def init(self, key: jax.Array, *args: Any) -> dict:
        """The function's own initial parameters: it runs once as NumPyro runs it (under
        `seed` and `trace`) and every `numpyro.param`'s initial value becomes a genvi
        parameter with its constraint (`to_genvi_param`).

        Args:
            key: a key for the run (random initial values, `numpyro.module`'s networks).
            *args: the function's arguments (data), without the parameters.

        Returns:
            a dict from `numpyro.param` name to its genvi parameter.

        Example:
            >>> import genvi as gv, numpyro, numpyro.distributions as nd, jax
            >>> from numpyro.distributions import constraints
            >>> def guide():
            ...     s = numpyro.param("s", 0.5, constraint=constraints.positive)
            ...     numpyro.sample("z", nd.Normal(0.0, s))
            >>> params = gv.from_numpyro(guide).init(jax.random.key(0))
            >>> round(float(gv.constrain(params)["s"]), 4)
            0.5
        """
        trace = nh.trace(nh.seed(self.fn, key)).get_trace(*args)
        return {name: to_genvi_param(name, site["value"], site["kwargs"].get("constraint"))
                for name, site in trace.items() if site["type"] == "param"}


def from_numpyro(fn: Callable, strategies: Any = None) -> NumPyroProgram:
    """A NumPyro model or guide function as a genvi program, run unchanged.

    Its addresses are the NumPyro site names; NumPyro distributions are genvi
    distributions (REPARAM where `has_rsample`, ENUM where `enumerate_support` is static,
    the support for automatic guides); `numpyro.plate` (subsampled too, scaled as NumPyro
    scales it), `handlers.mask`, `scale`, `condition`, `substitute`, `block` and
    `contrib.control_flow.scan` run as NumPyro runs them. The program takes the
    parameters first, `(params, *args)`; `program.init(key, *args)` gives the
    function's own initial ones.

    Args:
        fn: a NumPyro model or guide (a function, or one wrapped in NumPyro handlers).
        strategies: a gradient strategy for every latent site without its own
            `infer={"grad": ...}` (e.g. `gv.AUTO`), or a dict from NumPyro site name to
            strategy, whose entries override a site's own. A guide's latent sites need
            one where an objective samples them.

    Returns:
        a genvi program (`simulate`, `log_density`, a model or guide of any objective).

    Example:
        >>> import genvi as gv, numpyro, numpyro.distributions as nd, jax, optax
        >>> def model(y):
        ...     mu = numpyro.sample("mu", nd.Normal(0.0, 1.0))
        ...     numpyro.sample("y", nd.Normal(mu, 1.0), obs=y)
        >>> def guide(y):
        ...     m = numpyro.param("m", 0.0)
        ...     numpyro.sample("mu", nd.Normal(m, 1.0))
        >>> model_, guide_ = gv.from_numpyro(model), gv.from_numpyro(guide, gv.REPARAM)
        >>> params = guide_.init(jax.random.key(0), 1.0)
        >>> fit = gv.fit(gv.elbo(model_, guide_), params, 1.0, optimizer=optax.adam(0.1),
        ...              steps=300, key=jax.random.key(1), progress=False)
        >>> abs(float(fit.params["m"]) - 0.5) < 0.15          # the posterior mean is 0.5
        True
    """
    if not callable(fn):
        raise TypeError(f"gv.from_numpyro needs a NumPyro model or guide function; got {fn!r}")
    if isinstance(fn, GenFn):
        raise TypeError(f"gv.from_numpyro({fn.name}): it is a genvi program already")
    if strategies is not None and not isinstance(strategies, (Mapping, Strategy)):
        raise TypeError(f"gv.from_numpyro({_name_of(fn)}, strategies={strategies!r}): give a "
                        "strategy for every latent site (gv.REPARAM, gv.AUTO, ...) or a dict "
                        "from NumPyro site name to strategy")
    return NumPyroProgram(fn, strategies)

