"""A model's latent sites, found by running it: what automatic guides are built from.

`discover(model, key, args)` runs the model a few times on example arguments with
genvi's `RecordSites` handler, `Simulate` that records each site's distribution,
parameters and `gv.plate` scale (`g.interpret`, the public interpreter API). Each
continuous site becomes a `Site`: address, shape, distribution, support (`domain`)
and the shape of its unconstrained value; sites an automatic guide cannot cover (a
discrete site, a local latent of a subsampled plate, a support that moves) are refused
by name, with the fix.

Example:
    >>> import genvi as gv, jax
    >>> from genvi.guides.discover import discover
    >>> @gv.gen
    ... def model(y):
    ...     s = gv.gamma(2.0, 1.0) @ "s"
    ...     gv.observe(gv.normal(0.0, s), y)
    >>> sites, draws = discover(model, jax.random.key(0), (1.0,))
    >>> [(site.name, site.domain) for site in sites], draws[("s",)].shape
    ([('s', 'positive')], (15,))
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from genvi.core.tracing import merge_args, split_args
from genvi.gen.handlers import RecordSites
from genvi.guides import supports
from genvi.core.address import Address

PRIOR_DRAWS = 15  # initial locations: the median of this many prior draws (unconstrained)
# model -> {argument shapes: (jitted discovery run, its handler)}: one compile per model
_DISCOVERIES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class Site:
    """A latent site of the model: address, value shape and dtype, distribution,
    domain; `bounds` are the concrete support parameters ("interval": low, high;
    "own": all parameters), `ushape` the unconstrained shape."""

    addr: tuple
    shape: tuple
    dtype: Any
    dist: Any
    domain: str
    ushape: tuple
    bounds: tuple = ()

    @property
    def name(self) -> str:
        return str(Address(self.addr))

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


_MOVING = ("gv.{who}: the support of site {name!r} ({dist}) {why}; automatic guides "
           "need a fixed support. Write this site's guide by hand and combine it with the "
           "automatic one (exclude=[{name!r}], see AutoGuide.inline).")


def _site_errors(who: str, name: str, dist: Any, domain: Any, scale: float,
                 call_args: str = "") -> None:
    if scale != 1.0:
        raise ValueError(
            f"gv.{who}: site {name!r} ({dist.label}) is a local latent inside a "
            f"subsampled gv.plate (each lane counts {scale:g} times): a global guide "
            "parameter per datapoint cannot follow the minibatch. Write an amortized "
            "guide for it by hand (e.g. a network of the datapoint) and combine it: "
            f"auto = gv.{who}(model{call_args}, exclude=[{name!r}]), then call "
            "auto.inline(*args) inside your hand-written guide.")
    if domain == "discrete":
        raise ValueError(
            f"gv.{who}: site {name!r} ({dist.label}) is discrete; automatic guides "
            "cover continuous latents only. Write that part of the guide by hand and "
            f"combine it: auto = gv.{who}(model{call_args}, exclude=[{name!r}]); in a "
            f"@gv.gen guide with the model's arguments, call auto.inline(*args) and sample "
            f"gv.{dist.name}(..., grad=gv.ENUM) @ {name!r} (or another discrete "
            "strategy). Or sum it out of the model exactly: gv.marginal(model, keep=[its "
            "continuous sites], algorithm=gv.enumeration()), whose automatic guide covers "
            "the kept sites only.")
    if domain is None:
        raise ValueError(
            f"gv.{who}: site {name!r} ({dist.label}) declares no support: set its "
            "class attribute `domain` ('real', 'positive', 'unit_interval', 'interval', "
            "'simplex'), wrap it with gv.from_tfp, or write its guide by hand "
            f"(exclude=[{name!r}]).")


def discover(model: Any, key: jax.Array, args: tuple, exclude: Sequence = (),
             who: str = "automatic guide", draws: int = 15,
             call_args: str = "") -> tuple[list[Site], dict]:
    """The model's latent sites on `args` (in program order, minus `exclude`) and
    `draws` prior draws of each site's choice ({address: array with a leading axis}).

    `draws` runs of one jitted function (cached per model and argument shapes): the
    model's `Simulate` interpreter with a handler that records each site's
    distribution and plate scale and returns the support parameters of interval
    sites and of sites with their own bijector (TFP's, NumPyro's). Those must be the
    same in every draw (a support that moves with other latents is refused by name). `call_args` are the guide constructor's required
    arguments after the model (", rank=2"), quoted in the fixes the errors suggest."""
    # a marginal (gv.marginal) is discovered through its program, keeping its kept sites
    program, kept = getattr(model, "kept_sites_program", lambda: (model, None))()
    dyn, static, treedef, mask = split_args(args)
    cache_key = (treedef, mask, draws, tuple((jnp.shape(x), str(jnp.result_type(x)))
                                             for x in dyn))
    try:
        cached = _DISCOVERIES.setdefault(model, {}).get(cache_key + tuple(static))
    except TypeError:  # unhashable static arguments: no cache
        cached = None
    if cached is None:
        handler = RecordSites()

        def one(k, dyn):
            a = merge_args(dyn, static, treedef, mask)
            values = program.interpret(handler, *a, key=k).choices.flat()
            bounds = {a: supports.support_params(r.dist, r.params)
                      for a, r in handler.found.items()
                      if getattr(r.dist, "domain", None) in supports.WITH_PARAMS}
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
        moving = [(a, r.dist) for a, r in handler.found.items()
                  if getattr(r.dist, "domain", None) in supports.WITH_PARAMS]
        if not moving:
            raise
        raise ValueError(_MOVING.format(who=who, name=str(Address(moving[0][0])),
                                        dist=moving[0][1].label,
                                        why="is computed inside a gv.scan step or a cond "
                                            "branch")) from None
    excluded = {Address.parse(a if isinstance(a, tuple) else str(a)) for a in exclude}
    unknown = excluded - set(handler.found)
    if unknown:
        raise KeyError(f"gv.{who}: exclude={sorted('/'.join(a) for a in unknown)} names no "
                       f"site of {model.name}; its sites are "
                       f"{sorted('/'.join(map(str, a)) for a in handler.found)}")
    sites = []
    for addr, (dist, _, scale, _) in handler.found.items():
        if addr in excluded or (kept is not None and not kept(addr)):
            continue
        name = str(Address(addr))
        value = values[addr][0]
        domain = supports.domain_of(dist, value)
        _site_errors(who, name, dist, domain, scale, call_args)
        assert domain is not None  # _site_errors refuses a site that declares none
        bounds: tuple = ()
        if domain in supports.WITH_PARAMS:
            stacked = tuple(np.asarray(b) for b in all_bounds[addr])
            if any(not np.all(b == b[:1]) for b in stacked):
                raise ValueError(_MOVING.format(who=who, name=name, dist=dist.label,
                                                why="depends on other latent values (its "
                                                    "parameters differ between prior draws)"))
            bounds = tuple(b[0] for b in stacked)
        if domain == "interval":  # broadcast to the value: lanes under vmap stay aligned
            bounds = tuple(np.broadcast_to(b, jnp.shape(value)) for b in bounds)
        probe = supports.site_bijector(domain, dist, bounds)
        if probe is None:
            raise ValueError(f"gv.{who}: site {name!r} ({dist.label}) has no default event-"
                             f"space bijector; write its guide by hand "
                             f"(exclude=[{name!r}]).")
        ushape = supports.unconstrained_shape(probe, jnp.shape(value), jnp.result_type(value))
        if (domain == "own" and int(np.prod(ushape)) != int(np.prod(jnp.shape(value)))
                and not getattr(dist, "bijector_matches_density", False)):
            raise ValueError(
                f"gv.{who}: site {name!r} ({dist.label}): its own event-space bijector "
                f"changes the dimension ({ushape} -> {jnp.shape(value)}), where the library's "
                "log-Jacobian convention may differ from the density's; use genvi's own "
                "distribution (e.g. gv.dirichlet) or write its guide by hand "
                f"(exclude=[{name!r}]).")
        sites.append(Site(addr, tuple(jnp.shape(value)), jnp.result_type(value), dist,
                          domain, ushape, bounds))
    return sites, values
