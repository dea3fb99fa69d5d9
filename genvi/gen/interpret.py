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
from genvi.core.primitives import SITES, SiteEqn, observe_p, plate_marker, plate_p, site_p
from genvi.core.mistakes import addr_name
from genvi.core.walk import Hooks, env_of, walk
from genvi.distributions.factor import DETERMINISTIC
from genvi.gen.handlers import Handler, Site, State
from genvi.gen.site_checks import branch_gate, check_read_value, check_site
from genvi.gen.sites import site_addresses


def run(closed: Any, args: list, handler: Handler, state: State,
        gate: Any = None) -> tuple[list, State]:
    """Interpret a program's closed jaxpr on `args` with `handler`; `gate`: the lanes
    where this body runs, for validation's checks (None: everywhere)."""
    hooks = _Interpret(handler, state, gate)
    outs = walk(closed.jaxpr, env_of(closed, args), hooks)
    return outs, hooks.state


def _site(hooks: "_Interpret", i: int, eqn: Any, ins: list) -> list:
    check_site(eqn, ins, gate=hooks.gate)
    value, hooks.state = hooks.handler.site(Site.of(eqn, ins, hooks.handler.scale), hooks.state)
    if SiteEqn.of(eqn).addr in hooks.state.reads:  # a value given by the user: scored
        check_read_value(eqn, ins, value, hooks.gate)
    return [value]


def _plate(hooks: "_Interpret", i: int, eqn: Any, ins: list) -> list:
    hooks.handler.plate(*plate_marker(eqn))
    return []


def _observe(hooks: "_Interpret", i: int, eqn: Any, ins: list) -> list:
    check_site(eqn, ins, offset=1, value=hooks.handler.reads_observed_values, gate=hooks.gate)
    site = Site.of(eqn, ins, hooks.handler.scale)
    meaning = (hooks.handler.deterministic if SiteEqn.of(eqn).dist is DETERMINISTIC
               else hooks.handler.observe)
    hooks.state = meaning(site, hooks.state)
    return []


class _Interpret(Hooks):
    """The walk's hooks: sites and observations go to the handler, a `State` is
    threaded through them and through scan, cond and call bodies, and `gate` (the
    lanes where this body runs, for validation) is passed down to them."""

    rules = {site_p: _site, plate_p: _plate, observe_p: _observe}
    holds = SITES

    def __init__(self, handler: Handler, state: State, gate: Any):
        self.handler, self.state, self.gate = handler, state, gate

    def _control(self, eqn: Any, ins: list, body: Any) -> list:
        with jx.emitted_as(eqn):  # the scan/cond it emits points at the user's line
            outs, self.state = body(ins, self.handler, self.state, self.gate)
        return outs

    def call(self, i, view, ins):
        return self._control(view.eqn, ins, lambda *a: run(view.body, *a))

    def scan(self, i, view, ins):
        return self._control(view.eqn, ins, lambda *a: _scan(view, *a))

    def cond(self, i, view, ins):
        return self._control(view.eqn, ins, lambda *a: _cond(view, *a))


def _merge(handler: Handler, state: State, sub: State, choices: dict,
           masks: dict | None = None) -> State:
    masks = masks or {}
    for addr, value in choices.items():
        state = handler.record(state, addr, value, 0.0, masked=masks.get(addr))
    return replace(state, key=sub.key, log_density=state.log_density + sub.log_density)


def _scan(scan: jx.ScanEqn, ins: list, handler: Handler, state: State,
          gate: Any) -> tuple[list, State]:
    body = scan.body
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
        outs, sub = run(body, consts + list(c) + list(x_vals), handler, sub, gate)
        paths.update({a: p for a, (_, p) in sub.masks.items()})
        masks = {a: m for a, (m, _) in sub.masks.items()}
        new_c, ys = scan.split_outs(outs)
        return ((tuple(new_c), sub.key, logw + sub.log_density),
                (tuple(ys), sub.choices, masks))

    zero = jnp.zeros((), jnp.result_type(float))
    (c, key, logw), (ys, choices, masks) = scan.scan(
        step, (tuple(init), state.key, zero), (tuple(xs), reads))
    state.visited.update(visited)
    # a masked record (a scan inside a batched cond's branch) may still meet its
    # address from another branch of that cond
    masks = {a: (m, paths[a]) for a, m in masks.items()}
    state = _merge(handler, state, State(key, logw), choices, masks)
    return list(c) + list(ys), state


def _cond(view: jx.CondEqn, ins: list, handler: Handler, state: State,
          gate: Any) -> tuple[list, State]:
    index, ops = view.split(ins)
    branches = view.branches
    visited: set = set()

    def make(b):
        branch = branches[b]
        here = branch_gate(gate, index, b)  # validation's checks hold where b is taken

        def f(ops, key):
            sub = State(key, jnp.zeros((), jnp.result_type(float)), {}, state.reads, visited)
            outs, sub = run(branch, list(ops), handler, sub, here)
            return outs, sub.key, sub.log_density, sub.choices
        return f

    shapes = [jax.eval_shape(make(b), ops, state.key)[3] for b in range(len(branches))]
    union: dict[tuple, Any] = {}  # address -> its value's shape and dtype
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

    outs, key, logw, choices = jax.lax.switch(index, [padded(b) for b in range(len(branches))],
                                              ops, state.key)
    state.visited.update(visited)
    state = _merge(handler, state, State(key, logw), choices)
    return list(outs), state
