"""gv.fit's minibatches: a keyed permutation of the dataset per epoch, evaluated index
by index (O(batch) per step whatever the dataset size)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genvi.core.jaxpr import sub_jaxprs
from genvi.training.minibatch import shuffled_indices


@pytest.mark.parametrize("n", [1, 2, 3, 7, 16, 1000, 1024, 1025, 4097])
def test_every_index_once_per_epoch(n):
    idx = np.asarray(shuffled_indices(jax.random.key(n), jnp.arange(n), n))
    np.testing.assert_array_equal(np.sort(idx), np.arange(n))


def test_epochs_differ_and_positions_are_uniform():
    # the entry at position 0 over 20,000 keys: uniform over 10 values (chi-square), and
    # the entries at positions 0 and 1 independent-looking (never equal, all pairs seen)
    n, m = 10, 20000
    keys = jax.random.split(jax.random.key(0), m)
    first_two = np.asarray(jax.vmap(lambda k: shuffled_indices(k, jnp.arange(2), n))(keys))
    counts = np.bincount(first_two[:, 0], minlength=n)
    chi2 = float(np.sum((counts - m / n) ** 2 / (m / n)))
    assert chi2 < 27.9, counts  # the 0.999 quantile of chi-square with 9 degrees of freedom
    assert np.all(first_two[:, 0] != first_two[:, 1])
    pairs = np.bincount(first_two[:, 0] * n + first_two[:, 1], minlength=n * n)
    assert np.count_nonzero(pairs) == n * (n - 1)
    a, b = (np.asarray(shuffled_indices(jax.random.key(s), jnp.arange(1000), 1000)) for s in (1, 2))
    assert np.mean(a == b) < 0.01


def test_a_step_touches_only_its_batch_under_jit():
    # a big n costs nothing extra: no value in the computation has n entries
    f = jax.jit(lambda k, p: shuffled_indices(k, p, 10 ** 6))
    jaxpr = jax.make_jaxpr(f)(jax.random.key(0), jnp.arange(1024)).jaxpr
    sizes = set()

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            sizes.update(int(np.prod(v.aval.shape)) for v in eqn.outvars if hasattr(v.aval, "shape"))
            for sub in sub_jaxprs(eqn):  # the while loop's cond and body
                walk(sub)
    walk(jaxpr)
    assert max(sizes) <= 1024, sorted(sizes)[-3:]
    idx = np.asarray(f(jax.random.key(0), jnp.arange(1024)))
    assert len(set(idx.tolist())) == 1024 and idx.min() >= 0 and idx.max() < 10 ** 6


def test_bad_size():
    with pytest.raises(ValueError, match="dataset size n=0"):
        shuffled_indices(jax.random.key(0), jnp.arange(1), 0)
