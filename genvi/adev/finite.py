"""What the strategies of finite-support sites share (ENUM, SWOR, RELAX): where a
drawn value sits in the site's support, and the rest of the program run at each of
several values with those of probability 0 run at a stand-in.

Example:
    >>> import jax.numpy as jnp
    >>> from genvi.adev.finite import index_in_support
    >>> index_in_support(jnp.array([1, 2, 3]), jnp.array([3, 1])).tolist()
    [2, 0]
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def index_in_support(support: jax.Array, x: jax.Array) -> jax.Array:
    """The position of each entry of `x` in `support` (one lane's values, in any order):
    a value is not its own index unless the support is 0, 1, ..., K − 1. By
    comparisons (O(K) per entry, no loop of bisections).

    Example:
        >>> import jax.numpy as jnp
        >>> index_in_support(jnp.array([-1, 1]), jnp.array([[1, -1]])).tolist()
        [[1, 0]]
    """
    values = support.reshape(support.shape[:1] + (1,) * jnp.ndim(x))
    return jnp.argmax(values == x, axis=0).astype(jnp.int32)


def at_each_value(fn: Any, support: jax.Array, x: jax.Array, *params: Any) -> jax.Array:
    """`fn(value, *params)` per lane at every value of the support, each value given
    to every lane of `x` (the drawn value): [values, lanes...] (`fn` a lane density,
    `dist.lane_prob` or `dist.lane_log_prob`).

    Example:
        >>> import genvi as gv, jax.numpy as jnp
        >>> p = jnp.array([0.2, 0.9])     # two lanes of a flip site
        >>> probs = at_each_value(gv.flip.lane_prob, gv.flip.support(p), jnp.zeros(2, bool), p)
        >>> [[f"{q:.2f}" for q in row] for row in probs]   # [values (False, True), lanes]
        [['0.80', '0.10'], ['0.20', '0.90']]
    """
    return jax.vmap(lambda v: jnp.broadcast_to(fn(jnp.full(x.shape, v, x.dtype), *params),
                                               x.shape))(support)


def branches(k: Any, values: jax.Array, live: jax.Array, stand_in: jax.Array) -> Any:
    """`k.dual_map(values)` ([n, value shape...]) with the values where `live` ([n]) is
    False run at `stand_in` instead: a value of probability 0 contributes nothing, but
    its own continuation can be non-finite (log p − log q = −inf + inf), and reverse
    mode would multiply the masked branch's zero cotangent by its non-finite
    derivatives. The caller masks those branches out of its sums.

    Example:
        >>> from genvi.adev.finite import branches
        >>> branches.__name__
        'branches'
    """
    alive = live.reshape(live.shape[:1] + (1,) * (values.ndim - 1))
    return k.dual_map(jnp.where(alive, values, stand_in))
