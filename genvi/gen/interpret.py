"""The generative-language interpreter: a program's jaxpr walked with a handler.

One loop (`run`) threads a `State` (PRNG key, log density, choices) through ordinary
equations and through `scan`, `cond` and `jit` bodies, and hands each site and
observation to the handler (`genvi.gen.handlers`). Choices made inside a `scan` are
stacked on a leading axis; the choices of `cond` branches are the union of the
branches' addresses (untaken branches' addresses hold zeros). Under `gv.vmap` a cond
with a per-lane index becomes masked sites (see `genvi.core.primitives.run_masked`);
records of one address made in different branches of it merge lane by lane
(`Handler.record`), as the unbatched program would record them in each lane.

Example:
    >>> import genvi as gv
    >>> from genvi.gen.handlers import Assess
    >>> @gv.gen
    ... def g():
    ...     return gv.normal(0.0, 1.0) @ "x"
    >>> run = g.interpret(Assess(), choices={"x": 0.0})
    >>> round(float(run.log_density), 4), sorted(run.visited)
    (-0.9189, [('x',)])
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import jax
import jax.numpy as jnp

from genvi.core import jaxpr as jx
from genvi.core.primitives import SITES, SiteEqn, observe_p, plate_p, site_p
from genvi.core.mistakes import addr_name
from genvi.gen.handlers import Handler, State
from genvi.gen.site_checks import check_read_value, check_site, control as validation_control
from genvi.gen.sites import site_addresses


def run(closed: Any, args: list, handler: Handler, state: State) -> tuple[list, State]:
    """Interpret a program's closed jaxpr on `args` with `handler`."""
    env = dict(zip(closed.jaxpr.constvars, closed.consts))
    env.update(zip(closed.jaxpr.invars, args))
    return _level(closed.jaxpr, env, handler, state)


def _level(jaxpr: Any, env: dict, handler: Handler, state: State) -> tuple[list, State]:
    for eqn in jaxpr.eqns:
        ins = [jx.read(env, v) for v in eqn.invars]
        if eqn.primitive is site_p:
            check_site(eqn, ins, jaxpr=jaxpr)
            value, state = handler.site(eqn, ins, state)
            if SiteEqn.of(eqn).addr in state.reads:  # a value given by the user: scored
                check_read_value(eqn, ins, value, jaxpr)
            env[eqn.outvars[0]] = value
        elif eqn.primitive is plate_p:
            handler.plate(eqn)
        elif eqn.primitive is observe_p:
            check_site(eqn, ins, offset=1, value=handler.reads_observed_values, jaxpr=jaxpr)
            state = handler.observe(eqn, ins, state)
        elif any(jx.contains(j, SITES) for j in jx.sub_jaxprs(eqn)):
            # the scan/cond it emits points at the user's line; validation knows the branch
            with jx.emitted_as(eqn), validation_control(eqn, ins, jaxpr):
                outs, state = _control(eqn, ins, handler, state)
            env.update(zip(eqn.outvars, outs))
        else:
            env.update(zip(eqn.outvars, jx.eval_eqn(eqn, ins)))
    return [jx.read(env, v) for v in jaxpr.outvars], state


def _merge(handler: Handler, state: State, sub: State, choices: dict,
           masks: dict | None = None) -> State:
    masks = masks or {}
    for addr, value in choices.items():
        state = handler.record(state, addr, value, 0.0, masked=masks.get(addr))
    return replace(state, key=sub.key, log_density=state.log_density + sub.log_density)


def _control(eqn: Any, ins: list, handler: Handler, state: State) -> tuple[list, State]:
    kind = jx.kind(eqn)
    if kind == "call":
        body = jx.call_body(eqn)
        return run(body, ins, handler, state)
    if kind == "scan":
        return _scan(eqn, ins, handler, state)
    if kind == "cond":
        return _cond(eqn, ins, handler, state)
    raise NotImplementedError(
        f"sampling sites inside `{eqn.primitive.name}` are not supported: use gv.scan or "
        "jax.lax.scan with a fixed length for loops, and keep sampling out of "
        "custom_jvp/custom_vjp functions")


def _scan(eqn, ins, handler, state):
    scan = jx.ScanEqn.of(eqn)
    body, ncar = scan.body, scan.num_carry
    consts, init, xs = scan.split(ins)
    addrs = site_addresses(body)
    reads = {a: v for a, v in state.reads.items() if a in addrs}
    for a, v in reads.items():
        if jnp.ndim(v) == 0 or jnp.shape(v)[0] != scan.length:
            raise ValueError(
                f"log_density: the value at address {addr_name(a)!r} is sampled inside a scan of "
                f"length {scan.length}, so it needs a leading axis of that length; "
                f"got shape {jnp.shape(v)}")
    visited: set = set()
    paths: dict = {}  # the body's masked addresses: their branch paths (static)

    def step(carry, x):
        c, key, logw = carry
        x_vals, x_reads = x
        sub = State(key, jnp.zeros_like(logw), {}, x_reads, visited)
        outs, sub = run(body, consts + list(c) + list(x_vals), handler, sub)
        paths.update({a: p for a, (_, p) in sub.masks.items()})
        masks = {a: m for a, (m, _) in sub.masks.items()}
        return ((tuple(outs[:ncar]), sub.key, logw + sub.log_density),
                (tuple(outs[ncar:]), sub.choices, masks))

    zero = jnp.zeros((), jnp.result_type(float))
    (c, key, logw), (ys, choices, masks) = scan.scan(
        step, (tuple(init), state.key, zero), (tuple(xs), reads))
    state.visited.update(visited)
    # a masked record (a scan inside a batched cond's branch) may still meet its
    # address from another branch of that cond
    masks = {a: (m, paths[a]) for a, m in masks.items()}
    state = _merge(handler, state, State(key, logw), choices, masks)
    return list(c) + list(ys), state


def _cond(eqn, ins, handler, state):
    index, ops = ins[0], ins[1:]
    branches = jx.cond_branches(eqn)
    visited: set = set()

    def make(branch):
        def f(ops, key):
            sub = State(key, jnp.zeros((), jnp.result_type(float)), {}, state.reads, visited)
            outs, sub = run(branch, list(ops), handler, sub)
            return outs, sub.key, sub.log_density, sub.choices
        return f

    shapes = [jax.eval_shape(make(b), ops, state.key)[3] for b in branches]
    union = {}
    for s in shapes:
        for addr, sd in s.items():
            if addr in union and (union[addr].shape, union[addr].dtype) != (sd.shape, sd.dtype):
                raise ValueError(f"address {addr_name(addr)!r} has different shapes in the "
                                 "branches of a cond; use one shape or different addresses")
            union[addr] = sd

    def padded(branch):
        f = make(branch)

        def g(ops, key):
            outs, key, logw, choices = f(ops, key)
            full = {a: choices[a] if a in choices else jnp.zeros(sd.shape, sd.dtype)
                    for a, sd in union.items()}
            return outs, key, logw, full
        return g

    outs, key, logw, choices = jax.lax.switch(index, [padded(b) for b in branches], ops, state.key)
    state.visited.update(visited)
    state = _merge(handler, state, State(key, logw), choices)
    return list(outs), state
