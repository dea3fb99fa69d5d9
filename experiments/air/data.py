"""Multi-object canvases for AIR, generated in the package (no download).

Each canvas is `canvas × canvas` grey levels in [0, 1] holding 0, 1 or 2 digits
(uniformly) at random positions and sizes; overlapping digits add and are clipped
at 1. Digits come from scikit-learn's bundled 8×8 digits (upscaled bilinearly), or
from a local MNIST file (`--data PATH`, 28×28 digits as in the paper). Training
canvases use only training digits and held-out canvases only test digits. A seed
fixes the dataset.

Example:
    >>> from experiments.air.data import make_canvases
    >>> data = make_canvases(train=40, test=20, seed=0)
    >>> data.train.shape, data.test_counts.shape, int(data.train_counts.max()) <= 2
    ((40, 50, 50), (20,), True)
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np

from experiments.common.data import load_images


@dataclass(frozen=True)
class Canvases:
    """Canvases (float32, [n, canvas, canvas]) with their true object counts."""

    train: np.ndarray
    train_counts: np.ndarray
    test: np.ndarray
    test_counts: np.ndarray
    digit_sizes: tuple[int, int]
    name: str

    @property
    def canvas(self) -> int:
        return self.train.shape[1]


def make_canvases(train: int = 20000, test: int = 1000, seed: int = 0, canvas: int = 50,
                  max_objects: int = 2, data: str | None = None,
                  digit_sizes: tuple[int, int] | None = None) -> Canvases:
    """Generate the AIR dataset: `train` and `test` canvases with their counts.

    `digit_sizes` is the (smallest, largest) side of a placed digit in pixels; the
    default is (12, 20) for the 8×8 digits and (20, 28) for MNIST.
    """
    images = load_images(data)
    if digit_sizes is None:
        digit_sizes = (12, 20) if images.shape == (8, 8) else (20, 28)
    lo, hi = digit_sizes
    if not 1 <= lo <= hi <= canvas:
        raise ValueError(f"digit_sizes={digit_sizes} must satisfy 1 ≤ smallest ≤ largest ≤ "
                         f"canvas ({canvas})")
    rng = np.random.default_rng(seed)
    x_train, c_train = _compose(rng, images.train, images.shape, train, canvas, max_objects, lo, hi)
    x_test, c_test = _compose(rng, images.test, images.shape, test, canvas, max_objects, lo, hi)
    return Canvases(x_train, c_train, x_test, c_test, (lo, hi), images.name)


def _compose(rng: np.random.Generator, digits: np.ndarray, shape: tuple[int, int], n: int,
             canvas: int, max_objects: int, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    counts = rng.integers(0, max_objects + 1, size=n)
    owner = np.repeat(np.arange(n), counts)  # canvas of each placed digit
    m = len(owner)
    which = rng.integers(0, len(digits), size=m)
    sizes = rng.integers(lo, hi + 1, size=m)
    out = np.zeros((n, canvas, canvas), np.float32)
    square = digits.reshape(len(digits), *shape)
    for size in np.unique(sizes):  # one batched resize per digit size
        picked = np.flatnonzero(sizes == size)
        patches = np.asarray(jax.image.resize(jnp.asarray(square[which[picked]]),
                                              (len(picked), size, size), "bilinear"))
        rows = rng.integers(0, canvas - size + 1, size=len(picked))
        cols = rng.integers(0, canvas - size + 1, size=len(picked))
        for patch, i, r, c in zip(patches, owner[picked], rows, cols):
            out[i, r:r + size, c:c + size] += patch
    return np.clip(out, 0.0, 1.0), counts.astype(np.int32)
