"""Discrete sites local to a step of a chain, summed within the step (`gv.enumeration`).

In a `gv.scan` whose carry holds a chain's discrete values, a site whose value reaches
no carry but the log density's (a plate of discrete sites inside the step, each
depending on the chain's state: a factorial emission, a mixture per step) is local
to its step: given the chain's history and value, the step's log-density term is
summed over it exactly by the factor engine (`genvi.inference.enum_factors`), and the
forward algorithm then runs over the chain's values only. `local_positions` finds
such sites; `StepSum` holds the step's term as a density of them.

Example:
    >>> from genvi.inference.step_sums import local_positions
    >>> # site 3 reaches only the log density's carry (2), site 4 reaches carry 0
    >>> local_positions([3, 4], [{4}, set(), {3}], a=2, carries=3)
    [3]
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from genvi.core import jaxpr as jx
from genvi.core.walk import env_of, walk
from genvi.inference.enum_factors import (sum_over_sites, term_dependence, terms_part,
                                          whole)
from genvi.inference.enum_lanes import evaluate


def local_positions(zpos: list, deps: list, a: int, carries: int) -> list:
    """The body inputs among `zpos` (the scan's discrete sites) whose values reach no
    carry but the log density's (`a`); none where no site reaches a carry (then every
    site is the chain's)."""
    carried = [p for p in zpos if any(p in deps[j] for j in range(carries) if j != a)]
    return [p for p in zpos if p not in carried] if carried else []


class StepSum:
    """The log-density term of a step of `scan` summed over its local sites (at body
    inputs `positions`, `sites` their `AuxSite`s): `term(inputs)`, the body's
    inputs given (the local ones are not read)."""

    def __init__(self, scan: Any, a: int, positions: list, sites: list):
        body = scan.body
        avals = [scan.body_in_aval(i) for i in range(len(body.jaxpr.invars))]
        self.positions = list(positions)
        self.others = [i for i in range(len(avals)) if i not in self.positions]
        self.sites = [dataclasses.replace(s, shape=tuple(avals[p].shape),
                                          draw_shape=tuple(avals[p].shape))
                      for p, s in zip(self.positions, sites)]

        def term(local: list, others: list) -> Any:
            full: list = [None] * len(avals)
            for i, v in zip(self.positions, local):
                full[i] = v
            for i, v in zip(self.others, others):
                full[i] = v
            outs = walk(body.jaxpr, env_of(body, full), lambda i, e, ins: jx.eval_eqn(e, ins))
            return outs[a]
        zeros = [jnp.zeros(a_.shape, a_.dtype) for a_ in avals]
        self.closed = jax.make_jaxpr(term)([zeros[i] for i in self.positions],
                                           [zeros[i] for i in self.others])

    def term(self, inputs: list) -> Any:
        """The step's term summed over the local sites, at the body inputs `inputs`."""
        total, _ = sum_over_sites(self.closed, self.sites, self._others(inputs))
        return total

    def split(self, inputs: list, lanes: int) -> tuple[Any, Any, Any]:
        """A step of a batch of chains, whose local sites' first `lanes` axes are the
        sequences', at the body inputs `inputs` (lane-tracked): (its terms that read no
        local site, evaluated lane-tracked; then of the terms that do, summed over the
        local sites sequence by sequence, the part common to every sequence and one
        term per sequence)."""
        local_part, rest_part = self._parts
        placeholders = [jnp.zeros(s.shape, s.dtype) for s in self.sites]
        (rest,) = evaluate(rest_part, placeholders + [inputs[i] for i in self.others])
        (free, per_lane), _ = sum_over_sites(local_part, self.sites, self._others(inputs),
                                             lanes_kept=lanes)
        return rest, free, per_lane.reshape(-1)

    @functools.cached_property
    def _parts(self) -> tuple[Any, Any]:
        """The step's term as (the terms that read a local site, the others), each a
        closed jaxpr of the same inputs as `closed`."""
        n = len(self.positions)
        zeros = [jnp.zeros(a.shape, a.dtype) for a in self.closed.in_avals]
        deps = term_dependence(self.closed, zeros)
        reads = [k for k, d in enumerate(deps) if any(i < n for i in d)]
        return (terms_part(self.closed, reads),
                terms_part(self.closed, [k for k in range(len(deps)) if k not in reads]))

    def _others(self, inputs: list) -> list:
        return [whole(inputs[i]) for i in self.others]
