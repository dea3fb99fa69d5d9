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

Example:
    >>> from genvi.inference.enum_scan import Steps
    >>> Steps(site=None).site is None
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from genvi.core import jaxpr as jx
from genvi.core.rules import primitives
from genvi.inference.enum_lanes import Additive, NotSummable, evaluate, is_tracked, joint_values
from genvi.inference.chain_algebra import History, blocked_chain, remat
from genvi.inference.enum_same_rules import Same
from genvi.inference.enum_factors import MAX_JOINT
from genvi.inference.step_sums import StepSum, local_positions
from genvi.inference.sum_product import Plan
from genvi.replays.engine import Local

# reorderings of the stacked values on their way into the scan (vmap of a scan moves
# the sequences' axis behind the steps')
_LAYOUT = primitives(["transpose", "convert_element_type"])


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
    steps = _StepValues(scan, ins, chain, [ins[p].site for p in chain], first_init, local)
    step_sum = StepSum(scan, a, local, [ins[p].site for p in local]) if local else None
    if step_sum is not None and steps.lanes:
        raise NotSummable(f"the scan at {where} has sites local to its steps "
                          f"({', '.join(repr(x.name) for x in step_sum.sites)}) in a batch of "
                          "sequences: they are summed within the steps of one chain; keep "
                          "them, or carry them as the chain's values")
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
        return _forward_lanes(steps, history, echo, a, state, deps, where)
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
        outs = _every_pair(pair, histories, n)
        alpha = history.advance(alpha, outs[a])
        new = [history.shift(outs[j]) if j in state else outs[j][0, 0] for j in range(ncar)]
        return (alpha, new), None

    if length > 1 and set(echo) == state and _invariant(scan, a, state):
        # a step's factors depend on its input alone: every step's at once, then α
        def factors(x_t):
            def pair(h, v):
                cin = [state_at(j, h, None) if j in state else steps.init[j]
                       for j in range(ncar)]
                return run(cin, x_t, v)[a]
            return _every_pair(pair, histories, n)
        alpha, _ = blocked_chain(
            history, alpha[:, None],
            lambda x_t: (jnp.zeros((), alpha.dtype), factors(x_t)[..., None]), steps.rest)
        alpha = alpha[:, 0]
        carry0 = [steps.init[j] if j not in state else carry0[j] for j in range(ncar)]
    elif length > 1:
        (alpha, carry0), _ = jax.lax.scan(remat(step), (alpha, carry0), steps.rest)
    results = [steps.init[a] + logsumexp(alpha) if j == a else AfterScan(where) if j in state
               else carry0[j] for j in range(ncar)]
    return results + _after_scan_outputs(scan, zpos, a, state, deps, where)


class _StepValues:
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


def _every_pair(pair: Any, histories: Any, n: int) -> Any:
    """`pair(h, v)` for every history h and every one of the step's `n` joint values v,
    stacked [histories, n, ...] (under `vmap`)."""
    return jax.vmap(lambda h: jax.vmap(lambda v: pair(h, v))(jnp.arange(n)))(histories)


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


def _echoes(scan: Any, state: set, steps: "_StepValues", depth: dict) -> dict:
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


def _invariant(scan: Any, a: int, state: set) -> bool:
    """Whether every carry other than the state and the log density passes through the
    step unchanged (a hidden Markov model's parameters)."""
    return all(scan.passes_through(j) for j in range(scan.carry_count)
               if j != a and j not in state)


def _after_scan_outputs(scan: Any, zpos: list, a: int, state: set,
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


def _forward_lanes(steps: _StepValues, history: History, echo: dict, a: int, state: set,
                   deps: list, where: str) -> list:
    """The forward algorithm for a batch of chains: the scan's per-step site values
    have lanes (the sequences of a `gv.vmap`/`gv.plate` around a `gv.scan`), each lane
    its own chain. The body is evaluated once per (history h, value v) with every lane
    at v (and its state at h), lane-tracked, so the log density's step term comes out
    as a lane-free part plus one term per lane (`Additive`); the lanes' α recursions
    then run side by side (`History.advance` with a lanes axis), O(T × lanes ×
    values^(k+1)). In a subsampled plate a lane's terms arrive scaled: its chain is
    summed unscaled, then scaled."""
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
        outs = evaluate(body, list(steps.consts) + carry + steps.inputs(x_t, c, tracked=True))
        term = outs[a]
        if isinstance(term, Additive):
            free, per_lane = term.free, term.lanes
        elif is_tracked(term):
            raise NotSummable(f"the log density of a step of the scan at {where} is not a sum "
                              "of per-sequence terms")
        else:
            free, per_lane = term, jnp.zeros((count,), jnp.result_type(term))
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
        free, terms, new = _every_pair(pair, histories, n)   # terms: [C^k, C, lanes]
        alpha = history.advance(alpha, terms)
        new = [history.shift(c) if j in state else c[0, 0] for j, c in enumerate(new)]
        return (alpha, new, free_total + free[0, 0]), None

    if scan.length > 1 and set(echo) == state and _invariant(scan, a, state):
        # a step's factors depend on its input alone: every step's at once, then α
        def factors(x_t):
            def pair(h, v):
                cin = [state_at(j, h, None) if j in state else steps.init[j]
                       for j in range(ncar)]
                free, per_lane, _ = run(cin, x_t, v)
                return free, per_lane
            return _every_pair(pair, histories, n)
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
    return results + _after_scan_outputs(scan, zpos, a, state, deps, where)


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
