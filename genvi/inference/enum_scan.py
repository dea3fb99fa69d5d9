"""The forward algorithm for `gv.enumeration`: a discrete site inside `gv.scan`.

The model's log density, traced with the site's stacked values [T] as an input, holds
one `scan` that reads them as its per-step input. Its body is analysed once, by
dependence: the log-density carry (`logw_out = logw_in + term`) is the accumulator;
the carries whose new value depends on the step's discrete value z_t are its state.
Each must be a function of z_t alone (depth 0), or the value a carry of depth d held
at the step's start (depth d + 1: a register of earlier values), so the state is a
function of the last k = 1 + (largest depth) values: a hidden Markov model of order
k. With h the history of the last k joint values (`genvi.inference.chain_algebra`),

    α_0(v) = term_0(v),   α_t(v, h_1..h_{k−1}) = logsumexp_{h_k} [α_{t−1}(h) + term_t(h, v)],

and the scan's log density is logsumexp_h α_{T−1}(h): O(T × support^(k+1))
evaluations of the step, as one `lax.scan` whose step evaluates the body on every
(history, value) pair under `vmap`. Results of the scan that depend on the discrete
values may not be used after it (they would need the path); anything else raises
`NotSummable` by name.

A batch of sequences (the site's values have lanes) runs the same recursion lane by
lane side by side (`genvi.inference.enum_sequences`).

Example (a two-state chain of three steps, its states summed out):
    >>> import genvi as gv, jax.numpy as jnp
    >>> @gv.gen
    ... def step(prev, y):
    ...     z = gv.flip(jnp.where(prev, 0.9, 0.2)) @ "z"
    ...     gv.observe(gv.normal(jnp.where(z, 1.0, -1.0), 1.0), y)
    ...     return z, None
    >>> @gv.gen
    ... def chain(ys):
    ...     gv.normal(0.0, 1.0) @ "mu"
    ...     gv.scan(step)(False, ys) @ "steps"
    >>> m = gv.marginal(chain, keep=["mu"], algorithm=gv.enumeration())
    >>> round(float(m.log_density(gv.choices({"mu": 0.0}), jnp.array([0.5, 1.0, -0.3]))), 4)
    -5.7984
    >>> print(*m.plans.values())
      1. forward algorithm over 'steps/z' (the scan at ...): order 1, 2 histories × 2 values per step, 3 steps
      largest intermediate: 4 entries
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from genvi.core import jaxpr as jx
from genvi.core.rules import primitives
from genvi.inference.chain_algebra import History, blocked_chain, remat
from genvi.inference.enum_factors import MAX_JOINT
from genvi.inference.enum_lanes import NotSummable, evaluate, is_tracked
from genvi.inference.enum_same_rules import Same
from genvi.inference.enum_sequences import forward_lanes
from genvi.inference.enum_steps import (AfterScan, Steps, StepValues, after_scan_outputs,
                                        every_pair, invariant)
from genvi.inference.step_sums import StepSum, local_positions
from genvi.inference.sum_product import Plan

# reorderings of the stacked values on their way into the scan (vmap of a scan moves
# the sequences' axis behind the steps')
_LAYOUT = primitives(["transpose", "convert_element_type"])


def _forward(eqn: Any, ins: list, plan: Plan | None = None) -> list | None:
    scan = jx.view(eqn)
    if not isinstance(scan, jx.ScanEqn):
        return None
    where = jx.source_line(eqn)
    first_init = scan.split(ins)[1]  # unbroadcast where they are (`enum_same_rules`)
    ins = [x.materialized() if isinstance(x, Same) else x for x in ins]
    ncar, length = scan.carry_count, scan.length
    zpos = [i for i, x in enumerate(ins) if isinstance(x, Steps)]
    if not zpos or scan.scanned_index(zpos[0]) is None or any(
            not isinstance(x, Steps) and is_tracked(x) for x in ins):
        raise NotSummable(f"the scan at {where} reads them other than as its "
                          "per-step input")
    sites = [ins[p].site for p in zpos]
    deps = scan.dependence()
    # the carry the interpreter accumulates the log density in (`genvi.gen.interpret`
    # puts it last): `out = in + term`, its input used nowhere else
    a = ncar - 1 if ncar and ncar - 1 in scan.accumulators(subtract=False, sole_use=False) \
        else None
    if a is None:
        raise NotSummable(f"the scan at {where} is not a gv.scan of the model")
    # sites whose values reach no carry but the log density's: summed within each step
    local = local_positions(zpos, deps, a, ncar)
    chain = [p for p in zpos if p not in local]
    state: set = set()
    changed = True
    while changed:  # carries whose value depends on the discrete values
        changed = False
        for j in range(ncar):
            if j != a and j not in state and (
                    any(p in deps[j] for p in chain)
                    or any(scan.carry_input(s) in deps[j] for s in state)):
                state.add(j)
                changed = True
    depth = _depths(scan, state, deps, where)
    shapes = {tuple(scan.body_in_aval(p).shape) for p in chain}
    if len(shapes) > 1:
        raise NotSummable(f"the discrete sites of the scan at {where} have different shapes "
                          f"per step ({', '.join(f'{x.name}' for x in sites)}): they are "
                          "summed jointly only where each step holds one value of each per "
                          "sequence")
    steps = StepValues(scan, ins, chain, [ins[p].site for p in chain], first_init, local)
    step_sum = StepSum(scan, a, local, [ins[p].site for p in local]) if local else None
    history = History(steps.count, 1 + max(depth.values(), default=0))
    if history.size * history.count > MAX_JOINT:
        raise NotSummable(f"the chain of the scan at {where} remembers {history.k} steps of "
                          f"{history.count} joint values: {history.size * history.count:,} "
                          f"joint values per step (more than {MAX_JOINT:,})")
    echo = _echoes(scan, state, steps, depth)
    if plan is not None:
        lanes = math.prod(steps.lanes)
        if step_sum is not None:
            plan.note(f"sum out {', '.join(repr(x.name) for x in step_sum.sites)} within "
                      "each step, per history and value of the chain", 0)
        plan.note(f"forward algorithm over {', '.join(repr(x.name) for x in steps.sites)} (the "
                  f"scan at {where}): order {history.k}, {history.size:,} histories × "
                  f"{history.count} values per step, {length} steps"
                  + (f", {lanes:,} sequences at once" if steps.lanes else ""),
                  history.size * history.count * lanes)
    if shapes.pop():  # a batch of sequences: every lane's chain summed at once
        return forward_lanes(steps, history, echo, a, state, deps, where, step_sum)
    body = scan.body

    def run(carry, x_t, c):
        carry = list(carry)
        carry[a] = jnp.zeros_like(carry[a])
        inputs = list(steps.consts) + carry + steps.inputs(x_t, c)
        outs = evaluate(body, inputs)
        if step_sum is not None:  # the step's term summed over its local sites
            outs[a] = step_sum.term(inputs)
        return outs

    n, histories = steps.count, jnp.arange(history.size)
    outs0 = jax.vmap(lambda c: run(steps.first_init, steps.first, c))(jnp.arange(n))  # [C, ...]
    alpha = history.first(outs0[a])
    carry0 = [history.carried(o) if j in state else o[0]
              for j, o in enumerate(scan.split_outs(outs0)[0])]

    def state_at(j, h, carry):  # a site's own value is built here from h, not carried
        return (steps.value(echo[j][0], history.value_at(h, echo[j][1])) if j in echo
                else carry[j][h])

    def step(c, x_t):
        alpha, carry = c

        def pair(h, v):
            cin = [state_at(j, h, carry) if j in state else carry[j] for j in range(ncar)]
            return run(cin, x_t, v)
        outs = every_pair(pair, histories, n)
        alpha = history.advance(alpha, outs[a])
        new = [history.shift(outs[j]) if j in state else outs[j][0, 0] for j in range(ncar)]
        return (alpha, new), None

    if length > 1 and set(echo) == state and invariant(scan, a, state):
        # a step's factors depend on its input alone: every step's at once, then α
        def factors(x_t):
            def pair(h, v):
                cin = [state_at(j, h, None) if j in state else steps.init[j]
                       for j in range(ncar)]
                return run(cin, x_t, v)[a]
            return every_pair(pair, histories, n)
        alpha, _ = blocked_chain(
            history, alpha[:, None],
            lambda x_t: (jnp.zeros((), alpha.dtype), factors(x_t)[..., None]), steps.rest)
        alpha = alpha[:, 0]
        carry0 = [steps.init[j] if j not in state else carry0[j] for j in range(ncar)]
    elif length > 1:
        (alpha, carry0), _ = jax.lax.scan(remat(step), (alpha, carry0), steps.rest)
    results = [steps.init[a] + logsumexp(alpha) if j == a else AfterScan(where) if j in state
               else carry0[j] for j in range(ncar)]
    return results + after_scan_outputs(scan, zpos, a, state, deps, where)


def _depths(scan: Any, state: set, deps: list, where: str) -> dict:
    """Each state carry's depth: 0 where its new value is computed from the step's
    discrete values (and no state carry), d + 1 where it is the value a carry of depth
    d held at the step's start (a register of the chain's earlier values); the chain
    then remembers the last 1 + (largest depth) steps. Anything else is refused."""
    depth = {j: 0 for j in state if not any(scan.carry_input(s) in deps[j] for s in state)}
    changed = True
    while changed:
        changed = False
        for j in sorted(state - depth.keys()):
            source = next((s for s in sorted(depth) if scan.shifts(j, s)), None)
            if source is not None:
                depth[j] = depth[source] + 1
                changed = True
    if state - depth.keys():
        raise NotSummable(f"the carry of the scan at {where} remembers more than the last "
                          "steps' discrete values (a step's state must be a function of the "
                          "last k steps' values): carry the step's discrete values, or values "
                          "computed from them alone, and pass earlier ones on unchanged (a "
                          "k-th order chain carries its last k values)")
    return depth


def _echoes(scan: Any, state: set, steps: StepValues, depth: dict) -> dict:
    """The state carries that hold a site's value itself, d steps back (an HMM's
    z_{t−1}, a second-order chain's z_{t−2}): {carry: (site position, d)}. The step
    builds their value from the history index (a constant in every lane) instead of
    reading the carried array, so XLA folds what depends on it only (the transition
    row of the history) instead of computing it lane by lane from an array."""
    echo = {j: (i, 0) for j in state for i, k in enumerate(steps.where)
            if scan.carries_input(j, k)}
    for j in sorted(state, key=depth.get):
        if j not in echo:
            source = next((s for s in echo if scan.shifts(j, s)), None)
            if source is not None:
                echo[j] = (echo[source][0], echo[source][1] + 1)
    return echo


def forward_sums(closed: Any, sites: list, fixed: dict, flat_in: list,
                 plan: Plan | None = None) -> jax.Array:
    """log Σ over the scanned site's values (forward algorithm) of the density
    `closed` computes from (site values, *flat_in); scalar sites' values in `fixed`;
    each scan's recursion noted in `plan`."""
    inputs = [fixed[s.addr] if s.addr in fixed else Steps(s) for s in sites]

    def other(eqn, ins):
        if any(isinstance(x, Steps) for x in ins) and eqn.primitive in _LAYOUT:
            # a batch of sequences: the stacked values' axes put in the scan's order
            # (steps first); which steps and lanes are summed is checked in the scan
            return [ins[0]]
        if any(isinstance(x, AfterScan) for x in ins):
            raise NotSummable(f"results of a scan that depend on the discrete values are used "
                              f"at {jx.source_line(eqn)}: use them inside the scan (a step sees "
                              "the previous step's values), or keep the site")
        out = _forward(eqn, ins, plan)
        if out is None:
            raise NotSummable(f"`{jx.name_of(eqn)}` at {jx.source_line(eqn)} uses the "
                              "discrete values outside the scan")
        return out
    (out,) = evaluate(closed, inputs + list(flat_in), other)
    if is_tracked(out):
        raise NotSummable("the log density depends on the discrete values outside the scan")
    return out
