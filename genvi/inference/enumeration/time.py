"""The time product of enumeration: a chain's steps multiplied in log space.

`History` numbers the last k joint values of a step's sites, (h_1, …, h_k) with h_1
the latest, as one index h over C^k (h_1 most significant). The forward variable α
holds log p(observations so far, history h); a step with log factors m[h, v] (v the
step's value) advances it, O(C^{k+1}) per step:

    α'(v, h_1, …, h_{k−1}) = logsumexp over h_k of α(h) + m[h, v].

Where a step's factors depend on its input alone, the steps are multiplied by
`blocked_chain` (sequential: O(T × C^{k+1}) work, T deep) or `parallel_chain` (a
balanced tree: O(T × C^{3k}) work, log₂ T deep), equal in value and gradient.

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
    """α [C^k, lanes] through steps 1 … T − 1 of inputs `rest`, whose `factors(x_t)` (a
    lane-free part, m_t [C^k, C, lanes]) depend on the input alone, and the lane-free
    parts' sum: a scan over blocks of `BLOCK` steps, recomputed in the backward pass, or
    one block, kept, where all fit in `FACTORS_BUDGET` numbers (30% faster when small)."""
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
        (al, free_total), (xb, valid) = c, inp
        free, m = jax.vmap(factors)(xb)                      # [block], [block, C^k, C, lanes]
        al, _ = jax.lax.scan(forward, al, (m, valid))
        return (al, free_total + jnp.sum(jnp.where(valid, free, 0.0))), None

    start = (alpha, jnp.zeros((), alpha.dtype))
    if blocks == 1:
        return run_block(start, jax.tree_util.tree_map(lambda x: x[0], inputs))[0]
    return jax.lax.scan(remat(run_block), start, inputs)[0]


def parallel_chain(history: History, alpha: jax.Array, factors: Any,
                   rest: list) -> tuple[jax.Array, Any]:
    """`blocked_chain`'s result by the steps' transition matrices over histories
    multiplied in log space by a balanced tree (funsor's `sequential_sum_product`; a
    reduction, not `lax.associative_scan`'s prefixes: only the total is needed)."""
    free, m = jax.vmap(factors)(rest)                       # [T], [T, C^k, C, lanes]
    # P_t[h, h'] = m_t[h, v] where h' = (v, h_1, …, h_{k−1}): v is h''s leading digit,
    # and h''s other digits must be h's newest k − 1 (else −inf)
    older = history.size // history.count
    p = jnp.repeat(m, older, axis=2)                        # [T, C^k, C^k, lanes]
    if history.k > 1:
        h = jnp.arange(history.size)
        follows = (h[None, :] % older) == (h[:, None] // history.count)
        p = jnp.where(follows[:, :, None], p, -jnp.inf)
    while p.shape[0] > 1:   # log₂ T levels: pairs of neighbours multiplied at once
        odd = p[-1:] if p.shape[0] % 2 else p[:0]
        a, b = p[0:-1:2], p[1::2]   # log(exp(a) @ exp(b)) per pair and lane
        p = jnp.concatenate([_logsumexp(a[:, :, :, None] + b[:, None], axis=2), odd])
    return _logsumexp(alpha[:, None] + p[0], axis=0), jnp.sum(free)


def _logsumexp(x: jax.Array, axis: int) -> jax.Array:
    """logsumexp, but −inf with derivative 0 (not NaN) where every entry is −inf."""
    top = jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    total = jnp.sum(jnp.exp(x - top), axis=axis)
    out = jnp.log(jnp.where(total > 0, total, 1.0)) + jnp.squeeze(top, axis)
    return jnp.where(total > 0, out, -jnp.inf)


def remat(step: Any) -> Any:
    """A step rematerialized for reverse mode: the backward pass keeps each step's α
    and state, O(T × C^k), and recomputes its pair evaluations, O(T × C^{k+1})."""
    return jax.checkpoint(step, prevent_cse=False)
