"""`gv.enumeration()`, the exact algorithm of `gv.marginal` over discrete sites, and
`exact_log_density`, the pipeline of its stages (see `genvi.inference.enumeration`).
Gradients flow through the exact sum: no estimator is involved.

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
from jax.scipy.special import logsumexp

from genvi.core import validation
from genvi.core.choices import ChoiceMap, choices as to_choices
from genvi.core.context import current
from genvi.core.mistakes import addr_name
from genvi.core.tracing import shapes_key, trace_cached
from genvi.inference.enumeration.chain import forward_sums
from genvi.inference.enumeration.contract import Plan
from genvi.inference.enumeration.factors import sum_over_sites, term_dependence, terms_part
from genvi.inference.enumeration.sites import (MAX_JOINT, AuxSite, NotSummable,
                                               joint_values, summed_sites)
from genvi.gen.language import GenFn
from genvi.inference.importance import Marginal

#: the time products of a chain (`gv.enumeration(time=...)`)
TIMES = ("auto", "sequential", "parallel")
#: `time="auto"` multiplies a chain's steps in parallel on an accelerator from this
#: many steps on; on a CPU always one after another (faster there at every length)
PARALLEL_FROM = 1024


@dataclass(frozen=True)
class Enumeration:
    """Exact summation of a marginal's discrete auxiliary sites (see `gv.enumeration`)."""

    time: str = "auto"

    def marginal(self, g: GenFn, keep: Sequence) -> "EnumeratedMarginal":
        return EnumeratedMarginal(g, keep, self)

    def parallel(self, steps: int) -> bool:
        """Whether a chain of `steps` steps is multiplied in parallel in time."""
        if self.time != "auto":
            return self.time == "parallel"
        return jax.default_backend() != "cpu" and steps >= PARALLEL_FROM


def enumeration(time: str = "auto") -> Enumeration:
    """The exact algorithm for `gv.marginal`: discrete auxiliary sites are summed over
    their supports (by variable elimination over plates, by the forward algorithm over
    the steps of a `gv.scan`).

    Args:
        time: how a chain's steps are multiplied where a step's factors depend on its
            input alone (an HMM): "sequential" (one after another, O(T × C²) work,
            memory O(T / 16 × C) in the backward pass), "parallel" (a balanced tree of
            transition matrices, O(T × C³) work, log₂ T deep, memory O(T × C³)), or
            "auto": parallel on an accelerator from 1,024 steps on, else sequential.
            Both give the same value and gradient.

    Returns:
        an `Enumeration`, the `algorithm` of `gv.marginal`.

    Example:
        >>> import genvi as gv
        >>> # gv.marginal(model, keep=["mu", "sigma"], algorithm=gv.enumeration())
        >>> gv.enumeration()
        Enumeration(time='auto')
    """
    if time not in TIMES:
        raise ValueError(f"gv.enumeration: time={time!r} is not one of {TIMES}")
    return Enumeration(time)


class EnumeratedMarginal(Marginal):
    """`g`'s exact marginal over `keep` (see `gv.enumeration`)."""

    estimated_density = True  # a transformed program: not a plain sub-program call
    # Marginal's setup with its own algorithm, not an Importance: it overrides the methods
    # of Marginal that read an Importance's fields
    alg: Enumeration  # type: ignore[assignment]

    def __init__(self, g: GenFn, keep: Sequence, algorithm: Enumeration):
        super().__init__(g, keep, algorithm)  # type: ignore[arg-type]  # (see alg above)
        self.name = f"marginal({g.name}, enumeration)"
        self._aux_cache: dict = {}
        self._log_joints: dict = {}  # traced log densities, per argument shapes
        self.plans: dict = {}  # the contraction's steps, per argument shapes (`explain`)

    def aux_sites(self, *args: Any) -> list[AuxSite]:
        """The discrete sites summed out, found by running `g` abstractly on `args`."""
        key = shapes_key(args)
        if key not in self._aux_cache:
            sites = summed_sites(self.g, self._is_kept, args)
            if not sites:
                raise ValueError(f"gv.enumeration: {self.g.name} has no site outside keep="
                                 f"{[addr_name(k) for k in self.keep]} to sum out; use the model "
                                 "itself")
            self._aux_cache[key] = sites
        return self._aux_cache[key]

    def log_density(self, choices: Any, *args: Any) -> jax.Array:
        """The exact log marginal density of the kept `choices`."""
        return exact_log_density(self, self.aux_sites(*args), to_choices(choices), args)

    def sim(self, *args: Any) -> tuple[ChoiceMap, jax.Array]:
        """A draw of the kept choices (the whole program sampled) and their log density."""
        self._require_objective("sim")
        kept, _ = self._split(self.g.sim(*args)[0])
        return kept, self.log_density(kept, *args)

    def estimate_log_density(self, key: jax.Array, choices: Any, *args: Any) -> jax.Array:
        """The exact log density (`key` is not used: nothing is random)."""
        return self.log_density(choices, *args)


def exact_log_density(m: EnumeratedMarginal, sites: list[AuxSite], kept: ChoiceMap,
                      args: tuple) -> jax.Array:
    """log Σ over the sites' values of `m.g`'s density at (kept, values): sites of one
    value at every joint value around the plates or chains, plates beside chains `_apart`."""
    def log_joint(aux_values, kept, *args):
        return m.g.log_density(kept | ChoiceMap({s.addr: v for s, v in zip(sites, aux_values)}),
                               *args)
    # traced with the sites' values as its first inputs, validation off: they stand for
    # every value of the supports (a latent used as a shape was refused when the program
    # was traced to find the sites: `genvi.core.program_mistakes.static_use_error`)
    placeholders = [jnp.zeros(s.shape, s.dtype) for s in sites]
    traced, dyn = trace_cached(m._log_joints, log_joint, (placeholders, kept) + tuple(args),
                               lambda: validation.validation(False))
    closed, flat_in = traced.closed, list(dyn[len(sites):])
    scanned = [s for s in sites if s.shape != s.draw_shape]
    scalars = [s for s in sites if s.shape == ()] if scanned else []
    batched = [s for s in sites if s not in scanned and s not in scalars]
    plan = Plan()
    count = math.prod(len(s.support) for s in scalars)
    if scalars:
        plan.note(f"sum out {', '.join(repr(s.name) for s in scalars)} globally: every "
                  f"joint value, {count:,} of them", 0)
    if count > MAX_JOINT:
        raise ValueError(f"gv.enumeration: the scalar discrete sites "
                         f"{[s.name for s in scalars]} of {m.g.name} have {count:,} joint "
                         f"values (more than {MAX_JOINT:,}): put repeated sites in a gv.plate "
                         "or gv.scan, where they are summed lane by lane or step by step")
    parallel = m.alg.parallel(max((s.shape[0] for s in scanned), default=0))

    def at(values: list) -> jax.Array:  # the sum over the other sites, scalar sites fixed
        fixed = dict(zip([s.addr for s in scalars], values))
        if not scanned:
            total, contraction = sum_over_sites(closed, sites, flat_in)
            plan.steps[:], plan.largest = contraction.steps, contraction.largest
            return jnp.asarray(total, closed.out_avals[0].dtype)
        if not batched:
            return forward_sums(closed, sites, fixed, flat_in, plan, parallel)
        return _apart(closed, sites, fixed, flat_in, scanned, batched, plan, parallel)
    try:
        total = (logsumexp(jax.vmap(at, axis_size=count)(joint_values(scalars))) if scalars
                 else at([]))
    except NotSummable as why:
        raise ValueError(
            "gv.enumeration cannot sum the discrete sites "
            f"{', '.join(repr(s.name) for s in sites)} of {m.g.name} exactly: {why}. It sums a log "
            "density that is a sum of terms, each depending lane by lane on the sites of nested "
            "gv.plate/gv.vmap lanes (plates of any sizes, side by side or nested), and step by "
            "step in a gv.scan whose steps depend on the last k steps' discrete values (a hidden "
            "Markov model of order k), the two apart where no term reads both. Keep such a site "
            "and give it a guide (grad=gv.ENUM), or use gv.importance.") from None
    m.plans[shapes_key(args)] = plan
    current().observer.contraction(m.name, plan)   # `explain`
    return total


def _apart(closed: Any, sites: list, fixed: dict, flat_in: list, scanned: list,
           batched: list, plan: Plan, parallel: bool) -> jax.Array:
    """Plates beside chains: where no term of the density reads both a plate's site and
    a chain's, log Σ exp(A + B + C) = log Σ_plates exp(A + C) + log Σ_chains exp(B),
    with A, B the terms of the plates' and the chains' sites and C the rest (a constant
    factor of the plates' contraction)."""
    plain = [fixed[s.addr] if s.addr in fixed else jnp.full(s.shape, s.support[0], s.dtype)
             for s in sites]
    deps = [{i for i in d if i < len(sites)}
            for d in term_dependence(closed, plain + list(flat_in))]
    plate_at = [i for i, s in enumerate(sites) if any(s is b for b in batched)]
    chain_at = {i for i, s in enumerate(sites) if any(s is c for c in scanned)}
    for d in deps:
        if d & set(plate_at) and d & chain_at:
            names = sorted(repr(sites[i].name) for i in d & (set(plate_at) | chain_at))
            raise NotSummable(f"one term of the density depends on the plate's and the "
                              f"scan's sites {', '.join(names)} together, so they cannot be "
                              "summed apart: keep the sites of one of them and give them a guide")
    n = len(sites)
    over_plates, contraction = sum_over_sites(
        terms_part(closed, [k for k, d in enumerate(deps) if not d & chain_at], plate_at, n),
        [sites[i] for i in plate_at],
        [x for i, x in enumerate(plain) if i not in plate_at] + list(flat_in))
    plan.steps += contraction.steps
    plan.largest = max(plan.largest, contraction.largest)
    along = [i for i in range(n) if i not in plate_at]   # the chains', and the fixed ones
    return over_plates + forward_sums(
        terms_part(closed, [k for k, d in enumerate(deps) if d & chain_at], along, n),
        [sites[i] for i in along], fixed, [plain[i] for i in plate_at] + list(flat_in),
        plan, parallel)
