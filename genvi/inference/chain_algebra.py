"""The forward algorithm's arithmetic for `gv.enumeration` over a chain whose steps
depend on the last k steps' discrete values (`genvi.inference.enum_scan` finds k).

`History` numbers the last k joint values of a step's sites, (h_1, …, h_k) with h_1
the latest, as one index h over C^k (h_1 most significant). The forward variable α
holds log p(observations so far, history h) for every h; a step with log factors
m[h, v] (v the step's value) advances it:

    α'(v, h_1, …, h_{k−1}) = logsumexp over h_k of α(h) + m[h, v],

O(C^{k+1}) per step: a first-order chain (k = 1) is the hidden Markov model's
recursion, a second-order one its pair-state form. `blocked_chain` runs it over a
long chain in blocks whose factors are recomputed in the backward pass (bounded
memory); `remat` rematerializes a step of the general recursion.

Example:
    >>> import jax.numpy as jnp
    >>> h = History(count=2, k=2)
    >>> h.size, [int(h.value_at(2, d)) for d in (0, 1)]   # h = 2 is (h_1, h_2) = (1, 0)
    (4, [1, 0])
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
from jax.scipy.special import logsumexp


@dataclass(frozen=True)
class History:
    """The last `k` joint values of a step's sites, `count` joint values each."""

    count: int
    k: int

    @property
    def size(self) -> int:
        return self.count ** self.k

    def value_at(self, h: Any, back: int) -> Any:
        """The index of the joint value `back + 1` steps before, in history `h`."""
        return (h // self.count ** (self.k - 1 - back)) % self.count

    def first(self, alpha: Any) -> Any:
        """α [C, *rest] after the first step as α over histories [C^k, *rest]: the
        values before the first step are one placeholder (index 0)."""
        older = self.size // self.count
        alpha = jnp.repeat(alpha, older, axis=0)
        known = (jnp.arange(self.size) % older == 0).reshape((-1,) + (1,) * (alpha.ndim - 1))
        return jnp.where(known, alpha, -jnp.inf)

    def carried(self, values: Any) -> Any:
        """A carry's values after the first step [C, ...] per history [C^k, ...]."""
        return jnp.repeat(values, self.size // self.count, axis=0)

    def advance(self, alpha: Any, factors: Any) -> Any:
        """α [C^k, *rest] through a step with log factors [C^k, C, *rest]."""
        rest = jnp.shape(alpha)[1:]
        joint = (alpha[:, None] + factors).reshape(
            (self.size // self.count, self.count, self.count) + rest)
        return jnp.swapaxes(logsumexp(joint, axis=1), 0, 1).reshape((self.size,) + rest)

    def shift(self, outs: Any) -> Any:
        """A carry's new values per (history, value) [C^k, C, ...] as its values per
        new history [C^k, ...] (they do not depend on the oldest value: read at 0)."""
        shape = jnp.shape(outs)[2:]
        kept = outs.reshape((self.size // self.count, self.count, self.count) + shape)[:, 0]
        return jnp.swapaxes(kept, 0, 1).reshape((self.size,) + shape)


#: steps whose factors are computed together where all of them would not fit in
#: `FACTORS_BUDGET` numbers (`blocked_chain`)
BLOCK = 16
FACTORS_BUDGET = 1 << 22


def blocked_chain(history: History, alpha: jax.Array, factors: Any,
                  rest: list) -> tuple[jax.Array, Any]:
    """α [C^k, lanes] carried through steps 1 … T − 1, whose factors (a lane-free part
    and m_t [C^k, C, lanes]) depend on each step's input alone: `factors(x_t)`. The
    steps go in blocks of `BLOCK`: a block's factors are computed at once under
    `vmap`, then α runs through them; the blocks are a scan whose body is
    rematerialized (`remat`), so the backward pass keeps α at each block's start,
    O(T / BLOCK × C^k) per lane, and recomputes a block's factors, O(BLOCK × C^{k+1}),
    instead of keeping every step's, O(T × C^{k+1}). Where every step's factors fit in
    `FACTORS_BUDGET` numbers they are computed at once and kept (one block, no
    recomputation: about 30% faster for small chains)."""
    length = jax.tree_util.tree_leaves(rest)[0].shape[0]
    fits = length * history.size * history.count * alpha.shape[1] <= FACTORS_BUDGET
    block = length if fits else min(BLOCK, length)
    blocks = -(-length // block)
    pad = blocks * block - length

    def padded(x):  # past the end: the last step again, skipped below
        x = jnp.concatenate([x, jnp.repeat(x[-1:], pad, axis=0)]) if pad else x
        return x.reshape((blocks, block) + x.shape[1:])
    inputs = (jax.tree_util.tree_map(padded, rest),
              (jnp.arange(blocks * block) < length).reshape(blocks, block))

    def forward(al, step):
        m_t, valid = step
        return jnp.where(valid, history.advance(al, m_t), al), None

    def run_block(c, inp):
        al, free_total = c
        xb, valid = inp
        free, m = jax.vmap(factors)(xb)                      # [block], [block, C^k, C, lanes]
        al, _ = jax.lax.scan(forward, al, (m, valid))
        return (al, free_total + jnp.sum(jnp.where(valid, free, 0.0))), None

    start = (alpha, jnp.zeros((), alpha.dtype))
    if blocks == 1:
        (alpha, free_total), _ = run_block(start, jax.tree_util.tree_map(lambda x: x[0], inputs))
        return alpha, free_total
    (alpha, free_total), _ = jax.lax.scan(remat(run_block), start, inputs)
    return alpha, free_total


#: whether a step is recomputed in the backward pass (see `remat`)
REMAT = True


def remat(step: Any) -> Any:
    """The forward algorithm's step, rematerialized for reverse mode: the backward pass
    keeps each step's α and carried state, O(T × values) (× lanes), and recomputes the
    step's pair evaluations, instead of storing them all, O(T × values²)."""
    return jax.checkpoint(step, prevent_cse=False) if REMAT else step
