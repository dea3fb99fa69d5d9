"""`gv.predictive`: draws of a model's latents and named observations.

Latents come from the guide (or, without one, from the model's prior); the model is
then run with a handler that reads those latents and *samples* each observation
named with `gv.observe(..., name="y")` from its distribution instead of scoring the
value passed in. Draws are vectorized with `jax.vmap`: no Python loop over samples;
with `batch_size=k` they are drawn k at a time in a `lax.scan` (memory bounded by k,
beyond the output), and sample i depends only on `fold_in(key, i)`, so chunking
changes no draw.

Example:
    >>> import genvi as gv, jax
    >>> @gv.gen
    ... def model(params):
    ...     gv.normal(0.0, 1.0) @ "mu"
    >>> gv.predictive(model, None, None, 10, batch_size=4)(jax.random.key(0))["mu"].shape
    (10,)
"""

from __future__ import annotations

import operator
from dataclasses import replace
from typing import Any, Callable, Sequence

import jax
import jax.numpy as jnp

from genvi.core import jaxpr as jx
from genvi.core.choices import ChoiceMap
from genvi.core.keywords import takes_keywords
from genvi.core.mistakes import check_key, did_you_mean, is_count
from genvi.core.program_mistakes import require_program
from genvi.core.primitives import SiteEqn, observe_p
from genvi.gen.handlers import Handler, MissingChoice, observation_text
from genvi.gen.language import GenFn
from genvi.gen.sites import deterministic_of, without
from genvi.core.address import Address


def _draw_like(dist: Any, key: jax.Array, params: tuple, value: Any) -> jax.Array:
    """A draw from `dist(*params)` with the shape of the observed `value` where the
    parameters broadcast against it (as the log density does)."""
    if tuple(dist.value_shape(*params)) == jnp.shape(value):
        return dist.sample(key, *params)
    events = tuple(dist.param_event_ndims) + (0,) * len(params)
    value_batch = jnp.shape(value)[:jnp.ndim(value) - dist.value_event_ndim]
    batch = jnp.broadcast_shapes(value_batch, *[jnp.shape(p)[:jnp.ndim(p) - e]
                                                for p, e in zip(params, events)])
    params = tuple(jnp.broadcast_to(p, batch + jnp.shape(p)[jnp.ndim(p) - e:])
                   for p, e in zip(params, events))
    return dist.sample(key, *params)


class Predict(Handler):
    """Latent sites read from `state.reads` (with `prior`, or where it has no value,
    sampled from the model); named observations sampled and recorded at their
    addresses; unnamed ones skipped."""

    reads_observed_values = False

    def __init__(self, prior: bool):
        self.prior = prior

    def site(self, site, state):
        dist, addr = site.dist, site.addr
        if self.prior or addr not in state.reads:
            # a site the guide does not propose (a NumPyro observation given None at
            # new inputs) is drawn from the model given the guide's latents, as
            # NumPyro's Predictive(model, guide=...) draws it
            key, sub = jax.random.split(state.key)
            value = dist.sample(sub, *site.params)
            return value, replace(self.record(state, addr, value, 0.0, dist), key=key)
        name = str(Address(addr))
        value = state.reads[addr]
        if jnp.shape(value) != site.shape:
            raise ValueError(
                f"gv.predictive: the guide's value at address {name!r} "
                f"({dist.label}) has shape {jnp.shape(value)} but the model's site has shape "
                f"{site.shape}")
        state.visited.add(addr)
        return value, self.record(state, addr, value, 0.0, dist)

    def deterministic(self, site, state):
        (value,) = site.params
        return self.record(state, site.addr, value, 0.0, site.dist)

    def observe(self, site, state):
        if site.addr is None:  # unnamed: nothing to return
            return state
        key, sub = jax.random.split(state.key)
        value = _draw_like(site.dist, sub, site.params, site.observed)
        return replace(self.record(state, site.addr, value, 0.0, site.dist), key=key)


def _unnamed_observations(jaxpr: Any) -> list[str]:
    """Source lines of the unnamed `gv.observe` calls of a program's jaxpr."""
    return [f"{observation_text(eqn)} at {jx.source_line(eqn)}"
            for eqn, _ in jx.equations(jaxpr)
            if eqn.primitive is observe_p and SiteEqn.of(eqn).addr is None]


def _path(site: Any) -> tuple:
    if isinstance(site, tuple):
        return site
    if isinstance(site, str):
        return Address.parse(site)
    raise TypeError(f"gv.predictive: sites are addresses such as \"y\", \"data/y\" or "
                    f"(\"data\", \"y\"); got {site!r}")


def _predict_one(model: GenFn, key: jax.Array, latents: ChoiceMap | None, args: tuple) -> ChoiceMap:
    out = model.interpret(Predict(prior=latents is None), *args, key=key, choices=latents)
    if latents is not None:
        given = latents.flat()
        unvisited = set(given) - out.visited
        if unvisited:
            names = sorted(str(Address(a)) for a in unvisited)
            sampled = [a for a in out.choices.flat() if a not in given]
            hint = "".join(did_you_mean(a, sampled) for a in sorted(unvisited, key=str))
            raise MissingChoice(
                f"gv.predictive: the guide proposes addresses the model never samples: "
                f"{names}.{hint} Guide and model must have the same latent addresses (check "
                "the spelling).", min(unvisited, key=str))
    return out.choices


def _positive_int(value: Any, what: str) -> int:
    if not is_count(value):
        raise ValueError(f"gv.predictive: {what} is a positive int; got {value!r}")
    return operator.index(value)


def _draws(one: Callable[[jax.Array], Any], key: jax.Array, n: int, k: int | None) -> Any:
    """`one(fold_in(key, i))` for i < n, stacked; with `k`, computed k at a time in a
    `lax.scan` that writes each chunk into the output (no other buffer grows with n).
    The last chunk starts at n - k: it recomputes some draws of the one before, from
    the same keys, so every draw equals the unchunked one."""
    def chunk(start: Any, size: int) -> Any:
        return jax.vmap(lambda i: one(jax.random.fold_in(key, i)))(start + jnp.arange(size))

    if k is None or k >= n:
        return chunk(0, n)
    shapes = jax.eval_shape(lambda: chunk(0, k))
    out = jax.tree_util.tree_map(lambda a: jnp.zeros((n,) + a.shape[1:], a.dtype), shapes)

    def step(out: Any, c: jax.Array) -> tuple[Any, None]:
        start = jnp.minimum(c * k, n - k)
        return jax.tree_util.tree_map(
            lambda o, x: jax.lax.dynamic_update_slice_in_dim(o, x, start, 0),
            out, chunk(start, k)), None

    return jax.lax.scan(step, out, jnp.arange(-(-n // k)))[0]


def predictive(model: GenFn, guide: GenFn | None, params: Any, num_samples: int, *,
               sites: Sequence[Any] | None = None,
               batch_size: int | None = None) -> Callable[..., ChoiceMap]:
    """A function `(key, *args) -> ChoiceMap` of `num_samples` stacked draws (leading
    axis `num_samples`) of the model's latent sites, drawn from the guide, and of its
    observations named with `gv.observe(dist, value, name="y")`, drawn from the model
    given those latents instead of scored: the posterior predictive.

    Model and guide are called as `(params, *args)`, as objectives call them; the
    values passed for named observations are not used (only their shape, where the
    distribution's parameters broadcast against it), so new inputs come with None
    for them (`gv.observe(dist, None, name="y")` is allowed). `guide=None` draws the
    latents from the model's prior (the prior predictive); a latent site the guide does
    not propose is drawn from the model given the guide's latents (a NumPyro model's
    `obs=Y` with `Y=None` at new inputs, as NumPyro's `Predictive(model, guide=...)`
    draws it), and one the model never samples is an error. Unnamed observations are not
    returned; `sites` (addresses or address prefixes such as `"y"`, `"data/y"` or
    `("data", "y")`) keeps only those, and an address the draws lack is an error
    that lists the unnamed observations. Under `gv.vmap` / `gv.plate` / `gv.scan` the
    draws are stacked like choices, after the sample axis. Wrap the result in
    `jax.jit` to compile it.

    `batch_size=k` draws k samples at a time (a `lax.scan` over chunks of `vmap`ped
    draws), so the memory of the compiled draws, beyond the output itself, does not
    grow with `num_samples`. Sample i is drawn from `jax.random.fold_in(key, i)`
    whatever `batch_size` is, so the same key gives the same draws, chunked or not (up
    to floating-point rounding of batched arithmetic). `num_samples` need not be a
    multiple of k: the last chunk overlaps the one before and redraws some samples
    from the same keys.

    Args:
        model: the model, called as `(params, *args)`.
        guide: the guide to draw the latents from, or None for the prior predictive.
        params: the parameters passed to model and guide.
        num_samples: the number of draws.
        sites: addresses or address prefixes to keep (optional).
        batch_size: draws per chunk, bounding memory (optional).

    Returns:
        a function `(key, *args) -> ChoiceMap` of `num_samples` stacked draws.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp
        >>> @gv.gen
        ... def model(params, y):
        ...     mu = gv.normal(0.0, 1.0) @ "mu"
        ...     gv.observe(gv.normal(mu, 1.0), y, name="y")
        >>> @gv.gen
        ... def guide(params, y):
        ...     gv.normal(params["m"], 0.5, grad=gv.REPARAM) @ "mu"
        >>> draw = gv.predictive(model, guide, {"m": 1.0}, num_samples=100)
        >>> out = draw(jax.random.key(0), jnp.zeros(3))
        >>> out["mu"].shape, out["y"].shape
        ((100,), (100, 3))
        >>> chunked = gv.predictive(model, guide, {"m": 1.0}, num_samples=100, batch_size=30)
        >>> bool(jnp.allclose(chunked(jax.random.key(0), jnp.zeros(3))["y"], out["y"]))
        True
    """
    call = "gv.predictive(model, guide, params, num_samples)"
    require_program(model, "model", call)
    require_program(guide, "guide (None: draw latents from the prior)", call, optional=True)
    n = _positive_int(num_samples, "num_samples")
    k = None if batch_size is None else _positive_int(batch_size, "batch_size")
    wanted = None if sites is None else [_path(s) for s in sites]

    @takes_keywords
    def draw(key: jax.Array, *args: Any) -> ChoiceMap:
        check_key(key, "the function gv.predictive returns")
        full = (params,) + args
        derived = deterministic_of(guide, full)

        def one(k: jax.Array) -> ChoiceMap:
            k_guide, k_model = jax.random.split(k)
            latents = (None if guide is None
                       else without(guide.simulate(k_guide, *full).choices, derived))
            return _predict_one(model, k_model, latents, full)

        out = _draws(one, key, n, k)
        return out if wanted is None else _select(out, wanted, model, full)

    return draw


def _select(out: ChoiceMap, wanted: list, model: GenFn, args: tuple) -> ChoiceMap:
    flat = out.flat()
    for w in wanted:
        if not any(p[:len(w)] == w for p in flat):
            unnamed = _unnamed_observations(model.jaxpr(*args))
            hint = "" if not unnamed else (
                " The model's unnamed observations are not returned: " + "; ".join(unnamed)
                + ". Name one with gv.observe(dist, value, name=\"...\") to draw it.")
            raise MissingChoice(
                f"gv.predictive: no latent site or named observation at {'/'.join(w)!r}; the "
                f"draws hold {sorted('/'.join(p) for p in flat)}.{did_you_mean(w, list(flat))}"
                f"{hint}", w)
    return ChoiceMap({p: v for p, v in flat.items() if any(p[:len(w)] == w for w in wanted)})
