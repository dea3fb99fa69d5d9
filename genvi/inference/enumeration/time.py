"""The time product of enumeration: a chain's steps multiplied in log space, one step
after another or as a parallel reduction (`genvi.inference.enumeration.chain` finds the chain).

`History` numbers the last k joint values of a step's sites, (h_1, …, h_k) with h_1
the latest, as one index h over C^k (h_1 most significant). The forward variable α
holds log p(observations so far, history h) for every h; a step with log factors
m[h, v] (v the step's value) advances it:

    α'(v, h_1, …, h_{k−1}) = logsumexp over h_k of α(h) + m[h, v],

O(C^{k+1}) per step: a first-order chain (k = 1) is the hidden Markov model's
recursion, a second-order one its pair-state form. Where a step's factors depend on
its input alone, the steps' product is computed one of two ways, equal in value and
gradient:

* `sequential` (`blocked_chain`): α through the steps by a `lax.scan`, in blocks
  whose factors are recomputed in the backward pass: O(T × C^{k+1}) work, T deep,
  memory O(T / BLOCK × C^k);
* `parallel` (`parallel_chain`): each step as a transition matrix over histories,
  P_t[h, h'] = m_t[h, v] where h' = (v, h_1, …, h_{k−1}), multiplied in log space
  by a balanced tree (funsor's `sequential_sum_product`; only the total is needed,
  so a reduction, not `lax.associative_scan`'s prefixes): O(T × C^{3k}) work,
  log₂ T deep, memory O(T × C^{3k}).

`remat` rematerializes a step of the general recursion (a chain whose other
carries change, always sequential).

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


def parallel_chain(history: History, alpha: jax.Array, factors: Any,
                   rest: list) -> tuple[jax.Array, Any]:
    """`blocked_chain`'s result by a parallel product over the steps (see the module)."""
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
        p = jnp.concatenate([_log_matmul(p[0:-1:2], p[1::2]), odd])
    return _logsumexp(alpha[:, None] + p[0], axis=0), jnp.sum(free)


def _log_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """log(exp(a) @ exp(b)) per step and lane: a, b [T, S, S, lanes]."""
    return _logsumexp(a[:, :, :, None] + b[:, None], axis=2)


def _logsumexp(x: jax.Array, axis: int) -> jax.Array:
    """logsumexp whose value is −inf and derivative 0 where every entry is −inf (a
    history no step reaches), instead of NaN."""
    top = jax.lax.stop_gradient(jnp.max(x, axis=axis, keepdims=True))
    top = jnp.where(jnp.isfinite(top), top, 0.0)
    total = jnp.sum(jnp.exp(x - top), axis=axis)
    out = jnp.log(jnp.where(total > 0, total, 1.0)) + jnp.squeeze(top, axis)
    return jnp.where(total > 0, out, -jnp.inf)


#: whether a step is recomputed in the backward pass (see `remat`)
REMAT = True


def remat(step: Any) -> Any:
    """The forward algorithm's step, rematerialized for reverse mode: the backward pass
    keeps each step's α and carried state, O(T × values) (× lanes), and recomputes the
    step's pair evaluations, instead of storing them all, O(T × values²)."""
    return jax.checkpoint(step, prevent_cse=False) if REMAT else step
