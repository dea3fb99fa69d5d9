"""Minibatches without a full shuffle per step: entries of a keyed pseudo-random
permutation of `range(n)`, computed one index at a time, so a step's cost does not
grow with the dataset. Two orders, `gv.fit(..., batch_size=B, shuffle=...)`:

* `"epoch"` (the default): step t's batch is positions [tB mod n', (t+1)B mod n') of
  epoch ⌊t / (n // B)⌋'s permutation (n' = B·(n // B)): every datapoint once per epoch,
  a fresh order each epoch, O(B) work per step, then a gather of B scattered rows (a
  `jax.random.permutation` of n per step cost a sort of n: about 50 ms at n = 10⁶ on a
  CPU).
* `"once"`: the rows are permuted once, when the fit starts (O(n), once), and step t
  reads B consecutive rows of that order, cyclically, starting at
  `(offset_e + b·B) mod n`, where the epoch's offset is uniform in [0, n) and its
  blocks b = 0 … n // B − 1 come in a fresh order. A copy of B adjacent rows does not
  wait on memory for every row, so the step costs the same at n = 10⁶ as at 10⁴. The
  window's start is uniform in [0, n), so every datapoint is in a step's batch with
  probability B / n, exactly as in `"epoch"`: objectives scaled by n / B (`gv.plate`)
  stay unbiased. The batches' compositions are less varied across epochs (neighbours in
  the one permutation stay neighbours), which matters little for global latents.

The permutation is a Feistel network on the smallest even number of bits covering n
(six rounds of a murmur-style integer mix keyed by the epoch's key), restricted to
[0, n) by cycle walking: an index that lands outside is mapped again until it lands
inside, which keeps the map a bijection of [0, n).

Example:
    >>> import jax, jax.numpy as jnp
    >>> from genvi.training.minibatch import shuffled_indices
    >>> idx = shuffled_indices(jax.random.key(0), jnp.arange(10), 10)
    >>> sorted(idx.tolist()) == list(range(10))
    True
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

ROUNDS = 6


def _mix(x: jax.Array, k: jax.Array) -> jax.Array:
    """A 32-bit integer hash of x under round key k (murmur3's finalizer)."""
    x = x ^ k
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x85EBCA6B)
    x = x ^ (x >> 13)
    x = x * jnp.uint32(0xC2B2AE35)
    return x ^ (x >> 16)


def shuffled_indices(key: jax.Array, positions: jax.Array | int, n: int) -> jax.Array:
    """Entries at `positions` (integers in [0, n)) of the permutation of range(n) that
    `key` picks; equal positions give equal entries, distinct ones distinct entries.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from genvi.training.minibatch import shuffled_indices
        >>> first = shuffled_indices(jax.random.key(1), jnp.arange(0, 4), 1000)
        >>> rest = shuffled_indices(jax.random.key(1), jnp.arange(4, 1000), 1000)
        >>> len(set(first.tolist()) | set(rest.tolist()))
        1000
    """
    n = int(n)
    if not 1 <= n <= 2 ** 31:
        raise ValueError(f"shuffled_indices: the dataset size n={n} must be in [1, 2**31]")
    half = max(1, math.ceil(math.log2(n) / 2))  # the domain [0, 4**half) covers n
    mask = jnp.uint32((1 << half) - 1)
    round_keys = jax.random.bits(key, (ROUNDS,), jnp.uint32)

    def feistel(x):
        left, right = x >> half, x & mask
        for r in range(ROUNDS):  # six fixed rounds, not a loop over traced values
            left, right = right, left ^ (_mix(right, round_keys[r]) & mask)
        return (left << half) | right

    x = feistel(jnp.asarray(positions).astype(jnp.uint32))
    # cycle walking: the domain is at most 4n, so each lane needs few extra rounds
    x = jax.lax.while_loop(lambda x: jnp.any(x >= n),
                           lambda x: jnp.where(x >= n, feistel(x), x), x)
    return x.astype(jnp.int32)


SHUFFLES = ("epoch", "once")


def epoch_batch(data, key: jax.Array, step: jax.Array | int, batch_size: int, n: int):
    """Step `step`'s batch of `data` (arrays of n rows) in the `"epoch"` order.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from genvi.training.minibatch import epoch_batch
        >>> x = jnp.arange(10.0)
        >>> batches = [epoch_batch(x, jax.random.key(0), t, 5, 10) for t in (0, 1)]
        >>> sorted(jnp.concatenate(batches).tolist()) == x.tolist()
        True
    """
    per_epoch = n // batch_size
    positions = (step % per_epoch) * batch_size + jnp.arange(batch_size)
    idx = shuffled_indices(jax.random.fold_in(key, step // per_epoch), positions, n)
    return jax.tree_util.tree_map(lambda a: a[idx], data)


def shuffle_once(data, key: jax.Array, batch_size: int, n: int):
    """The rows of `data` in the `"once"` order, with the first `batch_size` of them
    appended again (n + batch_size rows), so every window is one contiguous slice.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from genvi.training.minibatch import shuffle_once
        >>> shuffle_once(jnp.arange(6.0), jax.random.key(0), 2, 6).shape
        (8,)
    """
    idx = shuffled_indices(key, jnp.arange(n), n)
    idx = jnp.concatenate([idx, idx[:batch_size]])
    return jax.tree_util.tree_map(lambda a: a[idx], data)


def window_batch(shuffled, key: jax.Array, step: jax.Array | int, batch_size: int, n: int):
    """Step `step`'s batch in the `"once"` order, from `shuffle_once`'s rows.

    Example:
        >>> import jax, jax.numpy as jnp
        >>> from genvi.training.minibatch import shuffle_once, window_batch
        >>> rows = shuffle_once(jnp.arange(10.0), jax.random.key(0), 5, 10)
        >>> batches = [window_batch(rows, jax.random.key(0), t, 5, 10) for t in (0, 1)]
        >>> sorted(jnp.concatenate(batches).tolist()) == list(range(10))
        True
    """
    per_epoch = n // batch_size
    epoch_key = jax.random.fold_in(key, step // per_epoch)
    offset = jax.random.randint(jax.random.fold_in(epoch_key, 1), (), 0, n)
    block = shuffled_indices(epoch_key, step % per_epoch, per_epoch)
    start = (offset + block * batch_size) % n
    return jax.tree_util.tree_map(
        lambda a: jax.lax.dynamic_slice_in_dim(a, start, batch_size), shuffled)
