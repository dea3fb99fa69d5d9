"""`gv.enumeration()`: an exact algorithm for `gv.marginal` over discrete sites.

`gv.marginal(model, keep=[...], algorithm=gv.enumeration())` sums the model's
auxiliary (not kept) sites over their finite supports, so the marginal's density is
exact, as Pyro's `TraceEnum_ELBO` does for sites enumerated in the model. The sum is
organized by where the discrete sites live:

* scalar sites outside any combinator: every joint value, vectorized;
* sites batched by `gv.plate`/`gv.vmap` (one shape, lanes conditionally independent
  given the kept choices, a mixture): lane by lane, O(lanes × support), by the
  additive evaluator in `genvi.inference.enum_lanes`;
* a site inside `gv.scan` whose steps depend on the previous step's value only (a
  hidden Markov model): the forward algorithm, O(steps × support²), in
  `genvi.inference.enum_scan`.

Elsewhere (lanes that couple, a scan whose carry remembers more, a site without a
finite support) it refuses, naming the site and why. The model's log density is
traced once per argument shapes with the discrete values as inputs, then evaluated
on all of them; gradients flow through the exact sum (no estimator is involved).

Example (a two-component mixture, its assignments summed out):
    >>> import genvi as gv, jax.numpy as jnp
    >>> @gv.gen
    ... def point(mu, y):
    ...     z = gv.flip(0.3) @ "z"
    ...     gv.observe(gv.normal(jnp.where(z, mu, -mu), 1.0), y)
    >>> @gv.gen
    ... def mixture(y):
    ...     mu = gv.normal(0.0, 3.0) @ "mu"
    ...     gv.vmap(point, in_axes=(None, 0))(mu, y) @ "data"
    >>> m = gv.marginal(mixture, keep=["mu"], algorithm=gv.enumeration())
    >>> round(float(m.log_density(gv.choices({"mu": 2.0}), jnp.array([1.5, -2.5]))), 4)
    -5.8825
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from genvi.core.choices import ChoiceMap, choices as to_choices
from genvi.core.mistakes import addr_name
from genvi.core.strategy import supports
from genvi.core.tracing import merge_args, shapes_key, split_args, trace_cached
from genvi.core import validation
from genvi.adev.strategies import ENUM
from genvi.gen.handlers import RecordSites
from genvi.gen.language import GenFn
from genvi.inference.enum_lanes import NotSummable, evaluate, joint_values, lane_sums
from genvi.inference.enum_scan import forward_sums
from genvi.inference.importance import Marginal

MAX_JOINT = 1 << 16  # joint values of scalar sites summed by brute force


@dataclass(frozen=True)
class Enumeration:
    """Exact summation of a marginal's discrete auxiliary sites (see the module)."""

    def marginal(self, g: GenFn, keep: Sequence) -> "EnumeratedMarginal":
        return EnumeratedMarginal(g, keep, self)


def enumeration() -> Enumeration:
    """The exact algorithm for `gv.marginal`: discrete auxiliary sites are summed over
    their supports (lane by lane in plates, by the forward algorithm in scans).

    Returns:
        an `Enumeration`, the `algorithm` of `gv.marginal`.

    Example:
        >>> import genvi as gv
        >>> # gv.marginal(model, keep=["mu", "sigma"], algorithm=gv.enumeration())
        >>> gv.enumeration()
        Enumeration()
    """
    return Enumeration()


@dataclass(frozen=True)
class AuxSite:
    """A discrete auxiliary site: address, its choice's shape (scan steps and lanes
    included), one draw's shape, and its support."""

    addr: tuple
    shape: tuple
    draw_shape: tuple
    dtype: Any
    dist: Any
    support: Any
    scale: float = 1.0  # the product of its enclosing gv.plate factors

    @property
    def name(self) -> str:
        return addr_name(self.addr)


class EnumeratedMarginal(Marginal):
    """`g`'s exact marginal over `keep` (see `gv.enumeration`)."""

    estimated_density = True  # a transformed program: not a plain sub-program call

    def __init__(self, g: GenFn, keep: Sequence, algorithm: Enumeration):
        super().__init__(g, keep, algorithm)
        self.name = f"marginal({g.name}, enumeration)"
        self._aux_cache: dict = {}
        self._log_joints: dict = {}  # traced log densities, per argument shapes

    # -- which sites are summed ---------------------------------------------------------
    def aux_sites(self, *args: Any) -> list[AuxSite]:
        """The discrete sites summed out, found by running `g` abstractly on `args`."""
        key = shapes_key(args)
        if key in self._aux_cache:
            return self._aux_cache[key]
        dyn, static, treedef, mask = split_args(args)
        handler = RecordSites()

        def run(k, dyn):
            return self.g.interpret(handler, *merge_args(dyn, static, treedef, mask),
                                    key=k).choices.flat()
        shapes = jax.eval_shape(run, jax.random.key(0), dyn)
        sites = []
        for addr, sd in shapes.items():
            if self._is_kept(addr):
                continue
            dist, params, scale, masked = handler.found[addr]   # params: shapes only
            if masked:
                raise ValueError(f"gv.enumeration: site {addr_name(addr)!r} (gv.{dist.name}) "
                                 "is sampled in a branch of a cond that differs by lane; "
                                 "enumeration does not sum such sites: keep it and give it "
                                 "a guide")
            sites.append(_aux_site(self, addr, sd, dist, params, scale))
        if not sites:
            raise ValueError(f"gv.enumeration: {self.g.name} has no site outside keep="
                             f"{[addr_name(k) for k in self.keep]} to sum out; use the model "
                             "itself")
        self._aux_cache[key] = sites
        return sites

    # -- densities ----------------------------------------------------------------------
    def log_density(self, choices: Any, *args: Any) -> jax.Array:
        """The exact log marginal density of the kept `choices`."""
        return exact_log_density(self, self.aux_sites(*args), to_choices(choices), args)

    def sim(self, *args: Any) -> tuple[ChoiceMap, jax.Array]:
        """A draw of the kept choices (the whole program sampled with its strategies)
        and their exact log marginal density."""
        self._require_objective("sim")
        full, _ = self.g.sim(*args)
        kept, _ = self._split(full)
        return kept, self.log_density(kept, *args)

    def estimate_log_density(self, key: jax.Array, choices: Any, *args: Any) -> jax.Array:
        """The exact log density (`key` is not used: nothing is random)."""
        return self.log_density(choices, *args)


def _aux_site(m: EnumeratedMarginal, addr: tuple, sd: Any, dist: Any, params: tuple,
              scale: float) -> AuxSite:
    name = addr_name(addr)
    if not supports(dist, ENUM):
        raise ValueError(
            f"gv.enumeration: site {name!r} (gv.{dist.name}) of {m.g.name} is not kept and has "
            "no finite support to sum over (gv.flip, gv.bernoulli and gv.categorical do). "
            f"Keep it (keep=[..., {name!r}]) and give it a guide, or marginalize it with "
            "gv.importance instead.")
    with jax.ensure_compile_time_eval():  # a constant, also inside a traced objective
        zeros = [jnp.zeros(jnp.shape(p), jnp.result_type(p)) for p in params]
        support = np.asarray(dist.support(*zeros))
    draw = jax.eval_shape(lambda *p: dist.sample(jax.random.key(0), *p), *zeros)
    if support.ndim != 1 or dist.value_event_ndim != 0:
        raise ValueError(f"gv.enumeration: site {name!r} (gv.{dist.name}) has values that are "
                         "vectors; enumeration sums sites with one value per lane")
    return AuxSite(addr, tuple(sd.shape), tuple(draw.shape), sd.dtype, dist, support, scale)


def exact_log_density(m: "EnumeratedMarginal", sites: list[AuxSite], kept: ChoiceMap,
                      args: tuple) -> jax.Array:
    """log Σ over the sites' values of `m.g`'s density at (kept, values). The density is
    traced once per argument shapes (`m`'s cache), with the sites' values as inputs."""
    g = m.g

    def log_joint(aux_values, kept, *args):
        return g.log_density(kept | ChoiceMap({s.addr: v for s, v in zip(sites, aux_values)}),
                             *args)

    placeholders = [jnp.zeros(s.shape, s.dtype) for s in sites]
    # validation off: the traced values are placeholders for every value of the supports
    traced, dyn = trace_cached(m._log_joints, log_joint, (placeholders, kept) + tuple(args),
                               lambda: validation.validation(False))
    closed, flat_in = traced.closed, list(dyn[len(sites):])
    scalars = [s for s in sites if s.shape == ()]
    try:
        rest = _summation(sites, scalars)
    except NotSummable as why:
        raise _refusal(g, sites, why) from None
    count = math.prod(len(s.support) for s in scalars)
    if count > MAX_JOINT:
        raise ValueError(f"gv.enumeration: the scalar discrete sites "
                         f"{[s.name for s in scalars]} of {g.name} have {count:,} joint "
                         f"values (more than {MAX_JOINT:,}): put repeated sites in a gv.plate "
                         "or gv.scan, where they are summed lane by lane or step by step")

    def at(values):  # the log density summed over the other sites, scalar sites fixed
        return rest(closed, sites, dict(zip([s.addr for s in scalars], values)), flat_in)
    try:
        per_combo = jax.vmap(at, axis_size=count)(joint_values(scalars))
    except NotSummable as why:
        raise _refusal(g, sites, why) from None
    return logsumexp(per_combo)


def _summation(sites: list[AuxSite], scalars: list[AuxSite]):
    """How the sites other than the scalar ones are summed: `(closed, sites, fixed,
    flat_in) -> log density`, with the scalar sites' values in `fixed`."""
    scanned = [s for s in sites if s.shape != s.draw_shape]
    batched = [s for s in sites if s not in scanned and s not in scalars]
    if scanned:
        if batched:
            raise NotSummable(f"sites {[s.name for s in scanned]} are inside a gv.scan and "
                              f"{[s.name for s in batched]} in a plate")
        return forward_sums
    if batched:
        if len({s.shape for s in batched}) > 1:
            raise NotSummable(
                "the batched discrete sites have different shapes "
                f"({', '.join(f'{s.name}: {s.shape}' for s in batched)}); enumeration "
                "sums lanes of one plate together")
        return lane_sums
    return _evaluated


def _evaluated(closed: Any, sites: list[AuxSite], fixed: dict, flat_in: list) -> jax.Array:
    """The log density with every site's value given (scalar sites only)."""
    return evaluate(closed, [fixed[s.addr] for s in sites] + flat_in)[0]


def _refusal(g: GenFn, sites: list[AuxSite], why: Exception) -> ValueError:
    names = ", ".join(repr(s.name) for s in sites)
    return ValueError(
        f"gv.enumeration cannot sum the discrete sites {names} of {g.name} exactly: {why}. "
        "It sums lane by lane in a gv.plate/gv.vmap whose lanes are conditionally "
        "independent given the kept choices (a mixture), and step by step in a gv.scan "
        "whose steps depend on the previous step's discrete value only (a hidden Markov "
        "model). Keep such a site and give it a guide (grad=gv.ENUM), or use "
        "gv.importance.")
