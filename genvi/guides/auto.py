"""Automatic guides: site discovery, the `AutoGuide` base program, and summaries.

An automatic guide is a `@gv.gen` program (a `GenFn`) built from a model. `init(key,
*args)` runs the model once on example arguments (genvi's own `Simulate`
interpreter, with a handler that also records each site's distribution) to find its
latent sites: addresses, shapes, distributions and supports. Every continuous site
is then sampled by the guide in an unconstrained space and mapped onto its support
by a TFP bijector (`genvi.guides.supports`); its log density is the transformed
density, with the exact log-Jacobian. Guide sites use REPARAM.

**Parameters.** The guide has the model's signature and reads its own parameters
from the first argument's `"guide"` entry (`params_key=`). So a model written as
`model(params, *data)` trains with `{"guide": auto.init(key, params, *data),
**model_params}` (the model ignores the extra entry; a model without parameters reads
nothing from `params`):

    auto = gv.auto_normal(model)
    params = {"guide": auto.init(jax.random.key(0), {}, y)}
    result = gv.fit(gv.elbo(model, auto), params, y, optimizer=..., steps=..., key=...)
    auto.median(result.params)          # {address: posterior median}

Joint families (`auto_mvn`, `auto_low_rank`, `auto_flow`) sample the sites one after
another from their conditionals given the earlier sites (the chain rule), so each
site's density is exact and the guide's choices sit at the model's addresses.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from genvi.core.choices import ChoiceMap
from genvi.core.primitives import site_parts
from genvi.core.tracing import merge_args, split_args
from genvi.distributions.base import Distribution
from genvi.gen import interpreters as interp
from genvi.gen import language
from genvi.guides import supports

_PRIOR_DRAWS = 15  # initial locations: the median of this many prior draws (unconstrained)
# model -> {argument shapes: (jitted discovery run, its handler)}: one compile per model
_DISCOVERIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Site:
    """A latent site of the model: address, value shape and dtype, distribution,
    domain; `bounds` are the concrete support parameters ("interval": low, high;
    "tfp": all parameters), `ushape` the unconstrained shape."""

    addr: tuple
    shape: tuple
    dtype: Any
    dist: Any
    domain: str
    ushape: tuple
    bounds: tuple = ()

    @property
    def name(self) -> str:
        return "/".join(map(str, self.addr))

    @property
    def size(self) -> int:
        return int(np.prod(self.ushape, dtype=int))

    def bijector(self, bounds: tuple | None = None) -> Any:
        return supports.site_bijector(self.domain, self.dist,
                                      self.bounds if bounds is None else bounds)

    def __hash__(self):  # bounds are arrays: hash what identifies the site
        return hash((self.addr, self.shape, self.domain))

    def __eq__(self, other):
        return self is other


class _Discover(interp.Simulate):
    """`Simulate` that also records each site's distribution, parameters and scale."""

    def __init__(self):
        self.found: dict = {}

    def site(self, eqn, params, state):
        dist, dparams, _, addr = site_parts(eqn, params)
        # the product of the enclosing gv.plate factors (1 outside subsampled plates)
        scale = getattr(self, "scale", 1.0)
        self.found[addr] = (getattr(dist, "base", dist), dparams, float(scale))
        return super().site(eqn, params, state)


_MOVING = ("gv.{who}: the support of site {name!r} (gv.{dist}) {why}; automatic guides "
           "need a fixed support. Write this site's guide by hand and combine it with the "
           "automatic one (exclude=[{name!r}], see AutoGuide.inline).")


def _site_errors(who: str, name: str, dist: Any, domain: Any, scale: float) -> None:
    if scale != 1.0:
        raise ValueError(
            f"gv.{who}: site {name!r} (gv.{dist.name}) is a local latent inside a "
            f"subsampled gv.plate (each lane counts {scale:g} times): a global guide "
            "parameter per datapoint cannot follow the minibatch. Write an amortized "
            "guide for it by hand (e.g. a network of the datapoint) and combine it: "
            f"auto = gv.{who}(model, exclude=[{name!r}]), then call auto.inline(*args) "
            "inside your hand-written guide.")
    if domain == "discrete":
        raise ValueError(
            f"gv.{who}: site {name!r} (gv.{dist.name}) is discrete; automatic guides "
            "cover continuous latents only. Write that part of the guide by hand and "
            f"combine it: auto = gv.{who}(model, exclude=[{name!r}]); in a @gv.gen guide "
            f"with the model's arguments, call auto.inline(*args) and sample "
            f"gv.{dist.name}(..., grad=gv.ENUM) @ {name!r} (or another discrete "
            "strategy), or marginalize the site out of the model.")
    if domain is None:
        raise ValueError(
            f"gv.{who}: site {name!r} (gv.{dist.name}) declares no support: set its "
            "class attribute `domain` ('real', 'positive', 'unit_interval', 'interval', "
            "'simplex'), wrap it with gv.from_tfp, or write its guide by hand "
            f"(exclude=[{name!r}]).")


def discover(model: Any, key: jax.Array, args: tuple, exclude: Sequence = (),
             who: str = "automatic guide", draws: int = 15) -> tuple[list[Site], dict]:
    """The model's latent sites on `args` (in program order, minus `exclude`) and
    `draws` prior draws of each site's choice ({address: array with a leading axis}).

    `draws` runs of one jitted function (cached per model and argument shapes): the
    model's `Simulate` interpreter with a handler that records each site's
    distribution and plate scale and returns the support parameters of interval /
    TFP sites. Those must be the same in every draw (a support that moves with other
    latents is refused by name)."""
    dyn, static, treedef, mask = split_args(args)
    cache_key = (treedef, mask, draws, tuple((jnp.shape(x), str(jnp.result_type(x)))
                                             for x in dyn))
    try:
        cached = _DISCOVERIES.setdefault(model, {}).get(cache_key + tuple(static))
    except TypeError:  # unhashable static arguments: no cache
        cached = None
    if cached is None:
        handler = _Discover()

        def one(k, dyn):
            a = merge_args(dyn, static, treedef, mask)
            traced, _, state = model._interpret(handler, a, key=k)
            values = model._user(traced, state.choices).flat()
            bounds = {a: (p[:2] if getattr(d, "domain", None) == "interval" else p)
                      for a, (d, p, _) in handler.found.items()
                      if getattr(d, "domain", None) in ("interval", "tfp")}
            return values, bounds
        cached = (jax.jit(one), handler)   # unbatched: compiles faster than a vmap
    run, handler = cached
    try:
        outs = [run(k, dyn) for k in jax.random.split(key, draws)]
        values, all_bounds = jax.tree_util.tree_map(lambda *x: jnp.stack(x), *outs)
        try:   # after the first run: the handler has recorded the sites
            _DISCOVERIES[model][cache_key + tuple(static)] = cached
        except TypeError:
            pass
    except jax.errors.UnexpectedTracerError:
        moving = [(a, d) for a, (d, _, _) in handler.found.items()
                  if getattr(d, "domain", None) in ("interval", "tfp")]
        if not moving:
            raise
        raise ValueError(_MOVING.format(who=who, name="/".join(map(str, moving[0][0])),
                                        dist=moving[0][1].name,
                                        why="is computed inside a gv.scan step or a cond "
                                            "branch")) from None
    excluded = {a if isinstance(a, tuple) else tuple(str(a).split("/")) for a in exclude}
    unknown = excluded - set(handler.found)
    if unknown:
        raise KeyError(f"gv.{who}: exclude={sorted('/'.join(a) for a in unknown)} names no "
                       f"site of {model.name}; its sites are "
                       f"{sorted('/'.join(map(str, a)) for a in handler.found)}")
    sites = []
    for addr, (dist, _, scale) in handler.found.items():
        if addr in excluded:
            continue
        name = "/".join(map(str, addr))
        value = values[addr][0]
        domain = supports.domain_of(dist, value)
        _site_errors(who, name, dist, domain, scale)
        bounds = ()
        if domain in ("interval", "tfp"):
            stacked = tuple(np.asarray(b) for b in all_bounds[addr])
            if any(not np.all(b == b[:1]) for b in stacked):
                raise ValueError(_MOVING.format(who=who, name=name, dist=dist.name,
                                                why="depends on other latent values (its "
                                                    "parameters differ between prior draws)"))
            bounds = tuple(b[0] for b in stacked)
        if domain == "interval":  # broadcast to the value: lanes under vmap stay aligned
            bounds = tuple(np.broadcast_to(b, jnp.shape(value)) for b in bounds)
        probe = supports.site_bijector(domain, dist, bounds)
        if probe is None:
            raise ValueError(f"gv.{who}: site {name!r} (gv.{dist.name}) has no default event-"
                             f"space bijector in TFP; write its guide by hand "
                             f"(exclude=[{name!r}]).")
        ushape = supports.unconstrained_shape(probe, jnp.shape(value), jnp.result_type(value))
        if domain == "tfp" and int(np.prod(ushape)) != int(np.prod(jnp.shape(value))):
            raise ValueError(
                f"gv.{who}: site {name!r} (gv.{dist.name}): its TFP event-space bijector "
                f"changes the dimension ({ushape} -> {jnp.shape(value)}), where TFP's "
                "log-Jacobian convention may differ from the density's; use genvi's own "
                "distribution (e.g. gv.dirichlet) or write its guide by hand "
                f"(exclude=[{name!r}]).")
        sites.append(Site(addr, tuple(jnp.shape(value)), jnp.result_type(value), dist,
                          domain, ushape, bounds))
    return sites, values


class Block(Distribution):
    """A guide site: a family's flat unconstrained draw of `site.size` numbers,
    reshaped and mapped onto the site's support. Leading axes of the parameters
    (particles under `jax.vmap`) are independent lanes. The log density is the
    family's at the unconstrained value minus the bijector's log-Jacobian."""

    strategies = ("REPARAM",)
    reparameterized = True

    def __init__(self, family: Any, site: Site, event_ndims: tuple):
        self.family, self.site = family, site
        self.param_event_ndims = tuple(event_ndims)
        self.value_event_ndim = len(site.shape)
        self.name = f"{family.name}[{site.name}]"

    def _split(self, params: tuple) -> tuple[tuple, tuple]:
        n = len(params) - len(self.site.bounds)
        return tuple(params[:n]), tuple(params[n:])

    def sample(self, key, *params):
        fam, bounds = self._split(params)
        z = self.family.sample_flat(key, self.site, *fam)        # (*batch, size)
        u = z.reshape(z.shape[:-1] + self.site.ushape)
        y = self.site.bijector(bounds).forward(u)
        return supports.inside(self.site.domain, y, bounds)

    def lane_log_prob(self, y, *params):
        fam, bounds = self._split(params)
        if getattr(self.family, "point", False):  # a point mass: log 1 at its point
            at = self.sample(None, *params)
            event = tuple(range(y.ndim - len(self.site.shape), y.ndim))
            return jnp.where(jnp.all(y == at, axis=event), 0.0, -jnp.inf)
        bij = self.site.bijector(bounds)
        u = bij.inverse(y)
        batch = u.shape[:u.ndim - len(self.site.ushape)]
        z = u.reshape(batch + (self.site.size,))
        ldj = supports.forward_log_det(self.site.domain, bij, u, self.site.shape,
                                       len(self.site.ushape))
        return self.family.log_prob_flat(z, self.site, *fam) - ldj

    def __eq__(self, other):
        return (isinstance(other, Block) and other.family is self.family
                and other.site is self.site and other.param_event_ndims == self.param_event_ndims)

    def __hash__(self):
        return hash((id(self.family), id(self.site), self.param_event_ndims))


def sample_site(family: Any, site: Site, params: Sequence) -> jax.Array:
    """Sample `site` from `family` with `params` (plus the site's bounds) at its
    address, under the enclosing program's prefix; returns the constrained value."""
    params = tuple(jnp.asarray(p) for p in params) + tuple(jnp.asarray(b) for b in site.bounds)
    dist = Block(family, site, tuple(jnp.ndim(p) for p in params))
    from genvi.adev.strategies import REPARAM  # noqa: PLC0415 - import cycle
    call = dist(*params, grad=REPARAM)
    prefix = language._current_prefix("an automatic guide's site")
    with language._prefix(prefix + site.addr[:-1]):
        return call @ site.addr[-1]


def unconstrained(site: Site, y: jax.Array) -> jax.Array:
    """The flat unconstrained value (leading axes kept) of a constrained value `y`."""
    from genvi.adev.smoothness import assume_continuous  # noqa: PLC0415 - import cycle
    with assume_continuous():  # bijector inverses are continuous (their `where`s are guards)
        u = site.bijector().inverse(y)
    return u.reshape(u.shape[:u.ndim - len(site.ushape)] + (site.size,))


class AutoGuide(language.GenFn):
    """Base class of the automatic guides (see the module docstring).

    Subclasses define `family_init(key, sites, z0)` (parameters from the
    unconstrained prior medians `z0`), `run(params, sites)` (sample every site,
    in order, with `sample_site`) and may override the summaries.

    Example:
        >>> import genvi as gv
        >>> @gv.gen
        ... def model(params):
        ...     gv.normal(0.0, 1.0) @ "x"
        >>> isinstance(gv.auto_normal(model), gv.AutoGuide)
        True
    """

    kind = "auto"

    def __init__(self, model: language.GenFn, *, params_key: str = "guide",
                 exclude: Sequence = (), init_scale: float = 0.1):
        super().__init__()
        if not isinstance(model, language.GenFn):
            raise TypeError(f"gv.{self.kind}(model) needs a @gv.gen program; got {model!r}")
        self.model, self.params_key, self.exclude = model, params_key, tuple(exclude)
        self.init_scale = float(init_scale)
        self.name = f"{self.kind}({model.name})"
        self.sites: list[Site] | None = None

    # -- parameters ------------------------------------------------------------------
    def init(self, key: jax.Array, *args: Any) -> Any:
        """Discover the model's latent sites on `args` (the model's arguments) and
        return this guide's initial parameters (locations at the prior median).

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params, y):
            ...     p = gv.beta(10.0, 10.0) @ "p"
            ...     gv.observe(gv.flip(p), y)
            >>> auto = gv.auto_normal(model)
            >>> params = {"guide": auto.init(jax.random.key(0), {}, True)}
        """
        k_sites, k_init = jax.random.split(key)
        sites, draws = discover(self.model, k_sites, args, self.exclude, who=self.kind,
                                draws=_PRIOR_DRAWS)
        self.sites, self._sampler = sites, None
        @jax.jit
        def medians(draws):  # the median of the prior draws, unconstrained
            z0 = {}
            for s in sites:
                z = unconstrained(s, draws[s.name])
                z = jnp.where(jnp.isfinite(z), z, jnp.nan)
                z0[s.name] = jnp.nan_to_num(jnp.nanmedian(z, axis=0))
            return z0
        z0 = medians({s.name: draws[s.addr] for s in sites})
        return self.family_init(k_init, sites, z0)

    def guide_params(self, params: Any) -> Any:
        """This guide's own parameters: `params[params_key]` for a dict holding them
        (the first argument of the guide), else `params` itself."""
        if isinstance(params, Mapping) and self.params_key in params:
            return params[self.params_key]
        return params

    def _check_ready(self) -> list[Site]:
        if self.sites is None:
            raise RuntimeError(f"{self.name}: call .init(key, *args) with the model's "
                               "arguments first; it traces the model to find its latent sites.")
        return self.sites

    # -- the program -----------------------------------------------------------------
    def body(self, *args: Any) -> dict:
        sites = self._check_ready()
        if not args or not isinstance(args[0], Mapping) or self.params_key not in args[0]:
            got = type(args[0]).__name__ if args else "no arguments"
            raise TypeError(
                f"{self.name} reads its parameters from the first argument's "
                f"{self.params_key!r} entry, as the model's first argument: pass "
                f"{{{self.params_key!r}: auto.init(key, *args), **model_params}}; got {got}.")
        return self.run(args[0][self.params_key], sites)

    def inline(self, *args: Any) -> dict:
        """Sample this guide's sites inside another `@gv.gen` guide (at the caller's
        address prefix): how an automatic guide combines with hand-written sites.

        Example:
            >>> import genvi as gv
            >>> # auto = gv.auto_normal(model, exclude=["c"])
            >>> @gv.gen
            ... def guide(params, y):
            ...     z = auto.inline(params, y)          # {"mu": value, ...}
            ...     gv.categorical(params["logits"], grad=gv.ENUM) @ "c"
        """
        return self.body(*args)

    def family_init(self, key: jax.Array, sites: list[Site], z0: dict) -> Any:
        raise NotImplementedError

    def run(self, params: Any, sites: list[Site]) -> dict:
        raise NotImplementedError

    # -- summaries -------------------------------------------------------------------
    def sample(self, key: jax.Array, params: Any, n: int) -> dict:
        """`n` draws from the fitted guide: {address: array with a leading axis n}
        (constrained values).

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params):
            ...     gv.gamma(2.0, 1.0) @ "r"
            >>> auto = gv.auto_normal(model)
            >>> params = {"guide": auto.init(jax.random.key(0), {})}
            >>> auto.sample(jax.random.key(1), params, 1000)["r"].shape
            (1000,)
        """
        self._check_ready()
        if getattr(self, "_sampler", None) is None:   # one compile per guide
            self._sampler = jax.jit(jax.vmap(lambda k, p: self.simulate(k, p).choices.flat(),
                                             in_axes=(0, None)))
        p = {self.params_key: self.guide_params(params)}
        draws = self._sampler(jax.random.split(key, n), p)
        return {s.name: draws[s.addr] for s in self.sites}

    def quantiles(self, params: Any, qs: Sequence[float], *, key: jax.Array | None = None,
                  num_samples: int = 4000) -> dict:
        """Per-site quantiles of the fitted guide (constrained space): {address:
        array with a leading axis len(qs)}. Monte Carlo here (`num_samples` draws);
        the Gaussian families compute them exactly.

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params):
            ...     gv.gamma(2.0, 1.0) @ "r"
            >>> auto = gv.auto_flow(model)
            >>> params = {"guide": auto.init(jax.random.key(0), {})}
            >>> auto.quantiles(params, [0.05, 0.5, 0.95])["r"].shape
            (3,)
        """
        key = jax.random.key(0) if key is None else key
        draws = self.sample(key, params, num_samples)
        qs = jnp.asarray(qs)
        return {k: jnp.quantile(v, qs, axis=0) for k, v in draws.items()}

    def median(self, params: Any) -> dict:
        """Per-site posterior median (constrained space): {address: value}.

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params):
            ...     gv.gamma(2.0, 1.0) @ "r"
            >>> auto = gv.auto_flow(model)
            >>> params = {"guide": auto.init(jax.random.key(0), {})}
            >>> bool(auto.median(params)["r"] > 0)
            True
        """
        return {k: v[0] for k, v in self.quantiles(params, [0.5]).items()}

    def mean(self, params: Any, *, key: jax.Array | None = None,
             num_samples: int = 20000) -> dict:
        """Per-site mean of the fitted guide (constrained space), by Monte Carlo.

        Example:
            >>> import genvi as gv, jax
            >>> @gv.gen
            ... def model(params):
            ...     gv.gamma(2.0, 1.0) @ "r"
            >>> auto = gv.auto_normal(model)
            >>> params = {"guide": auto.init(jax.random.key(0), {})}
            >>> bool(auto.mean(params)["r"] > 0)
            True
        """
        key = jax.random.key(0) if key is None else key
        return {k: v.mean(0) for k, v in self.sample(key, params, num_samples).items()}


def split_flat(sites: list[Site], z: jax.Array) -> dict:
    """A flat unconstrained vector (last axis) split into {site name: flat block}."""
    out, i = {}, 0
    for s in sites:
        out[s.name] = z[..., i:i + s.size]
        i += s.size
    return out


def to_choices(sites: list[Site], values: dict) -> ChoiceMap:
    return ChoiceMap({s.addr: values[s.name] for s in sites})
