"""Handlers: what a program's sampling sites and observations mean, one short class
each. This is the public interpreter API that automatic guides, `gv.predictive` and
user tools build on (see docs/extending.md):

* `Simulate` — sample each site (plain JAX); `g.simulate`.
* `Assess`   — read each site's value from a choice map; `g.log_density`.
* `Sim`      — inside an objective, turn each site into an ADEV `sample_p` carrying
  its gradient strategy; `g.sim`.
* `Generate` — constrained sites scored, the others sampled; `g.generate`.
* `Dream`    — `Sim` that also samples the observations; `g.dream`.
* `RecordSites` — `Simulate` that also notes each site's distribution, parameters
  and plate scale (what automatic guides and `gv.enumeration` read of a program).

A handler receives each site as its equation and operands (`site_parts` splits them
into distribution, parameters, strategy and address) and the `State` threaded through
the run; `Handler.record` adds a choice. `g.interpret(handler, *args, key=..., choices=...)`
runs one (`genvi.gen.interpret` walks the program's jaxpr).

Example:
    >>> import genvi as gv, jax
    >>> from genvi.gen.handlers import Simulate, site_parts
    >>> class Scales(Simulate):          # Simulate, noting each site's scale parameter
    ...     def __init__(self):
    ...         self.scales = {}
    ...     def site(self, eqn, params, state):
    ...         dist, dparams, _, addr = site_parts(eqn, params)
    ...         self.scales[addr] = dparams[1]
    ...         return super().site(eqn, params, state)
    >>> @gv.gen
    ... def g():
    ...     return gv.normal(0.0, 2.0) @ "x"
    >>> h = Scales()
    >>> out = g.interpret(h, key=jax.random.key(0))
    >>> float(h.scales[("x",)]), sorted(out.choices.flat())
    (2.0, [('x',)])
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from genvi.core import jaxpr as jx
from genvi.core.mistakes import addr_name, is_shape_error, site_shape_error
from genvi.core.primitives import Masked, SiteEqn, bind_site, plate_marker, sample_p, site_parts
from genvi.core.scopes import density_scope
from genvi.core.strategy import missing_strategy_error
from genvi.core.tracing import PLAIN

__all__ = ["Assess", "Dream", "Generate", "Handler", "MissingChoice", "Sim", "Simulate",
           "State", "UnnormalizedError", "site_parts"]


def _log_prob(dist: Any, value: Any, params: tuple, scale: float = 1.0) -> Any:
    """`dist`'s log density at `value`, under the scope that tells the smoothness
    check its support tests are not uses of the value; times `scale`, the product of
    the factors of the `gv.plate`s around the site (what every handler records)."""
    with density_scope():
        log_p = dist.log_prob(value, *params)
    return log_p if scale == 1.0 else log_p * scale


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
        raise ValueError(f"address {addr_name(addr)!r} is used twice in one execution; "
                         "give each sampling site its own address")
    old = state.choices[addr]
    if (jnp.shape(old), jnp.result_type(old)) != (jnp.shape(value), jnp.result_type(value)):
        raise ValueError(f"address {addr_name(addr)!r} has different shapes in the "
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
        """The product of the factors of the `gv.plate` bodies being interpreted."""
        return self.__dict__.get("_scales", [1.0])[-1]

    def plate(self, eqn: Any) -> None:
        """Enter or leave a `gv.plate`'s body (its markers; see `bind_plate`)."""
        stack = self.__dict__.setdefault("_scales", [1.0])
        enters, factor = plate_marker(eqn)
        if enters:
            stack.append(stack[-1] * factor)
        else:
            stack.pop()

    def site(self, eqn: Any, params: list, state: State) -> tuple[Any, State]:
        raise NotImplementedError

    def observe(self, eqn: Any, ins: list, state: State) -> State:
        dist, params, _, addr = site_parts(eqn, ins[1:])
        if SiteEqn.of(eqn).missing:
            raise ValueError(
                f"the observation {addr_name(addr)!r} (gv.{dist.name}) at {jx.source_line(eqn)} "
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
                    f"address {addr_name(short)!r} is used both for a choice and as the prefix of "
                    f"{addr_name(long)!r}; rename the site or the sub-program call")
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


class RecordedSite(NamedTuple):
    """A site as `RecordSites` saw it: its distribution (unmasked), parameters, the
    product of the `gv.plate` factors around it, and whether it is masked (in a branch
    of a cond that differs by lane)."""

    dist: Any
    params: tuple
    scale: float
    masked: bool


class RecordSites(Simulate):
    """`Simulate` that also records each site, by address, in `found` (`RecordedSite`).

    Example:
        >>> import genvi as gv, jax
        >>> from genvi.gen.handlers import RecordSites
        >>> @gv.gen
        ... def g():
        ...     return gv.normal(0.0, 2.0) @ "x"
        >>> h = RecordSites()
        >>> _ = g.interpret(h, key=jax.random.key(0))
        >>> h.found[("x",)].dist, h.found[("x",)].scale
        (gv.normal, 1.0)
    """

    def __init__(self):
        self.found: dict = {}

    def site(self, eqn, params, state):
        dist, dparams, _, addr = site_parts(eqn, params)
        self.found[addr] = RecordedSite(getattr(dist, "base", dist), dparams,
                                        float(self.scale), hasattr(dist, "base"))
        return super().site(eqn, params, state)


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


def observation_text(eqn: Any) -> str:
    """How the user wrote an observation equation: `gv.observe(gv.normal(...), ...)`
    or `gv.factor(...)`."""
    name = SiteEqn.of(eqn).dist.name
    return "gv.factor(...)" if name == "factor" else f"gv.observe(gv.{name}(...), ...)"


def unnormalized_error(program: str, eqn: Any, role: str) -> UnnormalizedError:
    return UnnormalizedError(
        f"{program} is {role}, where a normalized density is needed, but it calls "
        f"{observation_text(eqn)} at {jx.source_line(eqn)}. "
        "An observation (or a factor) makes its density unnormalized, so its samples and log density "
        "would not be those of a distribution and the objective would be silently wrong. "
        "Remove it from this program, or, to sample its posterior, use "
        f"gv.normalize({program}, gv.importance(particles=K)) instead.")
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
        if addr not in state.reads:  # GenFn._run_traced adds a "did you mean"
            raise MissingChoice(
                f"log_density: the choices have no value at address {addr_name(addr)!r} "
                f"(gv.{dist.name}), which the program samples; add it to the choice map.", addr)
        value = state.reads[addr]
        want = eqn.outvars[0].aval.shape
        if jnp.shape(value) != want:
            raise ValueError(
                f"log_density: the value at address {addr_name(addr)!r} (gv.{dist.name}) has "
                f"shape {jnp.shape(value)} but the site's parameters give shape {want}")
        state.visited.add(addr)
        scored = self.score_only is None or addr in self.score_only
        log_p = _log_prob(dist, value, params, self.scale) if scored else 0.0
        return value, self.record(state, addr, value, log_p, dist)
