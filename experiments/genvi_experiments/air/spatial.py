"""A differentiable spatial transformer for AIR, written in JAX.

`z_where = (s, x, y)` places a window on the canvas as the affine map of Jaderberg et
al.'s spatial transformer with θ = [[s, 0, x], [0, s, y]] (PyTorch's `affine_grid`
+ `grid_sample`, bilinear, zero padding, `align_corners=False`): canvas point u (in
[-1, 1] coordinates) reads the window at s·u + (x, y), so the window covers 1/s of
the canvas's width, centred at (−x/s, −y/s). The inverse (s, x, y) ↦ (1/s, −x/s,
−y/s) crops a window out of the canvas.

Because θ has no rotation, bilinear sampling is separable: the result is
`rows @ window @ cols.T` with two small interpolation matrices (hat functions), which
is exact, differentiable in `z_where`, and runs as matrix products instead of gathers.

Example:
    >>> import jax.numpy as jnp
    >>> from genvi_experiments.air.spatial import window_to_image, image_to_window
    >>> where = jnp.array([2.0, 0.0, 0.0])
    >>> image = window_to_image(where, jnp.ones((8, 8)), 20)
    >>> image.shape, float(image[10, 10]), float(image[0, 0])
    ((20, 20), 1.0, 0.0)
    >>> image_to_window(where, image, 8).shape
    (8, 8)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def interpolation_matrix(scale: jax.Array, shift: jax.Array, out_size: int,
                         in_size: int) -> jax.Array:
    """`[out_size, in_size]` bilinear weights: output pixel i reads the input at
    normalized coordinate `scale · u_i + shift`, u_i = (2i + 1)/out_size − 1."""
    u = (2.0 * jnp.arange(out_size) + 1.0) / out_size - 1.0
    source = ((scale * u + shift + 1.0) * in_size - 1.0) / 2.0  # input pixel coordinate
    return jax.nn.relu(1.0 - jnp.abs(source[:, None] - jnp.arange(in_size)[None, :]))


def _warp(scale: jax.Array, shift_x: jax.Array, shift_y: jax.Array, source: jax.Array,
          out_size: int) -> jax.Array:
    rows = interpolation_matrix(scale, shift_y, out_size, source.shape[0])
    cols = interpolation_matrix(scale, shift_x, out_size, source.shape[1])
    return rows @ source @ cols.T


def window_to_image(z_where: jax.Array, window: jax.Array, image_size: int) -> jax.Array:
    """Place a `[W, W]` window on an `image_size²` canvas (zeros outside)."""
    s, x, y = z_where[0], z_where[1], z_where[2]
    return _warp(s, x, y, window, image_size)


def image_to_window(z_where: jax.Array, image: jax.Array, window_size: int) -> jax.Array:
    """Crop the region `z_where` attends to out of `image`, as a `window_size²` window.

    A zero scale reads as 1: absent objects' choices are recorded as zeros, and the
    masked branch that reads them is still evaluated under `vmap` (its result is
    discarded, but a 1/0 there would turn the discarded gradient into NaN)."""
    s, x, y = z_where[0], z_where[1], z_where[2]
    s = jnp.where(s == 0, 1.0, s)
    return _warp(1.0 / s, -x / s, -y / s, image, window_size)
