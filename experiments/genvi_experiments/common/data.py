"""Image data for the deep generative model experiments, with no download.

The default is scikit-learn's bundled handwritten digits (1,797 images of 8×8, grey
levels scaled to [0, 1]); `--data PATH` loads MNIST from a local `.npz` (keys
`x_train`, `y_train`, `x_test`, `y_test`, as Keras saves it) or from a folder of the
four IDX files (optionally gzipped). Pixels stay grey levels: the objectives binarize
them dynamically (a fresh Bernoulli draw per use), as is standard.

Example:
    >>> from genvi_experiments.common.data import load_images
    >>> data = load_images()
    >>> data.train.shape[1], data.shape, data.test.shape[0] > 300
    (64, (8, 8), True)
"""

from __future__ import annotations

import argparse
import gzip
import os
from dataclasses import dataclass

import numpy as np

IDX_FILES = {"x_train": "train-images-idx3-ubyte", "y_train": "train-labels-idx1-ubyte",
             "x_test": "t10k-images-idx3-ubyte", "y_test": "t10k-labels-idx1-ubyte"}


@dataclass(frozen=True)
class Images:
    """Flattened grey-level images in [0, 1] (float32) with integer labels."""

    train: np.ndarray
    train_labels: np.ndarray
    test: np.ndarray
    test_labels: np.ndarray
    shape: tuple[int, int]
    name: str

    @property
    def pixels(self) -> int:
        return self.train.shape[1]

    def subset(self, train: int | None = None, test: int | None = None) -> "Images":
        """The first `train` / `test` images (for tiny runs)."""
        return Images(self.train[:train], self.train_labels[:train], self.test[:test],
                      self.test_labels[:test], self.shape, self.name)


def load_images(path: str | None = None, test_fraction: float = 0.2, seed: int = 0) -> Images:
    """Digits (default, a seeded `test_fraction` held out) or MNIST from `path`."""
    if path is None:
        return _digits(test_fraction, seed)
    if not os.path.exists(path):
        raise FileNotFoundError(
            f"--data {path!r} does not exist; give a local MNIST .npz (x_train, y_train, "
            f"x_test, y_test) or a folder with the IDX files {sorted(IDX_FILES.values())}, "
            "or leave --data out to use scikit-learn's bundled digits")
    arrays = _read_idx_folder(path) if os.path.isdir(path) else _read_npz(path)
    x_train, x_test = (arrays[k].reshape(len(arrays[k]), -1).astype(np.float32) / 255.0
                       for k in ("x_train", "x_test"))
    side = int(round(np.sqrt(x_train.shape[1])))
    return Images(x_train, arrays["y_train"].astype(np.int32), x_test,
                  arrays["y_test"].astype(np.int32), (side, side), os.path.basename(path))


def positive_int(text: str) -> int:
    """An argparse type: an integer ≥ 1, with a clear message otherwise.

    Example:
        >>> positive_int("3")
        3
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_experiment_arguments(ap: argparse.ArgumentParser, latent: int = 10) -> None:
    """The options every image experiment takes: data, sizes, optimizer, seed."""
    ap.add_argument("--data", default=None, metavar="PATH",
                    help="local MNIST .npz or IDX folder (default: scikit-learn's digits)")
    ap.add_argument("--epochs", type=positive_int, default=100,
                    help="passes over the training images")
    ap.add_argument("--batch-size", type=positive_int, default=100, help="images per step")
    ap.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    ap.add_argument("--latent", type=positive_int, default=latent,
                    help="dimensions of the latent code z")
    ap.add_argument("--hidden", type=positive_int, default=200,
                    help="hidden units of each network's layers")
    ap.add_argument("--train-size", type=positive_int, default=None,
                    help="use the first N training images")
    ap.add_argument("--test-size", type=positive_int, default=None,
                    help="use the first N test images")
    ap.add_argument("--seed", type=int, default=0,
                    help="random seed of the initialization, the minibatches and the evaluation")


def images_from_args(args: argparse.Namespace) -> "Images":
    return load_images(args.data).subset(args.train_size, args.test_size)


def _digits(test_fraction: float, seed: int) -> Images:
    from sklearn.datasets import load_digits
    bunch = load_digits()
    x = (bunch.data / 16.0).astype(np.float32)
    y = bunch.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    n_test = int(round(test_fraction * len(x)))
    test, train = order[:n_test], order[n_test:]
    return Images(x[train], y[train], x[test], y[test], (8, 8), "digits")


def _read_npz(path: str) -> dict:
    with np.load(path) as f:
        missing = [k for k in IDX_FILES if k not in f]
        if missing:
            raise KeyError(f"{path!r} lacks the arrays {missing}; it has {sorted(f.files)}")
        return {k: f[k] for k in IDX_FILES}


def _read_idx_folder(folder: str) -> dict:
    out = {}
    for key, stem in IDX_FILES.items():
        for name in (stem, stem + ".gz", stem.replace("-idx", ".idx")):
            p = os.path.join(folder, name)
            if os.path.exists(p):
                out[key] = _read_idx(p)
                break
        else:
            raise FileNotFoundError(f"no {stem}[.gz] in {folder!r}")
    return out


def _read_idx(path: str) -> np.ndarray:
    """An IDX file: 2 zero bytes, a dtype byte (0x08 = uint8), a rank byte, the
    dimensions as big-endian int32, then the data."""
    with (gzip.open if path.endswith(".gz") else open)(path, "rb") as f:
        raw = f.read()
    if raw[:2] != b"\0\0" or raw[2] != 0x08:
        raise ValueError(f"{path!r} is not an unsigned-byte IDX file")
    rank = raw[3]
    dims = np.frombuffer(raw[4:4 + 4 * rank], dtype=">i4")
    return np.frombuffer(raw[4 + 4 * rank:], dtype=np.uint8).reshape(dims)


def binarized(objective):
    """`E_{x ~ Bernoulli(grey)}[objective(params, x)]` for an objective taking
    `(params, x, *rest)`: dynamic binarization written as an expectation over the
    data distribution, so every evaluation draws fresh binary pixels. The draw does
    not depend on the parameters, so it adds no gradient term.

    Example:
        >>> import genvi as gv
        >>> # gv.batch_mean(binarized(gv.elbo(model, guide))).grad_estimate(key, params, grey)
    """
    import genvi as gv
    import jax.numpy as jnp

    @gv.expectation
    def on_grey(params, grey, *rest):
        x = gv.sample(gv.flip(grey, grad=gv.REINFORCE)).astype(jnp.float32)
        return objective(params, x, *rest)

    on_grey.name = f"binarized({getattr(objective, 'name', 'objective')})"
    return on_grey


def binarize(key, grey: np.ndarray) -> np.ndarray:
    """One fixed binarization (for held-out evaluation sets)."""
    import jax
    return np.asarray(jax.random.bernoulli(key, grey)).astype(np.float32)
