"""Plates and chains in one model, summed apart: `gv.enumeration` of a model whose
discrete sites lie in plates (`gv.vmap`/`gv.plate`) and in `gv.scan`s.

The log density is a sum of terms (`genvi.inference.enum_factors.split_terms`). Where
no term depends on both a plate's site and a scan's site, the sum over their values
factorizes: log Σ_plates Σ_scans exp(A + B + C) = log Σ_plates exp(A) + log Σ_scans
exp(B) + C, with A the terms of the plates' sites, B those of the scans' sites and C
the rest. A + C is contracted by the factor engine (`sum_over_sites`, where C is a
constant factor), B by the forward algorithm (`forward_sums`); the global sites of one
value are fixed by the caller. A term that reads both (an observation in a plate that
depends on a chain's state) is refused, naming the sites.

Example (a mixture over points beside a two-state chain, sharing a mean):
    >>> import genvi as gv, jax, jax.numpy as jnp
    >>> @gv.gen
    ... def point(mu, y):
    ...     z = gv.flip(0.3) @ "z"
    ...     gv.observe(gv.normal(jnp.where(z, mu, -mu), 1.0), y)
    >>> @gv.gen
    ... def step(s, y):
    ...     s = gv.categorical(jnp.log(jnp.array([[0.9, 0.1], [0.2, 0.8]]))[s]) @ "s"
    ...     gv.observe(gv.normal(s * 1.0, 1.0), y)
    ...     return s, None
    >>> @gv.gen
    ... def both(ys, yc):
    ...     mu = gv.normal(0.0, 3.0) @ "mu"
    ...     gv.vmap(point, in_axes=(None, 0))(mu, ys) @ "points"
    ...     gv.scan(step)(0, yc) @ "chain"
    >>> m = gv.marginal(both, keep=["mu"], algorithm=gv.enumeration())
    >>> lp = m.log_density(gv.choices({"mu": 1.0}), jnp.array([1.2, -0.7]), jnp.array([0.1, 1.1]))
    >>> round(float(lp), 4)                      # numpy over every joint value: -7.6104
    -7.6104
    >>> print(*m.plans.values())
      1. sum out 'points/z' per lane of {points/z:2}: 2 factors, 4 entries
      2. multiply over {points/z:2}
      3. forward algorithm over 'chain/s' (the scan at ...): order 1, 2 histories × 2 values per step, 2 steps
      largest intermediate: 4 entries
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from genvi.inference.enum_factors import sum_over_sites, term_dependence, terms_part
from genvi.inference.enum_scan import forward_sums
from genvi.inference.sum_product import NotSummable, Plan


def summed_apart(closed: Any, sites: list, fixed: dict, flat_in: list, *, scanned: list,
                 batched: list, plan: Plan) -> jax.Array:
    """log Σ over the values of the `batched` (plate) and `scanned` (chain) sites of the
    density `closed` computes from (site values, *flat_in), the sites not in either at
    their values in `fixed`; the steps noted in `plan`."""
    plain = [fixed[s.addr] if s.addr in fixed else _first_value(s) for s in sites]
    deps = [{i for i in d if i < len(sites)} for d in term_dependence(closed, plain + list(flat_in))]
    plate_at = {i for i, s in enumerate(sites) if any(s is b for b in batched)}
    chain_at = {i for i, s in enumerate(sites) if any(s is c for c in scanned)}
    for d in deps:
        if d & plate_at and d & chain_at:
            names = sorted(repr(sites[i].name) for i in d & (plate_at | chain_at))
            raise NotSummable(f"one term of the density depends on the plate's and the "
                              f"scan's sites {', '.join(names)} together, so they cannot be "
                              "summed apart: keep the sites of one of them and give them a guide")
    # the terms that read neither ride with the plates' (constants of their contraction)
    plate_terms = [k for k, d in enumerate(deps) if not d & chain_at]
    chain_terms = [k for k, d in enumerate(deps) if d & chain_at]

    n = len(sites)
    on_plates = sorted(plate_at)
    over_plates, contraction = sum_over_sites(
        terms_part(closed, plate_terms, on_plates, n), [sites[i] for i in on_plates],
        [x for i, x in enumerate(plain) if i not in plate_at] + list(flat_in))
    for step in contraction.steps:
        plan.note(step, 0)
    plan.largest = max(plan.largest, contraction.largest)
    along = [i for i in range(n) if i not in plate_at]   # the chains', and the fixed ones
    over_chains = forward_sums(
        terms_part(closed, chain_terms, along, n), [sites[i] for i in along], fixed,
        [plain[i] for i in on_plates] + list(flat_in), plan=plan)
    return over_plates + over_chains


def _first_value(s: Any) -> jax.Array:
    """A site's first value in every lane (and step): what a term that does not
    depend on it is evaluated at."""
    return jnp.full(s.shape, s.support[0], s.dtype)
