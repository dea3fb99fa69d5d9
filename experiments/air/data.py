"""Multi-object canvases for AIR, generated in the package (no download).

Each canvas is `canvas × canvas` grey levels in [0, 1] holding 0, 1 or 2 digits
(uniformly) at random positions and sizes, their boxes overlapping little (10% by
default, so the count is visible); where they touch they add, clipped at 1. Digits come from scikit-learn's bundled 8×8 digits (upscaled bilinearly), or
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
                  digit_sizes: tuple[int, int] | None = None, overlap: float = 0.1) -> Canvases:
    """Generate the AIR dataset: `train` and `test` canvases with their counts.

    `digit_sizes` is the (smallest, largest) side of a placed digit in pixels; the
    default is (12, 20) for the 8×8 digits and (20, 28) for MNIST. Two digits' boxes
    overlap by at most `overlap` of the smaller box (1.0: any overlap).
    """
    images = load_images(data)
    if digit_sizes is None:
        digit_sizes = (12, 20) if images.shape == (8, 8) else (20, 28)
    lo, hi = digit_sizes
    if not 1 <= lo <= hi <= canvas:
        raise ValueError(f"digit_sizes={digit_sizes} must satisfy 1 ≤ smallest ≤ largest ≤ "
                         f"canvas ({canvas})")
    rng = np.random.default_rng(seed)
    x_train, c_train = _compose(rng, images.train, images.shape, train, canvas, max_objects, lo, hi, overlap)
    x_test, c_test = _compose(rng, images.test, images.shape, test, canvas, max_objects, lo, hi, overlap)
    return Canvases(x_train, c_train, x_test, c_test, (lo, hi), images.name)


def _compose(rng: np.random.Generator, digits: np.ndarray, shape: tuple[int, int], n: int,
             canvas: int, max_objects: int, lo: int, hi: int,
             overlap: float) -> tuple[np.ndarray, np.ndarray]:
    counts = rng.integers(0, max_objects + 1, size=n)
    owner = np.repeat(np.arange(n), counts)  # canvas of each placed digit
    m = len(owner)
    which = rng.integers(0, len(digits), size=m)
    sizes = rng.integers(lo, hi + 1, size=m)
    rows, cols = _positions(rng, owner, sizes, canvas, overlap)
    out = np.zeros((n, canvas, canvas), np.float32)
    square = digits.reshape(len(digits), *shape)
    for size in np.unique(sizes):  # one batched resize per digit size
        picked = np.flatnonzero(sizes == size)
        patches = np.asarray(jax.image.resize(jnp.asarray(square[which[picked]]),
                                              (len(picked), size, size), "bilinear"))
        for patch, i, r, c in zip(patches, owner[picked], rows[picked], cols[picked]):
            out[i, r:r + size, c:c + size] += patch
    return np.clip(out, 0.0, 1.0), counts.astype(np.int32)


def _positions(rng: np.random.Generator, owner: np.ndarray, sizes: np.ndarray, canvas: int,
               overlap: float) -> tuple[np.ndarray, np.ndarray]:
    """Top-left corners, uniform over the canvas; a digit whose box overlaps an
    earlier digit of its canvas by more than `overlap` of the smaller box's area is
    placed again (so the true count stays visible)."""
    rows, cols = np.zeros(len(owner), int), np.zeros(len(owner), int)
    first = np.searchsorted(owner, owner)  # owner is sorted: a canvas's digits are adjacent
    for j in range(len(owner)):
        earlier = range(first[j], j)
        for _ in range(100):
            r, c = rng.integers(0, canvas - sizes[j] + 1, size=2)
            if all(_overlap(r, c, sizes[j], rows[m], cols[m], sizes[m]) <= overlap for m in earlier):
                break
        rows[j], cols[j] = r, c
    return rows, cols


def _overlap(r1: int, c1: int, s1: int, r2: int, c2: int, s2: int) -> float:
    h = max(0, min(r1 + s1, r2 + s2) - max(r1, r2))
    w = max(0, min(c1 + s1, c2 + s2) - max(c1, c2))
    return h * w / min(s1, s2) ** 2
