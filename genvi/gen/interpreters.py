"""The generative-language transformations, as jaxpr interpreters.

A `@gv.gen` program is traced to a jaxpr holding `site_p` / `observe_p`. One
interpreter walks it, threading a state (PRNG key, log density, choices) through
ordinary equations and through `scan`, `cond` and `jit` bodies; a *handler* gives
the sites their meaning:

* `Simulate` — sample each site (plain JAX); `g.simulate`.
* `Assess`   — read each site's value from a choice map; `g.log_density`.
* `Sim`      — inside an objective, turn each site into an ADEV `sample_p` carrying
  its gradient strategy; `g.sim`.

Choices made inside a `scan` are stacked on a leading axis; the choices of `cond`
branches are the union of the branches' addresses (untaken branches' addresses hold
zeros).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp

from genvi.adev.strategies import missing_strategy_error
from genvi.core import jaxpr as jx
from genvi.core.tracing import PLAIN
from genvi.core.primitives import (SITES, Masked, bind_site, observe_p, sample_p, site_p,
                                   site_parts)
from genvi.validation import check_site


def _name(addr: tuple) -> str:
    return "/".join(map(str, addr))


@dataclass
class State:
    key: Any
    log_density: Any
    choices: dict = field(default_factory=dict)
    reads: dict = field(default_factory=dict)  # Assess: the values to score
    visited: set = field(default_factory=set)  # Assess: addresses read (static)


class Handler:
    """What sampling sites mean; subclasses are one short class each."""

    def site(self, eqn: Any, params: list, state: State) -> tuple[Any, State]:
        raise NotImplementedError

    def observe(self, eqn: Any, ins: list, state: State) -> State:
        dist, params, _, _ = site_parts(eqn, ins[1:])
        return replace(state, log_density=state.log_density + dist.log_prob(ins[0], *params))

    def record(self, state: State, addr: tuple, value: Any, log_p: Any, dist: Any = None) -> State:
        if isinstance(dist, Masked):  # an untaken branch of a batched cond holds zeros
            value = dist.where(value)
        if addr in state.choices:
            raise ValueError(f"address {_name(addr)!r} is used twice in one execution; "
                             "give each sampling site its own address")
        for other in state.choices:
            short, long = sorted((other, addr), key=len)
            if long[:len(short)] == short:
                raise ValueError(
                    f"address {_name(short)!r} is used both for a choice and as the prefix of "
                    f"{_name(long)!r}; rename the site or the sub-program call")
        return replace(state, choices={**state.choices, addr: value},
                       log_density=state.log_density + log_p)


class Simulate(Handler):
    def site(self, eqn, params, state):
        dist, params, _, addr = site_parts(eqn, params)
        key, sub = jax.random.split(state.key)
        value = dist.sample(sub, *params)
        return value, replace(self.record(state, addr, value, dist.log_prob(value, *params), dist),
                              key=key)


def _objective_sample(dist: Any, params: tuple, strategy: Any, addr: tuple) -> Any:
    """An ADEV sampling site for `dist(*params)` (a site of the objective)."""
    if strategy is None and not PLAIN:
        raise missing_strategy_error(dist, addr)
    mask = dist.mask if isinstance(dist, Masked) else None
    return bind_site(sample_p, getattr(dist, "base", dist), params, strategy, addr, mask)


class Sim(Handler):
    def site(self, eqn, params, state):
        dist, dparams, strategy, addr = site_parts(eqn, params)
        value = _objective_sample(dist, dparams, strategy, addr)
        return value, self.record(state, addr, value, dist.log_prob(value, *dparams), dist)


class Generate(Handler):
    """Sites with a value in `state.reads` are constrained and scored; the others are
    sampled from the program (ADEV sites) and not scored: the log weight is that of
    importance sampling with the program's prior as proposal."""

    def site(self, eqn, params, state):
        dist, dparams, strategy, addr = site_parts(eqn, params)
        if addr in state.reads:
            value = state.reads[addr]
            state.visited.add(addr)
            return value, self.record(state, addr, value, dist.log_prob(value, *dparams), dist)
        value = _objective_sample(dist, dparams, strategy, addr)
        return value, self.record(state, addr, value, 0.0, dist)


class Dream(Sim):
    """Like `Sim`, but observations are *sampled* from their distributions (the
    values passed in are ignored) and recorded, in order, under the reserved
    addresses `("__observation__", i)`: a draw of latents and data from the model
    (wake-sleep's sleep phase)."""

    def observe(self, eqn, ins, state):
        dist, params, strategy, _ = site_parts(eqn, ins[1:])
        value = _objective_sample(dist, params, None, None)
        n = sum(1 for a in state.choices if a and a[0] == "__observation__")
        addr = ("__observation__", n)
        return self.record(state, addr, value, dist.log_prob(value, *params), dist)


class Assess(Handler):
    """Read every site's value from `state.reads` and score it; with `score_only`,
    only those addresses (and observations) are scored."""

    def __init__(self, score_only: set | None = None):
        self.score_only = score_only

    def site(self, eqn, params, state):
        dist, params, _, addr = site_parts(eqn, params)
        if addr not in state.reads:
            raise KeyError(
                f"log_density: the choices have no value at address {_name(addr)!r} "
                f"(gv.{dist.name}), which the program samples; add it to the choice map")
        value = state.reads[addr]
        want = eqn.outvars[0].aval.shape
        if jnp.shape(value) != want:
            raise ValueError(
                f"log_density: the value at address {_name(addr)!r} (gv.{dist.name}) has "
                f"shape {jnp.shape(value)} but the site's parameters give shape {want}")
        state.visited.add(addr)
        scored = self.score_only is None or addr in self.score_only
        log_p = dist.log_prob(value, *params) if scored else 0.0
        return value, self.record(state, addr, value, log_p, dist)


def run(closed: Any, args: list, handler: Handler, state: State) -> tuple[list, State]:
    """Interpret a program's closed jaxpr on `args` with `handler`."""
    env = dict(zip(closed.jaxpr.constvars, closed.consts))
    env.update(zip(closed.jaxpr.invars, args))
    return _level(closed.jaxpr, env, handler, state)


def _level(jaxpr: Any, env: dict, handler: Handler, state: State) -> tuple[list, State]:
    for eqn in jaxpr.eqns:
        ins = [jx.read(env, v) for v in eqn.invars]
        if eqn.primitive is site_p:
            check_site(eqn, ins)
            value, state = handler.site(eqn, ins, state)
            env[eqn.outvars[0]] = value
        elif eqn.primitive is observe_p:
            check_site(eqn, ins, offset=1)
            state = handler.observe(eqn, ins, state)
        elif any(jx.contains(j, SITES) for j in jx.sub_jaxprs(eqn)):
            outs, state = _control(eqn, ins, handler, state)
            env.update(zip(eqn.outvars, outs))
        else:
            env.update(zip(eqn.outvars, jx.eval_eqn(eqn, ins)))
    return [jx.read(env, v) for v in jaxpr.outvars], state


def site_addresses(jaxpr: Any) -> set:
    """Every address a jaxpr (and its nested bodies) may sample."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    out = set()
    for eqn in jaxpr.eqns:
        if eqn.primitive is site_p:
            out.add(eqn.params["addr"])
        for j in jx.sub_jaxprs(eqn):
            out |= site_addresses(j)
    return out


def site_layouts(jaxpr: Any, depth: int = 0) -> dict:
    """{address: (combinator nest, number of enclosing scan equations)} of every site."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    out: dict = {}
    for eqn in jaxpr.eqns:
        if eqn.primitive is site_p:
            out[eqn.params["addr"]] = (eqn.params.get("nest", ()), depth)
        inner = depth + (jx.kind(eqn) == "scan")
        for j in jx.sub_jaxprs(eqn):
            out.update(site_layouts(j, inner))
    return out


def _permutation(nest: tuple, depth: int) -> list | None:
    """Axis order taking the interpreter's layout (scan axes, then vmap axes) to the
    nesting order of the combinators, or None when it is already that (or unknown:
    scans not made by gv.scan)."""
    if nest.count("scan") != depth or "scan" not in nest or "vmap" not in nest:
        return None
    scans, vmaps = iter(range(depth)), iter(range(depth, len(nest)))
    perm = [next(scans) if kind == "scan" else next(vmaps) for kind in nest]
    return None if perm == sorted(perm) else perm


def to_user_layout(choices: dict, layouts: dict) -> dict:
    """Choices with batch axes in the order the combinators nest (`gv.vmap` of
    `gv.scan` gives (batch, steps, ...), as its return value does)."""
    out = {}
    for addr, v in choices.items():
        perm = _permutation(*layouts[addr]) if addr in layouts else None
        out[addr] = v if perm is None else jnp.transpose(v, perm + list(range(len(perm), v.ndim)))
    return out


def to_interpreter_layout(choices: dict, layouts: dict) -> dict:
    """The inverse of `to_user_layout`."""
    out = {}
    for addr, v in choices.items():
        perm = _permutation(*layouts[addr]) if addr in layouts else None
        if perm is not None:
            inverse = [perm.index(i) for i in range(len(perm))]
            v = jnp.transpose(v, inverse + list(range(len(perm), jnp.ndim(v))))
        out[addr] = v
    return out


def _merge(handler: Handler, state: State, sub: State, choices: dict) -> State:
    for addr, value in choices.items():
        state = handler.record(state, addr, value, 0.0)
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
    sp = jx.scan_params(eqn)
    body, nc, ncar = sp["body"], sp["num_consts"], sp["num_carry"]
    consts, init, xs = ins[:nc], ins[nc:nc + ncar], ins[nc + ncar:]
    addrs = site_addresses(body)
    reads = {a: v for a, v in state.reads.items() if a in addrs}
    for a, v in reads.items():
        if jnp.ndim(v) == 0 or jnp.shape(v)[0] != sp["length"]:
            raise ValueError(
                f"log_density: the value at address {_name(a)!r} is sampled inside a scan of "
                f"length {sp['length']}, so it needs a leading axis of that length; "
                f"got shape {jnp.shape(v)}")
    visited: set = set()

    def step(carry, x):
        c, key, logw = carry
        x_vals, x_reads = x
        sub = State(key, jnp.zeros_like(logw), {}, x_reads, visited)
        outs, sub = run(body, list(consts) + list(c) + list(x_vals), handler, sub)
        return (tuple(outs[:ncar]), sub.key, logw + sub.log_density), (tuple(outs[ncar:]), sub.choices)

    zero = jnp.zeros((), jnp.result_type(float))
    (c, key, logw), (ys, choices) = jax.lax.scan(
        step, (tuple(init), state.key, zero), (tuple(xs), reads), length=sp["length"],
        reverse=sp["reverse"], unroll=sp["unroll"])
    state.visited.update(visited)
    state = _merge(handler, state, State(key, logw), choices)
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
                raise ValueError(f"address {_name(addr)!r} has different shapes in the "
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
