"""A scan's steps as the forward algorithms of `gv.enumeration` read them
(`genvi.inference.enum_scan` for one chain, `genvi.inference.enum_sequences` for a
batch of sequences): markers for the site's stacked values and for results that
depend on the path, the step's inputs with the sites' values put in their places,
and the checks both algorithms make.

Example:
    >>> from genvi.inference.enum_steps import Steps
    >>> Steps(site=None).site is None
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp

from genvi.inference.enum_lanes import NotSummable, joint_values
from genvi.inference.enum_same_rules import Same


@dataclass
class Steps:
    """Stands for the stacked values of the site inside the scan (outer evaluation)."""

    site: Any
    enum_marker = True


@dataclass
class AfterScan:
    """A result of the scan that depends on the discrete path: not to be used."""

    where: str
    enum_marker = True


class StepValues:
    """The scan's operands with the discrete sites' stacked values taken out: the
    other per-step inputs (`first` step, the `rest`), and the joint values of the
    sites at one step, `count` of them (the product of their supports), put back in
    their places by `inputs(x_t, c)` (`lanes`: as lane-tracked values, every lane
    at combination c)."""

    def __init__(self, scan: Any, ins: list, zpos: list, sites: list, first_init: list,
                 local: list = ()):
        self.scan, self.sites = scan, sites
        self.consts, self.init, xs = scan.split(ins)
        self.first_init = list(first_init)  # what the first step reads
        xs = [jnp.flip(x, 0) if scan.reverse and not isinstance(x, Steps) else x for x in xs]
        self.where = [scan.scanned_index(p) for p in zpos]
        # sites summed within a step (`StepSum`): a placeholder in their places
        self.held = {scan.scanned_index(p): jnp.zeros(scan.body_in_aval(p).shape,
                                                      scan.body_in_aval(p).dtype)
                     for p in local}
        others = [x for i, x in enumerate(xs) if i not in self.where and i not in self.held]
        self.first, self.rest = [x[0] for x in others], [x[1:] for x in others]
        self.table = joint_values(sites)
        self.count = int(self.table[0].shape[0])
        self.dtypes = [scan.body_in_aval(p).dtype for p in zpos]
        self.lanes = tuple(scan.body_in_aval(zpos[0]).shape)

    def value(self, i: int, c: Any, tracked: bool = False) -> Any:
        """Site i's value in combination c, as the body reads it (`tracked`: every lane
        at that value, lane-tracked)."""
        v = self.table[i][c].astype(self.dtypes[i])
        if not tracked:
            return v
        one = jnp.full((1,) * len(self.lanes), v, self.dtypes[i])
        return Same(one, tuple(range(len(self.lanes))), self.lanes)

    def inputs(self, x_t: list, c: Any, tracked: bool = False) -> list:
        """The step's inputs with the sites' values in combination c in their places."""
        x_t = list(x_t)
        placed = {k: self.value(i, c, tracked) for i, k in enumerate(self.where)}
        for k in sorted({**placed, **self.held}):
            x_t.insert(k, placed[k] if k in placed else self.held[k])
        return x_t


def every_pair(pair: Any, histories: Any, n: int) -> Any:
    """`pair(h, v)` for every history h and every one of the step's `n` joint values v,
    stacked [histories, n, ...] (under `vmap`)."""
    return jax.vmap(lambda h: jax.vmap(lambda v: pair(h, v))(jnp.arange(n)))(histories)


def invariant(scan: Any, a: int, state: set) -> bool:
    """Whether every carry other than the state and the log density passes through the
    step unchanged (a hidden Markov model's parameters)."""
    return all(scan.passes_through(j) for j in range(scan.carry_count)
               if j != a and j not in state)


def after_scan_outputs(scan: Any, zpos: list, a: int, state: set,
                        deps: list, where: str) -> list:
    """The per-step outputs of the scan: none may be used (they need the path)."""
    outs = []
    for i in range(scan.carry_count, scan.body_out_count):
        if not (any(p in deps[i] for p in zpos) or scan.carry_input(a) in deps[i]
                or any(scan.carry_input(s) in deps[i] for s in state)):
            raise NotSummable(f"the scan at {where} returns per-step values alongside its "
                              "discrete site: return None as the step's output (its values "
                              "depend on the path, which the sum does not keep)")
        outs.append(AfterScan(where))
    return outs
