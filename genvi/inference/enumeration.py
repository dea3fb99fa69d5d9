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

import itertools
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from genvi.core.choices import ChoiceMap, choices as to_choices
from genvi.core.mistakes import addr_name
from genvi.core.tracing import merge_args, split_args
from genvi.core import validation
from genvi.gen.handlers import RecordSites
from genvi.gen.language import GenFn
from genvi.inference.enum_lanes import NotSummable, evaluate, lane_sums
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

    # -- which sites are summed ---------------------------------------------------------
    def aux_sites(self, *args: Any) -> list[AuxSite]:
        """The discrete sites summed out, found by running `g` abstractly on `args`."""
        dyn, static, treedef, mask = split_args(args)
        key = (treedef, mask, tuple(static), tuple((jnp.shape(x), str(jnp.result_type(x)))
                                                   for x in dyn))
        try:
            return self._aux_cache[key]
        except (KeyError, TypeError):
            pass
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
        try:
            self._aux_cache[key] = sites
        except TypeError:
            pass
        return sites

    # -- densities ----------------------------------------------------------------------
    def log_density(self, choices: Any, *args: Any) -> jax.Array:
        """The exact log marginal density of the kept `choices`."""
        kept = to_choices(choices)
        sites = self.aux_sites(*args)
        return exact_log_density(self.g, sites, kept, args)

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
    if not hasattr(dist, "support") or not dist.supports("ENUM"):
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
    if scale != 1.0 and tuple(sd.shape) != tuple(draw.shape):
        raise ValueError(f"gv.enumeration: site {name!r} is inside a gv.scan inside a subsampled "
                         "gv.plate; enumeration sums such a scan over the whole dataset only")
    return AuxSite(addr, tuple(sd.shape), tuple(draw.shape), sd.dtype, dist, support, scale)


def exact_log_density(g: GenFn, sites: list[AuxSite], kept: ChoiceMap, args: tuple) -> jax.Array:
    """log Σ over the sites' values of g's density at (kept, values)."""
    dyn, static, treedef, mask = split_args(args)
    kept_flat = kept.flat()

    def log_joint(aux_values, kept_values, dyn):
        cm = ChoiceMap({**dict(zip(kept_flat, kept_values)),
                        **{s.addr: v for s, v in zip(sites, aux_values)}})
        return g.log_density(cm, *merge_args(list(dyn), static, treedef, mask))

    placeholders = [jnp.zeros(s.shape, s.dtype) for s in sites]
    with validation.validation(False):  # values are summed over their supports
        closed = jax.make_jaxpr(log_joint)(placeholders, list(kept_flat.values()), list(dyn))
    flat_in = list(kept_flat.values()) + list(dyn)
    scanned = [s for s in sites if s.shape != s.draw_shape]
    scalars = [s for s in sites if s.shape == () and s not in scanned]
    batched = [s for s in sites if s.shape != () and s not in scanned]
    try:
        if scanned:
            if batched:
                raise NotSummable(
                    f"sites {[s.name for s in scanned]} are inside a gv.scan and "
                    f"{[s.name for s in batched]} in a plate")
            inner = lambda fixed: forward_sums(closed, sites, fixed, flat_in)  # noqa: E731
        elif batched:
            if len({s.shape for s in batched}) > 1:
                raise NotSummable(
                    "the batched discrete sites have different shapes "
                    f"({', '.join(f'{s.name}: {s.shape}' for s in batched)}); enumeration "
                    "sums lanes of one plate together")
            inner = lambda fixed: lane_sums(closed, sites, fixed, flat_in)  # noqa: E731
        else:
            inner = None
    except NotSummable as why:
        raise _refusal(g, sites, why) from None
    combos = list(itertools.product(*[range(len(s.support)) for s in scalars]))
    if len(combos) > MAX_JOINT:
        raise ValueError(f"gv.enumeration: the scalar discrete sites "
                         f"{[s.name for s in scalars]} of {g.name} have {len(combos):,} joint "
                         f"values (more than {MAX_JOINT:,}): put repeated sites in a gv.plate "
                         "or gv.scan, where they are summed lane by lane or step by step")
    table = {s.addr: jnp.asarray(np.array([s.support[c[i]] for c in combos]), s.dtype)
             for i, s in enumerate(scalars)}

    def one(fixed):
        if inner is None:
            return evaluate(closed, [fixed[s.addr] for s in sites] + flat_in)[0]
        return inner(fixed)
    try:
        per_combo = jax.vmap(one)(table) if scalars else one({})[None]
    except NotSummable as why:
        raise _refusal(g, sites, why) from None
    return logsumexp(per_combo)


def _refusal(g: GenFn, sites: list[AuxSite], why: Exception) -> ValueError:
    names = ", ".join(repr(s.name) for s in sites)
    return ValueError(
        f"gv.enumeration cannot sum the discrete sites {names} of {g.name} exactly: {why}. "
        "It sums lane by lane in a gv.plate/gv.vmap whose lanes are conditionally "
        "independent given the kept choices (a mixture), and step by step in a gv.scan "
        "whose steps depend on the previous step's discrete value only (a hidden Markov "
        "model). Keep such a site and give it a guide (grad=gv.ENUM), or use "
        "gv.importance.")
