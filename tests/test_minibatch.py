"""gv.fit's minibatches: a keyed permutation of the dataset per epoch, evaluated index
by index (O(batch) per step whatever the dataset size)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from genvi.core.jaxpr import sub_jaxprs
from genvi.training.minibatch import shuffle_once, shuffled_indices, window_batch


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


def once_batches(key, n, b, steps):
    """The batches of `steps` steps of gv.fit(..., batch_size=b, shuffle="once")."""
    rows = shuffle_once(jnp.arange(n), key, b, n)
    return jax.vmap(lambda t: window_batch(rows, key, t, b, n))(jnp.arange(steps))


@pytest.mark.parametrize("n,b", [(10, 5), (23, 5), (1000, 7), (1025, 1024)])
def test_once_windows_are_disjoint_within_an_epoch_and_move_between_epochs(n, b):
    per_epoch = n // b
    batches = np.asarray(once_batches(jax.random.key(n), n, b, 3 * per_epoch))
    for e in range(3):
        epoch = batches[e * per_epoch:(e + 1) * per_epoch].ravel()
        assert len(set(epoch.tolist())) == per_epoch * b and epoch.min() >= 0 and epoch.max() < n
    if per_epoch > 1:
        assert not np.array_equal(batches[:per_epoch], batches[per_epoch:2 * per_epoch])


def test_once_includes_every_point_with_probability_b_over_n():
    # what keeps objectives scaled by n / b unbiased: over 20,000 runs (keys), the
    # batch of a step, and the batch of a later epoch, include each point with
    # probability b / n (within 5 standard errors)
    n, b, m = 23, 5, 20000
    keys = jax.random.split(jax.random.key(0), m)
    for step in (0, 7, 4 * (n // b) + 2):
        batches = jax.vmap(lambda k: once_batches(k, n, b, step + 1)[step])(keys)
        counts = np.bincount(np.asarray(batches).ravel(), minlength=n)
        p = b / n
        z = np.abs(counts / m - p) / np.sqrt(p * (1 - p) / m)
        assert np.all(z < 5), (step, counts)


def test_once_windows_are_adjacent_rows_of_one_order():
    # a window is B adjacent rows (cyclically) of the order shuffled once: one slice,
    # no gather of scattered rows, whatever n
    n, b = 50, 8
    key = jax.random.key(3)
    rows = np.asarray(shuffle_once(jnp.arange(n), key, b, n))
    np.testing.assert_array_equal(np.sort(rows[:n]), np.arange(n))
    np.testing.assert_array_equal(rows[n:], rows[:b])
    for batch in np.asarray(once_batches(key, n, b, 20)):
        start = int(np.flatnonzero(rows[:n] == batch[0])[0])
        np.testing.assert_array_equal(batch, rows[start:start + b])
    f = lambda r, t: window_batch(r, key, t, 1024, 10 ** 6)  # noqa: E731
    jaxpr = jax.make_jaxpr(f)(jnp.zeros((10 ** 6 + 1024, 3)), 5).jaxpr
    prims = {e.primitive.name for e in jaxpr.eqns}
    assert "dynamic_slice" in prims and "gather" not in prims, prims
