"""The experiments' data loaders: bundled digits, local MNIST files, binarization."""

import gzip

import jax
import numpy as np
import pytest

import genvi as gv
from genvi_experiments.common.data import binarized, load_images


def fake_mnist(rng, n):
    return rng.integers(0, 256, (n, 28, 28), dtype=np.uint8), rng.integers(0, 10, n).astype(np.uint8)


def test_digits_split_is_disjoint_and_scaled():
    data = load_images()
    assert data.train.shape == (1438, 64) and data.test.shape == (359, 64)
    assert 0.0 <= data.train.min() and data.train.max() == 1.0
    assert set(np.unique(data.test_labels)) == set(range(10))
    assert np.array_equal(load_images().test, data.test)   # seeded


def test_mnist_npz_and_idx_folder(tmp_path):
    rng = np.random.default_rng(0)
    (xtr, ytr), (xte, yte) = fake_mnist(rng, 12), fake_mnist(rng, 5)
    np.savez(tmp_path / "mnist.npz", x_train=xtr, y_train=ytr, x_test=xte, y_test=yte)
    a = load_images(str(tmp_path / "mnist.npz"))
    assert a.train.shape == (12, 784) and a.shape == (28, 28) and a.train.max() <= 1.0
    folder = tmp_path / "idx"
    folder.mkdir()

    def write_idx(name, array, compress):
        header = bytes([0, 0, 8, array.ndim]) + np.asarray(array.shape, ">i4").tobytes()
        opener = gzip.open if compress else open
        with opener(folder / (name + (".gz" if compress else "")), "wb") as f:
            f.write(header + array.tobytes())

    write_idx("train-images-idx3-ubyte", xtr, True)
    write_idx("train-labels-idx1-ubyte", ytr, True)
    write_idx("t10k-images-idx3-ubyte", xte, False)
    write_idx("t10k-labels-idx1-ubyte", yte, False)
    b = load_images(str(folder))
    assert np.array_equal(a.train, b.train) and np.array_equal(a.test_labels, b.test_labels)


def test_missing_data_path_says_what_to_give(tmp_path):
    with pytest.raises(FileNotFoundError, match="leave --data out"):
        load_images(str(tmp_path / "nope.npz"))
    np.savez(tmp_path / "bad.npz", x=np.zeros(3))
    with pytest.raises(KeyError, match="x_train"):
        load_images(str(tmp_path / "bad.npz"))


def test_binarized_objective_is_the_expectation_over_binarizations():
    # E_{x ~ Bern(g)} [log N(x; mu, 1)] has gradient E[x] - mu = g - mu in mu; the
    # binarization adds no gradient term of its own.
    @gv.gen
    def model(mu, x):
        gv.observe(gv.normal(mu, 1.0), x)

    @gv.gen
    def guide(mu, x):
        pass

    obj = binarized(gv.elbo(model, guide))
    keys = jax.random.split(jax.random.key(0), 20000)
    grads = jax.vmap(lambda k: obj.grad_estimate(k, 0.25, 0.7))(keys)
    se = float(np.std(grads) / np.sqrt(len(keys)))
    assert abs(float(np.mean(grads)) - (0.7 - 0.25)) < 5 * se
