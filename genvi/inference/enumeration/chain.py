"""Stages 2–3 for a `gv.scan`: the chain's steps are the time dimension of the
contraction, summed by one forward recursion for one chain and for a batch.

The scan's body is analysed once, by dependence: the log-density carry is the
accumulator; the carries whose value depends on the step's value z_t are the state,
each a function of z_t (depth 0) or a register of what a carry of depth d held (depth
d + 1), so a step depends on the last k = 1 + (largest depth) values. A site that
reaches only the log density (a plate in the step) is summed within the step (`StepSum`).

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
from dataclasses import dataclass, replace
from typing import Any, Sequence

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from genvi.core import jaxpr as jx
from genvi.core.rules import LAYOUT
from genvi.inference.enumeration.contract import Plan
from genvi.inference.enumeration.evaluate import Evaluator, Terms, evaluate, whole
from genvi.inference.enumeration.factors import sum_over_sites, term_dependence, terms_part
from genvi.inference.enumeration.same import Same, every_lane
from genvi.inference.enumeration.sites import MAX_JOINT, NotSummable
from genvi.inference.enumeration.time import History, blocked_chain, parallel_chain, remat
from genvi.replays.engine import Local, Tracked, is_tracked



@dataclass
class Steps(Tracked):
    """Stands for the stacked values of the site inside the scan (outer evaluation)."""

    site: Any


@dataclass
class AfterScan(Tracked):
    """A result of the scan that depends on the discrete path: not to be used."""

    where: str


def forward_sums(closed: Any, sites: list, fixed: dict, flat_in: list,
                 plan: Plan | None = None, parallel: bool = False) -> jax.Array:
    """log Σ over the scanned sites' values of the density `closed` (of site values,
    *flat_in), scalar sites at `fixed`; each recursion noted in `plan`."""
    inputs = [fixed[s.addr] if s.addr in fixed else Steps(s) for s in sites]
    (out,) = evaluate(closed, inputs + list(flat_in), evaluator=_Forward(plan, parallel))
    if isinstance(out, Terms):
        out = out.total("the log density")
    if is_tracked(out):
        raise NotSummable("the log density depends on the discrete values outside the scan")
    return out


class _Forward(Evaluator):
    """The evaluator with the scanned sites' markers (`Steps`): a scan that reads them
    has its steps' sites summed (`_forward`); the scan's results that depend on them
    (`AfterScan`) are refused, as is any other use of them outside the scan."""

    def __init__(self, plan: Plan | None, parallel: bool):
        self.plan, self.parallel = plan, parallel

    def markers(self, eqn: Any, ins: list) -> list | None:
        if any(isinstance(x, Steps) for x in ins) and eqn.primitive in LAYOUT:
            return [ins[0]]   # the steps and lanes summed are checked in the scan
        _no_results_after(eqn, ins)
        raise NotSummable(f"`{jx.name_of(eqn)}` at {jx.source_line(eqn)} uses the "
                          "discrete values outside the scan")

    def scan_sites(self, view: jx.ScanEqn, ins: list) -> list:
        _no_results_after(view.eqn, ins)
        return _forward(view, ins, self.plan, self.parallel)


def _no_results_after(eqn: Any, ins: list) -> None:
    if any(isinstance(x, AfterScan) for x in ins):
        raise NotSummable(f"results of a scan that depend on the discrete values are used "
                          f"at {jx.source_line(eqn)}: use them inside the scan (a step sees "
                          "the previous step's values), or keep the site")


def _forward(scan: jx.ScanEqn, ins: list, plan: Plan | None, parallel: bool) -> list:
    """The scan `scan` with its steps' sites summed (see the module)."""
    eqn = scan.eqn
    where = jx.source_line(eqn)
    first_init = scan.split(ins)[1]  # unbroadcast where they are (`Same`)
    ins = [x.materialized() if isinstance(x, Same) else x for x in ins]
    ncar = scan.carry_count
    zpos = [i for i, x in enumerate(ins) if isinstance(x, Steps)]
    if not zpos or scan.scanned_index(zpos[0]) is None or any(
            not isinstance(x, Steps) and is_tracked(x) for x in ins):
        raise NotSummable(f"the scan at {where} reads them other than as its per-step input")
    deps = scan.dependence()
    # the log density's carry: last (`genvi.gen.interpret`), `out = in + term`
    if not ncar or ncar - 1 not in scan.accumulators(subtract=False, sole_use=False):
        raise NotSummable(f"the scan at {where} is not a gv.scan of the model")
    a = ncar - 1
    carried = [p for p in zpos if any(p in deps[j] for j in range(ncar) if j != a)]
    local = [p for p in zpos if p not in carried] if carried else []
    chain = [p for p in zpos if p not in local]
    state: set = set()   # carries whose value depends on the discrete values
    while grown := {j for j in range(ncar) if j != a and j not in state and (
            any(p in deps[j] for p in chain)
            or any(scan.carry_input(s) in deps[j] for s in state))}:
        state |= grown
    depth, echo = _registers(scan, state, deps, [scan.scanned_index(p) for p in chain], where)
    if len({tuple(scan.body_in_aval(p).shape) for p in chain}) > 1:
        raise NotSummable(f"the discrete sites of the scan at {where} have different shapes per "
                          f"step ({', '.join(ins[p].site.name for p in zpos)}): they are summed "
                          "jointly only where each step holds one value of each per sequence")
    steps = StepValues(scan, ins, chain, [ins[p].site for p in chain], first_init, local)
    step_sum = StepSum(scan, a, local, [ins[p].site for p in local]) if local else None
    history = History(steps.count, 1 + max(depth.values(), default=0))
    if history.size * history.count > MAX_JOINT:
        raise NotSummable(f"the chain of the scan at {where} remembers {history.k} steps of "
                          f"{history.count} joint values: {history.size * history.count:,} "
                          f"joint values per step (more than {MAX_JOINT:,})")
    recursion = _Recursion(steps, history, echo, a, state, step_sum, where)
    parallel = parallel and recursion.invariant
    if plan is not None:
        lanes = math.prod(steps.lanes)
        if step_sum is not None:
            plan.note(f"sum out {', '.join(repr(x.name) for x in step_sum.sites)} within "
                      "each step, per history and value of the chain", 0)
        plan.note(f"forward algorithm over {', '.join(repr(x.name) for x in steps.sites)} (the "
                  f"scan at {where}): order {history.k}, {history.size:,} histories × "
                  f"{history.count} values per step, {scan.length} steps"
                  + (f", {lanes:,} sequences at once" if steps.lanes else "")
                  + (", parallel in time" if parallel else ""),
                  history.size * (history.size if parallel else history.count) * lanes)
    results = recursion.run(parallel)
    for i in range(ncar, scan.body_out_count):  # per-step outputs: they need the path
        if not (any(p in deps[i] for p in zpos) or scan.carry_input(a) in deps[i]
                or any(scan.carry_input(s) in deps[i] for s in state)):
            raise NotSummable(f"the scan at {where} returns per-step values alongside its "
                              "discrete site: return None as the step's output (its values "
                              "depend on the path, which the sum does not keep)")
        results.append(AfterScan(where))
    return results


class _Recursion:
    """The forward algorithm over the steps of one scan, for every sequence at once."""

    def __init__(self, steps: StepValues, history: History, echo: dict, a: int, state: set,
                 step_sum: StepSum | None, where: str):
        self.steps, self.history, self.echo, self.a = steps, history, echo, a
        self.state, self.step_sum, self.where = state, step_sum, where
        scan = steps.scan
        scales = {s.scale for s in steps.sites}
        if len(scales) > 1:
            raise NotSummable(f"the discrete sites of the scan at {where} lie in gv.plates "
                              "of different scales")
        # in a subsampled plate a lane's terms arrive scaled: summed unscaled, then scaled
        self.scale = scales.pop()
        self.state_axes: dict = {}  # a state carry's lane axes (from its first evaluation)
        self.invariant = scan.length > 1 and set(echo) == state and all(
            scan.passes_through(j) for j in range(scan.carry_count) if j != a and j not in state)

    def _state_at(self, j: int, h: Any, carry: list) -> Any:
        """State carry j in history h: a site's own value (an HMM's z_{t−1}) built from
        h, so XLA folds what depends on it alone (the transition row), else read."""
        if j in self.echo:
            i, back = self.echo[j]
            return self.steps.value(i, self.history.value_at(h, back))
        x = carry[j][h]
        return Local(x, x, self.state_axes[j]) if j in self.state_axes else x

    def _step(self, carry: list, x_t: list, c: Any) -> tuple:
        """One step at joint value c: (its part common to every sequence, its term per
        sequence, unscaled, [lanes], the new carries)."""
        steps, a, lanes = self.steps, self.a, self.steps.lanes
        carry = [jnp.zeros_like(x) if j == a else x for j, x in enumerate(carry)]
        inputs = list(steps.consts) + carry + steps.inputs(x_t, c)
        outs = evaluate(steps.scan.body, inputs)
        extra: Sequence[Any]  # (free, per lane) added to the step's own
        term, extra = outs[a], (0.0, 0.0)
        if self.step_sum is not None:  # the local sites' terms, summed sequence by sequence
            term, *extra = self.step_sum.split(inputs, len(lanes))
        free, per_lane = _per_sequence(term, math.prod(lanes), steps.init[a].dtype, self.where)
        free, per_lane = free + extra[0], per_lane + extra[1]
        if not lanes:   # a single chain: its whole term is its one lane's
            free, per_lane = jnp.zeros_like(free), per_lane + free
        new = []
        for j, o in enumerate(steps.scan.split_outs(outs)[0]):
            if j == a:  # the log density's accumulator: its term is read above
                o = jnp.zeros_like(steps.init[a])
            if isinstance(o, Terms):
                o = o.total(f"the carry of the scan at {self.where}")
            if isinstance(o, Same):
                o = o.local()
            # a state carry's lanes: the sequences', in one order from its first evaluation
            if isinstance(o, Local) and j in self.state and o.axes in (
                    tuple(range(len(lanes))), self.state_axes.get(j, o.axes)):
                self.state_axes[j] = o.axes
                o = o.base
            if is_tracked(o):
                raise NotSummable(f"the carry of the scan at {self.where} mixes the sequences")
            new.append(o)
        return free, per_lane / self.scale, new

    def _pairs(self, carry: list, x_t: list) -> tuple:
        """`_step` for every history h and value v, stacked [histories, values, ...]."""
        def pair(h, v):
            cin = [self._state_at(j, h, carry) if j in self.state else x
                   for j, x in enumerate(carry)]
            return self._step(cin, x_t, v)
        return jax.vmap(lambda h: jax.vmap(lambda v: pair(h, v))(jnp.arange(self.steps.count)))(
            jnp.arange(self.history.size))

    def run(self, parallel: bool) -> list:
        """The scan's carries out: the log density's summed, the state's unusable."""
        steps, history, state, a = self.steps, self.history, self.state, self.a
        free, alpha, carry = jax.vmap(lambda c: self._step(steps.first_init, steps.first, c))(
            jnp.arange(steps.count))
        free, alpha = free[0], history.first(alpha)            # alpha: [C^k, lanes]
        carry = [history.carried(c) if j in state else c[0] for j, c in enumerate(carry)]
        if self.invariant:   # a step's factors depend on its input alone: a time product
            def factors(x_t):
                f, m, _ = self._pairs(steps.init, x_t)
                return f[0, 0], m
            product = parallel_chain if parallel else blocked_chain
            alpha, rest = product(history, alpha, factors, steps.rest)
            free, carry = free + rest, list(steps.init)   # the others pass through
        elif steps.scan.length > 1:
            def step(c, x_t):
                alpha, carry, free = c
                f, terms, new = self._pairs(carry, x_t)     # terms: [C^k, C, lanes]
                new = [history.shift(n) if j in state else n[0, 0] for j, n in enumerate(new)]
                return (history.advance(alpha, terms), new, free + f[0, 0]), None
            (alpha, carry, free), _ = jax.lax.scan(remat(step), (alpha, carry, free), steps.rest)
        total = free + self.scale * jnp.sum(logsumexp(alpha, axis=0))
        return [steps.init[a] + total if j == a else AfterScan(self.where) if j in state
                else carry[j] for j in range(len(carry))]


def _per_sequence(term: Any, count: int, dtype: Any, where: str) -> tuple[Any, Any]:
    """A step's log-density term as (its part common to every sequence, one each [count])."""
    free, per_lane = jnp.zeros((), dtype), jnp.zeros((count,), dtype)
    for leaf, coeff in (term.leaves if isinstance(term, Terms) else ((term, 1.0),)):
        if isinstance(leaf, Same):
            leaf = leaf.materialized()
        if isinstance(leaf, Local):   # summed within each lane, the lanes in the site's order
            base, axes = leaf.base, leaf.axes
            rest = tuple(d for d in range(jnp.ndim(base)) if d not in axes)
            lane = jnp.sum(base, axis=rest) if rest else base
            lane = jnp.transpose(lane, [sorted(axes).index(d) for d in axes])
            per_lane = per_lane + coeff * lane.reshape(-1).astype(dtype)
        elif is_tracked(leaf):
            raise NotSummable(f"the log density of a step of the scan at {where} is not a sum "
                              "of per-sequence terms")
        else:
            free = free + coeff * jnp.sum(leaf).astype(dtype)
    return free, per_lane


def _registers(scan: Any, state: set, deps: list, scanned: list, where: str) -> tuple:
    """Each state carry's depth (see the module; anything else is refused), and those that
    hold a site's own value d steps back (an HMM's z_{t−1}): {carry: (index in `scanned`, d)}."""
    depth = {j: 0 for j in state if not any(scan.carry_input(s) in deps[j] for s in state)}
    echo = {j: (i, 0) for j in state for i, k in enumerate(scanned) if scan.carries_input(j, k)}
    changed = True
    while changed:
        changed = False
        for j in sorted(state - depth.keys()):
            source = next((s for s in sorted(depth) if scan.shifts(j, s)), None)
            if source is not None:
                depth[j] = depth[source] + 1
                if source in echo:
                    echo[j] = (echo[source][0], echo[source][1] + 1)
                changed = True
    if state - depth.keys():
        raise NotSummable(f"the carry of the scan at {where} remembers more than the last "
                          "steps' discrete values (a step's state must be a function of the "
                          "last k steps' values): carry the step's discrete values, or values "
                          "computed from them alone, and pass earlier ones on unchanged (a "
                          "k-th order chain carries its last k values)")
    return depth, echo


class StepValues:
    """The scan's operands with the discrete sites' stacked values taken out (the other
    per-step inputs: `first` step, the `rest`), and the sites' `count` joint values at
    one step, put back in their places by `inputs(x_t, c)` (lanes as a `Same`)."""

    def __init__(self, scan: Any, ins: list, zpos: list, sites: list, first_init: list,
                 local: Sequence = ()):
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
        self.count = math.prod(len(s.support) for s in sites)
        self.dtypes = [scan.body_in_aval(p).dtype for p in zpos]
        self.lanes = tuple(scan.body_in_aval(zpos[0]).shape)

    def value(self, i: int, c: Any) -> Any:
        """Site i's value in combination c, as the body reads it: c's digit of site i, as
        a value of its support read by a select (no gather: see `same._selected`)."""
        below = math.prod(len(s.support) for s in self.sites[i + 1:])
        digit = (c // below) % len(self.sites[i].support)
        values = jnp.asarray(self.sites[i].support, self.dtypes[i])
        v = jnp.sum(jnp.where(digit == jnp.arange(len(values)), values, 0)).astype(values.dtype)
        return every_lane(v, self.lanes, self.dtypes[i])

    def inputs(self, x_t: list, c: Any) -> list:
        """The step's inputs with the sites' values in combination c in their places."""
        x_t = list(x_t)
        placed = {k: self.value(i, c) for i, k in enumerate(self.where)}
        for k in sorted({**placed, **self.held}):
            x_t.insert(k, placed[k] if k in placed else self.held[k])
        return x_t


class StepSum:
    """The log-density term of a step of `scan` over its local sites (at body inputs
    `positions`, `sites` their `AuxSite`s), split by `split(inputs, lanes)`."""

    def __init__(self, scan: Any, a: int, positions: list, sites: list):
        body, n = scan.body, len(scan.body.in_avals)
        self.others = [i for i in range(n) if i not in positions]
        self.sites = [replace(s, shape=tuple(scan.body_in_aval(p).shape),
                              draw_shape=tuple(scan.body_in_aval(p).shape))
                      for p, s in zip(positions, sites)]
        # its terms that read a local site, and the others: each of (local, other inputs)
        deps = term_dependence(body, [jnp.zeros(v.shape, v.dtype) for v in body.in_avals], output=a)
        reads = [k for k, d in enumerate(deps) if d & set(positions)]
        self.reads, self.rest = (terms_part(body, ks, positions, n, output=a) for ks in (
            reads, [k for k in range(len(deps)) if k not in reads]))

    def split(self, inputs: list, lanes: int) -> tuple[Any, Any, Any]:
        """A step at the body `inputs` (the local ones not read): its terms that read no
        local site; then those that do, summed over the local sites per sequence (their
        first `lanes` axes): a part common to every sequence, and one term each."""
        placeholders = [jnp.zeros(s.shape, s.dtype) for s in self.sites]
        (rest,) = evaluate(self.rest, placeholders + [inputs[i] for i in self.others])
        others = [whole(inputs[i]) for i in self.others]
        out, _ = sum_over_sites(self.reads, self.sites, others, lanes_kept=lanes)
        free, per_lane = out if lanes else (out, jnp.zeros((), jnp.result_type(out)))
        return rest, free, per_lane.reshape(-1)
