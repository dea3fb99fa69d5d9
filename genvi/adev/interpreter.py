"""The ADEV interpreter: an objective's jaxpr in, a forward-mode estimator out.

`estimate_jvp(closed, key, primals, tangents)` evaluates the objective's jaxpr on
dual numbers. Ordinary equations are differentiated by JAX (`jvp_eqn`); each
`sample_p` site calls its strategy's rule with a continuation:

* `k.dual(v, dv)` continues in place; the rule's score and tangent terms are
  accumulated and added to the final tangent as `score × result + offset`
  (so REPARAM, REINFORCE and baselines never re-run anything);
* `k.pure(v)` is the rest of the program with the site's value replaced by `v`,
  resolved at trace time by replaying the objective (primal only, same key, so
  every other choice is the same) with an *override* at this site and scan step;
  replays are vectorized over alternatives with `vmap`. A rule that wants a
  weighted sum of replays says so (`Deferred.plus_replays`) and lets the
  interpreter choose when to run them;
* `k.dual_map(vs)` (top level only) evaluates the remaining equations, dually, at
  each value in `vs` under one `vmap`: exact enumeration in one trace.

Sites inside `scan` bodies and `cond` branches are handled in place: the scan is
re-emitted with the accumulators in its carry, and `k.pure` replays the objective
with the override at the current step. Replays asked for with `plus_replays` are
evaluated by the replay engine (`genvi.replays.engine`), which owns the chain
lane-local → Markov-local → whole-objective; inside a scan they leave the body as
outputs and run after the scan (`ScanReplays`). Nothing is unrolled: trace size does
not grow with batch, particle or step counts.
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp

from genvi.adev import dual as d
from genvi.adev.continuation import SiteContinuation
from genvi.adev.dual import Dual
from genvi.replays.engine import Replay, ScanReplays, draw, split_keys
from genvi.core import jaxpr as jx
from genvi.core.context import RunContext, current, using
from genvi.core.draws import DrawEqn, draw_p
from genvi.core.primitives import RANDOMNESS, SiteEqn, sample_p, site_parts
from genvi.core.strategy import missing_strategy_error
from genvi.core.tracing import GENVI_CONDS
from genvi.core.walk import Hooks, Stop, env_of, walk


def _instantiate(t: Any, p: Any) -> Any:
    if not jx.is_float(p):
        return None
    if t is None:
        return jnp.zeros(jnp.shape(p), jnp.result_type(p))
    return jax.lax.convert_element_type(t, jnp.result_type(p))


class _Run:
    """One evaluation of an objective jaxpr (the main dual run, or a replay)."""

    def __init__(self, closed: Any, key: Any, primals: Sequence, tangents: Sequence,
                 overrides: tuple = (), replay: bool = False,
                 context: RunContext | None = None):
        # what the run is for (its observer, lane-local replays): read once, here,
        # and passed on to its replays and the replay engine
        self.context = current() if context is None else context
        self.closed, self.key = closed, key
        self.primals, self.tangents = list(primals), list(tangents)
        self.overrides, self.replay = overrides, replay
        self.dual = any(t is not None for t in self.tangents)
        # what strategies keep across the run (gv.SD's pruning pool), by class; a
        # replay runs no rule, so it keeps nothing
        self.states = {} if replay else {cls: cls() for cls in run_state_classes(closed)}
        outs = closed.jaxpr.outvars
        self.out_dtype = outs[0].aval.dtype if outs else jnp.float32

    # -- entry points ---------------------------------------------------------
    def run(self) -> Dual:
        with GENVI_CONDS.set(), jx.genvi_conds:
            return self._run_top()

    def _run_top(self) -> Dual:
        env = env_of(self.closed, [Dual(p, t) for p, t in zip(self.primals, self.tangents)],
                     wrap=Dual)
        return self.level(self.closed.jaxpr, 0, env, self.key, (), True)

    def with_override(self, override: tuple) -> "_Run":
        return _Run(self.closed, self.key, self.primals, self.tangents,
                    self.overrides + (override,), self.replay, self.context)

    def replay_with(self, override: tuple) -> Any:
        """The objective's value (primal only) with one more site overridden."""
        return self._replay_overrides((override,))

    # -- evaluation -------------------------------------------------------------
    def level(self, jaxpr: Any, start: int, env: dict, key: Any, steps: tuple, top: bool,
              keys: dict | None = None, pending: ScanReplays | None = None):
        """Evaluate `jaxpr`'s equations from the `start`-th on. At top level return the final `Dual`;
        inside a body return `(outs, (score, offset))`. `key` is split once into
        one key per consumer (site or control equation) of this jaxpr; `keys` passes
        that split on to a continuation. Replays that rules ask for are collected in
        `pending` (a scan body's) when given, else evaluated at once."""
        keys = split_keys(jaxpr, key) if keys is None else keys
        hooks = _Level(self, jaxpr, env, keys, steps, top, pending)
        outs = walk(jaxpr, env, hooks, start=start, literal=Dual)
        if isinstance(outs, Stop):  # a rule evaluated the rest of the program
            return outs.value
        if top:
            return self._finish(outs[0], hooks.acc.score, hooks.acc.offset)
        return outs, (hooks.acc.score, hooks.acc.offset)

    def _site(self, level: "_Level", i: int, eqn: Any, ins: list) -> Any:
        """A sampling site of `level`'s walk: its strategy's rule with the rest of the
        walk as continuation; its outputs, or `Stop` with the final `Dual`."""
        site_key, steps, acc = level.keys[i], level.steps, level.acc
        if self.replay:
            return [Dual(self._replay_site(eqn, ins, site_key, steps))]
        dist, params, strategy, addr = site_parts(
            eqn, [x.primal for x in ins], [x.tangent for x in ins])
        if strategy is None:  # allowed only where nothing is differentiated
            if any(x.tangent is not None for x in ins[:len(params)]):
                raise missing_strategy_error(dist, addr)
            return [Dual(self._replay_site(eqn, ins, site_key, steps))]
        k = SiteContinuation(self, level.jaxpr, i, eqn, level.env, level.keys, steps, level.top)
        self.context.observer.site(eqn, dist, strategy, eqn.outvars[0].aval, steps,
                                   self.context.within)
        res = strategy.jvp(dist, site_key, params, [x.tangent for x in ins[:len(params)]], k)
        if isinstance(res, Dual):  # the rule evaluated the rest of the program
            return Stop(self._finish(res, acc.score, acc.offset))
        if res.replays is not None and level.pending is not None:
            level.pending.add(steps + (eqn,), res.value, res.replays)
            self.context.observer.replays(eqn, res.replays.weights,
                                          "whole-objective replays, after the scan")
        else:
            res = k.resolved(res)
        acc.add(res.score, res.offset)
        return [Dual(res.value, res.tangent if jx.is_float(res.value) else None)]

    def _draw(self, eqn: Any, ins: list, key: Any) -> Dual:
        """One draw of an expectation's estimator (`genvi.core.draws`): its forward
        estimator with this draw's key, at the operands and their tangents (values
        only in a replay); `explain` shows its sites within it."""
        view = DrawEqn.of(eqn)
        tangents = None if self.replay or not self.dual else [x.tangent for x in ins]
        with using(within=self.context.within + (view.label,)):
            value, tangent = view.estimate(key, [x.primal for x in ins], tangents)
        return Dual(value, tangent)

    def _finish(self, out: Dual, score: Any, offset: Any) -> Dual:
        for state in self.states.values():
            offset = d.add(offset, state.finish(self._replay_overrides, out.primal))
        tangent = d.add(d.add(out.tangent, d.mul(out.primal, score)), offset)
        if tangent is not None:
            tangent = jax.lax.convert_element_type(tangent, jnp.result_type(out.primal))
        return Dual(out.primal, tangent)

    def replay_context(self) -> Replay:
        """What the lane-tracked evaluator (`genvi.replays.lanes`) needs to replay this
        run: its objective, key, inputs and overrides, and control flow as a replay."""
        return Replay(self.closed, self.key, self.primals, self.overrides,
                      self._replay_control, self._replay_overrides, self.context.lane_local)

    def _replay_control(self, eqn: Any, ins: list, key: Any, steps: tuple) -> list:
        """A control-flow equation holding sites, evaluated as in a replay (values
        only, this run's overrides)."""
        run = _Run(self.closed, self.key, self.primals, [None] * len(self.primals),
                   self.overrides, replay=True, context=self.context)
        level = _Level(run, None, {}, {0: key}, steps, False, None)
        return [x.primal for x in level.control(0, eqn, [Dual(x) for x in ins])]

    def _replay_overrides(self, overrides: tuple) -> Any:
        """The objective's value (primal only) with several more sites overridden."""
        return _Run(self.closed, self.key, self.primals, [None] * len(self.primals),
                    self.overrides + overrides, replay=True, context=self.context).run().primal

    def _replay_site(self, eqn: Any, ins: list, site_key: Any, steps: tuple) -> Any:
        return draw(eqn, [x.primal for x in ins], site_key, steps, self.overrides)

    def _enter(self) -> dict:
        return {cls: state.enter() for cls, state in self.states.items()}

    def _leave(self, saved: dict) -> dict:
        return {cls: state.leave(saved[cls]) for cls, state in self.states.items()}

    def _acc_zero(self) -> Any:
        return jnp.zeros((), self.out_dtype) if self.dual else None

    def _scan(self, scan: jx.ScanEqn, ins: list, key: Any, steps: tuple):
        eqn, body = scan.eqn, scan.body
        consts, init, xs = scan.split(ins)
        dual = self.dual  # replays run without tangents, so they are never dual

        def tangents_of(xs_):
            return [_instantiate(x.tangent, x.primal) if dual else None for x in xs_]

        # Replays of sites in the body are deferred: the step emits each site's
        # alternatives and weights; after the scan, replays run several steps per vmap.
        pending = ScanReplays(len(steps) + 2) if dual else None

        def step(carry, x):
            c_p, c_t, i, s, o = carry
            x_p, x_t, key = x
            env = env_of(body, consts + [Dual(p, t) for p, t in zip(c_p, c_t)]
                         + [Dual(p, t) for p, t in zip(x_p, x_t)], wrap=Dual)
            if pending is not None:
                pending.start()
            saved = self._enter()  # what strategies keep of this step leaves as outputs
            outs, (ds, do) = self.level(body.jaxpr, 0, env, key, steps + (eqn, i), False,
                                        pending=pending)
            kept = self._leave(saved)
            new_c, ys = scan.split_outs(outs)
            s, o = (None, None) if not dual else (d.add(s, ds), d.add(o, do))
            deferred = () if pending is None else pending.arrays(i)
            return ((tuple(x.primal for x in new_c), tuple(tangents_of(new_c)), i + 1,
                     s, o), (tuple(y.primal for y in ys), tuple(y.tangent for y in ys), deferred, kept))

        init_carry = (tuple(x.primal for x in init), tuple(tangents_of(init)),
                      jnp.zeros((), jnp.int32), self._acc_zero(), self._acc_zero())
        xs_in = (tuple(x.primal for x in xs), tuple(x.tangent if dual else None for x in xs),
                 None if key is None else jax.random.split(key, scan.length))
        (c_p, c_t, _, s, o), (y_p, y_t, deferred, kept) = scan.scan(step, init_carry, xs_in)
        if pending is not None:
            for below, weights, total in pending.totals(self.replay_context(),
                                                        steps + (eqn,), deferred):
                self.context.observer.total(below[-1], weights, total, scan.length)
                o = d.add(o, total.value)
        for cls, state in self.states.items():
            state.after_scan(key, kept[cls])
        outs = [Dual(p, t) for p, t in zip(c_p, c_t)] + [Dual(p, t) for p, t in zip(y_p, y_t)]
        return outs, (s, o)

    def _cond(self, view: jx.CondEqn, ins: list, key: Any, steps: tuple):
        eqn = view.eqn
        index, ops = ins[0].primal, ins[1:]
        dual = self.dual  # replays run without tangents, so they are never dual

        def make(branch):
            def f(ops_p, ops_t, key):
                env = env_of(branch, [Dual(p, t) for p, t in zip(ops_p, ops_t)], wrap=Dual)
                saved = self._enter()
                outs, (s, o) = self.level(branch.jaxpr, 0, env, key, steps + (eqn,), False)
                kept = self._leave(saved)  # what strategies keep of the branch
                o_t = [_instantiate(x.tangent, x.primal) if dual else None for x in outs]
                zero = self._acc_zero()
                return ([x.primal for x in outs], o_t,
                        d.add(zero, s) if dual else None, d.add(zero, o) if dual else None, kept)
            return f

        branches = [make(b) for b in view.branches]
        ops_p, ops_t = [x.primal for x in ops], [x.tangent if dual else None for x in ops]
        if dual:
            # Tangents must not enter a `cond`: under vmap JAX turns a batched cond
            # into a select whose stop_gradient on the operands cannot be transposed.
            # Evaluate every branch and select (what vmap of a cond does anyway).
            which = jnp.clip(index, 0, len(branches) - 1).astype(jnp.int32)
            results = [f(ops_p, ops_t, key) for f in branches]
            for cls, state in self.states.items():
                state.after_cond(key, which, [r[4][cls] for r in results])
            o_p, o_t, s, o = jax.tree_util.tree_map(
                lambda *xs: _select(which, xs), *[r[:4] for r in results],
                is_leaf=lambda x: x is None)
        else:
            o_p, o_t, s, o, _ = jax.lax.switch(index, branches, ops_p, ops_t, key)
        return [Dual(p, t) for p, t in zip(o_p, o_t)], (s, o)


def run_state_classes(closed: Any) -> list:
    """The `RunState` classes of the strategies at an objective's sites (nested
    bodies included, the strategies a `gv.switch` chooses among too), in order."""
    strategies = (SiteEqn.of(eqn).strategy for eqn, _ in jx.equations(closed)
                  if eqn.primitive is sample_p)
    chosen = (s for strategy in strategies for s in getattr(strategy, "strategies", (strategy,)))
    return list(dict.fromkeys(s.run_state for s in chosen
                              if getattr(s, "run_state", None) is not None))


class _Level(Hooks):
    """The walk of one level of a run (a jaxpr or a body): sampling sites run their
    strategy's rule, draws their estimator; control flow holding randomness (or a
    `cond` reached by tangents) is interpreted from its typed view; every other
    equation is differentiated by JAX. `acc` gathers the score and offset terms."""

    def __init__(self, run: _Run, jaxpr: Any, env: dict, keys: dict, steps: tuple,
                 top: bool, pending: ScanReplays | None):
        self.run, self.jaxpr, self.env, self.keys = run, jaxpr, env, keys
        self.steps, self.top, self.pending = steps, top, pending
        self.acc = _Accumulated()

    rules = {
        sample_p: lambda self, i, eqn, ins: self.run._site(self, i, eqn, ins),
        draw_p: lambda self, i, eqn, ins: [self.run._draw(eqn, ins, self.keys[i])],
    }

    def interprets(self, eqn: Any, ins: list) -> bool:
        # A `cond` with tangents (even without sites, e.g. in a log density) is
        # evaluated branch by branch too: under vmap JAX turns the JVP of a cond with
        # a batched predicate into a select that cannot be transposed. A custom
        # derivative's body is not differentiated (its rule is): its conds are JAX's.
        return (jx.nests(eqn, RANDOMNESS)
                or (any(x.tangent is not None for x in ins) and _holds_cond(eqn)
                    and not jx.has_custom_rule(eqn)))

    def _body(self, outs_terms: tuple) -> list:
        outs, (s, o) = outs_terms
        self.acc.add(s, o)
        return outs

    def scan(self, i: int, view: jx.ScanEqn, ins: list) -> list:
        return self._body(self.run._scan(view, ins, self.keys.get(i), self.steps))

    def cond(self, i: int, view: jx.CondEqn, ins: list) -> list:
        return self._body(self.run._cond(view, ins, self.keys.get(i), self.steps))

    def call(self, i: int, view: jx.CallEqn, ins: list) -> list:
        body = view.body
        return self._body(self.run.level(body.jaxpr, 0, env_of(body, ins, wrap=Dual),
                                         self.keys.get(i), self.steps + (view.eqn,), False,
                                         pending=self.pending))

    def unsupported(self, i: int, eqn: Any, ins: list) -> list:
        raise NotImplementedError(
            f"genvi cannot differentiate sampling sites inside `{jx.name_of(eqn)}`. "
            "Use gv.scan / jax.lax.scan (fixed length) instead of while loops, and keep "
            "sampling out of custom_jvp/custom_vjp functions.")

    def other(self, i: int, eqn: Any, ins: list) -> list:
        outs, touts = jx.jvp_eqn(eqn, [x.primal for x in ins], [x.tangent for x in ins])
        return [Dual(p, t) for p, t in zip(outs, touts)]


class _Accumulated:
    """A walk's score and offset: the terms its sites' rules add to the final tangent."""

    def __init__(self) -> None:
        self.score = self.offset = None

    def add(self, score: Any, offset: Any) -> None:
        self.score, self.offset = d.add(self.score, score), d.add(self.offset, offset)


def _holds_cond(eqn: Any) -> bool:
    return eqn.primitive in jx.CONDS or jx.nests(eqn, jx.CONDS)


def _select(which: Any, cases: tuple) -> Any:
    if cases[0] is None:
        return None
    return jax.lax.select_n(which, *cases)


def estimate_jvp(closed: Any, key: Any, primals: Sequence, tangents: Sequence,
                 context: RunContext | None = None) -> Dual:
    """Run the forward-mode estimator of the objective `closed` (a closed jaxpr
    with one scalar output) at `primals` in direction `tangents` (None = zero);
    `context`: what the run is for (None: the run context in force)."""
    return _Run(closed, key, primals, tangents, context=context).run()


def sample_outputs(closed: Any, key: Any, primals: Sequence) -> list:
    """Run an objective-style jaxpr for its values only: every site samples (no
    strategies needed); returns all outputs."""
    run = _Run(closed, key, primals, [None] * len(primals), replay=True)
    env = env_of(closed, [Dual(p) for p in primals], wrap=Dual)
    with GENVI_CONDS.set(), jx.genvi_conds:
        outs, _ = run.level(closed.jaxpr, 0, env, key, (), False)
    return [o.primal for o in outs]
