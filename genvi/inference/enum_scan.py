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

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp

from genvi.core import jaxpr as jx
from genvi.inference.enum_lanes import NotSummable, evaluate, is_tracked


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
    for i in range(ncar, len(body.jaxpr.outvars)):  # per-step outputs
        if not (zpos in deps[i] or nc + a in deps[i] or any(nc + s in deps[i] for s in state)):
            raise NotSummable(f"the scan at {where} returns per-step values alongside its "
                              "discrete site")
        results.append(AfterScan(where))
    return results


def forward_sums(closed: Any, sites: list, fixed: dict, flat_in: list) -> jax.Array:
    """log Σ over the scanned site's values (forward algorithm) of the density
    `closed` computes from (site values, *flat_in); scalar sites' values in `fixed`."""
    scanned = [s for s in sites if s.addr not in fixed]
    if len(scanned) != 1 or len(scanned[0].shape) != 1:
        raise NotSummable("the forward algorithm sums one discrete site with one value per "
                          f"step; found {[(s.name, s.shape) for s in scanned]}")
    inputs = [fixed[s.addr] if s.addr in fixed else Steps(s) for s in sites]

    def other(eqn, ins):
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
