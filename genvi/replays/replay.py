"""Replays: the objective re-run for its value with some sites overridden.

MVD, ENUM and SD need the rest of the objective at other values of a site. A replay
evaluates the objective again, primal only, with the same key (so every other choice
is drawn the same) and *overrides*: (location, value) pairs, a location being the
site's enclosing equations and traced scan steps. This module holds what both the
interpreter (`genvi.adev.interpreter`) and the lane-tracked evaluator
(`genvi.replays.lanes`) need to agree on: how a level's key is split among its sites,
how a site's location is matched, and how a site draws its value in a replay.
`Replay` hands the lane analysis exactly that, not the interpreter object.

Example:
    >>> from genvi.replays.replay import same_site
    >>> same_site((0,), (0, 1)), bool(same_site((2,), (3,))), bool(same_site((2,), (2,)))
    (False, False, True)
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from genvi.core import jaxpr as jx
from genvi.core.primitives import RANDOMNESS, site_parts


def split_keys(jaxpr: Any, key: Any) -> dict:
    """One key per equation of `jaxpr` that consumes randomness (a sampling site, a
    draw of an expectation, or a body holding one), from a single split (one RNG
    call, not one per site)."""
    users = jx.consumers(jaxpr, RANDOMNESS)
    if len(users) <= 1:
        return {i: key for i in users}
    return dict(zip(users, jax.random.split(key, len(users))))


def same_site(a: tuple, b: tuple) -> Any:
    """Whether two site locations are the same: the same enclosing equations (by
    identity: JAX shares the jaxpr of a function traced twice, so an equation alone
    does not identify a site) and equal scan steps. False when statically different,
    else a traced boolean (or True)."""
    if len(a) != len(b):
        return False
    match: Any = True  # a Python bool or a traced boolean
    for x, y in zip(a, b):
        if hasattr(x, "primitive") or hasattr(y, "primitive"):
            if x is not y:
                return False
        else:
            match = jnp.logical_and(match, x == y)
    return match


def draw(eqn: Any, ins: list, site_key: Any, steps: tuple, overrides: tuple) -> Any:
    """A site's value in a replay: sampled with its key from its parameters `ins`
    (primal values), then the `overrides` that match its location (`steps` + `eqn`).
    An override's value may be a function of the draw (gv.SD: one lane set)."""
    dist, params, _, _ = site_parts(eqn, ins)
    value = dist.sample(site_key, *params)
    here = steps + (eqn,)
    for where, ov_value in overrides:
        match = same_site(here, where)
        if match is not False:
            if callable(ov_value):
                ov_value = ov_value(value)
            value = jnp.where(match, ov_value, value)
    return value


class Replay(NamedTuple):
    """What a replay of one objective run needs: the objective (a closed jaxpr), its
    key and primal inputs, the overrides in force, `control(eqn, ins, key, steps)`,
    which evaluates a control-flow equation holding sites as a replay does (values
    only), `whole(overrides)`, the objective's value with more sites overridden
    (the run's own evaluation, so that every other draw is the run's), and whether
    its run context allows lane-local and Markov-local replays."""

    closed: Any
    key: Any
    primals: list
    overrides: tuple
    control: Callable[..., list]
    whole: Callable[[tuple], Any]
    lane_local: bool = True

    def site(self, eqn: Any, ins: list, site_key: Any, steps: tuple) -> Any:
        """`draw` under this replay's overrides."""
        return draw(eqn, ins, site_key, steps, self.overrides)
