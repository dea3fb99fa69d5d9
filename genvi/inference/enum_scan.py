"""The forward algorithm for `gv.enumeration`: a discrete site inside `gv.scan`.

The model's log density, traced with the site's stacked values [T] as an input, holds
one `scan` that reads them as its per-step input. Its body is analysed once, by
dependence: the log-density carry (`logw_out = logw_in + term`) is the accumulator;
the carries whose new value depends on the step's discrete value z_t are its state,
and each must be a function of z_t alone (not of the previous state: a hidden Markov
model, where the step's term depends on z_{t−1} through that state and on z_t). Then

    α_0(v) = term_0(v),   α_t(v) = logsumexp_u [α_{t−1}(u) + term_t(state(u), v)],

and the scan's log density is logsumexp_v α_{T−1}(v): O(T × support²) evaluations of
the step, as one `lax.scan` whose step evaluates the body on every (u, v) pair under
`vmap`. Results of the scan that depend on the discrete values may not be used after
it (they would need the path); anything else raises `NotSummable` by name.

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
from genvi.inference.enum_lanes import Additive, NotSummable, evaluate, is_tracked
from genvi.replays.engine import Local

# reorderings of the stacked values on their way into the scan (vmap of a scan moves
# the sequences' axis behind the steps')
_LAYOUT = frozenset({"transpose", "convert_element_type"})


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


def _dependence(jaxpr: Any) -> list[set]:
    """For each output of `jaxpr`, the positions of the inputs it depends on."""
    deps: dict = {v: {i} for i, v in enumerate(jaxpr.invars)}

    def of(v: Any) -> set:
        return set() if isinstance(v, jx.Literal) else deps.get(v, set())
    for eqn in jaxpr.eqns:  # an equation's outputs depend on all its inputs (conservative)
        found = set().union(set(), *[of(v) for v in eqn.invars])
        for out in eqn.outvars:
            deps[out] = found
    return [of(v) for v in jaxpr.outvars]


def _log_density_carry(jaxpr: Any, nc: int, ncar: int) -> int | None:
    """The carry the interpreter accumulates the log density in (`genvi.gen.interpret`
    puts it last): `out = in + term`, its input used nowhere else."""
    j = ncar - 1
    var = jaxpr.invars[nc + j]
    uses = [e for e in jaxpr.eqns if var in e.invars]
    if (ncar and len(uses) == 1 and uses[0].primitive.name == "add"
            and uses[0].outvars[0] is jaxpr.outvars[j] and var not in jaxpr.outvars):
        return j
    return None


def _forward(eqn: Any, ins: list) -> list | None:
    if jx.kind(eqn) != "scan":
        return None
    where = jx.source_line(eqn)
    scan = jx.ScanEqn.of(eqn)
    body, nc, ncar, length = scan.body, scan.num_consts, scan.num_carry, scan.length
    steps = [i for i, x in enumerate(ins) if isinstance(x, Steps)]
    if len(steps) != 1 or steps[0] < nc + ncar or any(
            not isinstance(x, Steps) and is_tracked(x) for x in ins):
        raise NotSummable(f"the scan at {where} reads them other than as its "
                          "per-step input")
    zpos = steps[0]
    site = ins[zpos].site
    deps = _dependence(body.jaxpr)
    a = _log_density_carry(body.jaxpr, nc, ncar)
    if a is None:
        raise NotSummable(f"the scan at {where} is not a gv.scan of the model")
    state: set = set()
    changed = True
    while changed:  # carries whose value depends on the discrete values
        changed = False
        for j in range(ncar):
            if j != a and j not in state and (
                    zpos in deps[j] or any(nc + s in deps[j] for s in state)):
                state.add(j)
                changed = True
    for j in state:
        if any(nc + s in deps[j] for s in state):
            raise NotSummable(f"the carry of the scan at {where} remembers more "
                              "than the previous step's discrete value (a step's state must be "
                              "a function of that step's value alone)")
    support = jnp.asarray(site.support, site.dtype)
    lanes = tuple(body.jaxpr.invars[zpos].aval.shape)
    if lanes:  # a batch of sequences: every lane's chain summed at once
        return _forward_lanes(scan, ins, zpos, a, state, site, lanes, deps, where)
    consts, init, xs = scan.split(ins)
    xs = [jnp.flip(x, 0) if scan.reverse and not isinstance(x, Steps) else x for x in xs]
    k = zpos - nc - ncar

    def run(carry, x_t, v):
        x_t = list(x_t)
        x_t.insert(k, v)
        carry = list(carry)
        carry[a] = jnp.zeros_like(carry[a])
        return evaluate(body, list(consts) + carry + x_t)

    others = [x for i, x in enumerate(xs) if i != k]
    first = [x[0] for x in others]
    outs0 = jax.vmap(lambda v: run(init, first, v))(support)   # every output: [V, ...]
    alpha = outs0[a]
    carry0 = [o if j in state else o[0] for j, o in enumerate(outs0[:ncar])]

    def step(c, x_t):
        alpha, carry = c

        def pair(u, v):
            cin = [carry[j][u] if j in state else carry[j] for j in range(ncar)]
            return run(cin, x_t, support[v])
        n = support.shape[0]
        outs = jax.vmap(lambda u: jax.vmap(lambda v: pair(u, v))(jnp.arange(n)))(jnp.arange(n))
        alpha = logsumexp(alpha[:, None] + outs[a], axis=0)
        new = [outs[j][0] if j in state else outs[j][0, 0] for j in range(ncar)]
        return (alpha, new), None

    if length > 1:
        (alpha, carry0), _ = jax.lax.scan(step, (alpha, carry0), [x[1:] for x in others])
    results = [init[a] + logsumexp(alpha) if j == a else AfterScan(where) if j in state
               else carry0[j] for j in range(ncar)]
    return results + _after_scan_outputs(body, nc, ncar, zpos, a, state, deps, where)


def _after_scan_outputs(body: Any, nc: int, ncar: int, zpos: int, a: int, state: set,
                        deps: list, where: str) -> list:
    """The per-step outputs of the scan: none may be used (they need the path)."""
    outs = []
    for i in range(ncar, len(body.jaxpr.outvars)):
        if not (zpos in deps[i] or nc + a in deps[i] or any(nc + s in deps[i] for s in state)):
            raise NotSummable(f"the scan at {where} returns per-step values alongside its "
                              "discrete site")
        outs.append(AfterScan(where))
    return outs


def _forward_lanes(scan: Any, ins: list, zpos: int, a: int, state: set, site: Any,
                   lanes: tuple, deps: list, where: str) -> list:
    """The forward algorithm for a batch of chains: the scan's per-step site value has
    `lanes` (the sequences of a `gv.vmap`/`gv.plate` around a `gv.scan`), each lane its
    own chain. The body is evaluated once per pair (u, v) of values with every lane at
    v (and its state at u), lane-tracked, so the log density's step term comes out as a
    lane-free part plus one term per lane (`Additive`); the lanes' α recursions then
    run side by side: α_t[l, v] = logsumexp_u α_{t−1}[l, u] + term_t[l](u, v), O(T ×
    lanes × support²). In a subsampled plate a lane's terms arrive scaled: its chain
    is summed unscaled, then scaled."""
    body, nc, ncar = scan.body, scan.num_consts, scan.num_carry
    support = jnp.asarray(site.support, site.dtype)
    n, axes, count = support.shape[0], tuple(range(len(lanes))), math.prod(lanes)
    consts, init, xs = scan.split(ins)
    xs = [jnp.flip(x, 0) if scan.reverse and not isinstance(x, Steps) else x for x in xs]
    k = zpos - nc - ncar
    others = [x for i, x in enumerate(xs) if i != k]
    state_axes: dict = {}  # a state carry's lane axes (from its first evaluation)

    def tracked(x: Any, j: int) -> Any:
        return Local(x, x, state_axes[j]) if j in state_axes else x

    dtype = body.jaxpr.invars[zpos].aval.dtype  # the step's value as the body reads it

    def run(carry: list, x_t: list, v: Any) -> tuple:
        full = jnp.full(lanes, v, dtype)
        x_t = list(x_t)
        x_t.insert(k, Local(full, full, axes))
        carry = list(carry)
        carry[a] = jnp.zeros_like(carry[a])
        outs = evaluate(body, list(consts) + carry + x_t)
        term = outs[a]
        if isinstance(term, Additive):
            free, per_lane = term.free, term.lanes
        elif is_tracked(term):
            raise NotSummable(f"the log density of a step of the scan at {where} is not a sum "
                              "of per-sequence terms")
        else:
            free, per_lane = term, jnp.zeros((count,), jnp.result_type(term))
        new = []
        for j, o in enumerate(outs[:ncar]):
            if j == a:  # the log density's accumulator: its term is read above
                o = jnp.zeros_like(init[a])
            elif isinstance(o, Local):
                if j not in state or o.axes not in (axes, state_axes.get(j, o.axes)):
                    raise NotSummable(f"the carry of the scan at {where} mixes the sequences")
                state_axes[j] = o.axes
                o = o.base
            elif is_tracked(o):
                raise NotSummable(f"the carry of the scan at {where} mixes the sequences")
            new.append(o)
        return free, per_lane / site.scale, new

    free0, alpha, carry0 = jax.vmap(lambda v: run(list(init), [x[0] for x in others], v))(support)
    alpha = alpha.T                                         # [lanes, V]
    carry0 = [c if j in state else c[0] for j, c in enumerate(carry0)]
    free_total = free0[0]

    def step(c: tuple, x_t: list) -> tuple:
        alpha, carry, free_total = c

        def pair(u, v):
            cin = [tracked(carry[j][u], j) if j in state else carry[j] for j in range(ncar)]
            return run(cin, x_t, support[v])
        free, terms, new = jax.vmap(lambda u: jax.vmap(lambda v: pair(u, v))(jnp.arange(n)))(
            jnp.arange(n))                                  # terms: [V(u), V(v), lanes]
        alpha = logsumexp(alpha.T[:, None, :] + terms, axis=0).T
        new = [c[0] if j in state else c[0, 0] for j, c in enumerate(new)]
        return (alpha, new, free_total + free[0, 0]), None

    if scan.length > 1:
        (alpha, carry0, free_total), _ = jax.lax.scan(
            step, (alpha, carry0, free_total), [x[1:] for x in others])
    total = free_total + site.scale * jnp.sum(logsumexp(alpha, axis=1))
    results = [init[a] + total if j == a else AfterScan(where) if j in state else carry0[j]
               for j in range(ncar)]
    return results + _after_scan_outputs(body, nc, ncar, zpos, a, state, deps, where)


def forward_sums(closed: Any, sites: list, fixed: dict, flat_in: list) -> jax.Array:
    """log Σ over the scanned site's values (forward algorithm) of the density
    `closed` computes from (site values, *flat_in); scalar sites' values in `fixed`."""
    scanned = [s for s in sites if s.addr not in fixed]
    if len(scanned) != 1:
        raise NotSummable("the forward algorithm sums one discrete site per step (and "
                          "sequence); found " + ", ".join(f"{s.name!r}" for s in scanned))
    inputs = [fixed[s.addr] if s.addr in fixed else Steps(s) for s in sites]

    def other(eqn, ins):
        if any(isinstance(x, Steps) for x in ins) and eqn.primitive.name in _LAYOUT:
            # a batch of sequences: the stacked values' axes put in the scan's order
            # (steps first); which steps and lanes are summed is checked in the scan
            return [ins[0]]
        if any(isinstance(x, AfterScan) for x in ins):
            raise NotSummable(f"results of a scan that depend on the discrete values are used "
                              f"at {jx.source_line(eqn)}")
        out = _forward(eqn, ins)
        if out is None:
            raise NotSummable(f"`{eqn.primitive.name}` at {jx.source_line(eqn)} uses the "
                              "discrete values outside the scan")
        return out
    (out,) = evaluate(closed, inputs + list(flat_in), other)
    if is_tracked(out):
        raise NotSummable("the log density depends on the discrete values outside the scan")
    return out
