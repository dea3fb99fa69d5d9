"""Markov-local replays: a `scan` whose steps are lanes, evaluated in O(T).

A discrete site inside a `scan` body (ENUM, MVD, RLOO...) asks for the objective at
each step t with the site's value at step t changed. Replaying the objective per step
costs O(T) each, O(T²) in all. In a mean-field guide or an HMM, step t's value reaches
the rest of the objective only through the next few steps: the model's carry holds
z_{t-1} for one step and is then overwritten, and the log densities are *accumulated*
(`acc + term`), so a change at step t adds a difference to the total and is gone.

Here the steps are the first lane axis of the lane-tracked evaluator
(`genvi.replays.lanes`): the scan holding the site, with every step at its alternative,
returns its stacked outputs as `Local` along the step axis; a later scan over such a
value (the model's log density over the guide's z) is a scan over the lanes. Both are
evaluated by `markov_scan` in one `lax.scan`; at each step t the body runs

* once at the sampled values (the base run, whose carry goes on);
* once with step t's value at its alternative (round 0);
* once per earlier step whose change still sits in a carry (rounds 1 … W-1), on
  that carry as the previous step left it.

The window W is found before the scan, as JAX's batching rule finds batched carries:
the body is evaluated abstractly on the kinds of its carries, round after round, until
no carry depends on the change any more. Carries that only accumulate (`c + term`,
`c` used nowhere else) are run at zero and their differences summed per lane after
the scan, so they never keep a change alive. A carry that keeps a change for ever (an
autoregressive guide's state, an RNN) makes the window unbounded: `Coupled` is raised
and the objective is replayed whole, as exact as before.

A `cond` whose branches sample, on a step's changed value (a switching model's regime
choosing the branch that draws the continuous state), runs once per lane's replay with
the step's key (`genvi.replays.lanes`); at a step of one lane its output is that lane's
replay, and stacked over the steps it is `Local` along them, its base the base run's.

An output that a step's change reaches at later steps too (an emission mean computed
from z_{t-1} and z_t, observed after the scan), or one that mixes a step's lanes, is
held in every lane's replay (`Perturbed`: T × T step outputs, the base run's with the
steps each lane's change reached replaced), up to `MAX_OUTPUT_ELEMENTS`.

Cost: (W + 1) body evaluations per step and alternative, against T per step before.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from genvi.replays.lane_scan import PERTURBED, SAME, _decode, _encode, _kind
from genvi.replays.replay import split_keys
from genvi.replays.values import Coupled, Local, Perturbed, is_tracked
from genvi.core import jaxpr as jx
from genvi.core.walk import env_of


def scans_over_lanes(eqn: Any, ins: list) -> bool:
    """Whether `eqn` is a scan over the first lane axis: an operand it scans over is
    `Local` with that lane axis on its step axis."""
    _, _, xs = jx.ScanEqn.of(eqn).split(ins)
    return any(isinstance(x, Local) and x.axes and x.axes[0] == 0 for x in xs)


def markov_scan(ev: Any, eqn: Any, ins: list, key: Any, steps: tuple,
                holding: tuple | None = None) -> list:
    """Evaluate `scan` when its steps are the evaluator's first lane axis: a scan over
    `Local` operands along that axis, or (`holding = (below, alternatives)`) the scan
    holding the site, every step's value at `alternatives[t]`. Outputs are lane-tracked
    over all lanes (steps × the site's own lanes)."""
    scan = _MarkovScan(ev, eqn, ins, key, steps, holding)
    rounds = scan.window()
    ev.windows.append(len(rounds))
    final, incoming, terms, base_ys = scan.base_run()
    results = scan.rounds(rounds, incoming, terms)
    carries = [scan.final_carry(j, rounds, results, final[j]) for j in range(scan.carry_count)]
    ys = [scan.output(base_y, [res[2][j] for res in results], [rnd[2][j] for rnd in rounds])
          for j, base_y in enumerate(base_ys)]
    return carries + ys


class _MarkovScan:
    """One scan over the steps (see `markov_scan`): its body run at the base values, in
    round 0 and in the later rounds."""

    def __init__(self, ev: Any, eqn: Any, ins: list, key: Any, steps: tuple,
                 holding: tuple | None):
        scan = jx.ScanEqn.of(eqn)
        self.ev, self.eqn, self.steps, self.scan = ev, eqn, steps, scan
        self.body, self.carry_count, self.length = scan.body, scan.carry_count, scan.length
        self.consts, self.init, xs = scan.split(ins)
        if any(is_tracked(v) for v in list(self.consts) + list(self.init)):
            raise Coupled("scan over the steps with lane-tracked constants or initial carries")
        if self.length != ev.site_shape[0]:
            raise Coupled("scan over the steps of another scan")
        self.inner = ev.site_shape[1:]
        self.acc = scan.accumulators()
        self.x_base = [x.base if isinstance(x, Local) else x for x in xs]
        self.x_round0: tuple
        self.x_kinds: tuple
        self.x_round0, self.x_kinds = zip(*[_step_slices(x) for x in xs]) if xs else ((), ())
        self.keys = None if key is None else jax.random.split(key, self.length)
        self.below, self.alternatives = ((), None) if holding is None else holding
        self.direction = -1 if scan.reverse else 1
        positions = jnp.arange(self.length, dtype=jnp.int32)
        # a step's location holds its iteration, which runs backwards in a reverse scan
        self.iterations = positions if self.direction > 0 else self.length - 1 - positions
        self.lane_free = ev.sub(self.inner, None)  # materializes one step's lanes

    def run(self, carry: list, x_vals: list, i: Any, k: Any, alt: Any = None) -> list:
        """The body at step `i` (key `k`) on lane-tracked operands, accumulators at
        zero (their outputs are the step's terms); `alt`: the site's alternative at
        this step (round 0 of the scan holding the site)."""
        carry = [jnp.zeros_like(c) if j in self.acc else c for j, c in enumerate(carry)]
        target = None if alt is None else (self.steps + (self.eqn, i) + self.below, alt)
        sub = self.ev.sub(self.inner, target)
        body = self.body.jaxpr
        env = env_of(self.body, list(self.consts) + list(carry) + list(x_vals))
        return sub.level(body, 0, env, {} if k is None else split_keys(body, k),
                         self.steps + (self.eqn, i))

    def window(self) -> list:
        """Per round, the kinds of the carries it reads, of its carries out and of its
        outputs: round 0 sees the step's change, round r the carries round r - 1 left;
        the rounds end when only accumulators hold the change."""
        first = functools.partial(jax.tree.map, lambda leaf: leaf[0])
        i, k = jnp.zeros((), jnp.int32), None if self.keys is None else self.keys[0]
        alt = None if self.alternatives is None else self.alternatives[0]
        found: dict = {}

        def probe(carry_enc, kinds, r):
            carry = [_decode(e, kd) for e, kd in zip(carry_enc, kinds)]
            if r == 0:
                x_vals = [_decode(e, kd) for e, kd in zip(first(list(self.x_round0)),
                                                          self.x_kinds)]
                outs = self.run(carry, x_vals, i, k, alt)
            else:
                outs = self.run(carry, first(self.x_base), i, k)
            found["out"] = [_kind(v) for v in outs]

        rounds: list = []
        kinds = [SAME] * self.carry_count
        while not rounds or any(kd != SAME for kd in kinds):
            if len(rounds) > self.carry_count:
                raise Coupled("a scan carry that keeps a step's value")
            jax.eval_shape(functools.partial(probe, kinds=kinds, r=len(rounds)),
                           [_encode(self.lane_free, v, kd) for v, kd in zip(self.init, kinds)])
            out_carries, out_ys = self.scan.split_outs(found["out"])
            rounds.append((kinds, out_carries, out_ys))
            kinds = [SAME if j in self.acc else kd for j, kd in enumerate(out_carries)]
        return rounds

    def base_run(self) -> tuple:
        """The body at the base values: the final carries, and per step the incoming
        carries (accumulators: None), accumulators' terms and outputs. Only carries
        that are not accumulators need the steps in order (a `lax.scan` over them
        alone); the rest runs every step at once."""
        acc, kept = self.acc, [j for j in range(self.carry_count) if j not in self.acc]
        incoming = [None] * self.carry_count
        final = list(self.init)
        if kept:
            def step(carry, x):
                state, i = carry
                xb, k = x
                full = list(self.init)
                for j, c in zip(kept, state):
                    full[j] = c
                outs = self.run(full, xb, i, k)
                return ([outs[j] for j in kept], i + 1), state

            (last, _), before = self.scan.scan(
                step, ([self.init[j] for j in kept], jnp.zeros((), jnp.int32)),
                (self.x_base, self.keys))
            for j, c, b in zip(kept, last, before):
                final[j], incoming[j] = c, b
        carry_in = [self._stacked_zeros(j) if j in acc else incoming[j]
                    for j in range(self.carry_count)]
        outs = jax.vmap(lambda c, xb, i, k: self.run(c, xb, i, k))(
            carry_in, self.x_base, self.iterations, self.keys)
        terms = [outs[j] if j in acc else None for j in range(self.carry_count)]
        for j in acc:  # summed at once: equal to the scan's running sum up to rounding
            final[j] = final[j] + jnp.sum(terms[j], axis=0)
        return final, incoming, terms, self.scan.split_outs(outs)[1]

    def _stacked_zeros(self, j: int) -> Any:
        c = self.init[j]
        return jnp.zeros((self.length,) + jnp.shape(c), jnp.result_type(c))

    def rounds(self, rounds: list, incoming: list, terms: list) -> list:
        """Every round at every step at once (`vmap` over the steps): round r at step t
        starts from round r - 1's carries at the step before, so none waits on another
        step. Per round: (carries for the next round, accumulators' differences from
        their base terms, outputs), stacked over the steps."""
        incoming = [self._stacked_zeros(j) if j in self.acc else incoming[j]
                    for j in range(self.carry_count)]

        def one(r, carry, x_vals, i, k, alt, term):
            outs = self.run(carry, x_vals, i, k, alt)
            kinds = rounds[r][1]
            onward = rounds[r + 1][0] if r + 1 < len(rounds) else [SAME] * self.carry_count
            lane_free = self.lane_free
            carries = [None if kd == SAME else _encode(lane_free, outs[j], kinds[j])
                       for j, kd in enumerate(onward)]
            deltas = [_delta(lane_free, outs[j], term[j], kinds[j]) if j in self.acc else None
                      for j in range(self.carry_count)]
            ys = [None if kd == SAME else _encode(lane_free, y, kd)
                  for y, kd in zip(self.scan.split_outs(outs)[1], rounds[r][2])]
            return carries, deltas, ys

        def round0(carry, x0, i, k, alt, term):
            x0 = [_decode(e, kd) for e, kd in zip(x0, self.x_kinds)]
            return one(0, carry, x0, i, k, alt, term)

        results = [jax.vmap(round0)(incoming, list(self.x_round0), self.iterations,
                                    self.keys, self.alternatives, terms)]
        for r in range(1, len(rounds)):
            kinds = rounds[r][0]
            # round r - 1's carries one step on (the first step's: the initial carry)
            before = [None if kd == SAME else jax.tree.map(
                lambda a, f: _moved(a, self.direction, f), results[-1][0][j],
                _encode(self.lane_free, self.init[j], kd))
                for j, kd in enumerate(kinds)]

            def later(carry, before, xb, i, k, term, r=r, kinds=kinds):
                carry = [c if kd == SAME else _decode(b, kd)
                         for c, b, kd in zip(carry, before, kinds)]
                return one(r, carry, xb, i, k, None, term)

            results.append(jax.vmap(later)(incoming, before, self.x_base, self.iterations,
                                           self.keys, terms))
        return results

    def final_carry(self, j: int, rounds: list, results: list, final: Any) -> Any:
        """Carry `j` after the last step in every lane's replay: accumulators with their
        differences summed; other carries differ only in the lanes of the last steps,
        whose change has not left them yet."""
        if j in self.acc:
            return self._accumulated(final, [res[1][j] for res in results],
                                     [rnd[1][j] for rnd in rounds])
        kinds = [rnd[0][j] for rnd in rounds[1:]]
        if all(kd == SAME for kd in kinds):
            return final
        lanes, last = math.prod(self.inner), (self.length - 1 if self.direction > 0 else 0)
        values = jnp.broadcast_to(final, (self.length, lanes) + jnp.shape(final))
        for r, kd in enumerate(kinds):  # round r's carry at the last step: lane r back
            if kd != SAME:
                changed = jax.tree.map(lambda a: a[last], results[r][0][j])
                values = values.at[last - self.direction * r].set(
                    self.lane_free.materialize(_decode(changed, kd)).values)
        return Perturbed(values.reshape((self.length * lanes,) + jnp.shape(final)))

    def output(self, base: Any, encoded: list, kinds: list) -> Any:
        """An output stacked over the steps, in every lane's replay: `Local` along the
        steps where only round 0 changes it, lane by lane; else `Perturbed`, each lane's
        whole output, the steps its change reached (round r: r steps on) replaced."""
        lanes = math.prod(self.inner)
        if all(kd == SAME for kd in kinds[1:]) and (kinds[0] != PERTURBED or lanes == 1):
            return _stacked_over_steps(base, encoded[0], kinds[0])
        size = self.length * lanes * math.prod(jnp.shape(base))
        if size > MAX_OUTPUT_ELEMENTS:  # O(T²): whole replays hold one lane at a time
            raise Coupled(f"a scan output that depends on an earlier step's value, "
                          f"{size:,} elements in every lane's replay")
        values = jnp.broadcast_to(base, (self.length, lanes) + jnp.shape(base))
        steps = np.arange(self.length)
        for r, (enc, kd) in enumerate(zip(encoded, kinds)):
            if kd == SAME:
                continue
            per_step = jax.vmap(lambda e, kd=kd: self.lane_free.materialize(
                _decode(e, kd)).values)(enc)  # [T, lanes, *y]: round r's output at step t
            # [lane, 1, step]: lane l's change reaches step l + r (l - r in reverse)
            reached = (steps[None, :] == steps[:, None] + self.direction * r)[:, None]
            reached = reached.reshape(reached.shape + (1,) * (per_step.ndim - 2))
            values = jnp.where(reached, jnp.moveaxis(per_step, 0, 1)[None], values)
        return Perturbed(values.reshape((self.length * lanes,) + jnp.shape(base)))

    def _accumulated(self, final: Any, deltas: list, kinds: list) -> Any:
        """An accumulator's final value in every lane's replay: the base value plus the
        differences its terms took in the steps each lane's change reached."""
        if all(kd == SAME for kd in kinds):
            return final
        lanes = math.prod(self.inner)
        total = jnp.zeros((self.length, lanes) + jnp.shape(final), jnp.result_type(final))
        for r, (dl, kd) in enumerate(zip(deltas, kinds)):
            if kd == SAME:
                continue
            if kd != PERTURBED:  # slice l of a `Local` difference is lane l's
                dl = jax.vmap(lambda d, kd=kd: self.lane_free.materialize(
                    Local(jnp.zeros_like(d), d, kd[1])).values)(dl)
            # the difference at step t in round r belongs to the lane r steps back
            total = total + _moved(dl, -self.direction * r, jnp.zeros((), dl.dtype))
        return Perturbed((final + total).reshape((self.length * lanes,) + jnp.shape(final)))


#: the most elements a scan output may hold in every lane's replay (an output that
#: reads an earlier step's change is T × T × its step's size); beyond, whole replays
MAX_OUTPUT_ELEMENTS = 1 << 24


def _moved(stacked: jax.Array, by: int, fill: Any) -> jax.Array:
    """`stacked` (per step, in position order) moved `by` positions: the value at
    position t is the one at t - by, `fill` where there is none."""
    if by == 0:
        return stacked
    pad = jnp.broadcast_to(fill, (abs(by),) + stacked.shape[1:]).astype(stacked.dtype)
    return (jnp.concatenate([pad, stacked[:-by]]) if by > 0
            else jnp.concatenate([stacked[-by:], pad]))


def _step_slices(x: Any) -> tuple[Any, tuple]:
    """An operand scanned over, in round 0: `Local` along the step axis becomes, per
    step, `Local` along the site's own lane axes."""
    if isinstance(x, Local) and x.axes and x.axes[0] == 0:
        if 0 in x.axes[1:]:
            raise Coupled("scan over two lane axes")
        return (x.base, x.alt), ("local", tuple(a - 1 for a in x.axes[1:]))
    if is_tracked(x):
        raise Coupled("scan over the steps of an operand tracked along other lanes")
    return x, SAME


def _delta(sub: Any, out: Any, base_out: Any, kind: tuple) -> Any:
    """An accumulator's term in one round minus its base term (both run at zero)."""
    if kind == SAME:
        return None
    if isinstance(out, Local):
        return out.alt - out.base
    return sub.materialize(out).values - base_out[None]


def _stacked_over_steps(base: Any, enc: Any, kind: tuple) -> Any:
    """A round-0 output stacked over the steps: `Local` along the step axis too. A
    step of one lane may hold it as that lane's replay (`Perturbed`: a `cond` holding
    sites, an operation without a lane rule); its base is the base run's output."""
    if kind == SAME:
        return base
    if kind == PERTURBED:
        return Local(base, enc[:, 0], (0,))
    return Local(enc[0], enc[1], (0,) + tuple(a + 1 for a in kind[1]))
