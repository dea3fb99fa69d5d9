"""`gv.plate`: a minibatch of a dataset, scaled to stand for the whole dataset.

`gv.plate(g, size)` is `gv.vmap(g)` whose densities count each lane `size / lanes`
times. The plate's body is bracketed by two marker equations carrying that factor
(`genvi.core.primitives.scaled_by`); the interpreters keep a stack of the factors
of the plates they are inside (nested plates multiply), and every handler multiplies
the log density of each site and observation it scores by the product:
`simulate`'s trace, `log_density`, and `sim` / `generate` inside objectives.
(Markers rather than a parameter stamped on each site: a scan or jit body that JAX
traced once and reuses from its caches is then scaled by the plate it runs in.)
The sampling itself is unchanged (gradient strategies see the guide's own sampling
distribution), so a REINFORCE score, an ENUM sum, an MVD or SD replay all see the
scaled densities downstream of the site, which is what makes a minibatch estimate
of an objective linear in the per-datapoint terms unbiased for the full-data one.
"""

from __future__ import annotations

import operator
from typing import Any

import jax
import jax.numpy as jnp

from genvi.core.primitives import scaled_by
from genvi.gen.combinators import Vmap
from genvi.gen.language import GenFn


def _check_size(g: Any, size: Any) -> int:
    where = f"gv.plate({getattr(g, 'name', g)!s}, size={size!r})"
    if isinstance(size, bool) or not hasattr(size, "__index__"):
        raise TypeError(f"{where}: size is the number of datapoints in the whole dataset, a "
                        f"Python int such as size=len(y); got {type(size).__name__}. (A traced "
                        "or array size cannot work: the scale size / lanes is fixed when the "
                        "program is traced.)")
    size = operator.index(size)
    if size < 1:
        raise ValueError(f"{where}: size is the number of datapoints in the whole dataset and "
                         "must be a positive int, such as size=len(y)")
    return size


class Plate(Vmap):
    """`gv.vmap` whose log densities count each lane `size / lanes` times."""

    def __init__(self, inner: GenFn, size: int, in_axes: Any):
        super().__init__(inner, in_axes)
        self.size = size
        self.name = f"plate({inner.name}, {size})"

    def lanes(self, args: tuple) -> int:
        """The number of lanes (minibatch size) `args` map over."""
        sizes: set = set()

        def visit(axis: Any, sub: Any) -> None:
            if axis is not None:
                sizes.update(jnp.shape(leaf)[axis] for leaf in jax.tree_util.tree_leaves(sub))
        axes = tuple(self.in_axes) if isinstance(self.in_axes, list) else self.in_axes
        try:
            jax.tree_util.tree_map(visit, axes if isinstance(axes, tuple) else (axes,) * len(args),
                                   tuple(args), is_leaf=lambda x: x is None)
        except (ValueError, TypeError, IndexError):
            sizes = set()
        if len(sizes) == 1:
            return int(sizes.pop())
        try:  # a case the shapes do not settle: jax.vmap's own reading (and error)
            probe = jax.vmap(lambda *_: jnp.zeros((), jnp.int8), in_axes=self.in_axes)(*args)
        except ValueError as err:
            raise ValueError(f"gv.{self.name}: {err}") from err
        return int(jnp.shape(probe)[0])

    def body(self, *args: Any) -> Any:
        lanes = self.lanes(args)
        if lanes > self.size:
            raise ValueError(
                f"gv.{self.name} maps over {lanes} lanes, more than size={self.size}: size is "
                f"the number of datapoints in the whole dataset (each lane counts "
                f"size / lanes times), so it must be at least the minibatch's {lanes}. Pass the "
                "full dataset's size, e.g. size=len(y), also under gv.fit(..., batch_size=B).")
        with scaled_by(self.size / lanes):   # the whole dataset (1): gv.vmap, exactly
            return super().body(*args)


def plate(g: GenFn, size: int, in_axes: Any = 0) -> GenFn:
    """`g` mapped over a minibatch of a dataset of `size` datapoints, like
    `gv.vmap(g, in_axes)` (choices stacked on a leading axis), whose log density
    counts each lane `size / lanes` times.

    With `size == lanes` it is `gv.vmap`. With a minibatch drawn uniformly from the
    dataset (as `gv.fit(..., batch_size=B)` does) the ELBO, and its gradient with any
    strategy, estimated on the minibatch is unbiased for the full-data ELBO. The
    factor applies to every site and observation inside `g` (`simulate`'s
    `log_density` and `log_density` are the scaled densities, the guide's `sim` log
    weight too); plates inside plates multiply their factors. Use it in the model
    for the likelihood and in the guide around local latents, with `gv.elbo` itself
    (not `gv.batch_mean`, which averages per-datapoint objectives instead).

    Args:
        g: the generative function of one datapoint.
        size: the number of datapoints in the whole dataset.
        in_axes: the mapped axes of `g`'s arguments, as `gv.vmap` takes them.

    Returns:
        a generative function of a minibatch, its density scaled by `size / lanes`.

    Example:
        >>> import genvi as gv, jax, jax.numpy as jnp
        >>> @gv.gen
        ... def point(w, x, y):
        ...     gv.observe(gv.normal(w * x, 1.0), y)
        >>> @gv.gen
        ... def model(params, x, y):                 # x, y: a minibatch of 4 of 1000 points
        ...     w = gv.normal(0.0, 1.0) @ "w"
        ...     gv.plate(point, size=1000, in_axes=(None, 0, 0))(w, x, y) @ "data"
        >>> ld = model.log_density(gv.choices({"w": 0.5}), None, jnp.ones(4), jnp.zeros(4))
        >>> # = log N(0.5; 0, 1) + (1000 / 4) * Σ_i log N(y_i; 0.5 x_i, 1)
    """
    if not isinstance(g, GenFn):
        raise TypeError(f"gv.plate needs a @gv.gen program, got {g!r}: decorate the function "
                        "with @gv.gen first")
    return Plate(g, _check_size(g, size), in_axes)
