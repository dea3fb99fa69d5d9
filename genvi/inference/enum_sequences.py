"""The forward algorithm of `gv.enumeration` over a batch of sequences: a discrete
site inside a `gv.scan` inside a `gv.vmap` or `gv.plate`, each lane its own chain,
every lane's recursion run side by side (`forward_lanes`; one chain's is
`genvi.inference.enum_scan`).

Example (two sequences of a two-state chain, each summed by its own recursion; the
same sequence twice gives twice one chain's log marginal, less the shared prior's):
    >>> import genvi as gv, jax.numpy as jnp
    >>> @gv.gen
    ... def step(prev, y):
    ...     z = gv.flip(jnp.where(prev, 0.9, 0.2)) @ "z"
    ...     gv.observe(gv.normal(jnp.where(z, 1.0, -1.0), 1.0), y)
    ...     return z, None
    >>> @gv.gen
    ... def chains(ys):
    ...     gv.normal(0.0, 1.0) @ "mu"
    ...     gv.vmap(gv.scan(step), in_axes=(None, 0))(False, ys) @ "seqs"
    >>> m = gv.marginal(chains, keep=["mu"], algorithm=gv.enumeration())
    >>> ys = jnp.array([[0.5, 1.0, -0.3], [0.5, 1.0, -0.3]])
    >>> round(float(m.log_density(gv.choices({"mu": 0.0}), ys)), 4)
    -10.6778
    >>> print(*m.plans.values())
      1. forward algorithm over 'seqs/z' (the scan at ...): order 1, 2 histories × 2 values per step, 3 steps, 2 sequences at once
      largest intermediate: 8 entries
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from genvi.inference.chain_algebra import History, blocked_chain, remat
from genvi.inference.enum_lanes import Additive, NotSummable, evaluate, is_tracked
from genvi.inference.enum_same_rules import Same
from genvi.inference.step_sums import StepSum
from genvi.inference.enum_steps import (AfterScan, StepValues, after_scan_outputs,
                                        every_pair, invariant)
from genvi.replays.engine import Local


def forward_lanes(steps: StepValues, history: History, echo: dict, a: int, state: set,
                  deps: list, where: str, step_sum: StepSum | None = None) -> list:
    """The forward algorithm for a batch of chains: the scan's per-step site values
    have lanes (the sequences of a `gv.vmap`/`gv.plate` around a `gv.scan`), each lane
    its own chain. The body is evaluated once per (history h, value v) with every lane
    at v (and its state at h), lane-tracked, so the log density's step term comes out
    as a lane-free part plus one term per lane (`Additive`); the lanes' α recursions
    then run side by side (`History.advance` with a lanes axis), O(T × lanes ×
    values^(k+1)). In a subsampled plate a lane's terms arrive scaled: its chain is
    summed unscaled, then scaled. Sites local to a step (`step_sum`: a plate inside
    each sequence's step) are summed within the step, sequence by sequence."""
    scan = steps.scan
    body, ncar = scan.body, scan.carry_count
    scales = {s.scale for s in steps.sites}
    if len(scales) > 1:
        raise NotSummable(f"the discrete sites of the scan at {where} lie in gv.plates of "
                          "different scales")
    scale = scales.pop()
    n, count = steps.count, math.prod(steps.lanes)
    axes = tuple(range(len(steps.lanes)))
    state_axes: dict = {}  # a state carry's lane axes (from its first evaluation)

    def tracked(x: Any, j: int) -> Any:
        return Local(x, x, state_axes[j]) if j in state_axes else x

    def run(carry: list, x_t: list, c: Any) -> tuple:
        carry = list(carry)
        carry[a] = jnp.zeros_like(carry[a])
        inputs = list(steps.consts) + carry + steps.inputs(x_t, c, tracked=True)
        outs = evaluate(body, inputs)
        term, local_free, local_lanes = outs[a], 0.0, 0.0
        if step_sum is not None:  # the terms of its local sites summed sequence by sequence
            term, local_free, local_lanes = step_sum.split(inputs, len(steps.lanes))
        if isinstance(term, Additive):
            free, per_lane = term.free, term.lanes
        elif is_tracked(term):
            raise NotSummable(f"the log density of a step of the scan at {where} is not a sum "
                              "of per-sequence terms")
        else:
            free, per_lane = term, jnp.zeros((count,), jnp.result_type(term))
        free, per_lane = free + local_free, per_lane + local_lanes
        new = []
        for j, o in enumerate(scan.split_outs(outs)[0]):
            if isinstance(o, Same):
                o = o.local()
            if j == a:  # the log density's accumulator: its term is read above
                o = jnp.zeros_like(steps.init[a])
            elif isinstance(o, Local):
                if j not in state or o.axes not in (axes, state_axes.get(j, o.axes)):
                    raise NotSummable(f"the carry of the scan at {where} mixes the sequences")
                state_axes[j] = o.axes
                o = o.base
            elif is_tracked(o):
                raise NotSummable(f"the carry of the scan at {where} mixes the sequences")
            new.append(o)
        return free, per_lane / scale, new

    free0, alpha, carry0 = jax.vmap(lambda c: run(steps.first_init, steps.first, c))(
        jnp.arange(n))
    alpha = history.first(alpha)                            # [C^k, lanes]
    carry0 = [history.carried(c) if j in state else c[0] for j, c in enumerate(carry0)]
    free_total = free0[0]
    histories = jnp.arange(history.size)

    def state_at(j: int, h: Any, carry: list | None) -> Any:
        if j in echo:  # the site's own value: every lane at it, built here
            return steps.value(echo[j][0], history.value_at(h, echo[j][1]), tracked=True)
        return tracked(carry[j][h], j)

    def step(c: tuple, x_t: list) -> tuple:
        alpha, carry, free_total = c

        def pair(h, v):
            cin = [state_at(j, h, carry) if j in state else carry[j] for j in range(ncar)]
            return run(cin, x_t, v)
        free, terms, new = every_pair(pair, histories, n)   # terms: [C^k, C, lanes]
        alpha = history.advance(alpha, terms)
        new = [history.shift(c) if j in state else c[0, 0] for j, c in enumerate(new)]
        return (alpha, new, free_total + free[0, 0]), None

    if scan.length > 1 and set(echo) == state and invariant(scan, a, state):
        # a step's factors depend on its input alone: every step's at once, then α
        def factors(x_t):
            def pair(h, v):
                cin = [state_at(j, h, None) if j in state else steps.init[j]
                       for j in range(ncar)]
                free, per_lane, _ = run(cin, x_t, v)
                return free, per_lane
            return every_pair(pair, histories, n)
        alpha, free_rest = blocked_chain(
            history, alpha, lambda x_t: (lambda f, m: (f[0, 0], m))(*factors(x_t)), steps.rest)
        free_total = free_total + free_rest
        carry0 = [steps.init[j] if j not in state else carry0[j] for j in range(ncar)]
    elif scan.length > 1:
        (alpha, carry0, free_total), _ = jax.lax.scan(
            remat(step), (alpha, carry0, free_total), steps.rest)
    total = free_total + scale * jnp.sum(logsumexp(alpha, axis=0))
    results = [steps.init[a] + total if j == a else AfterScan(where) if j in state
               else carry0[j] for j in range(ncar)]
    zpos = [scan.scanned_input(k) for k in steps.where]
    return results + after_scan_outputs(scan, zpos, a, state, deps, where)
