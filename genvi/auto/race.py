"""The measurement of a site's candidates: one compiled program (`variance_program`)
whose estimates run in one loop, and the race (`race`) that runs it in batches,
interleaved, dropping the candidates far behind the best.

Example:
    >>> batch_size(64), BATCHES
    (32, 4)
"""

from __future__ import annotations

import math
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from genvi.adev.expectation import Expectation


# The measurement's estimates per candidate come in batches of half `estimates`: a first
# batch of every candidate, then up to `BATCHES` - 1 more of those still racing, the
# ones whose first batch's variance × time is within `RACE_MARGIN` of the best. A batch
# of 32 estimates measures a variance to about a quarter (a sample variance of n draws
# spreads about sqrt(2 / n) of the truth), so a candidate twice as costly as the best
# is out of the race, and the racing ones' further batches decide among them.
# Where the first round takes less than `RACE_FROM` seconds (a scalar site's batch takes
# tens of microseconds, mostly the dispatch), its times cannot rank the candidates and
# measuring all of them costs little: every candidate runs every batch.
BATCHES = 4
RACE_MARGIN = 2.0
RACE_FROM = 0.05
# A budgeted race (a fit's, which training waits for) sizes its batches to fit its first
# round in the budget, but never below this many estimates: a variance of 8 draws
# spreads about half of the truth, enough to tell apart candidates whose variance ×
# time differ by orders (REINFORCE's and ENUM's), and the closer ones tie anyway.
FEWEST = 8


def batch_size(estimates: int) -> int:
    return max(2, estimates // 2)



def variance_program(tuned: list[Expectation]) -> Any:
    """A jitted `(index, keys, count, args) -> variance`: candidate `index`'s gradient
    estimates at the first `count` of `keys` under one loop (no dispatch between them,
    as in a fit; `count` is a run-time value, so a race sizes its rounds without
    compiling again), their variance summed over every entry (Welford's update, so
    memory stays at one gradient)."""
    def run(index, keys, count, args):
        def flat(t):
            return lambda k: ravel_pytree(t.value_and_grad_estimate(k, *args)[1])[0]
        branches = [flat(t) for t in tuned]

        def one(i, carry):
            n, mean, m2 = carry
            g = jax.lax.switch(index, branches, keys[i])
            delta = g - mean
            mean = mean + delta / (n + 1)
            return n + 1, mean, m2 + delta * (g - mean)
        size = jax.eval_shape(branches[0], keys[0]).shape
        zeros = jnp.zeros(size, jnp.result_type(float))
        n, _, m2 = jax.lax.fori_loop(0, count, one, (0.0, zeros, zeros))
        return jnp.sum(m2) / (n - 1)
    return jax.jit(run)


def race(program: Any, candidates: int, args: tuple, keys: jax.Array,
         budget: float | None = None) -> list[tuple[float, float, int]]:
    """(variance, seconds per estimate, estimates taken) of each candidate of
    `program`, as a race: a warm-up of two estimates, then a batch of each candidate;
    those whose variance × time is within `RACE_MARGIN` of the best so far take the
    remaining batches, interleaved (the variance: the mean of its batches'; the time:
    its fastest batch's), while the others keep their first batch's numbers. Where the
    first round took less than `RACE_FROM` seconds, every candidate with finite
    estimates races on. A race of one ends after the first batch: there is nothing
    left to choose. With a `budget` (seconds; None: no limit), the batches are sized
    at the warm-up's pace so that the first round fits in it (though never under
    `FEWEST` estimates), and a further round is run only where, at its racers'
    first-round times, the race stays within it."""
    batch = keys.shape[1]
    rows = [keys[j] for j in range(keys.shape[0])]   # sliced before any timing
    began = time.perf_counter()
    jax.block_until_ready(program(0, rows[0], 2, args))
    count = batch
    if budget is not None:   # the warm-up's pace: its first call's overheads make it slower
        pace = (time.perf_counter() - began) / 2
        count = int(min(batch, max(FEWEST, budget / (candidates * pace))))
    variances: list[list[float]] = [[] for _ in range(candidates)]
    times: list[list[float]] = [[] for _ in range(candidates)]

    def onebatch_size(i: int, k: jax.Array) -> None:
        t0 = time.perf_counter()
        variances[i].append(float(jax.block_until_ready(program(i, k, count, args))))
        times[i].append(time.perf_counter() - t0)

    for i in range(candidates):
        onebatch_size(i, rows[1])
    work = [v[0] * t[0] if math.isfinite(v[0]) else math.inf
            for v, t in zip(variances, times)]
    best = min(work)
    # where the first round was quick, its times are mostly dispatch and the timer's
    # noise, and more batches of every candidate cost next to nothing: all race on
    first_round = sum(t[0] for t in times)
    quick = first_round < RACE_FROM
    racing = [i for i, w in enumerate(work)
              if math.isfinite(w) and (quick or w <= RACE_MARGIN * best)]
    if len(racing) > 1:
        spent, round_cost = first_round, sum(times[i][0] for i in racing)
        for k in rows[2:]:
            if budget is not None and spent + round_cost > budget:
                break
            began = time.perf_counter()
            for i in racing:
                onebatch_size(i, k)
            spent += time.perf_counter() - began
    return [(float(np.mean(v)), min(t) / count, count * len(v))
            for v, t in zip(variances, times)]
