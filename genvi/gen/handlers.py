"""Handlers: what a program's sampling sites and observations mean, one short class
each. This is the public interpreter API that automatic guides, `gv.predictive` and
user tools build on (see docs/extending.md):

* `Simulate` — sample each site (plain JAX); `g.simulate`.
* `Assess`   — read each site's value from a choice map; `g.log_density`.
* `Sim`      — inside an objective, turn each site into an ADEV `sample_p` carrying
  its gradient strategy; `g.sim`.
* `Generate` — constrained sites scored, the others sampled; `g.generate`.
* `Dream`    — `Sim` that also samples the observations; `g.dream`.
* `RecordSites` — `Simulate` (less `gv.deterministic` values) that also notes each site's distribution, parameters
  and plate scale (what automatic guides and `gv.enumeration` read of a program).

A handler receives each site and observation as a `Site` record (address,
distribution, parameters, strategy, plate scale, source location; NumPyro passes its
`msg` the same way) and the `State` threaded through the run; `Handler.record` adds a
choice. `g.interpret(handler, *args, key=..., choices=...)` runs one
(`genvi.gen.interpret` walks the program's jaxpr and builds the records).

Example:
    >>> import genvi as gv, jax
    >>> from genvi.gen.handlers import Simulate
    >>> class Scales(Simulate):          # Simulate, noting each site's scale parameter
    ...     def __init__(self):
    ...         self.scales = {}
    ...     def site(self, site, state):
    ...         _, scale = site.params           # gv.normal's (loc, scale)
    ...         self.scales[site.addr] = scale
    ...         return super().site(site, state)
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
from genvi.core.primitives import Masked, SiteEqn, bind_site, sample_p, site_parts
from genvi.core.scopes import assume_continuous, density_scope
from genvi.core.strategy import missing_strategy_error
from genvi.core.tracing import IN_OBJECTIVE, PLAIN
from genvi.gen.branch_records import rejoined

__all__ = ["Assess", "Dream", "Generate", "Handler", "MissingChoice", "Sim", "Simulate",
           "Site", "State", "UnnormalizedError", "site_parts"]


@dataclass(frozen=True)
class Site:
    """One sampling site or observation, as a handler receives it.

    `addr` is None for an unnamed observation; `dist` is a `Masked` distribution for
    a site in an untaken branch of a batched cond (its lanes there hold no density);
    `strategy` carries its dynamic operands (a baseline's value); `scale` is the
    product of the `gv.plate` factors around the site; `shape` the shape of its
    value; `observed` an observation's value (None for a sampling site).

    Example:
        >>> import genvi as gv, jax
        >>> from genvi.gen.handlers import Simulate
        >>> class Where(Simulate):
        ...     def site(self, site, state):
        ...         print(site.addr, site.dist, site.shape, site.location.startswith("<doctest"))
        ...         return super().site(site, state)
        >>> @gv.gen
        ... def g():
        ...     return gv.normal(0.0, 1.0) @ "x"
        >>> _ = g.interpret(Where(), key=jax.random.key(0))
        ('x',) gv.normal () True
    """

    addr: tuple | None
    dist: Any
    params: tuple
    strategy: Any
    scale: float
    shape: tuple
    observed: Any = None
    eqn: Any = field(default=None, repr=False, compare=False)

    @staticmethod
    def of(eqn: Any, ins: list, scale: float) -> "Site":
        """The record of a site or observation equation on its operands."""
        view = SiteEqn.of(eqn)
        observed = view.is_observation
        operands = ins[1:] if observed else ins
        dist, params, strategy, addr = site_parts(eqn, operands)
        shape = tuple(jnp.shape(ins[0])) if observed else view.value_shape
        return Site(addr, dist, params, strategy, scale, shape,
                    ins[0] if observed else None, eqn)

    @property
    def location(self) -> str:
        """Where the user wrote the site: file and line."""
        return jx.source_line(self.eqn)

    @property
    def batch_axes(self) -> int:
        """How many leading axes of the value are lanes of the `vmap` transformations
        around the site (plates, particles)."""
        return 0 if self.eqn is None else SiteEqn.of(self.eqn).batch_axes

    @property
    def missing(self) -> bool:
        """An observation given no value (`gv.observe(..., None, name=...)`)."""
        return SiteEqn.of(self.eqn).missing

    @property
    def auxiliary(self) -> bool:
        """A site scored in its program's density but not one of its choices."""
        return self.eqn is not None and SiteEqn.of(self.eqn).auxiliary


def _drawn(site: "Site", sample: Any) -> tuple[Any, Any]:
    """`(value, log density)` of a site drawn by `sample(dist, params)`. A distribution
    that is the pushforward of a base one (`pushforward`, an automatic guide's site) is
    drawn in the base space and scored at that draw: log base(u) − log |det ∂y/∂u|,
    not at the inverse of its value `y`, which float rounding makes lossy near the
    boundary of a support (a sigmoid of 20 is 1.0 in float32)."""
    push = getattr(site.dist, "pushforward", None)
    parts = None if push is None or isinstance(site.dist, Masked) else push(*site.params)
    if parts is None:
        value = sample(site.dist, site.params)
        return value, _log_prob(site.dist, value, site.params, site.scale)
    base, base_params, forward = parts
    u = sample(base, base_params)
    with assume_continuous():  # a bijection onto the support: part of the site's sampler
        value, log_det = forward(u)
    log_p = _log_prob(base, u, base_params) - jnp.sum(log_det)
    return value, log_p if site.scale == 1.0 else log_p * site.scale


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


def _join(state: State, addr: tuple, value: Any, log_p: Any, masked: tuple | None) -> State:
    """Record `addr` again (a masked site in another branch of a batched cond:
    `genvi.gen.branch_records`)."""
    merged, entry = rejoined(addr, state.choices[addr], state.masks.get(addr), value, masked)
    return replace(state, choices={**state.choices, addr: merged},
                   log_density=state.log_density + log_p, masks={**state.masks, addr: entry})


class Handler:
    """What sampling sites mean; subclasses are one short class each."""

    # whether observed values are checked by validation (handlers that sample
    # observations instead, like Dream, ignore the values passed in)
    reads_observed_values = True

    @property
    def scale(self) -> float:
        """The product of the factors of the `gv.plate` bodies being interpreted."""
        return self.__dict__.get("_scales", [1.0])[-1]

    def plate(self, enters: bool, factor: float) -> None:
        """Enter (with its scale `factor`) or leave a `gv.plate`'s body."""
        stack = self.__dict__.setdefault("_scales", [1.0])
        if enters:
            stack.append(stack[-1] * factor)
        else:
            stack.pop()

    def site(self, site: Site, state: State) -> tuple[Any, State]:
        """The value of a sampling site, and the state after it."""
        raise NotImplementedError

    def observe(self, site: Site, state: State) -> State:
        """The state after an observation (default: its log density is added)."""
        if site.missing:
            raise ValueError(
                f"the observation {addr_name(site.addr)!r} ({site.dist.label}) at "
                f"{site.location} has no value (gv.observe(..., None, name=...)), so it cannot "
                "be scored: pass the observed data, or draw it with gv.predictive")
        try:
            log_p = _log_prob(site.dist, site.observed, site.params, site.scale)
        except (ValueError, TypeError) as err:
            if not is_shape_error(err):
                raise
            raise site_shape_error(site.dist, None, [jnp.shape(p) for p in site.params],
                                   site.shape, observation=True) from err
        return replace(state, log_density=state.log_density + log_p)

    def deterministic(self, site: Site, state: State) -> State:
        """The state after `gv.deterministic(name, value)` (`site.params` is
        `(value,)`): default, unchanged; the handlers that return choices record it."""
        return state

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
    def site(self, site, state):
        key, sub = jax.random.split(state.key)
        value, log_p = _drawn(site, lambda dist, params: dist.sample(sub, *params))
        return value, replace(self.record(state, site.addr, value, log_p, site.dist), key=key)

    def deterministic(self, site, state):
        (value,) = site.params
        return self.record(state, site.addr, value, 0.0, site.dist)


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

    def __init__(self) -> None:
        self.found: dict = {}

    deterministic = Handler.deterministic  # derived values are not sites

    def observe(self, site, state):
        # finding sites reads no data: new inputs without it (None) are fine here
        return state if site.missing else super().observe(site, state)

    def site(self, site, state):
        dist = site.dist
        self.found[site.addr] = RecordedSite(getattr(dist, "base", dist), site.params,
                                             float(site.scale), hasattr(dist, "base"))
        return super().site(site, state)


def _objective_sample(site: Site, strategy: Any) -> Any:
    """An ADEV sampling site for the site's distribution call (a site of the objective)."""
    dist = site.dist
    if strategy is None and not PLAIN:
        raise missing_strategy_error(dist, site.addr)
    mask = dist.mask if isinstance(dist, Masked) else None
    return bind_site(sample_p, getattr(dist, "base", dist), site.params, strategy, site.addr,
                     mask, batch_axes=site.batch_axes)


class Sim(Handler):
    """Sample a program with its sites' strategies, as a normalized density (a guide,
    a proposal): an observation there is an error (`UnnormalizedError`)."""

    def __init__(self, program: str = "the program"):
        self.program = program

    def site(self, site, state):
        value, log_p = _drawn(site, lambda dist, params: _objective_sample(
            replace(site, dist=dist, params=params), site.strategy))
        return value, self.record(state, site.addr, value, log_p, site.dist)

    def observe(self, site, state):
        raise unnormalized_error(self.program, site.eqn,
                                 "sampled with .sim (a guide or a proposal)")


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

    def site(self, site, state):
        if site.addr in state.reads:
            value = state.reads[site.addr]
            state.visited.add(site.addr)
            log_p = _log_prob(site.dist, value, site.params, site.scale)
            return value, self.record(state, site.addr, value, log_p, site.dist)
        value = _objective_sample(site, site.strategy)
        return value, self.record(state, site.addr, value, 0.0, site.dist)


class Dream(Sim):
    """Like `Sim`, but observations are *sampled* from their distributions (the
    values passed in are ignored) and recorded, in order, under the reserved
    addresses `("__observation__", i)`: a draw of latents and data from the model
    (wake-sleep's sleep phase)."""

    reads_observed_values = False

    def observe(self, site, state):
        value = _objective_sample(replace(site, addr=None), None)
        n = sum(1 for a in state.choices if a and a[0] == "__observation__")
        addr = ("__observation__", n)
        log_p = _log_prob(site.dist, value, site.params, site.scale)
        return self.record(state, addr, value, log_p, site.dist)


class Assess(Handler):
    """Read every site's value from `state.reads` and score it; with `score_only`,
    only those addresses (and observations) are scored. A draw of randomness without
    density (`draws_randomness`: `numpyro.prng_key()`, for dropout) is drawn inside an
    objective, which averages over it; outside one there is no key to draw it with."""

    def __init__(self, score_only: set | None = None):
        self.score_only = score_only

    def _randomness(self, site: Site, state: State) -> tuple[Any, State]:
        if not IN_OBJECTIVE:
            raise ValueError(
                f"log_density: the program draws {site.dist.label} at "
                f"{addr_name(site.addr)!r} ({site.location}): randomness without a density "
                "(dropout, say) makes its log density at given choices random; score it "
                "inside an objective (gv.elbo, gv.iwelbo), which averages over it")
        return _objective_sample(site, site.strategy), state

    def site(self, site, state):
        addr, dist = site.addr, site.dist
        if getattr(dist, "draws_randomness", False) and addr not in state.reads:
            return self._randomness(site, state)
        if site.auxiliary and addr not in state.reads:
            raise ValueError(
                f"log_density: {addr_name(addr)!r} ({dist.label}) is an auxiliary site "
                "(NumPyro's infer={'is_auxiliary': True}, as an autoguide's joint latent): "
                "its value is drawn when the program is sampled, and is not among the "
                "choices, so the program's density at given choices would be an integral "
                "over it. Use this guide where it is sampled (gv.elbo, gv.iwelbo, .sim, "
                "gv.predictive), or give the value at that address too.")
        if addr not in state.reads:  # GenFn._run_traced adds a "did you mean"
            raise MissingChoice(
                f"log_density: the choices have no value at address {addr_name(addr)!r} "
                f"({dist.label}), which the program samples; add it to the choice map.", addr)
        value = state.reads[addr]
        if jnp.shape(value) != site.shape:
            raise ValueError(
                f"log_density: the value at address {addr_name(addr)!r} ({dist.label}) has "
                f"shape {jnp.shape(value)} but the site's parameters give shape {site.shape}")
        state.visited.add(addr)
        scored = self.score_only is None or addr in self.score_only
        log_p = _log_prob(dist, value, site.params, site.scale) if scored else 0.0
        return value, self.record(state, addr, value, log_p, dist)
