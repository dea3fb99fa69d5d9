"""Stage 2–3 of enumeration for a `gv.scan`: the chain's steps as the time dimension of
the contraction, one forward recursion for one chain and for a batch of them.

The model's log density, traced with a site's stacked values [T, *lanes] as an input,
holds one `scan` that reads them as its per-step input. Its body is analysed once, by
dependence: the log-density carry (`logw_out = logw_in + term`) is the accumulator;
the carries whose new value depends on the step's discrete value z_t are its state.
Each must be a function of z_t alone (depth 0), or the value a carry of depth d held
at the step's start (depth d + 1: a register of earlier values), so the state is a
function of the last k = 1 + (largest depth) values: a chain of order k. Sites of the
step whose values reach no carry but the log density's (a plate inside the step) are
local to it: the step's terms that read them are contracted over them by the factor
engine (`StepSum`), per history and value of the chain.

The body is evaluated once per (history h, value v) with every lane (sequence) at v
and its state at h, so its log-density term comes out as `Terms`: a part common to
every sequence plus one term per sequence (`_per_sequence`; a single chain is a
batch of one, its whole term its lane's). The lanes' forward variables then run
side by side through the time product of `genvi.inference.enumeration.time`:

    α_0(v) = term_0(v),   α_t(v, h_1..h_{k−1}) = logsumexp_{h_k} [α_{t−1}(h) + term_t(h, v)],

sequential or parallel in time where a step's factors depend on its input alone.
Results of the scan that depend on the discrete values may not be used after it
(they would need the path); anything else raises `NotSummable` by name.

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

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from genvi.core import jaxpr as jx
from genvi.core.rules import primitives
from genvi.core.walk import env_of, walk
from genvi.inference.enumeration.contract import Plan
from genvi.inference.enumeration.evaluate import Terms, evaluate, whole
from genvi.inference.enumeration.factors import sum_over_sites, term_dependence, terms_part
from genvi.inference.enumeration.same import Same
from genvi.inference.enumeration.sites import MAX_JOINT, NotSummable, joint_values
from genvi.inference.enumeration.time import History, blocked_chain, parallel_chain, remat
from genvi.replays.engine import Local, Tracked, is_tracked

# reorderings of the stacked values on their way into the scan (vmap of a scan moves
# the sequences' axis behind the steps')
_LAYOUT = primitives(["transpose", "convert_element_type"])


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
    """log Σ over the scanned sites' values of the density `closed` computes from (site
    values, *flat_in); scalar sites' values in `fixed`; each scan's recursion noted in
    `plan`, its time product `parallel` where its factors allow."""
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
        out = _forward(eqn, ins, plan, parallel)
        if out is None:
            raise NotSummable(f"`{jx.name_of(eqn)}` at {jx.source_line(eqn)} uses the "
                              "discrete values outside the scan")
        return out
    (out,) = evaluate(closed, inputs + list(flat_in), other)
    if isinstance(out, Terms):
        out = out.total("the log density")
    if is_tracked(out):
        raise NotSummable("the log density depends on the discrete values outside the scan")
    return out


def _forward(eqn: Any, ins: list, plan: Plan | None, parallel: bool) -> list | None:
    """The scan `eqn` with its steps' sites summed (see the module), or None."""
    scan = jx.view(eqn)
    if not isinstance(scan, jx.ScanEqn):
        return None
    where = jx.source_line(eqn)
    first_init = scan.split(ins)[1]  # unbroadcast where they are (`Same`)
    ins = [x.materialized() if isinstance(x, Same) else x for x in ins]
    ncar = scan.carry_count
    zpos = [i for i, x in enumerate(ins) if isinstance(x, Steps)]
    if not zpos or scan.scanned_index(zpos[0]) is None or any(
            not isinstance(x, Steps) and is_tracked(x) for x in ins):
        raise NotSummable(f"the scan at {where} reads them other than as its per-step input")
    deps = scan.dependence()
    # the carry the interpreter accumulates the log density in (`genvi.gen.interpret`
    # puts it last): `out = in + term`, its input used nowhere else
    if not ncar or ncar - 1 not in scan.accumulators(subtract=False, sole_use=False):
        raise NotSummable(f"the scan at {where} is not a gv.scan of the model")
    a = ncar - 1
    # sites whose values reach no carry but the log density's: summed within each step
    carried = [p for p in zpos if any(p in deps[j] for j in range(ncar) if j != a)]
    local = [p for p in zpos if p not in carried] if carried else []
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
    if len({tuple(scan.body_in_aval(p).shape) for p in chain}) > 1:
        raise NotSummable(f"the discrete sites of the scan at {where} have different shapes "
                          f"per step ({', '.join(ins[p].site.name for p in zpos)}): they are "
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

    def _tracked(self, x: Any, j: int) -> Any:
        return Local(x, x, self.state_axes[j]) if j in self.state_axes else x

    def _state_at(self, j: int, h: Any, carry: list | None) -> Any:
        """State carry j in history h: a site's own value (an HMM's z_{t−1}) built from
        h, so XLA folds what depends on it alone (the transition row), else read."""
        if j in self.echo:
            i, back = self.echo[j]
            return self.steps.value(i, self.history.value_at(h, back), bool(self.steps.lanes))
        return self._tracked(carry[j][h], j)

    def _step(self, carry: list, x_t: list, c: Any) -> tuple:
        """One step at joint value c: (its part common to every sequence, its term per
        sequence, unscaled, [lanes], the new carries)."""
        steps, a = self.steps, self.a
        scan, lanes = steps.scan, steps.lanes
        carry = list(carry)
        carry[a] = jnp.zeros_like(carry[a])
        inputs = list(steps.consts) + carry + steps.inputs(x_t, c, bool(lanes))
        outs = evaluate(scan.body, inputs)
        term, extra = outs[a], (0.0, 0.0)
        if self.step_sum is not None:  # the local sites' terms, summed sequence by sequence
            term, *extra = self.step_sum.split(inputs, len(lanes))
        free, per_lane = _per_sequence(term, math.prod(lanes), steps.init[a].dtype, self.where)
        free, per_lane = free + extra[0], per_lane + extra[1]
        if not lanes:   # a single chain: its whole term is its one lane's
            free, per_lane = jnp.zeros_like(free), per_lane + free
        new = []
        for j, o in enumerate(scan.split_outs(outs)[0]):
            if j == a:  # the log density's accumulator: its term is read above
                new.append(jnp.zeros_like(steps.init[a]))
                continue
            if isinstance(o, Terms):
                o = o.total(f"the carry of the scan at {self.where}")
            if isinstance(o, Same):
                o = o.local()
            if isinstance(o, Local):
                axes = tuple(range(len(lanes)))
                if j not in self.state or o.axes not in (axes, self.state_axes.get(j, o.axes)):
                    raise NotSummable(f"the carry of the scan at {self.where} mixes the "
                                      "sequences")
                self.state_axes[j] = o.axes
                o = o.base
            elif is_tracked(o):
                raise NotSummable(f"the carry of the scan at {self.where} mixes the sequences")
            new.append(o)
        return free, per_lane / self.scale, new

    def _pairs(self, carry: list | None, x_t: list) -> tuple:
        """`_step` for every history h and value v, stacked [histories, values, ...]."""
        ncar, steps = self.steps.scan.carry_count, self.steps

        def pair(h, v):
            cin = [self._state_at(j, h, carry) if j in self.state
                   else (carry[j] if carry is not None else steps.init[j]) for j in range(ncar)]
            return self._step(cin, x_t, v)
        return jax.vmap(lambda h: jax.vmap(lambda v: pair(h, v))(jnp.arange(steps.count)))(
            jnp.arange(self.history.size))

    def run(self, parallel: bool) -> list:
        """The scan's carries out: the log density's summed, the state's unusable."""
        steps, history, state, a = self.steps, self.history, self.state, self.a
        free0, alpha, carry = jax.vmap(lambda c: self._step(steps.first_init, steps.first, c))(
            jnp.arange(steps.count))
        alpha = history.first(alpha)                            # [C^k, lanes]
        carry = [history.carried(c) if j in state else c[0] for j, c in enumerate(carry)]
        free = free0[0]
        if self.invariant:   # a step's factors depend on its input alone: a time product
            def factors(x_t):
                f, m, _ = self._pairs(None, x_t)
                return f[0, 0], m
            product = parallel_chain if parallel else blocked_chain
            alpha, free_rest = product(history, alpha, factors, steps.rest)
            free = free + free_rest
            carry = [steps.init[j] if j not in state else carry[j] for j in range(len(carry))]
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
    """A step's log-density term as (its part common to every sequence, its term per
    sequence [count])."""
    free, per_lane = jnp.zeros((), dtype), jnp.zeros((count,), dtype)
    for leaf, coeff in (term.leaves if isinstance(term, Terms) else ((term, 1.0),)):
        if isinstance(leaf, Same):
            leaf = leaf.materialized()
        if isinstance(leaf, Local):   # summed within each lane, the lanes in the site's order
            base, axes = leaf.base, leaf.axes
            rest = tuple(d for d in range(jnp.ndim(base)) if d not in axes)
            lane = jnp.sum(base, axis=rest) if rest else base
            order = sorted(axes)
            lane = jnp.transpose(lane, [order.index(d) for d in axes])
            per_lane = per_lane + coeff * lane.reshape(-1).astype(dtype)
        elif is_tracked(leaf):
            raise NotSummable(f"the log density of a step of the scan at {where} is not a sum "
                              "of per-sequence terms")
        else:
            free = free + coeff * jnp.sum(leaf).astype(dtype)
    return free, per_lane


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
    z_{t−1}, a second-order chain's z_{t−2}): {carry: (site position, d)}."""
    echo = {j: (i, 0) for j in state for i, k in enumerate(steps.where)
            if scan.carries_input(j, k)}
    for j in sorted(state, key=depth.get):
        if j not in echo:
            source = next((s for s in echo if scan.shifts(j, s)), None)
            if source is not None:
                echo[j] = (echo[source][0], echo[source][1] + 1)
    return echo


class StepValues:
    """The scan's operands with the discrete sites' stacked values taken out: the
    other per-step inputs (`first` step, the `rest`), and the joint values of the
    sites at one step, `count` of them, put back in their places by `inputs(x_t, c)`
    (`tracked`: every lane at combination c, as a `Same`)."""

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
        """Site i's value in combination c, as the body reads it."""
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


class StepSum:
    """The log-density term of a step of `scan` over its local sites (at body inputs
    `positions`, `sites` their `AuxSite`s), split by `split(inputs, lanes)`."""

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
            return walk(body.jaxpr, env_of(body, full), lambda i, e, ins: jx.eval_eqn(e, ins))[a]
        self.closed = jax.make_jaxpr(term)([jnp.zeros(avals[i].shape, avals[i].dtype)
                                            for i in self.positions],
                                           [jnp.zeros(avals[i].shape, avals[i].dtype)
                                            for i in self.others])

    def split(self, inputs: list, lanes: int) -> tuple[Any, Any, Any]:
        """A step at the body inputs `inputs` (the local ones are not read), whose local
        sites' first `lanes` axes are the sequences': (its terms that read no local
        site, evaluated as they are; then those that do, summed over the local sites
        sequence by sequence: the part common to every sequence and one term per
        sequence)."""
        reads, rest_part = self._parts
        placeholders = [jnp.zeros(s.shape, s.dtype) for s in self.sites]
        (rest,) = evaluate(rest_part, placeholders + [inputs[i] for i in self.others])
        others = [whole(inputs[i]) for i in self.others]
        out, _ = sum_over_sites(reads, self.sites, others, lanes_kept=lanes)
        free, per_lane = out if lanes else (out, jnp.zeros((), jnp.result_type(out)))
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

