"""Lane-local replays: the rest of an objective at every lane's alternative, in O(B).

ENUM and MVD at a batched discrete site (B lanes: a plate of datapoints, particles)
need, for each lane l and alternative value a_l, the objective's value with lane l of
the site set to a_l and every other lane kept (the `Replays` a rule asks for,
`genvi.replays.engine`). Replaying the
whole objective per lane costs O(B) each, O(B²) in all. But the rest of the objective
usually touches lane l only through values computed lane by lane that are then summed
(a plate's log densities, an amortized guide over a batch). Then one evaluation of the
rest of the objective with *every* lane set to its alternative gives every lane's
replay at once: lane l's replay is the base value with lane l's part of each sum
swapped for its alternative.

This module evaluates the rest of the objective (after the site) on three kinds of
values, the way JAX's batching rules track a batch axis:

* a plain array: does not depend on the site;
* `Local(base, alt, axes)`: slice l along `axes` (the site's lane axes) depends only on
  lane l of the site; `base` at the sampled values, `alt` with every lane at its
  alternative;
* `Perturbed(values)`: an arbitrary value, one copy per lane's replay (`[lanes, ...]`).

Elementwise operations, broadcasts, transposes, reshapes that keep the lane axes,
reductions and matrix products along other axes keep `Local` (a rule per structure of
primitive, `genvi.replays.lane_rules`, on the registry `genvi.core.rules`). A sum or contraction
over the lane axes turns `Local` into `Perturbed` at O(size) cost. Anything that
couples lanes (a max or sort across the batch, a gather, a non-additive use) turns its
`Local` operands into `Perturbed` ones (`materialize`, O(B × size)) and runs per
replay under `vmap`: the general path, correct for any program, taken only where the
lanes couple. A `scan` holding sampling sites is tracked through (`lane_scan`,
`markov_scan`); a `cond` holding them, on lane-tracked values, runs per replay the same
way, each lane's copy as a whole replay evaluates it (the run's key, its overrides). A
`cond` holding the replayed site itself falls back to whole-objective replays (the
engine, `genvi.replays.engine`, answers `Fallback`).
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from genvi.replays.lane_rules import rule_for
from genvi.replays.lane_scan import lane_scan
from genvi.replays.markov_scan import markov_scan, scans_over_lanes
from genvi.replays.replay import Replay, same_site, split_keys
from genvi.replays.values import Coupled, Local, Perturbed, is_tracked
from genvi.core import jaxpr as jx
from genvi.core.walk import Hooks, env_of, walk
from genvi.core.draws import DrawEqn, draw_p
from genvi.core.primitives import RANDOMNESS, sample_p, site_parts

class LaneEval:
    """Evaluates the rest of one objective (after one site) on lane-tracked values."""

    def __init__(self, replay: Replay, site_shape: tuple, target: tuple | None = None,
                 every_step: tuple | None = None):
        self.replay = replay  # the run's key, inputs and overrides (`genvi.replays.replay`)
        # (location, alternative): the site made lane-tracked where it is sampled (a
        # site inside `scan`, at a traced step); None when the caller sets its value
        self.target = target
        # (scan location, site location below a step, alternatives [T, ...]): the site
        # at every step of a scan, the steps being the first lane axis (Markov-local)
        self.every_step = every_step
        self.site_shape = tuple(site_shape)
        self.lanes = math.prod(self.site_shape)
        self.coupled: list[str] = []  # primitives where lanes coupled (for `explain`)
        self.windows: list[int] = []  # steps a change reaches, per Markov-local scan
        # elements written once per lane as arrays (`Perturbed` results holding more
        # than a number per lane: a scalar per lane costs what an elementwise operation
        # on the lanes does), and what the same equations write in one evaluation:
        # lane-by-lane replays' cost against one more evaluation of the rest
        self.per_lane_elements = 0
        self.once_elements = 0

    def sub(self, site_shape: tuple, target: tuple | None) -> "LaneEval":
        """An evaluator for one step's body of a Markov-local scan: lanes `site_shape`
        (the site's own), the same replay, notes shared with this one."""
        ev = LaneEval(self.replay, site_shape, target)
        ev.coupled, ev.windows = self.coupled, self.windows
        return ev

    # -- values -----------------------------------------------------------------------
    def materialize(self, v: Any) -> Perturbed:
        """Any value as one copy per lane's replay."""
        if isinstance(v, Perturbed):
            return v
        if not isinstance(v, Local):
            return Perturbed(jnp.broadcast_to(v, (self.lanes,) + jnp.shape(v)))
        shape = jnp.shape(v.base)
        if not self.site_shape:  # a single lane: its replay is the alternative
            return Perturbed(v.alt[None])
        lane_index = np.unravel_index(np.arange(self.lanes), self.site_shape)
        mask = np.ones((self.lanes,) + (1,) * len(shape), bool)
        for coord, axis in zip(lane_index, v.axes):
            at = np.arange(shape[axis]).reshape([-1 if a == axis else 1 for a in range(len(shape))])
            mask = mask & (coord.reshape((-1,) + (1,) * len(shape)) == at[None])
        return Perturbed(jnp.where(mask, v.alt[None], v.base[None]))

    def _general(self, eqn: Any, ins: list, evaluate: Any = None) -> list:
        """Evaluate `eqn` once per lane's replay (lanes coupled here), by
        `evaluate(*ins)` (default: the equation itself)."""
        if self.lanes > 1 and any(isinstance(x, Local) for x in ins):
            self.coupled.append(jx.name_of(eqn))
        evaluate = evaluate or (lambda *a: jx.eval_eqn(eqn, a))
        return [Perturbed(o) for o in self._per_lane(ins, evaluate)]

    def _per_lane(self, ins: list, f: Any) -> Any:
        """`f(*ins)` once per lane's replay: lane-tracked operands as each lane's copy."""
        ins = [self.materialize(x) if isinstance(x, Local) else x for x in ins]
        axes = [0 if isinstance(x, Perturbed) else None for x in ins]
        vals = [x.values if isinstance(x, Perturbed) else x for x in ins]
        return jax.vmap(f, in_axes=axes)(*vals)

    # -- evaluation -----------------------------------------------------------------
    def level(self, jaxpr: Any, start: int, env: dict, keys: dict, steps: tuple) -> list:
        """Evaluate `jaxpr`'s equations from the `start`-th on, lane-tracked (a walk on
        `genvi.core.walk`, by `_Level`'s hooks)."""
        return walk(jaxpr, env, _Level(self, keys, steps), start=start)

    def _holds_target(self, eqn: Any, steps: tuple) -> bool:
        """Whether `eqn` (at `steps`) holds the site that becomes lane-tracked."""
        loc = (self.every_step[0] if self.every_step is not None
               else () if self.target is None else self.target[0])
        return len(loc) > len(steps) and loc[len(steps)] is eqn

    def _scan(self, eqn: Any, ins: list, key: Any, steps: tuple) -> list:
        if self.every_step is not None and _at(self.every_step[0], steps + (eqn,)):
            return markov_scan(self, eqn, ins, key, steps, self.every_step[1:])
        if scans_over_lanes(eqn, ins):
            return markov_scan(self, eqn, ins, key, steps)
        return lane_scan(self, eqn, ins, key, steps)

    def _sample(self, eqn: Any, ins: list, key: Any, steps: tuple) -> Any:
        value = self._draw(eqn, ins, key, steps)
        if self.target is None or len(self.target[0]) != len(steps) + 1:
            return value
        match = same_site(steps + (eqn,), self.target[0])
        if match is False:
            return value
        # the site itself (at the traced step, if any): every lane at its alternative
        lanes = tuple(range(len(eqn.outvars[0].aval.shape)))
        if isinstance(value, Perturbed) or (isinstance(value, Local) and value.axes != lanes):
            raise Coupled("the site's own parameters")
        base, alt = (value.base, value.alt) if isinstance(value, Local) else (value, value)
        return Local(base, jnp.where(match, self.target[1].astype(base.dtype), alt), lanes)

    def _draw(self, eqn: Any, ins: list, key: Any, steps: tuple) -> Any:
        """A site's value in the replays, as a replay draws it (same key, overrides)."""
        replay_site = self.replay.site
        if all(not is_tracked(x) for x in ins):
            return replay_site(eqn, list(ins), key, steps)
        dist = site_parts(eqn, [_shape_of(x) for x in ins])[0]
        locals_ = [x for x in ins if isinstance(x, Local)]
        value_shape = eqn.outvars[0].aval.shape
        if (not any(isinstance(x, Perturbed) for x in ins)
                and getattr(dist, "lanewise", False)  # a sample with lane-local parameters is lane-local
                and all(jnp.shape(x.base) == value_shape and x.axes == locals_[0].axes
                        for x in locals_)):
            base = replay_site(eqn, [x.base if isinstance(x, Local) else x for x in ins],
                               key, steps)
            alt = replay_site(eqn, [x.alt if isinstance(x, Local) else x for x in ins],
                              key, steps)
            return Local(base, alt, locals_[0].axes)
        if self.lanes > 1:
            self.coupled.append(f"gv.{getattr(dist, 'name', '?')} sample")
        return Perturbed(self._per_lane(ins, lambda *a: replay_site(eqn, list(a), key, steps)))


class _Level(Hooks):
    """One level of a lane-tracked evaluation (a jaxpr's equations, at `steps`, with the
    run's `keys`). An equation on values none of which is lane-tracked, and that holds
    no site becoming lane-tracked, is JAX's; a control-flow equation holding sampling
    sites is replayed whole where its operands are the same in every lane, a scan is
    tracked through (`LaneEval._scan`), a cond on lane-tracked values runs per lane's
    replay, anything else holding sites couples the lanes; a call is walked into; every
    other equation goes by its lane rule (`rule_for`) or per lane's replay."""

    rules = {
        sample_p: lambda self, i, eqn, ins: [
            self.ev._sample(eqn, ins, self.keys.get(i), self.steps)],
        draw_p: lambda self, i, eqn, ins: self._draw(i, eqn, ins),
    }

    def __init__(self, ev: LaneEval, keys: dict, steps: tuple):
        self.ev, self.keys, self.steps = ev, keys, steps

    def __call__(self, i: int, eqn: Any, ins: list) -> list:
        outs = super().__call__(i, eqn, ins)
        ev = self.ev
        ev.once_elements += sum(math.prod(v.aval.shape) for v in eqn.outvars)
        ev.per_lane_elements += sum(jnp.size(o.values) for o in outs
                                    if isinstance(o, Perturbed) and jnp.size(o.values) > ev.lanes)
        return outs

    def interprets(self, eqn: Any, ins: list) -> bool:
        return bool(jx.sub_jaxprs(eqn))

    def _draw(self, i: int, eqn: Any, ins: list) -> list:
        if not _same(ins):   # a draw of an expectation: its lanes are its own
            raise Coupled("an expectation's draw")
        return [DrawEqn.of(eqn).estimate(self.keys.get(i), ins)[0]]

    def _for_jax(self, eqn: Any, ins: list) -> bool:
        """Whether JAX evaluates `eqn` as it is: no lane-tracked operand, and not holding
        the site that becomes lane-tracked."""
        return _same(ins) and not self.ev._holds_target(eqn, self.steps)

    def _replayed(self, i: int, eqn: Any, ins: list) -> list:
        """A control-flow equation holding sites, on the same values in every lane: as a
        whole replay evaluates it."""
        return self.ev.replay.control(eqn, ins, self.keys.get(i), self.steps)

    def call(self, i: int, view: jx.CallEqn, ins: list) -> list:
        if self._for_jax(view.eqn, ins):
            # a call holding sites draws as the run drew them, as a scan or cond does
            if jx.nests(view.eqn, RANDOMNESS):
                return self._replayed(i, view.eqn, ins)
            return jx.eval_eqn(view.eqn, ins)
        body = view.body   # jit, remat, a custom derivative: its body
        if body is not None and len(body.jaxpr.invars) == len(ins):
            sub_keys = split_keys(body.jaxpr, self.keys.get(i))
            return self.ev.level(body.jaxpr, 0, env_of(body, ins), sub_keys,
                                 self.steps + (view.eqn,))
        return self.ev._general(view.eqn, ins)

    custom = call

    def scan(self, i: int, view: jx.ScanEqn, ins: list) -> list:
        eqn = view.eqn
        if not _same(ins) or self.ev._holds_target(eqn, self.steps):
            return self.ev._scan(eqn, ins, self.keys.get(i), self.steps)
        if jx.nests(eqn, RANDOMNESS):
            return self._replayed(i, eqn, ins)
        return jx.eval_eqn(eqn, ins)

    def cond(self, i: int, view: jx.CondEqn, ins: list) -> list:
        eqn = view.eqn
        if jx.nests(eqn, RANDOMNESS):
            if _same(ins):
                return self._replayed(i, eqn, ins)
            if self.ev._holds_target(eqn, self.steps):
                raise Coupled(jx.name_of(eqn))
            # sites in a cond on lane-tracked values: each lane's replay evaluates the
            # cond as a whole replay does (same key), so the lanes stay exact
            return self.ev._general(eqn, ins, lambda *a: self._replayed(i, eqn, list(a)))
        if self._for_jax(eqn, ins):
            return jx.eval_eqn(eqn, ins)
        return self.ev._general(eqn, ins)

    def _holding_sites(self, i: int, eqn: Any, ins: list) -> list:
        """Another equation holding sites (a while loop): replayed whole where every
        lane is the same, else its lanes couple."""
        if _same(ins):
            return self._replayed(i, eqn, ins)
        raise Coupled(jx.name_of(eqn))

    def while_(self, i: int, view: jx.WhileEqn, ins: list) -> list:
        if jx.nests(view.eqn, RANDOMNESS):
            return self._holding_sites(i, view.eqn, ins)
        if self._for_jax(view.eqn, ins):
            return jx.eval_eqn(view.eqn, ins)
        return self.ev._general(view.eqn, ins)

    def unsupported(self, i: int, eqn: Any, ins: list) -> list:
        if jx.nests(eqn, RANDOMNESS):
            return self._holding_sites(i, eqn, ins)
        return self.other(i, eqn, ins)

    def other(self, i: int, eqn: Any, ins: list) -> list:
        if self._for_jax(eqn, ins):
            return jx.eval_eqn(eqn, ins)
        if any(isinstance(x, Perturbed) for x in ins):
            return self.ev._general(eqn, ins)
        rule = rule_for(eqn)
        out = None if rule is None else rule(eqn, ins)
        return self.ev._general(eqn, ins) if out is None else out


def _same(ins: list) -> bool:
    """Whether no operand is lane-tracked (every lane's replay sees the same values)."""
    return all(not is_tracked(x) for x in ins)


def _at(location: tuple, here: tuple) -> bool:
    """Whether two locations made of equations only are the same (by identity)."""
    return len(location) == len(here) and all(a is b for a, b in zip(location, here))


def _shape_of(x: Any) -> Any:
    if isinstance(x, Local):
        return x.base
    if isinstance(x, Perturbed):
        return x.values[0]
    return x
