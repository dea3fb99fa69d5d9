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
zeros). Under `gv.vmap` a cond with a per-lane index becomes masked sites (see
`genvi.core.primitives.run_masked`); records of one address made in different
branches of it merge lane by lane (`Handler.record`), as the unbatched program would
record them in each lane.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import jax
import jax.numpy as jnp

from genvi.adev.smoothness import density_scope
from genvi.adev.strategies import missing_strategy_error
from genvi.core import jaxpr as jx
from genvi.core.mistakes import is_shape_error, site_shape_error
from genvi.core.tracing import PLAIN
from genvi.core.primitives import (SITES, Masked, bind_site, observe_p, plate_p, sample_p,
                                   site_p, site_parts)
from genvi.validation import check_read_value, check_site, control as validation_control


def _log_prob(dist: Any, value: Any, params: tuple, scale: float = 1.0) -> Any:
    """`dist`'s log density at `value`, under the scope that tells the smoothness
    check its support tests are not uses of the value; times `scale`, the product of
    the factors of the `gv.plate`s around the site (what every handler records)."""
    with density_scope():
        log_p = dist.log_prob(value, *params)
    return log_p if scale == 1.0 else log_p * scale


def _name(addr: tuple) -> str:
    return "/".join(map(str, addr))


class MissingChoice(KeyError):
    """`log_density`'s choices lack an address the program samples (`.addr`)."""

    def __init__(self, message: str, addr: tuple):
        super().__init__(message)
        self.addr = addr

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0])


@dataclass
class State:
    key: Any
    log_density: Any
    choices: dict = field(default_factory=dict)
    reads: dict = field(default_factory=dict)  # Assess: the values to score
    visited: set = field(default_factory=set)  # Assess: addresses read (static)
    # addresses recorded by masked sites (batched cond branches): (mask, branch paths)
    masks: dict = field(default_factory=dict)


def _exclusive(a: tuple, b: tuple) -> bool:
    """Whether two branch paths part at one batched cond, in different branches."""
    for (token_a, branch_a), (token_b, branch_b) in zip(a, b):
        if token_a != token_b:
            return False
        if branch_a != branch_b:
            return True
    return False


def _lanes(mask: Any, ndim: int) -> Any:
    """`mask` with trailing axes, to broadcast against a value of `ndim` axes."""
    return jnp.reshape(mask, jnp.shape(mask) + (1,) * max(0, ndim - jnp.ndim(mask)))


def _join(state: State, addr: tuple, value: Any, log_p: Any, masked: tuple | None) -> State:
    """Record `addr` again: allowed only for a masked site in another branch of a
    batched cond than every earlier record of `addr` (each lane then executes one
    of them, as the unbatched program does), whose value fills its lanes."""
    prev = state.masks.get(addr)
    if masked is None or prev is None or not all(
            _exclusive(p, q) for p in masked[1] for q in prev[1]):
        raise ValueError(f"address {_name(addr)!r} is used twice in one execution; "
                         "give each sampling site its own address")
    old = state.choices[addr]
    if (jnp.shape(old), jnp.result_type(old)) != (jnp.shape(value), jnp.result_type(value)):
        raise ValueError(f"address {_name(addr)!r} has different shapes in the "
                         "branches of a cond; use one shape or different addresses")
    mask, ndim = masked[0], jnp.ndim(value)
    joined = jnp.logical_or(_lanes(prev[0], max(ndim, jnp.ndim(mask))), _lanes(mask, ndim))
    merged = jnp.where(_lanes(mask, ndim), value, old)
    return replace(state, choices={**state.choices, addr: merged},
                   log_density=state.log_density + log_p,
                   masks={**state.masks, addr: (joined, prev[1] + masked[1])})


class Handler:
    """What sampling sites mean; subclasses are one short class each."""

    # whether observed values are checked by validation (handlers that sample
    # observations instead, like Dream, ignore the values passed in)
    reads_observed_values = True

    @property
    def scale(self) -> float:
        """The product of the factors of the `gv.plate`s being interpreted."""
        return self.__dict__.get("_scales", [1.0])[-1]

    def plate(self, eqn: Any) -> None:
        """Enter or leave a `gv.plate`'s body (its markers; see `bind_plate`)."""
        stack = self.__dict__.setdefault("_scales", [1.0])
        if eqn.params["enter"]:
            stack.append(stack[-1] * eqn.params["factor"])
        else:
            stack.pop()

    def site(self, eqn: Any, params: list, state: State) -> tuple[Any, State]:
        raise NotImplementedError

    def observe(self, eqn: Any, ins: list, state: State) -> State:
        dist, params, _, addr = site_parts(eqn, ins[1:])
        if eqn.params.get("missing"):
            raise ValueError(
                f"the observation {_name(addr)!r} (gv.{dist.name}) at {jx.source_line(eqn)} "
                "has no value (gv.observe(..., None, name=...)), so it cannot be scored: pass "
                "the observed data, or draw it with gv.predictive")
        try:
            log_p = _log_prob(dist, ins[0], params, self.scale)
        except (ValueError, TypeError) as err:
            if not is_shape_error(err):
                raise
            raise site_shape_error(dist, None, [jnp.shape(p) for p in params],
                                   jnp.shape(ins[0]), observation=True) from err
        return replace(state, log_density=state.log_density + log_p)

    def record(self, state: State, addr: tuple, value: Any, log_p: Any, dist: Any = None,
               masked: tuple | None = None) -> State:
        """Add a choice; `masked` = (mask, branch paths) of a masked record leaving a
        scan (a `Masked` dist gives its own)."""
        if isinstance(dist, Masked):  # an untaken branch of a batched cond holds zeros
            value = dist.where(value)
            masked = (dist.mask, (dist.path,))
        if addr in state.choices:
            return _join(state, addr, value, log_p, masked)
        for other in state.choices:
            short, long = sorted((other, addr), key=len)
            if long[:len(short)] == short:
                raise ValueError(
                    f"address {_name(short)!r} is used both for a choice and as the prefix of "
                    f"{_name(long)!r}; rename the site or the sub-program call")
        masks = state.masks if masked is None else {**state.masks, addr: masked}
        return replace(state, choices={**state.choices, addr: value},
                       log_density=state.log_density + log_p, masks=masks)


class Simulate(Handler):
    def site(self, eqn, params, state):
        dist, params, _, addr = site_parts(eqn, params)
        key, sub = jax.random.split(state.key)
        value = dist.sample(sub, *params)
        log_p = _log_prob(dist, value, params, self.scale)
        return value, replace(self.record(state, addr, value, log_p, dist), key=key)


def _objective_sample(dist: Any, params: tuple, strategy: Any, addr: tuple) -> Any:
    """An ADEV sampling site for `dist(*params)` (a site of the objective)."""
    if strategy is None and not PLAIN:
        raise missing_strategy_error(dist, addr)
    mask = dist.mask if isinstance(dist, Masked) else None
    return bind_site(sample_p, getattr(dist, "base", dist), params, strategy, addr, mask)


class Sim(Handler):
    """Sample a program with its sites' strategies, as a normalized density (a guide,
    a proposal): an observation there is an error (`UnnormalizedError`)."""

    def __init__(self, program: str = "the program"):
        self.program = program

    def site(self, eqn, params, state):
        dist, dparams, strategy, addr = site_parts(eqn, params)
        value = _objective_sample(dist, dparams, strategy, addr)
        log_p = _log_prob(dist, value, dparams, self.scale)
        return value, self.record(state, addr, value, log_p, dist)

    def observe(self, eqn, ins, state):
        raise unnormalized_error(self.program, eqn, "sampled with .sim (a guide or a proposal)")


class UnnormalizedError(ValueError):
    """A program with `gv.observe` is used where a normalized density is needed."""


def unnormalized_error(program: str, eqn: Any, role: str) -> UnnormalizedError:
    return UnnormalizedError(
        f"{program} is {role}, where a normalized density is needed, but it calls "
        f"gv.observe(gv.{eqn.params['dist'].name}(...), ...) at {jx.source_line(eqn)}. "
        "An observation makes its density unnormalized, so its samples and log density "
        "would not be those of a distribution and the objective would be silently wrong. "
        "Remove the observation from this program, or, to sample its posterior, use "
        f"gv.normalize({program}, gv.importance(particles=K)) instead.")


def first_observation(jaxpr: Any) -> Any:
    """The first `gv.observe` equation of a program's jaxpr (nested bodies
    included), or None."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    for eqn in jaxpr.eqns:
        if eqn.primitive is observe_p:
            return eqn
        for j in jx.sub_jaxprs(eqn):
            found = first_observation(j)
            if found is not None:
                return found
    return None


class Generate(Handler):
    """Sites with a value in `state.reads` are constrained and scored; the others are
    sampled from the program (ADEV sites) and not scored: the log weight is that of
    importance sampling with the program's prior as proposal."""

    def site(self, eqn, params, state):
        dist, dparams, strategy, addr = site_parts(eqn, params)
        if addr in state.reads:
            value = state.reads[addr]
            state.visited.add(addr)
            log_p = _log_prob(dist, value, dparams, self.scale)
            return value, self.record(state, addr, value, log_p, dist)
        value = _objective_sample(dist, dparams, strategy, addr)
        return value, self.record(state, addr, value, 0.0, dist)


class Dream(Sim):
    """Like `Sim`, but observations are *sampled* from their distributions (the
    values passed in are ignored) and recorded, in order, under the reserved
    addresses `("__observation__", i)`: a draw of latents and data from the model
    (wake-sleep's sleep phase)."""

    reads_observed_values = False

    def observe(self, eqn, ins, state):
        dist, params, strategy, _ = site_parts(eqn, ins[1:])
        value = _objective_sample(dist, params, None, None)
        n = sum(1 for a in state.choices if a and a[0] == "__observation__")
        addr = ("__observation__", n)
        return self.record(state, addr, value, _log_prob(dist, value, params, self.scale), dist)


class Assess(Handler):
    """Read every site's value from `state.reads` and score it; with `score_only`,
    only those addresses (and observations) are scored."""

    def __init__(self, score_only: set | None = None):
        self.score_only = score_only

    def site(self, eqn, params, state):
        dist, params, _, addr = site_parts(eqn, params)
        if addr not in state.reads:  # GenFn._interpret adds a "did you mean"
            raise MissingChoice(
                f"log_density: the choices have no value at address {_name(addr)!r} "
                f"(gv.{dist.name}), which the program samples; add it to the choice map.", addr)
        value = state.reads[addr]
        want = eqn.outvars[0].aval.shape
        if jnp.shape(value) != want:
            raise ValueError(
                f"log_density: the value at address {_name(addr)!r} (gv.{dist.name}) has "
                f"shape {jnp.shape(value)} but the site's parameters give shape {want}")
        state.visited.add(addr)
        scored = self.score_only is None or addr in self.score_only
        log_p = _log_prob(dist, value, params, self.scale) if scored else 0.0
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
            check_site(eqn, ins, jaxpr=jaxpr)
            value, state = handler.site(eqn, ins, state)
            if eqn.params["addr"] in state.reads:  # a value given by the user: scored
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


def site_strategies(jaxpr: Any) -> dict:
    """{address: strategy (None if none)} of every site of a program's jaxpr."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    out: dict = {}
    for eqn in jaxpr.eqns:
        if eqn.primitive is site_p:
            out[eqn.params["addr"]] = eqn.params["strategy"]
        for j in jx.sub_jaxprs(eqn):
            out.update(site_strategies(j))
    return out


def site_layouts(jaxpr: Any, depth: int = 0) -> dict:
    """{address: (combinator nest, number of enclosing scan equations)} of every site."""
    jaxpr = getattr(jaxpr, "jaxpr", jaxpr)
    out: dict = {}
    for eqn in jaxpr.eqns:
        if eqn.primitive is site_p or (eqn.primitive is observe_p and eqn.params["addr"]):
            out[eqn.params["addr"]] = (eqn.params.get("nest", ()), depth)  # named observations too
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
    paths: dict = {}  # the body's masked addresses: their branch paths (static)

    def step(carry, x):
        c, key, logw = carry
        x_vals, x_reads = x
        sub = State(key, jnp.zeros_like(logw), {}, x_reads, visited)
        outs, sub = run(body, list(consts) + list(c) + list(x_vals), handler, sub)
        paths.update({a: p for a, (_, p) in sub.masks.items()})
        masks = {a: m for a, (m, _) in sub.masks.items()}
        return ((tuple(outs[:ncar]), sub.key, logw + sub.log_density),
                (tuple(outs[ncar:]), sub.choices, masks))

    zero = jnp.zeros((), jnp.result_type(float))
    (c, key, logw), (ys, choices, masks) = jax.lax.scan(
        step, (tuple(init), state.key, zero), (tuple(xs), reads), length=sp["length"],
        reverse=sp["reverse"], unroll=sp["unroll"])
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
