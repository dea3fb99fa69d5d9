"""Multi-object canvases for AIR, generated in the package (no download).

Each canvas is `canvas × canvas` grey levels in [0, 1] holding 0, 1 or 2 digits
(uniformly) at random positions and sizes, their boxes overlapping little (10% by
default, so the count is visible); where they touch they add, clipped at 1. Digits come from scikit-learn's bundled 8×8 digits (upscaled bilinearly), or
from a local MNIST file (`--data PATH`, 28×28 digits as in the paper). Training
canvases use only training digits and held-out canvases only test digits. A seed
fixes the dataset.

Example:
    >>> from genvi_experiments.air.data import make_canvases
    >>> data = make_canvases(train=40, test=20, seed=0)
    >>> data.train.shape, data.test_counts.shape, int(data.train_counts.max()) <= 2
    ((40, 50, 50), (20,), True)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from genvi_experiments.common.data import load_images


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
    """Vectorized over canvases: one pass per object slot (the k-th digit of every
    canvas holding more than k), never a loop over canvases or digits."""
    counts = rng.integers(0, max_objects + 1, size=n)
    out = np.zeros((n, canvas + hi, canvas + hi), np.float32)  # padded: a hi×hi block fits anywhere
    square = digits.reshape(len(digits), *shape).astype(np.float32)
    placed: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    for slot in range(max_objects):
        owner = np.flatnonzero(counts > slot)  # canvases with a digit in this slot
        which = rng.integers(0, len(digits), size=len(owner))
        sizes = rng.integers(lo, hi + 1, size=len(owner))
        rows, cols = _positions(rng, owner, sizes, canvas, overlap, placed)
        placed.append((owner, sizes, rows, cols))
        # each canvas appears once per slot, so fancy-index += adds without collisions
        patches = _resize_padded(square[which], sizes, hi)
        ii = owner[:, None, None]
        rr = rows[:, None, None] + np.arange(hi)[None, :, None]
        cc = cols[:, None, None] + np.arange(hi)[None, None, :]
        out[ii, rr, cc] += patches
    return np.clip(out[:, :canvas, :canvas], 0.0, 1.0), counts.astype(np.int32)


def bilinear_matrix(size_in: int, size_out: int) -> np.ndarray:
    """The (size_out, size_in) matrix of bilinear resizing with half-pixel centres, what
    `jax.image.resize(..., "bilinear")` computes along one axis (when shrinking, its
    triangle kernel widens by the shrink factor: antialiasing).

    Example:
        >>> import numpy as np
        >>> from genvi_experiments.air.data import bilinear_matrix
        >>> w = bilinear_matrix(8, 12)
        >>> w.shape, bool(np.allclose(w.sum(1), 1.0))
        ((12, 8), True)
    """
    scale = size_out / size_in
    width = max(1.0, 1.0 / scale)  # kernel radius in input pixels
    x = (np.arange(size_out) + 0.5) / scale - 0.5  # sample positions in input pixels
    w = np.maximum(0.0, 1.0 - np.abs(x[:, None] - np.arange(size_in)[None, :]) / width)
    return (w / w.sum(1, keepdims=True)).astype(np.float32)  # edges renormalize, like jax


def _resize_padded(images: np.ndarray, sizes: np.ndarray, pad: int) -> np.ndarray:
    """Each image enlarged to its size, zero-padded to pad×pad (one product per size)."""
    out = np.zeros((len(images), pad, pad), np.float32)
    for size in np.unique(sizes):  # at most hi - lo + 1 sizes
        picked = np.flatnonzero(sizes == size)
        w = bilinear_matrix(images.shape[1], int(size))
        out[picked, :size, :size] = np.einsum("ij,njk,lk->nil", w, images[picked], w)
    return out


def _positions(rng: np.random.Generator, owner: np.ndarray, sizes: np.ndarray, canvas: int,
               overlap: float, placed: list) -> tuple[np.ndarray, np.ndarray]:
    """Top-left corners, uniform over the canvas; a digit whose box overlaps an
    earlier digit of its canvas by more than `overlap` of the smaller box's area is
    drawn again (up to 100 times, all such digits at once), so the count stays visible."""
    rows = rng.integers(0, canvas - sizes + 1)
    cols = rng.integers(0, canvas - sizes + 1)
    # the earlier slots' boxes on these canvases (owner arrays are sorted, and every
    # canvas here also had a digit in each earlier slot)
    earlier = []
    for o, s, r, c in placed:
        at = np.searchsorted(o, owner)
        earlier.append((r[at], c[at], s[at]))
    for _ in range(100):
        bad = np.zeros(len(owner), bool)
        for r, c, s in earlier:
            bad |= _overlap(rows, cols, sizes, r, c, s) > overlap
        if not bad.any():
            break
        rows[bad] = rng.integers(0, canvas - sizes[bad] + 1)
        cols[bad] = rng.integers(0, canvas - sizes[bad] + 1)
    return rows, cols


def _overlap(r1, c1, s1, r2, c2, s2) -> np.ndarray:
    h = np.maximum(0, np.minimum(r1 + s1, r2 + s2) - np.maximum(r1, r2))
    w = np.maximum(0, np.minimum(c1 + s1, c2 + s2) - np.maximum(c1, c2))
    return h * w / np.minimum(s1, s2) ** 2
