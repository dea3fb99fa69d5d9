"""`gv.from_numpyro`: a NumPyro model or guide function as a genvi program.

The program runs the function unchanged under `GenviEffects`
(`genvi.interop.numpyro_effects`), so every genvi objective, strategy, automatic guide,
diagnostic and `gv.fit` applies to it. Like every genvi program it takes the parameters
first, `(params, *args)`: `params` holds the values `numpyro.param` reads (`{}` for a
model without any), and `program.init(key, *args)` returns the function's own initial
values, each stored unconstrained as NumPyro stores it (`NumPyroParam`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Callable

import jax
import jax.numpy as jnp
from numpyro import handlers as nh
from numpyro.infer.autoguide import AutoGuide
import numpyro.distributions as nd
from numpyro.distributions import constraints as nc

from genvi.core.keywords import call_with_keywords
from genvi.core.strategy import Strategy
from genvi.interop.numpyro_distributions import NumPyroBijector, base_constraint
from genvi.gen.language import GenFn
from genvi.guides import params as gp
from genvi.interop.numpyro_effects import GenviEffects, NumPyroError


def _name_of(fn: Any) -> str:
    """The name of the function a chain of NumPyro handlers wraps."""
    while not hasattr(fn, "__name__") and hasattr(fn, "fn"):
        fn = fn.fn
    return getattr(fn, "__name__", type(fn).__name__)


@jax.tree_util.register_pytree_node_class
class NumPyroParam(gp.Constrained):
    """A `numpyro.param` stored as NumPyro stores it: unconstrained through NumPyro's
    own `biject_to(constraint)` (a `softplus_positive` scale stays softplus), so that
    the same optimizer follows the same trajectory in both libraries. Read it as any
    genvi constrained parameter (`.value`, `gv.constrain`).

    Example:
        >>> from numpyro.distributions import constraints
        >>> p = NumPyroParam.of(2.0, constraints.softplus_positive)
        >>> round(float(p.raw), 4), round(float(p.value), 4)   # softplus⁻¹(2), 2
        (1.8546, 2.0)
    """

    __slots__ = ("constraint",)

    def __init__(self, raw: Any, constraint: Any):
        super().__init__(raw, "numpyro")
        self.constraint = constraint

    @staticmethod
    def of(value: Any, constraint: Any) -> "NumPyroParam":
        """The parameter whose constrained value is `value`."""
        transform = nd.transforms.biject_to(constraint)
        return NumPyroParam(jax.tree_util.tree_map(
            lambda v: transform.inv(jnp.asarray(v)), value), constraint)

    @property
    def bijector(self) -> Any:
        return NumPyroBijector(nd.transforms.biject_to(self.constraint))

    def tree_flatten(self):
        return (self.raw,), (self.constraint,)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], *aux)

    def __repr__(self) -> str:
        return f"NumPyroParam({self.constraint}, raw={self.raw!r})"


def to_genvi_param(name: str, value: Any, constraint: Any) -> Any:
    """A `numpyro.param`'s initial value as a genvi parameter: a plain array on the
    real line, else a `NumPyroParam`, stored unconstrained as NumPyro stores it
    (`biject_to(constraint)`), for every constraint NumPyro can biject onto. A value
    outside its constraint is refused, naming the parameter.

    Example:
        >>> from numpyro.distributions import constraints
        >>> p = to_genvi_param("s", 2.0, constraints.positive)
        >>> type(p).__name__, round(float(p.value), 4)
        ('NumPyroParam', 2.0)
    """
    base = None if constraint is None else base_constraint(constraint)
    if base is None or base is nc.real:
        return jax.tree_util.tree_map(jnp.asarray, value)
    try:
        nd.transforms.biject_to(constraint)
    except NotImplementedError:
        raise NumPyroError(
            f"numpyro.param({name!r}, ..., constraint={constraint}): NumPyro has no "
            "transform onto this constraint (biject_to), so neither library can store "
            "it unconstrained; reparameterize it onto one NumPyro can") from None
    inside = constraint(jnp.asarray(value))
    if not isinstance(inside, jax.core.Tracer) and not bool(jnp.all(inside)):
        raise NumPyroError(
            f"numpyro.param({name!r}, ...): the initial value is outside its constraint "
            f"{constraint}; give an initial value inside it (init_value=...)")
    return NumPyroParam.of(value, constraint)


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
        if isinstance(self.fn, AutoGuide) and self.fn.prototype_trace is None:
            raise NumPyroError(
                f"{self.name} (gv.from_numpyro) is run before it knows the model's sites: "
                f"an autoguide learns them from one run of the model, which "
                "program.init(key, *args) makes (as NumPyro's SVI.init does). Start from "
                "params = program.init(key, *args), then run it.")
        effects = GenviEffects(args[0], self.strategies, self.name)
        with effects:
            out = call_with_keywords(self.fn, args[1:])
        effects.check_strategies()
        return out

    def init(self, key: jax.Array, *args: Any, **kwargs: Any) -> dict:
        """The function's own initial parameters: it runs once as NumPyro runs it (under
        `seed` and `trace`) and every `numpyro.param`'s initial value becomes a genvi
        parameter with its constraint (`to_genvi_param`).

        Args:
            key: a key for the run (random initial values, `numpyro.module`'s networks).
            *args: the function's arguments (data), without the parameters; keyword
                arguments as the function takes them (`X=X, Y=Y`).

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
        trace = nh.trace(nh.seed(self.fn, key)).get_trace(*args, **kwargs)
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

