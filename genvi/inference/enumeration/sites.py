"""Stage 1 of enumeration: which sites are summed (`summed_sites`), and over what
finite supports; `NotSummable`, the engine's refusal, which the marginal names the
sites in.

Example:
    >>> from types import SimpleNamespace as S
    >>> import numpy as np
    >>> a = S(support=np.array([0, 1]), dtype=np.int32)
    >>> [v.tolist() for v in joint_values([a, a])]
    [[0, 0, 1, 1], [0, 1, 0, 1]]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np

from genvi.adev.strategies import ENUM
from genvi.core.mistakes import addr_name
from genvi.core.strategy import supports
from genvi.core.tracing import merge_args, split_args
from genvi.gen.handlers import RecordSites

#: joint values of the sites one factor (or one step of a chain) depends on, at most
MAX_JOINT = 1 << 16


class NotSummable(Exception):
    """The log density is not a sum of terms that this engine contracts exactly."""


@dataclass(frozen=True)
class AuxSite:
    """A discrete auxiliary site: its choice's shape (scan steps and lanes included),
    one draw's shape, its support, and the product of its enclosing `gv.plate` scales."""

    addr: tuple
    shape: tuple
    draw_shape: tuple
    dtype: Any
    dist: Any
    support: Any
    scale: float = 1.0

    @property
    def name(self) -> str:
        return addr_name(self.addr)


class _NotStatic(Exception):
    """A site's support depends on values known only when the program runs."""


def summed_sites(g: Any, is_kept: Callable[[tuple], bool], args: tuple) -> list[AuxSite]:
    """The discrete sites of `g` not kept, found by running `g` abstractly on `args`, each
    with its support at the parameters it saw (a site without a finite one is refused)."""
    dyn, static, treedef, mask = split_args(args)
    handler = RecordSites()

    def run(k, dyn, handler=handler):
        return g.interpret(handler, *merge_args(dyn, static, treedef, mask), key=k).choices.flat()
    shapes = jax.eval_shape(run, jax.random.key(0), dyn)
    fixed = None  # the sites' parameters with those fixed at tracing as values
    sites = []
    for addr, sd in shapes.items():
        if is_kept(addr):
            continue
        dist, params, scale, masked = handler.found[addr]
        if masked:
            raise ValueError(f"gv.enumeration: site {addr_name(addr)!r} ({dist.label}) is "
                             "sampled in a branch of a cond that differs by lane; enumeration "
                             "does not sum such sites: keep it and give it a guide")
        try:
            site = _aux_site(g, addr, sd, dist, params, scale)
        except _NotStatic:
            if fixed is None:
                # again, the program already traced: what is computed from constants only
                # (a binomial's n broadcast over a plate) is computed as a value
                fixed = RecordSites()

                def again(k, dyn):
                    with jax.ensure_compile_time_eval():
                        return run(k, dyn, fixed)
                jax.eval_shape(again, jax.random.key(0), dyn)
            try:
                site = _aux_site(g, addr, sd, dist, fixed.found[addr].params, scale)
            except _NotStatic as err:
                raise ValueError(
                    f"gv.enumeration: site {addr_name(addr)!r} ({dist.label}) of {g.name} has "
                    "no static finite support here, so it cannot be summed: "
                    f"{err.__cause__}") from None
        sites.append(site)
    return sites


def _aux_site(g: Any, addr: tuple, sd: Any, dist: Any, params: tuple, scale: float) -> AuxSite:
    name = addr_name(addr)
    if not supports(dist, ENUM):
        raise ValueError(
            f"gv.enumeration: site {name!r} ({dist.label}) of {g.name} is not kept and has "
            "no finite support to sum over (gv.flip, gv.bernoulli and gv.categorical do). "
            f"Keep it (keep=[..., {name!r}]) and give it a guide, or marginalize it with "
            "gv.importance instead.")
    zeros = [jnp.zeros(jnp.shape(p), jnp.result_type(p)) for p in params]
    try:
        with jax.ensure_compile_time_eval():  # a constant, also inside a traced objective
            support = np.asarray(dist.support(*params))
    except (TypeError, jax.errors.TracerArrayConversionError,
            jax.errors.ConcretizationTypeError, jax.errors.UnexpectedTracerError) as err:
        raise _NotStatic() from err
    draw = jax.eval_shape(lambda *p: dist.sample(jax.random.key(0), *p), *zeros)
    if support.ndim != 1 or dist.value_event_ndim != 0:
        raise ValueError(f"gv.enumeration: site {name!r} ({dist.label}) has values that are "
                         "vectors; enumeration sums sites with one value per lane")
    return AuxSite(addr, tuple(sd.shape), tuple(draw.shape), sd.dtype, dist, support, scale)


def joint_values(sites: list) -> list:
    """Every joint value of `sites`: one array [C] per site, the last varying fastest."""
    combos = list(itertools.product(*[range(len(s.support)) for s in sites]))
    return [jnp.asarray(np.array([s.support[c[i]] for c in combos]), s.dtype)
            for i, s in enumerate(sites)]
