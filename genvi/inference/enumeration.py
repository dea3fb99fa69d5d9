"""`gv.enumeration()`: an exact algorithm for `gv.marginal` over discrete sites.

`gv.marginal(model, keep=[...], algorithm=gv.enumeration())` sums the model's
auxiliary (not kept) sites over their finite supports, so the marginal's density is
exact, as Pyro's `TraceEnum_ELBO` does for sites enumerated in the model:

* sites outside any `gv.scan` (global ones, and ones batched by `gv.plate`/`gv.vmap`:
  plates of any sizes, side by side or nested): the log density is split into its
  terms, each a tensor over the sites it depends on and the plates it lies in
  (`genvi.inference.enum_factors`), contracted by variable elimination in log space:
  a site summed per lane of its plates, a plate multiplied over its lanes, in an order
  that keeps the largest intermediate small (`genvi.inference.sum_product`);
* a site inside `gv.scan` whose steps depend on the last k steps' values (a hidden
  Markov model of order k, also a batch of them in a plate): the forward algorithm
  over the last k values, O(steps × support^(k+1)), in `genvi.inference.enum_scan`;
  sites of a step that reach no carry (a plate inside the step) are summed within
  the step by the factor engine (`genvi.inference.step_sums`), sequence by sequence
  in a batch of sequences;
* plates beside scans in one model: summed apart, the plates' sites by the factors
  and the scans' by the forward algorithm, where no term of the density reads both
  (`genvi.inference.enum_apart`).

Elsewhere (lanes that couple, plates that cross, a scan whose carry remembers more,
a site without a static finite support) it refuses, naming the site and why.
`EnumeratedMarginal.plans` holds each contraction's steps (`explain`). The model's
log density is traced once per argument shapes with the discrete values as inputs,
then evaluated on all of them; gradients flow through the exact sum (no estimator
is involved).

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

import functools
import math
from dataclasses import dataclass
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.scipy.special import logsumexp

from genvi.core.choices import ChoiceMap, choices as to_choices
from genvi.core.context import current
from genvi.core.mistakes import addr_name
from genvi.core.strategy import supports
from genvi.core.tracing import merge_args, shapes_key, split_args, trace_cached
from genvi.core import validation
from genvi.adev.strategies import ENUM
from genvi.gen.handlers import RecordSites
from genvi.gen.language import GenFn
from genvi.inference.enum_apart import summed_apart
from genvi.inference.enum_factors import MAX_JOINT, sum_over_sites
from genvi.inference.enum_lanes import joint_values
from genvi.inference.enum_scan import forward_sums
from genvi.inference.importance import Marginal
from genvi.inference.sum_product import NotSummable, Plan



@dataclass(frozen=True)
class Enumeration:
    """Exact summation of a marginal's discrete auxiliary sites (see the module)."""

    def marginal(self, g: GenFn, keep: Sequence) -> "EnumeratedMarginal":
        return EnumeratedMarginal(g, keep, self)


def enumeration() -> Enumeration:
    """The exact algorithm for `gv.marginal`: discrete auxiliary sites are summed over
    their supports (by variable elimination over plates, by the forward algorithm in
    scans).

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
        self.plans: dict = {}  # the contraction's steps, per argument shapes (`explain`)

    # -- which sites are summed ---------------------------------------------------------
    def aux_sites(self, *args: Any) -> list[AuxSite]:
        """The discrete sites summed out, found by running `g` abstractly on `args`."""
        key = shapes_key(args)
        if key in self._aux_cache:
            return self._aux_cache[key]
        dyn, static, treedef, mask = split_args(args)
        handler = RecordSites()

        def run(k, dyn, handler=handler):
            return self.g.interpret(handler, *merge_args(dyn, static, treedef, mask),
                                    key=k).choices.flat()
        shapes = jax.eval_shape(run, jax.random.key(0), dyn)
        fixed = None  # the sites' parameters with those fixed at tracing as values
        sites = []
        for addr, sd in shapes.items():
            if self._is_kept(addr):
                continue
            dist, params, scale, masked = handler.found[addr]
            if masked:
                raise ValueError(f"gv.enumeration: site {addr_name(addr)!r} ({dist.label}) "
                                 "is sampled in a branch of a cond that differs by lane; "
                                 "enumeration does not sum such sites: keep it and give it "
                                 "a guide")
            try:
                site = _aux_site(self, addr, sd, dist, params, scale)
            except _NotStatic:
                if fixed is None:
                    # again, the program already traced: what is computed from constants
                    # only (a binomial's n broadcast over a plate) is computed as a value
                    fixed = RecordSites()

                    def again(k, dyn):
                        with jax.ensure_compile_time_eval():
                            return run(k, dyn, fixed)
                    jax.eval_shape(again, jax.random.key(0), dyn)
                try:
                    site = _aux_site(self, addr, sd, dist, fixed.found[addr].params, scale)
                except _NotStatic as err:
                    raise ValueError(
                        f"gv.enumeration: site {addr_name(addr)!r} ({dist.label}) of "
                        f"{self.g.name} has no static finite support here, so it cannot be "
                        f"summed: {err.__cause__}") from None
            sites.append(site)
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


class _NotStatic(Exception):
    """A site's support depends on values known only when the program runs."""


def _aux_site(m: EnumeratedMarginal, addr: tuple, sd: Any, dist: Any, params: tuple,
              scale: float) -> AuxSite:
    name = addr_name(addr)
    if not supports(dist, ENUM):
        raise ValueError(
            f"gv.enumeration: site {name!r} ({dist.label}) of {m.g.name} is not kept and has "
            "no finite support to sum over (gv.flip, gv.bernoulli and gv.categorical do). "
            f"Keep it (keep=[..., {name!r}]) and give it a guide, or marginalize it with "
            "gv.importance instead.")
    zeros = [jnp.zeros(jnp.shape(p), jnp.result_type(p)) for p in params]
    try:
        with jax.ensure_compile_time_eval():  # a constant, also inside a traced objective
            # the parameters as the site saw them: those fixed when the program is traced
            # are values (a binomial's n), the others stand for their shapes only
            support = np.asarray(dist.support(*params))
    except (TypeError, jax.errors.TracerArrayConversionError,
            jax.errors.ConcretizationTypeError, jax.errors.UnexpectedTracerError) as err:
        raise _NotStatic() from err
    draw = jax.eval_shape(lambda *p: dist.sample(jax.random.key(0), *p), *zeros)
    if support.ndim != 1 or dist.value_event_ndim != 0:
        raise ValueError(f"gv.enumeration: site {name!r} ({dist.label}) has values that are "
                         "vectors; enumeration sums sites with one value per lane")
    return AuxSite(addr, tuple(sd.shape), tuple(draw.shape), sd.dtype, dist, support, scale)


def exact_log_density(m: "EnumeratedMarginal", sites: list[AuxSite], kept: ChoiceMap,
                      args: tuple) -> jax.Array:
    """log Σ over the sites' values of `m.g`'s density at (kept, values). The density is
    traced once per argument shapes (`m`'s cache), with the sites' values as inputs."""
    closed, flat_in = _traced(m, sites, kept, args)
    dtype = closed.out_avals[0].dtype
    if all(s.shape == s.draw_shape for s in sites):  # no site in a scan: the factors
        try:
            total, plan = sum_over_sites(closed, sites, flat_in)
        except NotSummable as why:
            raise _refusal(m.g, sites, why) from None
        _record(m, args, plan)
        return jnp.asarray(total, dtype)
    scalars = [s for s in sites if s.shape == ()]
    plan = Plan()
    if scalars:
        plan.note(f"sum out {', '.join(repr(s.name) for s in scalars)} globally: every "
                  f"joint value, {math.prod(len(s.support) for s in scalars):,} of them", 0)
    try:
        rest = _summation(sites, scalars, plan)
    except NotSummable as why:
        raise _refusal(m.g, sites, why) from None
    count = math.prod(len(s.support) for s in scalars)
    if count > MAX_JOINT:
        raise ValueError(f"gv.enumeration: the scalar discrete sites "
                         f"{[s.name for s in scalars]} of {m.g.name} have {count:,} joint "
                         f"values (more than {MAX_JOINT:,}): put repeated sites in a gv.plate "
                         "or gv.scan, where they are summed lane by lane or step by step")

    def at(values):  # the log density summed over the other sites, scalar sites fixed
        return rest(closed, sites, dict(zip([s.addr for s in scalars], values)), flat_in)
    try:
        per_combo = jax.vmap(at, axis_size=count)(joint_values(scalars))
    except NotSummable as why:
        raise _refusal(m.g, sites, why) from None
    _record(m, args, plan)
    return logsumexp(per_combo)


def _record(m: "EnumeratedMarginal", args: tuple, plan: Plan) -> None:
    """Keep the contraction's plan (`m.plans`) and tell the run's observer (`explain`)."""
    m.plans[shapes_key(args)] = plan
    current().observer.contraction(m.name, plan)


def _traced(m: "EnumeratedMarginal", sites: list[AuxSite], kept: ChoiceMap,
            args: tuple) -> tuple[Any, list]:
    """`m.g`'s log density traced with the sites' values as its first inputs: the
    closed jaxpr and its other inputs (kept choices and arguments, flat)."""
    g = m.g

    def log_joint(aux_values, kept, *args):
        return g.log_density(kept | ChoiceMap({s.addr: v for s, v in zip(sites, aux_values)}),
                             *args)

    placeholders = [jnp.zeros(s.shape, s.dtype) for s in sites]
    # validation off: the traced values are placeholders for every value of the supports
    # (a latent used as a shape was refused already, naming it, when the program itself
    # was traced to find the sites: `genvi.core.program_mistakes.static_use_error`)
    traced, dyn = trace_cached(m._log_joints, log_joint, (placeholders, kept) + tuple(args),
                               lambda: validation.validation(False))
    return traced.closed, list(dyn[len(sites):])


def _summation(sites: list[AuxSite], scalars: list[AuxSite], plan: Plan):
    """How the sites in a scan are summed (the forward algorithm, noted in `plan`), with
    the scalar sites' values in `fixed`: `(closed, sites, fixed, flat_in) -> log
    density`."""
    scanned = [s for s in sites if s.shape != s.draw_shape]
    batched = [s for s in sites if s not in scanned and s not in scalars]
    if batched:   # plates beside chains: summed apart where no term couples them
        return functools.partial(summed_apart, scanned=scanned, batched=batched, plan=plan)
    return functools.partial(forward_sums, plan=plan)


def _refusal(g: GenFn, sites: list[AuxSite], why: Exception) -> ValueError:
    names = ", ".join(repr(s.name) for s in sites)
    return ValueError(
        f"gv.enumeration cannot sum the discrete sites {names} of {g.name} exactly: {why}. "
        "It sums a log density that is a sum of terms, each depending lane by lane on the "
        "sites of nested gv.plate/gv.vmap lanes (plates of any sizes, side by side or "
        "nested), and step by step in a gv.scan whose steps depend on the last k steps' "
        "discrete values (a hidden Markov model of order k), the two apart where no term "
        "reads both. Keep such a site and give it a guide "
        "(grad=gv.ENUM), or use gv.importance.")
